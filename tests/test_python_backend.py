"""The pure-Python backend's own I/O paths (about one backend: not parametrized)."""

import os
import threading

import pytest
from helpers import assert_same

import atlas_fast
from atlas_fast import _python
from atlas_fast._core import _reader_py as _pyreader


def _write(root, n=300, block_size=7, strategy=1):
    examples = [{"id": i, "text": "x" * (i % 50)} for i in range(n)]
    with atlas_fast.AtlasDatasetWriter(
        root, shard_size=100, block_size=block_size, compression_strategy=strategy
    ) as writer:
        for example in examples:
            writer.add_example(example)
    return examples


def test_read_at_reads_across_short_reads(tmp_path, monkeypatch):
    path = tmp_path / "f"
    path.write_bytes(bytes(range(256)) * 40)
    calls = []

    def short_pread(fd, size, offset):  # at most 100 bytes per call, as a pipe or a cap would
        calls.append(size)
        return os.pread(fd, min(size, 100), offset)

    if hasattr(os, "pread"):
        monkeypatch.setattr(_pyreader, "_pread", short_pread)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert _pyreader.read_at(fd, 1000, 5) == (bytes(range(256)) * 40)[5:1005]
        assert _pyreader.read_at(fd, 1000, 10_200) == (bytes(range(256)) * 40)[10_200:]
        assert _pyreader.read_at(fd, 10, 20_000) == b""
    finally:
        os.close(fd)
    if hasattr(os, "pread"):
        assert len(calls) > 10  # the loop really went round


@pytest.mark.parametrize("strategy", [0, 1])
def test_without_pread_threads_read_correct_examples(tmp_path, monkeypatch, strategy):
    """Where the OS has no pread (Windows), a seek and a read under the pool lock."""
    monkeypatch.setattr(_pyreader, "_pread", None)
    examples = _write(tmp_path / "ds", strategy=strategy)
    ds = _python.AtlasDataset(tmp_path / "ds")
    errors = []

    def reader(seed):
        try:
            for k in range(600):
                i = (k * 7919 + seed * 104729) % len(examples)
                assert_same(ds[i], examples[i], f"example {i}")
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ds.close()
    assert errors == []


# -- the spare block: the block read last at random, kept until the next is decoded ----------

_ALIVE = None  # a weakref.WeakSet, set by the test below: the Tracked examples alive now
_MADE = [0]  # Tracked examples unpickled so far


class Tracked:
    """An example that counts its unpickling and can be seen alive (through ``_ALIVE``)."""

    __slots__ = ("i", "__weakref__")

    def __init__(self, i):
        self.i = i

    def __reduce__(self):
        return _tracked, (self.i,)


def _tracked(i):
    _MADE[0] += 1
    example = Tracked(i)
    if _ALIVE is not None:
        _ALIVE.add(example)
    return example


