"""The dataset writer drives its shard writers exactly as the reference's does.

Code written against torch_atlas_ds patches ``<package>.writer.AtlasDatasetShardWriter`` with a
double that accepts the reference's keywords only; these tests use a double of our own making
(``RecordingShardWriter``) to pin each call the dataset writer makes, and the files it reads.
"""

from __future__ import annotations

import json
import os
import pickle
import warnings

import numpy as np
import pytest
import zstandard

import atlas_fast
import atlas_fast.writer
from atlas_fast import AtlasDatasetShardWriter, AtlasDatasetWriter, CompressionStrategy

REFERENCE_KEYWORDS = {
    "path",
    "block_size",
    "compression_strategy",
    "compression_level",
    "compression_dict_size",
    "compression_dict",
}


def _trained_dict() -> bytes:
    samples = [f"sample {i}: the quick brown fox {i * 7}".encode() * 20 for i in range(64)]
    return zstandard.train_dictionary(1024, samples).as_bytes()


class RecordingShardWriter:
    """A shard writer double: keywords only (the reference's names), records what it is told,
    and on close writes a meta.json (and a dictionary) as ``decide`` says."""

    def __init__(self, log, decide, **kwargs):
        unknown = set(kwargs) - REFERENCE_KEYWORDS
        if unknown:
            raise TypeError(f"unexpected keyword(s) {sorted(unknown)}")
        self.kwargs = kwargs
        self.path = kwargs["path"]
        self.path.mkdir()
        self.examples = []
        self.closed = False
        self.log = log
        self.decide = decide
        log.append(("new", self.path.name))

    def add_example(self, example):
        assert not self.closed
        self.examples.append(example)

    def __len__(self):
        return len(self.examples)

    def close(self):
        assert not self.closed
        self.closed = True
        self.log.append(("close", self.path.name, len(self.examples)))
        strategy = self.decide(self)
        meta = {
            "version": 1,
            "block_size": self.kwargs["block_size"],
            "stored_examples": len(self.examples),
            "compression_strategy": int(strategy),
            "compression_level": self.kwargs["compression_level"],
            "compression_dict_size": self.kwargs["compression_dict_size"],
        }
        (self.path / "meta.json").write_text(json.dumps(meta, indent=4))
        if strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            (self.path / "zstd_dict.bin").write_bytes(_trained_dict())


class Factory:
    def __init__(self, decide=lambda shard: shard.kwargs["compression_strategy"]):
        self.log = []
        self.made = []
        self.decide = decide

    def __call__(self, *args, **kwargs):
        assert not args, "shard writers are created with keywords only"
        shard = RecordingShardWriter(self.log, self.decide, **kwargs)
        self.made.append(shard)
        return shard


@pytest.fixture
def factory(monkeypatch):
    f = Factory()
    monkeypatch.setattr(atlas_fast.writer, "AtlasDatasetShardWriter", f)
    return f


@pytest.mark.parametrize("strategy,first", [(0, 0), (1, 1), (2, 3), (3, 3)])
def test_construction_makes_the_directory_and_the_first_shard_writer(
    factory, tmp_path, strategy, first
):
    root = tmp_path / "ds"
    w = AtlasDatasetWriter(root, shard_size=10, block_size=2, compression_strategy=strategy)
    assert root.is_dir()
    assert len(factory.made) == 1
    assert factory.made[0].kwargs == {
        "path": root / "0",
        "block_size": 2,
        "compression_strategy": first,
        "compression_level": 3,
        "compression_dict_size": 0.01,
    }
    assert (w.path, w.shard_size, w.block_size) == (root, 10, 2)
    assert w.compression_strategy == strategy
    assert (w.compression_level, w.compression_dict_size) == (3, 0.01)


def test_the_patch_is_looked_up_at_each_shard(monkeypatch, tmp_path):
    """A patch made after the writer exists still creates every later shard writer."""
    w = AtlasDatasetWriter(tmp_path / "ds", shard_size=2, block_size=1, compression_strategy=1)
    f = Factory()
    monkeypatch.setattr(atlas_fast.writer, "AtlasDatasetShardWriter", f)
    for i in range(5):
        w.add_example(i)
    w.close()
    assert [s.path.name for s in f.made] == ["1", "2"]
    assert f.made[-1].examples == [4]


@pytest.mark.parametrize("strategy", [0, 1, 3])
def test_later_shards_get_no_dictionary_and_the_same_strategy(factory, tmp_path, strategy):
    root = tmp_path / "ds"
    with AtlasDatasetWriter(root, shard_size=3, block_size=2, compression_strategy=strategy) as w:
        for i in range(35):
            w.add_example(i)
    later = factory.made[1:]
    assert [s.kwargs["path"] for s in later] == [root / str(n) for n in range(1, 12)]
    for shard in later:
        assert shard.kwargs["compression_dict"] is None
        assert shard.kwargs["compression_strategy"] == strategy
    # numbered 0..11 while written, padded to one width at close
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [f"{n:02d}" for n in range(12)]
    meta = json.loads((root / "meta.json").read_text())
    assert meta == {"version": 1, "shard_sizes": [3] * 11 + [2], "compression_strategy": strategy}


