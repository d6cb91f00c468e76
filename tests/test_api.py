"""atlas_fast is a drop-in replacement: the reference's names, signatures and exceptions."""

import errno
import inspect
import os
import subprocess
import sys
import textwrap
from unittest import mock

import pytest
from helpers import case_dataset

import atlas_fast
import atlas_fast.atlas
import atlas_fast.writer

REFERENCE_TOP_LEVEL = [
    "AtlasDataset",
    "AtlasDatasetShard",
    "CompressionStrategy",
    "AtlasDatasetMetadata",
    "AtlasDatasetShardMetadata",
    "AtlasDatasetWriter",
    "AtlasDatasetShardWriter",
]

# (class, parameters with defaults) exactly as the reference declares them.
REFERENCE_SIGNATURES = {
    "AtlasDatasetShard": [
        ("root", inspect.Parameter.empty),
        ("mmap_index", True),
        ("compression_dict_bytes", None),
    ],
    "AtlasDataset": [("root", inspect.Parameter.empty), ("mmap_index", True)],
    "AtlasDatasetShardWriter": [
        ("path", inspect.Parameter.empty),
        ("block_size", inspect.Parameter.empty),
        ("compression_strategy", 3),
        ("compression_level", 3),
        ("compression_dict", None),
        ("compression_dict_size", 0.01),
    ],
    "AtlasDatasetWriter": [
        ("path", inspect.Parameter.empty),
        ("shard_size", inspect.Parameter.empty),
        ("block_size", inspect.Parameter.empty),
        ("compression_strategy", 2),
        ("compression_level", 3),
        ("compression_dict_size", 0.01),
    ],
}


def test_top_level_names():
    for name in REFERENCE_TOP_LEVEL:
        assert hasattr(atlas_fast, name), name
    assert atlas_fast.BACKEND in ("cython", "python")


def test_submodules_hold_the_reference_names():
    for name in (
        "AtlasDataset",
        "AtlasDatasetShard",
        "AtlasDatasetMetadata",
        "AtlasDatasetShardMetadata",
        "CompressionStrategy",
    ):
        assert getattr(atlas_fast.atlas, name) is getattr(atlas_fast, name)
    for name in ("AtlasDatasetWriter", "AtlasDatasetShardWriter"):
        assert getattr(atlas_fast.writer, name) is getattr(atlas_fast, name)


@pytest.mark.parametrize("name", sorted(REFERENCE_SIGNATURES))
def test_signatures_start_like_the_reference(name, atlas):
    cls = getattr(atlas, name, None) or getattr(atlas_fast, name)
    params = list(inspect.signature(cls).parameters.values())
    want = REFERENCE_SIGNATURES[name]
    got = [(p.name, p.default) for p in params[: len(want)]]
    assert got == want
    # Anything we add comes after, keyword-only, so positional calls mean the same.
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[len(want) :])


def test_enum_and_metadata_types():
    cs = atlas_fast.CompressionStrategy
    assert [(m.name, int(m)) for m in cs] == [
        ("NO_COMPRESSION", 0),
        ("STANDARD_COMPRESSION", 1),
        ("SHARED_DICTIONARY_COMPRESSION", 2),
        ("DICTIONARY_COMPRESSION", 3),
    ]
    assert atlas_fast.AtlasDatasetShardMetadata._fields == (
        "version",
        "block_size",
        "stored_examples",
        "compression_strategy",
        "compression_level",
        "compression_dict_size",
    )
    assert atlas_fast.AtlasDatasetMetadata._fields == (
        "version",
        "shard_sizes",
        "compression_strategy",
    )


def test_version_constants(atlas):
    for cls in (
        atlas.AtlasDataset,
        atlas.AtlasDatasetShard,
        atlas_fast.AtlasDatasetWriter,
        atlas_fast.AtlasDatasetShardWriter,
    ):
        assert cls.VERSION == 1


def test_public_attributes(atlas, reference_case):
    root = case_dataset(reference_case)
    ds = atlas.AtlasDataset(root)
    assert ds.root == root and ds.mmap_index is True
    assert isinstance(ds.metadata, atlas_fast.AtlasDatasetMetadata)
    assert list(ds.actual_shard_sizes) == [s.metadata.stored_examples for s in ds.shards]
    assert list(ds.cumulative_shard_sizes) == [
        sum(ds.actual_shard_sizes[: k + 1]) for k in range(len(ds.shards))
    ]
    for shard in ds.shards:
        assert isinstance(shard, atlas.AtlasDatasetShard)
        assert isinstance(shard.metadata, atlas_fast.AtlasDatasetShardMetadata)
        assert len(shard) == shard.metadata.stored_examples
        assert shard.mmap_index is True
        if ds.metadata.compression_strategy == 2:
            assert shard.compression_dict_bytes == (root / "zstd_dict.bin").read_bytes()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_size": 0},
        {"block_size": -3},
        {"block_size": 4, "compression_dict_size": 1.5},
        {"block_size": 4, "compression_dict_size": -0.1},
        {"block_size": 4, "compression_strategy": 2},  # no compression_dict
    ],
)
def test_bad_shard_writer_arguments_raise_assertion_error(tmp_path, kwargs):
    with pytest.raises(AssertionError):
        atlas_fast.AtlasDatasetShardWriter(tmp_path / "shard", **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"shard_size": 10, "block_size": 0},
        {"shard_size": 0, "block_size": 4},
        {"shard_size": 10, "block_size": 4, "compression_dict_size": 2},
    ],
)
def test_bad_dataset_writer_arguments_raise_assertion_error(tmp_path, kwargs):
    with pytest.raises(AssertionError):
        atlas_fast.AtlasDatasetWriter(tmp_path / "ds", **kwargs)


