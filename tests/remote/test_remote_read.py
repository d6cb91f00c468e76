"""Datasets read from S3 (moto) and HTTP (nginx) equal the local read, both backends."""

from __future__ import annotations

import shutil

import pytest
from helpers import case_dataset, fixture_cases, load_expected, same
from servers import upload_tree

import atlas_fast

CASES = fixture_cases()


def _check_all(ds, expected) -> None:
    assert len(ds) == len(expected)
    got = [ds[i] for i in range(len(ds))]
    assert all(same(a, b) for a, b in zip(got, expected))


@pytest.mark.parametrize("case", CASES)
def test_reference_fixture_through_s3(s3, atlas, case):
    upload_tree(s3.client, s3.bucket, case_dataset(case), case)
    expected = load_expected(case)
    with atlas.AtlasDataset(s3.url(case)) as ds:
        _check_all(ds, expected)
        assert all(same(a, b) for a, b in zip(iter(ds), expected))
        if len(ds) > 3:
            idx = [len(ds) - 1, 0, len(ds) // 2, 1]
            assert all(same(a, expected[i]) for a, i in zip(ds.__getitems__(idx), idx))
    shard_dir = sorted(p for p in (case_dataset(case)).iterdir() if p.is_dir())
    if (
        shard_dir
        and atlas_fast.CompressionStrategy(
            atlas.AtlasDataset(case_dataset(case)).metadata.compression_strategy
        )
        != atlas_fast.CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
    ):
        local = atlas.AtlasDatasetShard(shard_dir[0])
        remote = atlas.AtlasDatasetShard(s3.url(f"{case}/{shard_dir[0].name}"))
        assert len(remote) == len(local)
        assert all(same(remote[i], local[i]) for i in range(len(local)))


@pytest.mark.parametrize("case", CASES)
def test_reference_fixture_through_http(nginx, atlas, case):
    root, proxy = nginx
    shutil.copytree(case_dataset(case), root / case)
    with atlas.AtlasDataset(f"{proxy.url}/{case}") as ds:
        _check_all(ds, load_expected(case))


def test_file_url_reads_the_local_path(atlas, reference_case):
    path = case_dataset(reference_case)
    ds = atlas.AtlasDataset(f"file://{path}")
    assert ds.root == path
    _check_all(ds, load_expected(reference_case))


def test_fsspec_scheme_reads_like_local(atlas, reference_case):
    """A scheme obstore lacks goes through fsspec (its in-memory filesystem here)."""
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    base = f"/atlas-{reference_case}"
    for path in sorted((case_dataset(reference_case)).rglob("*")):
        if path.is_file():
            rel = path.relative_to(case_dataset(reference_case)).as_posix()
            fs.pipe(f"{base}/{rel}", path.read_bytes())
    try:
        with atlas.AtlasDataset(f"memory://{base.lstrip('/')}") as ds:
            _check_all(ds, load_expected(reference_case))
    finally:
        fs.rm(base, recursive=True)
