"""The seven defects of the reference (REFERENCE_API.md), each shown fixed on every backend."""

import json
import os
import pickle
import random
import sys
import threading

import numpy as np
import pytest
import zstandard
from helpers import assert_same, open_fd_count

import atlas_fast
from atlas_fast import AtlasDatasetShardWriter, AtlasDatasetWriter


def docs(n, seed=0):
    rng = random.Random(seed)
    return [
        {"id": i, "text": " ".join(str(rng.random()) for _ in range(rng.randint(1, 40)))}
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def doc_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("docs") / "ds"
    examples = docs(3000)
    with AtlasDatasetWriter(root, shard_size=700, block_size=16) as w:
        for x in examples:
            w.add_example(x)
    return root, examples


# 1. fork ----------------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_children_read_correctly_after_the_parent_read(atlas, doc_dataset):
    root, examples = doc_dataset
    ds = atlas.AtlasDataset(root)
    for i in range(0, len(ds), 7):  # the parent touches every shard first
        assert ds[i]["id"] == i
    children = []
    for child in range(4):
        pid = os.fork()
        if pid == 0:  # child: thousands of random reads, exit status says if all were right
            status = 0
            try:
                rng = random.Random(child)
                for _ in range(3000):
                    i = rng.randrange(len(examples))
                    if ds[i] != examples[i]:
                        status = 1
                        break
            except BaseException:
                status = 2
            os._exit(status)
        children.append(pid)
    statuses = [os.waitpid(pid, 0)[1] for pid in children]
    assert statuses == [0, 0, 0, 0]


# 2. pickling ------------------------------------------------------------------------------------


def test_pickles_before_and_after_reads(atlas, doc_dataset):
    root, examples = doc_dataset
    ds = atlas.AtlasDataset(root)
    fresh = pickle.loads(pickle.dumps(ds))
    assert fresh[5] == examples[5]
    for i in range(0, len(ds), 3):
        ds[i]
    again = pickle.loads(pickle.dumps(ds))
    assert type(again) is type(ds)
    assert [again[i] for i in range(-5, 5)] == [examples[i] for i in range(-5, 5)]
    shard = ds.shards[1]
    shard[3]
    copy = pickle.loads(pickle.dumps(shard))
    assert [copy[i] for i in range(len(copy))] == examples[700:1400]
    assert len(pickle.dumps(ds)) < 1000  # pickles to its constructor arguments only


# 3. file descriptors ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("many") / "ds"
    with AtlasDatasetWriter(root, shard_size=1, block_size=1, compression_strategy=1) as w:
        for i in range(2000):
            w.add_example(i)
    return root


def test_descriptors_stay_bounded_over_2000_shards(atlas, many_shards):
    before = open_fd_count()
    with atlas.AtlasDataset(many_shards) as ds:
        assert len(ds.shards) == 2000
        peak = before
        for i in range(len(ds)):
            assert ds[i] == i
            if i % 100 == 0:
                peak = max(peak, open_fd_count())
        peak = max(peak, open_fd_count())
        assert peak - before <= 70, f"{peak - before} descriptors held"
    assert open_fd_count() <= before  # close() (here: leaving the with block) releases them


def test_close_releases_and_the_reader_stays_usable(atlas, doc_dataset):
    root, examples = doc_dataset
    before = open_fd_count()
    ds = atlas.AtlasDataset(root)
    assert ds[2999] == examples[2999]
    ds.close()
    assert open_fd_count() <= before
    assert ds[0] == examples[0]  # reopens on demand
    ds.close()


# 4. indices below -len --------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-3001, -3002, -6000, -(10**30), 3000, 10**30])
def test_out_of_range_indices_raise_index_error(atlas, doc_dataset, bad):
    root, _ = doc_dataset
    ds = atlas.AtlasDataset(root)
    with pytest.raises(IndexError):
        ds[bad]
    with pytest.raises(IndexError):
        ds.shards[0][bad]


@pytest.mark.parametrize("bad", [1.0, "1", None, slice(0, 2)])
def test_non_integer_indices_raise_type_error(atlas, doc_dataset, bad):
    ds = atlas.AtlasDataset(doc_dataset[0])
    with pytest.raises(TypeError):
        ds[bad]


def test_numpy_integers_are_indices(atlas, doc_dataset):
    root, examples = doc_dataset
    ds = atlas.AtlasDataset(root)
    assert ds[np.int64(-1)] == examples[-1]
    assert ds.shards[0][np.uint8(3)] == examples[3]


# 5. empty shards and roots ----------------------------------------------------------------------


def test_empty_shard_reads_as_empty(atlas, tmp_path):
    with AtlasDatasetShardWriter(tmp_path / "s", 4, compression_strategy=1):
        pass
    shard = atlas.AtlasDatasetShard(tmp_path / "s")
    assert len(shard) == 0
    with pytest.raises(IndexError):
        shard[0]
    with pytest.raises(IndexError):
        shard[-1]
    (tmp_path / "s" / "data.bin").unlink()  # as the reference leaves an empty shard
    shard = atlas.AtlasDatasetShard(tmp_path / "s")
    assert len(shard) == 0
    with pytest.raises(IndexError):
        shard[0]


def test_dataset_with_an_empty_shard_in_the_middle(atlas, tmp_path):
    root = tmp_path / "ds"
    for number, values in enumerate([[1, 2, 3], [], [4, 5]]):
        with AtlasDatasetShardWriter(root / str(number), 2, compression_strategy=0) as w:
            for v in values:
                w.add_example(v)
    (root / "1" / "data.bin").unlink()
    (root / "meta.json").write_text(
        json.dumps({"version": 1, "shard_sizes": [3, 0, 2], "compression_strategy": 0}, indent=4)
    )
    ds = atlas.AtlasDataset(root)
    assert len(ds) == 5
    assert [ds[i] for i in range(5)] == [1, 2, 3, 4, 5]
    assert [ds[-i] for i in range(1, 6)] == [5, 4, 3, 2, 1]


def test_root_without_shards_reads_as_empty(atlas, tmp_path):
    (tmp_path / "meta.json").write_text(
        json.dumps({"version": 1, "shard_sizes": [], "compression_strategy": 2}, indent=4)
    )
    ds = atlas.AtlasDataset(tmp_path)
    assert len(ds) == 0 and ds.shards == []
    with pytest.raises(IndexError):
        ds[0]
    with pytest.raises(IndexError):
        ds[-1]


# 6. threads -------------------------------------------------------------------------------------


def test_threads_share_one_reader(atlas, doc_dataset):
    root, examples = doc_dataset
    ds = atlas.AtlasDataset(root)
    errors = []
    start = threading.Barrier(8)

    def work(seed):
        rng = random.Random(seed)
        start.wait()
        try:
            for k in range(1500):
                i = rng.randrange(len(examples)) if seed % 2 else (k * 7 + seed) % len(examples)
                got = ds[i]
                if got != examples[i]:
                    errors.append((i, got))
                    return
                if seed == 0 and k % 300 == 0:
                    ds.close()  # closing under the other threads' feet is harmless
        except Exception as exc:
            errors.append(exc)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # interleave threads as much as possible
    try:
        threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)
    assert errors == []


