"""Random reads decode one example out of a block (compiled core) or remember the block only
(Python core): every example exact, in any order, from many threads, with blocks held as their
pickle, or remembered, in the cache."""

from __future__ import annotations

import datetime
import decimal
import pickle
import random

import numpy as np
import pytest
from helpers import assert_same, run_threads

import atlas_fast


def _examples(n):
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append({"id": i, "text": f"document {i} " * (i % 5), "tags": ["a", str(i % 3)]})
        elif kind == 1:
            out.append(np.arange(i % 7 + 1, dtype=["u2", "f4", "i8"][i % 3]))
        elif kind == 2:
            out.append((datetime.date(2024, 1, 1 + i % 28), decimal.Decimal(i) / 8, None))
        else:
            out.append({"id": i, "text": "shared key names", "n": np.int64(i)})
    return out


@pytest.fixture(scope="module", params=[0, 1, 2, 3])
def dataset(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("partial") / f"s{request.param}"
    examples = _examples(400)
    with atlas_fast.AtlasDatasetWriter(root, 160, 16, compression_strategy=request.param) as w:
        for x in examples:
            w.add_example(x)
    return root, examples


def test_random_reads_are_exact(atlas, dataset):
    root, examples = dataset
    order = list(range(len(examples)))
    random.Random(0).shuffle(order)
    for cache_blocks in (1, 4, None):
        ds = atlas.AtlasDataset(root, cache_blocks=cache_blocks)
        for i in order:
            assert_same(ds[i], examples[i], f"example {i}")
        # Every block read again, in order, and in batches: the same examples.
        for i in range(len(examples)):
            assert_same(ds[i], examples[i], f"example {i}")
        for got, i in zip(ds.__getitems__(order[:50]), order[:50]):
            assert_same(got, examples[i], f"example {i}")


def test_no_block_read_twice_then_every_block_again(atlas, dataset):
    root, examples = dataset
    ds = atlas.AtlasDataset(root)
    blocks = list(range(len(examples) // 16))
    random.Random(1).shuffle(blocks)
    for b in blocks:  # one example of each block: the partial path
        i = b * 16 + (b * 7) % 16
        assert_same(ds[i], examples[i], f"example {i}")
    for b in blocks:  # a second example of each: the block's pickle, then whole
        i = b * 16 + (b * 7 + 3) % 16
        assert_same(ds[i], examples[i], f"example {i}")
    for i, got in enumerate(ds):
        assert_same(got, examples[i], f"example {i}")


def test_many_threads_on_one_dataset(atlas, dataset):
    root, examples = dataset
    ds = atlas.AtlasDataset(root, cache_blocks=3)  # small enough to evict all the time

    def reader(seed):
        rng = random.Random(seed)
        for _ in range(400):
            i = rng.randrange(len(examples))
            assert_same(ds[i], examples[i], f"example {i}")
        batch = [rng.randrange(len(examples)) for _ in range(40)]
        for got, i in zip(ds.__getitems__(batch), batch):
            assert_same(got, examples[i], f"example {i}")

    assert run_threads(reader, 8) == []


def test_a_block_read_at_random_is_held_once_read_again(atlas, dataset):
    """The compiled core decodes one example of a block read at random and holds the block
    as its pickle; the Python core unpickles it whole and remembers it only (its examples
    freed). In both, a second read holds it whole, and a block read right after the one before
    is read whole. Which blocks are held so needs the core's cache (``_block_cache``): the
    public API reports counts, not how a block is held."""
    root, examples = dataset
    ds = atlas.AtlasDataset(root)
    cache = ds._block_cache
    assert_same(ds[37], examples[37])  # block 2 of shard 0, read out of order
    assert cache.partial_keys() == [(0, 2)]
    assert_same(ds[38], examples[38])  # a second example: the block is unpickled whole
    assert cache.partial_keys() == []
    assert cache.keys() == [(0, 2)]
    info = ds.cache_info()
    assert (info.hits, info.misses) == (1, 1)
    assert_same(ds[200], examples[200])  # shard 1, block 2: partial
    assert_same(ds[216], examples[216])  # block 3 right after block 2: in order, whole
    assert cache.partial_keys() == [(1, 2)]
    assert cache.keys() == [(0, 2), (1, 2), (1, 3)]
    assert_same(ds[201], examples[201])  # block 2 of shard 1 again: now whole
    assert cache.partial_keys() == []
    assert ds.cache_info()[:2] == (2, 3)


def _damaged_copy(root, tmp_path, seed):
    """``root`` copied with bytes in the middle of shard 0's block 2 overwritten."""
    import shutil

    copy = tmp_path / f"damaged{seed}"
    shutil.copytree(root, copy)
    shard = sorted(p for p in copy.iterdir() if p.is_dir())[0]
    offsets = np.load(shard / "index.npy")
    start, end = int(offsets[2]), int(offsets[3])
    data = bytearray((shard / "data.bin").read_bytes())
    at = start + (end - start) // 2 + seed
    data[at : at + 12] = random.Random(seed).randbytes(12)
    (shard / "data.bin").write_bytes(bytes(data))
    return copy


def _outcome(ds, i):
    try:
        return ("example", ds[i])
    except atlas_fast.AtlasFormatError as exc:
        return (type(exc).__name__, str(exc))


@pytest.mark.skipif(atlas_fast.BACKEND != "cython", reason="compares the compiled core with Python")
@pytest.mark.parametrize("strategy", [1, 2, 3])
def test_damage_in_the_middle_of_a_block_fails_alike_on_random_reads(tmp_path, strategy):
    """A frame damaged mid-block, read at random (the compiled core's partial path): each
    example of the block is the same named error on both backends (or, where zstd cannot see
    the damage, the same example); the other blocks stay exact."""
    from atlas_fast import _python

    root = tmp_path / "clean"
    examples = _examples(160)
    with atlas_fast.AtlasDatasetWriter(root, 160, 16, compression_strategy=strategy) as w:
        for x in examples:
            w.add_example(x)
    detected = 0
    for seed in range(6):
        damaged = _damaged_copy(root, tmp_path, seed)
        order = list(range(32, 48))  # block 2 of shard 0
        random.Random(seed).shuffle(order)
        cython = atlas_fast.AtlasDataset(damaged)
        python = _python.AtlasDataset(damaged)
        cython[100], python[100]  # another block first: block 2 is not read in order
        for i in order:
            got, want = _outcome(cython, i), _outcome(python, i)
            if want[0] == "example":
                assert got[0] == "example", (seed, i, got)
                assert_same(got[1], want[1], f"example {i}")
            else:
                assert got == want, (seed, i)
                detected += 1
        for i in (0, 31, 48, 159):
            assert_same(cython[i], examples[i], f"example {i}")
        cython.close()
        python.close()
    assert detected  # most such damage is seen by zstd


def test_one_scan_leaves_nothing_for_the_next(atlas, tmp_path):
    """The compiled core reuses one scan's arrays from a random read to the next: a block's
    memo entries, a fallback half-way, or a block far larger than the others must not change
    what the next block's scan finds. Blocks made by hand, read at random, never in order."""
    from corrupt import write_blocks

    keys = {"id": 0, "text": "t", "tags": ["a"], "n": 1.5}
    big = [{f"k{m}": [m, str(m)] for m in range(k, k + 700)} for k in range(4)]
    blocks = {
        0: [dict(keys, id=k) for k in range(4)],  # memo entries 0.. for shared keys
        # GET of memo index 3, never stored in this block: not a valid pickle
        1: b"\x80\x04]\x94(h\x03K\x01K\x02K\x03e.",
        # DUP: valid, beyond the scanner (falls back to a whole decode)
        2: b"\x80\x04]\x94(K\x012K\x022e.",
        3: big,  # thousands of memo entries: the arrays grow
        4: [[k, "x", (k, "x")] for k in range(4)],
        5: [dict(keys, id=k) for k in range(4, 8)],
    }
    examples = {
        b: (pickle.loads(v) if isinstance(v, bytes) else v) for b, v in blocks.items() if b != 1
    }
    root = tmp_path / "hand"
    with atlas_fast.AtlasDatasetWriter(root, 24, 4, compression_strategy=0) as w:
        for k in range(24):
            w.add_example(k)
    write_blocks(
        root / "0",
        [v if isinstance(v, bytes) else pickle.dumps(v) for v in (blocks[b] for b in range(6))],
    )
    ds = atlas.AtlasDataset(root)
    # Each read out of order (the last block read is never the one before): partial path.
    for b, j in [(0, 2), (3, 1), (1, 0), (5, 3), (2, 1), (4, 2), (3, 0), (0, 1)]:
        if b == 1:
            with pytest.raises(atlas_fast.AtlasFormatError, match=r"data\.bin.*block 1"):
                ds[b * 4 + j]
        else:
            assert_same(ds[b * 4 + j], examples[b][j], f"block {b} example {j}")
        ds[20 + (b % 2)]  # block 5 between reads: never in order


def _with_dtype_flags(example, flags: int, protocol: int) -> bytes:
    """The pickle of ``[example, 1, 2, 3]`` (``example`` a numpy array or scalar of int64) with
    the dtype's state flags set to ``flags``: one damaged byte, which numpy accepts."""
    data = bytearray(pickle.dumps([example, 1, 2, 3], protocol=protocol))
    at = data.index(b"J\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00") + 11
    data[at] = flags
    return bytes(data)


# Two loads that fail inside numpy, and the exception each leaves behind (the cause of the
# AtlasFormatError): flags 63 on an array's dtype make it claim to hold objects; numpy cannot
# free such an array, reports a RuntimeError ("get_clear_loop not set") as unraisable and so
# clears the exception the failing load was raising: the load returns NULL with no exception
# set, which CPython's call protocol reports as SystemError. Flags 2 (NPY_LIST_PICKLE) on a
# scalar's dtype make numpy's own unpickling raise RuntimeError.
DAMAGED_NUMPY = {
    "array, flags 63: the load loses its error": (np.arange(3), 63, SystemError),
    "scalar, flags 2: numpy raises RuntimeError": (np.int64(5), 2, RuntimeError),
}

# Every way a reader reads the damaged example 4 (block 1 of the dataset below: blocks of 4),
# from a fresh reader: at random (block 2 read before: the compiled core decodes one example
# out of block 1), again after a failed read, in order (after block 0), in a batch, its block
# read whole, and by iterating. (Other examples of the block read at random may be decoded
# without it.)
READS = {
    "at random": lambda ds: (ds[9], ds[4]),
    "at random, twice": lambda ds: (ds[9], _raises(ds, 4), ds[4]),
    "in order": lambda ds: (ds[3], ds[4]),
    "in order, from the shard's first example": lambda ds: [ds[i] for i in range(8)],
    "a batch": lambda ds: ds.__getitems__([9, 5, 0]),
    "a batch in order": lambda ds: ds.__getitems__(list(range(8))),
    "the block whole": lambda ds: ds.shards[0].read_block(1),
    "iterating": list,
}


def _raises(ds, i):
    with pytest.raises(atlas_fast.AtlasFormatError):
        ds[i]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("read", sorted(READS))
@pytest.mark.parametrize("damage", sorted(DAMAGED_NUMPY))
@pytest.mark.parametrize("protocol", [2, 4])
@pytest.mark.parametrize("trusted", [True, False])
def test_a_load_that_fails_in_numpy_is_a_named_error(
    atlas, tmp_path, trusted, protocol, damage, read
):
    """However block 1 is read, on both backends, trusted or not: AtlasFormatError naming the
    block, from the exception the load left (never SystemError or numpy's RuntimeError
    unwrapped), and the other blocks read on."""
    from corrupt import write_blocks

    example, flags, cause = DAMAGED_NUMPY[damage]
    root = tmp_path / "flags"
    with atlas_fast.AtlasDatasetWriter(root, 12, 4, compression_strategy=0) as w:
        for k in range(12):
            w.add_example(k)
    blocks = [pickle.dumps([0, 1, 2, 3]), _with_dtype_flags(example, flags, protocol)]
    write_blocks(root / "0", [*blocks, pickle.dumps([8, 9, 10, 11])])
    ds = atlas.AtlasDataset(root, trusted=trusted)
    with pytest.raises(atlas_fast.AtlasFormatError, match=r"data\.bin: block 1 does not") as info:
        READS[read](ds)
    assert type(info.value.__cause__) is cause
    assert f"{cause.__name__}: " in str(info.value)
    assert [ds[i] for i in (11, 0, 8)] == [11, 0, 8]
    ds.close()
