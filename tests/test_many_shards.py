"""Opening a dataset of many shards reads only its meta.json and lists its folder."""

from __future__ import annotations

import json

import pytest
from loader_helpers import keep_shards

import atlas_fast
from atlas_fast import AtlasFormatError, CompressionStrategy

SHARDS = 2000


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    path = tmp_path_factory.mktemp("lazy") / "ds"
    with atlas_fast.AtlasDatasetWriter(path, 1, 1, CompressionStrategy.NO_COMPRESSION) as writer:
        for i in range(SHARDS):
            writer.add_example(i)
    return path


def _break(shard_dir):
    """Make every file of a shard unreadable as what it should be."""
    for name in ("meta.json", "index.npy", "data.bin"):
        (shard_dir / name).write_bytes(b"\xff not this file")


def test_opening_touches_no_shard_file(atlas, many):
    root = many
    broken = many / f"{SHARDS - 1:04d}"
    saved = {p.name: p.read_bytes() for p in broken.iterdir()}
    _break(broken)
    try:
        ds = atlas.AtlasDataset(root)
        assert len(ds) == SHARDS and len(ds.shards) == SHARDS
        assert ds.actual_shard_sizes == [1] * SHARDS
        assert ds[0] == 0 and ds[SHARDS - 2] == SHARDS - 2  # the broken shard is never read
        assert ds.__getitems__([5, 7]) == [5, 7]
        with pytest.raises(AtlasFormatError) as info:
            ds[SHARDS - 1]
        assert str(broken / "meta.json") in str(info.value)
    finally:
        for name, data in saved.items():
            (broken / name).write_bytes(data)
    assert atlas.AtlasDataset(root)[-1] == SHARDS - 1


def test_shard_disagreeing_with_the_root_is_found_on_first_use(atlas, many, tmp_path):
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(many, root, ignore=shutil.ignore_patterns("1[0-9][0-9][0-9]"))
    meta = json.loads((root / "meta.json").read_text())
    meta["shard_sizes"] = meta["shard_sizes"][:1000]
    meta["shard_sizes"][3] = 2
    (root / "meta.json").write_text(json.dumps(meta))
    ds = atlas.AtlasDataset(root)
    assert len(ds) == 1001
    assert ds[2] == 2
    with pytest.raises(AtlasFormatError) as info:
        ds[3]
    message = str(info.value)
    assert str(root / "0003" / "meta.json") in message and str(root / "meta.json") in message


def test_a_node_holding_some_shards_reads_their_own_sizes(atlas, many, tmp_path):
    root = keep_shards(many, tmp_path / "node", [0, 7, 1999])
    ds = atlas.AtlasDataset(root)
    assert len(ds) == 3 and [ds[i] for i in range(3)] == [0, 7, 1999]
    assert [s.root.name for s in ds.shards] == ["0000", "0007", "1999"]