def _occupy(path, state: str) -> None:
    if state == "file":
        path.write_text("")
    else:
        path.mkdir()
        if state == "full":
            (path / "keep.txt").write_text("mine")


@pytest.mark.parametrize("state", ["empty", "full", "file"])
@pytest.mark.parametrize("writer", ["AtlasDatasetWriter", "AtlasDatasetShardWriter"])
def test_writer_refuses_an_existing_path(tmp_path, monkeypatch, writer, state):
    """The reference's error (FileExistsError, errno EEXIST, from its Path.mkdir), for an
    empty directory too, with a sentence naming the path and what to do; nothing touched."""
    path = tmp_path / "my_ds"
    _occupy(path, state)
    monkeypatch.chdir(tmp_path)  # a relative path, as in the README's example
    args = ("my_ds", 4, 2) if writer == "AtlasDatasetWriter" else ("my_ds", 2)
    with pytest.raises(FileExistsError) as info:
        getattr(atlas_fast, writer)(*args)
    exc = info.value
    assert type(exc) is FileExistsError and exc.errno == errno.EEXIST
    detail = {"empty": "(an empty directory)", "full": "and is not empty", "file": "and is not a"}
    what = "dataset" if writer == "AtlasDatasetWriter" else "shard"
    assert exc.strerror == (
        f"my_ds: already exists {detail[state]}"
        + (" directory" if state == "file" else "")
        + f"; {writer} creates the directory of a new {what} itself: remove it or choose "
        "another path"
    )
    if state == "full":
        assert sorted(p.name for p in path.iterdir()) == ["keep.txt"]
    try:
        import torch_atlas_ds
    except ImportError:
        return
    other = tmp_path / "theirs"
    _occupy(other, state)
    with pytest.raises(OSError) as theirs:
        getattr(torch_atlas_ds, writer)(*(("theirs", *args[1:])))
    assert type(theirs.value) is type(exc) and theirs.value.errno == exc.errno


def test_other_versions_are_refused_with_an_exception(atlas, tmp_path):
    with atlas_fast.AtlasDatasetWriter(tmp_path / "ds", 4, 2, compression_strategy=0) as w:
        for i in range(6):
            w.add_example(i)
    meta = tmp_path / "ds" / "0" / "meta.json"
    meta.write_text(meta.read_text().replace('"version": 1', '"version": 2'))
    with pytest.raises(Exception, match="version") as info:
        atlas.AtlasDataset(tmp_path / "ds")[0]  # a shard's meta.json is read on first use
    assert str(meta) in str(info.value)


def test_patching_the_shard_class_in_the_submodule_is_honoured(tmp_path):
    with atlas_fast.AtlasDatasetWriter(tmp_path / "ds", 4, 2, compression_strategy=0) as w:
        for i in range(6):
            w.add_example(i)
    real = atlas_fast.atlas.AtlasDatasetShard
    with mock.patch("atlas_fast.atlas.AtlasDatasetShard", wraps=real) as spy:
        ds = atlas_fast.atlas.AtlasDataset(tmp_path / "ds")
        assert spy.call_count == 0  # shard objects are made on first access
        assert len(list(ds.shards)) == 2
    assert spy.call_count == 2
    assert [ds[i] for i in range(6)] == list(range(6))


def test_torch_dataset_when_torch_is_installed(atlas, reference_case):
    torch_data = pytest.importorskip("torch.utils.data")
    ds = atlas.AtlasDataset(case_dataset(reference_case))
    assert isinstance(ds, torch_data.Dataset)
    assert isinstance(ds.shards[0], torch_data.Dataset)


def test_works_without_torch(tmp_path):
    """With torch blocked, the package imports, never imports torch, and reads and writes."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["torch"] = None  # what an interpreter without torch sees
        import atlas_fast
        with atlas_fast.AtlasDatasetWriter({str(tmp_path / "ds")!r}, 5, 2) as w:
            for i in range(23):
                w.add_example({{"i": i}})
        ds = atlas_fast.AtlasDataset({str(tmp_path / "ds")!r})
        assert [ds[i]["i"] for i in range(len(ds))] == list(range(23))
        assert sys.modules["torch"] is None
        assert not any(m.startswith("torch.") for m in sys.modules)
        print("ok", atlas_fast.BACKEND)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=dict(os.environ)
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok")