@pytest.mark.parametrize("strategy", [0, 1])
def test_the_block_read_last_at_random_is_kept_until_the_next_is_decoded(
    tmp_path, monkeypatch, strategy
):
    """A block read at random that the cache only remembers (ShardCore._miss) keeps its
    examples alive until the cache's next block is decoded, one block at most beyond the
    budget, as the reference keeps the block it read last: read again, it is not decoded."""
    import gc
    import weakref

    global _ALIVE
    root = tmp_path / "tracked"
    with atlas_fast.AtlasDatasetWriter(root, 160, 16, compression_strategy=strategy) as w:
        for i in range(320):
            w.add_example(Tracked(i))
    _ALIVE = weakref.WeakSet()
    try:
        ds = _python.AtlasDataset(root, cache_bytes=1)  # holds no block but the one in use
        cache = ds._block_cache

        def alive():
            gc.collect()
            return sorted(x.i for x in _ALIVE)

        assert ds[37].i == 37  # block 2, at random: remembered; a small block is not kept
        assert cache.partial_keys() == [(0, 2)]
        assert alive() == []
        monkeypatch.setattr(_pyreader, "SPARE_MIN_BYTES", 0)
        assert ds[101].i == 101 and alive() == list(range(96, 112))
        assert ds[37].i == 37  # block 2 again: decoded again, held whole now
        ds.close()
        assert ds[37].i == 37  # block 2, at random: remembered, its examples kept
        assert cache.partial_keys() == [(0, 2)]
        assert alive() == list(range(32, 48))
        made = _MADE[0]
        hits, misses = ds.cache_info()[:2]
        assert ds[40].i == 40  # block 2 again: from the kept examples, not decoded
        assert _MADE[0] == made
        assert cache.partial_keys() == [] and cache.keys() == [(0, 2)]
        # A hit, as the compiled core counts it.
        assert ds.cache_info()[:2] == (hits + 1, misses)
        for i in (100, 5, 250, 130, 70, 300):  # each a block read at random
            assert ds[i].i == i
            # The block just read, and no other (the one before it freed once it was decoded).
            assert alive() == list(range(i - i % 16, i - i % 16 + 16))
        assert ds[301].i == 301
        assert [x.i for x in ds.__getitems__([3, 200, 290])] == [3, 200, 290]
        assert len(alive()) <= 3 * 16
        ds.close()  # nothing is kept after close
        assert alive() == []
        assert ds[17].i == 17 and alive() == list(range(16, 32))
        del ds, cache
        assert alive() == []
    finally:
        _ALIVE = None


@pytest.mark.parametrize("budget", [{"cache_bytes": 1}, {}], ids=["no-room", "default"])
@pytest.mark.parametrize("strategy", [0, 1])
def test_a_pass_in_order_frees_a_compressed_block_after_the_next_is_decoded(
    tmp_path, monkeypatch, strategy, budget
):
    """A pass in order (``ds[i]``, i rising) that does not keep its blocks (a cache with no
    room, or the default budget, whose passes keep none) drops each block it is done with. A
    compressed shard's block of ``SPARE_MIN_BYTES`` or more, decoded, stays alive (the spare)
    until the pass's next block is decoded, so that its memory is reused, not handed back
    and faulted in again; an uncompressed shard's is freed at once, and so is a smaller one.
    Either way at most one block is alive between two decodes, and nothing after close()."""
    import gc
    import weakref

    global _ALIVE
    root = tmp_path / "tracked"
    with atlas_fast.AtlasDatasetWriter(root, 48, 16, compression_strategy=strategy) as w:
        for i in range(96):  # two shards of three blocks: the pass crosses a shard
            w.add_example(Tracked(i))
    shards = _python.AtlasDataset(root).shards
    sizes = sorted(len(s._block_bytes(b)) for s in shards for b in range(3))
    _ALIVE = weakref.WeakSet()
    seen = []  # the examples alive as each block starts to be decoded
    unpickle = _pyreader.ShardCore._unpickle

    def watched(self, data, b):
        gc.collect()
        seen.append(sorted(x.i for x in _ALIVE))
        return unpickle(self, data, b)

    monkeypatch.setattr(_pyreader.ShardCore, "_unpickle", watched)
    kept = [[]] + [list(range(s, s + 16)) for s in range(0, 80, 16)]
    try:
        # The threshold is the decoded size (not what the cache charges, several times more
        # for these objects): just above every block's, none is kept; at the smallest, all.
        for threshold, expected in ((sizes[-1] + 1, [[]] * 6), (sizes[0], kept)):
            monkeypatch.setattr(_pyreader, "SPARE_MIN_BYTES", threshold)
            seen.clear()
            ds = _python.AtlasDataset(root, **budget)
            assert [ds[i].i for i in range(96)] == list(range(96))
            assert seen == (expected if strategy else [[]] * 6)
            gc.collect()
            assert sorted(x.i for x in _ALIVE) == list(range(80, 96))
            ds.close()
            gc.collect()
            assert list(_ALIVE) == []
    finally:
        _ALIVE = None