# 7. frames without a content size ---------------------------------------------------------------


@pytest.mark.parametrize("strategy", [1, 3])
def test_frames_without_content_size(atlas, tmp_path, strategy):
    examples = docs(200, seed=strategy)
    root = tmp_path / "s"
    with AtlasDatasetShardWriter(root, 10, compression_strategy=strategy) as w:
        for x in examples:
            w.add_example(x)
    # Re-encode every block without the content size in its frame header.
    index = np.load(root / "index.npy")
    data = (root / "data.bin").read_bytes()
    zdict = None
    if (root / "zstd_dict.bin").exists():
        zdict = zstandard.ZstdCompressionDict((root / "zstd_dict.bin").read_bytes())
    dctx = zstandard.ZstdDecompressor(dict_data=zdict) if zdict else zstandard.ZstdDecompressor()
    cctx = (
        zstandard.ZstdCompressor(write_content_size=False, dict_data=zdict)
        if zdict
        else zstandard.ZstdCompressor(write_content_size=False)
    )
    frames = []
    for b in range(len(index) - 1):
        plain = dctx.decompress(data[index[b] : index[b + 1]])
        frame = cctx.compress(plain)
        assert zstandard.frame_content_size(frame) == -1
        frames.append(frame)
    offsets = np.cumsum([0] + [len(f) for f in frames])
    (root / "data.bin").write_bytes(b"".join(frames))
    np.save(root / "index.npy", offsets.astype(np.uint32))
    shard = atlas.AtlasDatasetShard(root)
    for i in range(len(examples)):
        assert_same(shard[i], examples[i], f"[{i}]")


def test_backend_is_reported():
    assert atlas_fast.BACKEND in ("cython", "python")
    info = atlas_fast.zstd_library()
    assert info["version"].count(".") == 2