def test_a_shard_is_finished_when_the_next_example_arrives(factory, tmp_path):
    with AtlasDatasetWriter(
        tmp_path / "ds", shard_size=2, block_size=1, compression_strategy=1
    ) as w:
        for i in range(4):
            w.add_example(i)
        assert factory.log == [("new", "0"), ("close", "0", 2), ("new", "1")]
    assert factory.log[-1] == ("close", "1", 2)
    assert len(factory.made) == 2  # no empty trailing shard


def test_strategy_2_shares_what_the_first_shard_trained(factory, tmp_path):
    root = tmp_path / "ds"
    with AtlasDatasetWriter(root, shard_size=4, block_size=1) as w:
        for i in range(10):
            w.add_example(i)
    first, *later = factory.made
    assert first.kwargs["compression_strategy"] == 3
    assert "compression_dict" not in first.kwargs
    for shard in later:
        assert shard.kwargs["compression_strategy"] == 2
        assert isinstance(shard.kwargs["compression_dict"], zstandard.ZstdCompressionDict)
        assert shard.kwargs["compression_dict"].as_bytes() == _trained_dict()
    assert (root / "zstd_dict.bin").read_bytes() == _trained_dict()
    assert not (root / "0" / "zstd_dict.bin").exists()
    shard_meta = json.loads((root / "0" / "meta.json").read_text())
    assert shard_meta["compression_strategy"] == 2
    assert json.loads((root / "meta.json").read_text())["compression_strategy"] == 2


def test_strategy_2_follows_a_first_shard_that_fell_back(monkeypatch, tmp_path):
    """What the first shard wrote decides, not a block count of the dataset writer's own."""
    f = Factory(decide=lambda shard: 1 if shard.kwargs["compression_strategy"] == 3 else 9)
    monkeypatch.setattr(atlas_fast.writer, "AtlasDatasetShardWriter", f)
    root = tmp_path / "ds"
    with AtlasDatasetWriter(root, shard_size=100, block_size=1) as w:  # 100 blocks each
        for i in range(250):
            w.add_example(i)
    assert [s.kwargs["compression_strategy"] for s in f.made] == [3, 1, 1]
    assert [s.kwargs["compression_dict"] for s in f.made[1:]] == [None, None]
    assert not (root / "zstd_dict.bin").exists()
    assert w.compression_strategy == 1
    assert json.loads((root / "meta.json").read_text())["compression_strategy"] == 1


def test_strategy_2_without_the_first_shards_dictionary_names_the_file(monkeypatch, tmp_path):
    class NoDict(Factory):
        def __call__(self, **kwargs):
            shard = super().__call__(**kwargs)
            shard.close = lambda: (self.log.append("closed"), _write_meta(shard, 3))
            return shard

    def _write_meta(shard, strategy):
        meta = dict.fromkeys(("version", "stored_examples"), 1)
        meta.update(block_size=1, compression_strategy=strategy, compression_level=3)
        meta["compression_dict_size"] = 0.01
        (shard.path / "meta.json").write_text(json.dumps(meta))

    monkeypatch.setattr(atlas_fast.writer, "AtlasDatasetShardWriter", NoDict())
    w = AtlasDatasetWriter(tmp_path / "ds", shard_size=1, block_size=1)
    w.add_example(0)
    with pytest.raises(FileNotFoundError) as info:
        w.add_example(1)
    assert info.value.filename == str(tmp_path / "ds" / "0" / "zstd_dict.bin")
    assert info.value.__notes__ == [
        "atlas_fast: the first shard of a SHARED_DICTIONARY_COMPRESSION dataset says "
        "compression_strategy 3 in its meta.json but left no dictionary to share"
    ]


def test_our_options_are_passed_only_when_set(factory, tmp_path):
    with pytest.raises(TypeError, match="checksums"):
        AtlasDatasetWriter(tmp_path / "a", shard_size=2, block_size=1, checksums=True)
    with AtlasDatasetWriter(tmp_path / "b", shard_size=2, block_size=1, checksums=False) as w:
        w.add_example(1)


def test_checksums_reach_the_real_shard_writer(tmp_path):
    with AtlasDatasetWriter(tmp_path / "ds", 3, 1, compression_strategy=1, checksums=True) as w:
        for i in range(7):
            w.add_example(i)
    for name in ("0", "1", "2"):
        assert (tmp_path / "ds" / name / "checksums.npy").is_file()


@pytest.mark.parametrize("strategy", list(CompressionStrategy))
def test_shard_writer_compressor_is_what_it_compresses_with(tmp_path, strategy):
    zdict = zstandard.ZstdCompressionDict(_trained_dict()) if strategy == 2 else None
    w = AtlasDatasetShardWriter(
        tmp_path / "s",
        4,
        compression_strategy=strategy,
        compression_level=5,
        compression_dict=zdict,
    )
    assert (w.path, w.stored_examples) == (tmp_path / "s", 0)
    assert w.metadata == (1, 4, 0, strategy, 5, 0.01)
    if strategy in (0, 3):
        assert w.compressor is None
    else:
        assert isinstance(w.compressor, zstandard.ZstdCompressor)
    examples = [f"example {i} " * (i % 5) for i in range(40)]
    for x in examples:
        w.add_example(x)
    w.close()
    data = (tmp_path / "s" / "data.bin").read_bytes()
    index = np.load(tmp_path / "s" / "index.npy")
    blocks = [pickle.dumps(examples[i : i + 4]) for i in range(0, 40, 4)]
    if strategy == 0:
        assert w.compressor is None
        expected = blocks
    else:  # strategy 3: the compressor with the dictionary trained at close
        expected = [w.compressor.compress(b) for b in blocks]
    assert [data[index[i] : index[i + 1]] for i in range(10)] == expected


def test_with_block_that_raises_leaves_no_meta_and_says_so(factory, tmp_path):
    root = tmp_path / "ds"
    with pytest.warns(RuntimeWarning, match=r"ds: the dataset is incomplete and has no meta\.json"):
        with pytest.raises(KeyError):
            with AtlasDatasetWriter(root, shard_size=2, block_size=1, compression_strategy=1) as w:
                for i in range(5):
                    w.add_example(i)
                raise KeyError("boom")
    assert not (root / "meta.json").exists()
    # finished shards stay; the shard being written is not finished (the double has no abort)
    assert [s.closed for s in factory.made] == [True, True, False]
    assert sorted(p.name for p in root.iterdir()) == ["0", "1", "2"]  # not renamed either
    with pytest.raises(atlas_fast.AtlasFormatError, match="the dataset was not completed"):
        atlas_fast.AtlasDataset(root)


def test_real_shard_of_a_failed_dataset_is_abandoned(tmp_path):
    root = tmp_path / "ds"
    with warnings.catch_warnings(record=True) as caught, pytest.raises(ZeroDivisionError):
        warnings.simplefilter("always")
        with AtlasDatasetWriter(root, shard_size=3, block_size=2, compression_strategy=3) as w:
            for i in range(5):
                w.add_example(i)
            1 / 0  # noqa: B018
    assert len(caught) == 1 and "incomplete" in str(caught[0].message)
    assert not (root / "meta.json").exists()
    assert (root / "0" / "meta.json").is_file()
    assert sorted(p.name for p in (root / "1").iterdir()) == []  # no data.bin, index or meta
    w.close()  # a no-op after the failure: still no meta.json
    assert not (root / "meta.json").exists()


def test_shard_writer_with_block_that_raises_is_not_finished(atlas, tmp_path):
    with pytest.warns(RuntimeWarning, match=r"s: the shard is incomplete"):
        with pytest.raises(RuntimeError), AtlasDatasetShardWriter(tmp_path / "s", 1, 1) as w:
            for i in range(3):
                w.add_example(i)
            raise RuntimeError
    assert {p.name for p in (tmp_path / "s").iterdir()} <= {"data.bin"}  # no index, no meta
    with pytest.raises(atlas_fast.AtlasFormatError, match="the shard was not completed"):
        atlas.AtlasDatasetShard(tmp_path / "s")


def test_meta_json_is_the_last_file_written(tmp_path, monkeypatch):
    """At the moment the root meta.json appears, the shards already have their final names.

    Spies on ``atlas_fast.writer.dump_meta_atomic`` (a private name): the order of renames and
    writes is not observable from outside otherwise."""
    seen = []
    real = atlas_fast.writer.dump_meta_atomic

    def spy(path, fields, **kwargs):
        if path.parent == tmp_path / "ds":
            seen.append(sorted(p.name for p in path.parent.iterdir()))
        real(path, fields, **kwargs)

    monkeypatch.setattr(atlas_fast.writer, "dump_meta_atomic", spy)
    with AtlasDatasetWriter(tmp_path / "ds", 1, 1, compression_strategy=1) as w:
        for i in range(11):
            w.add_example(i)
    assert seen == [[f"{n:02d}" for n in range(11)]]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names fds through /proc")
@pytest.mark.parametrize("strategy", [0, 1, 2, 3])
def test_only_the_root_meta_json_is_flushed_to_disk(tmp_path, monkeypatch, strategy):
    """The commit marker is fsynced before its rename; nothing else is (strategy 2's rewrite
    of the first shard's meta.json included: the dataset is not committed yet)."""
    flushed = []
    real_fsync = os.fsync

    def spy(fd):
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    root = tmp_path / "ds"
    with AtlasDatasetWriter(root, 40, 4, compression_strategy=strategy) as w:
        for i in range(100):
            w.add_example(f"example {i}" * (i % 7))
    assert [os.path.basename(p) for p in flushed] == [f".meta.json.tmp-{os.getpid()}"]
    assert os.path.dirname(flushed[0]) == str(root)


def test_opening_a_directory_that_is_not_there_says_so(atlas, tmp_path):
    with pytest.raises(atlas_fast.AtlasFormatError, match="the dataset directory does not exist"):
        atlas.AtlasDataset(tmp_path / "nowhere")
