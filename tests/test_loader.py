"""Batched reads, read-ahead iteration and the block cache (no torch needed; DataLoader
runs are in test_dataloader.py)."""

from __future__ import annotations

import pickle
import random
import threading

import pytest
from helpers import assert_same, case_dataset, load_expected
from loader_helpers import example, write_dataset

import atlas_fast
from atlas_fast import CompressionStrategy

N = 300  # shards of 64 examples (the last 44), blocks of 8: 38 blocks over 5 shards


@pytest.fixture(autouse=True)
def small_blocks_use_the_pool(monkeypatch):
    """This module's blocks are small: send them to the pool anyway, so read-ahead through
    the pool is what these tests exercise (test_small_blocks_are_read_ahead_inline aside)."""
    monkeypatch.setattr(atlas_fast._core._pool, "POOL_MIN_BLOCK_BYTES", 0)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("loader") / "ds", N, 64, 8)


@pytest.fixture(scope="module")
def expected():
    return [example(i) for i in range(N)]


def decodes(reader) -> int:
    """Blocks ``reader`` decoded: every cache miss decodes one block."""
    return reader.cache_info().misses


def cached(reader) -> list:
    """``(shard number, block)`` of the blocks held, least recently used first.

    Needs the facade's handle on the core's cache (``_block_cache``): the public API reports
    counts (``cache_info``), not which blocks are held.
    """
    return reader._block_cache.keys()


# -- __getitems__ ---------------------------------------------------------------------------


@pytest.mark.parametrize("cache_blocks", [1, 5])
def test_getitems_equals_getitem(atlas, root, cache_blocks):
    ds = atlas.AtlasDataset(root, cache_blocks=cache_blocks)
    rng = random.Random(7)
    batches = [
        [],
        [0],
        [-1, -N, N - 1, 0],
        [5, 5, 5, 4, 5],  # repeated indices
        [63, 64, 127, 128, 299, 0],  # across shards
        [rng.randrange(-N, N) for _ in range(200)],
        list(range(N))[::-7],
        list(range(60, 70)),  # runs of consecutive indices: read as a pass in order
        list(range(40, 140)),  # across shards
        list(range(N - 5, N)),
        [7, 8],
        [8, 9, 11],  # not a run
        [-2, -1],  # nor this (negative)
    ]
    for batch in batches:
        want = [ds[i] for i in batch]
        assert ds.__getitems__(batch) == want
        assert ds.__getitems__(tuple(batch)) == want
    shard = ds.shards[1]
    local = [3, -1, 0, 63, 3, -64, 17]
    assert shard.__getitems__(local) == [shard[i] for i in local]
    assert shard.__getitems__([]) == []


@pytest.mark.parametrize("batch", [1, 7, 64, 100])
def test_batches_of_a_pass_in_order(atlas, root, expected, batch):
    """``DataLoader(shuffle=False)``'s batches (consecutive indices): the examples in order,
    each block decoded once, on a dataset and on a shard."""
    ds = atlas.AtlasDataset(root)
    got = []
    for start in range(0, N, batch):
        got += ds.__getitems__(list(range(start, min(N, start + batch))))
    assert got == expected
    assert decodes(ds) == 38
    shard = atlas.AtlasDataset(root).shards[2]
    local = []
    for start in range(0, len(shard), batch):
        local += shard.__getitems__(list(range(start, min(len(shard), start + batch))))
    assert local == expected[128:192]


def test_a_batch_of_a_pass_in_order_counts_as_reads_in_order(atlas, root):
    """``cache_info`` counts a batch of a pass in order (consecutive indices from 0 or from
    where the last such batch ended) as ``ds[i]`` over it (one look-up per example), the same
    on both backends; any other batch one look-up per distinct block."""
    from atlas_fast._contract import run_start

    assert run_start(list(range(40, 140)), N, 40) == 40 and run_start((7, 8), N, 7) == 7
    assert run_start([0, 1], N, 99) == 0  # a pass starts again at 0
    assert run_start(list(range(40, 140)), N, 0) == -1  # consecutive, but not where it was
    for other in ([8, 9, 11], [-2, -1], [5], (N - 1, N), [True, 2], [1.0, 2.0], range(3, 9)):
        assert run_start(other, N, other[0]) == -1

    def lookups(ds):
        info = ds.cache_info()
        return info.hits + info.misses

    ds = atlas.AtlasDataset(root)
    ds.__getitems__(list(range(40)))  # a pass in order starts at 0
    assert lookups(ds) == 40
    ds.__getitems__(list(range(40, 140)))  # and goes on where it ended
    assert lookups(ds) == 140
    ds.__getitems__([300 - 1, 0, 1])  # blocks 37 (shard 4) and 0 (shard 0): 2 look-ups
    assert lookups(ds) == 142
    # Every other batch (what one of two DataLoader workers gets): consecutive indices, but
    # not a pass in order: one look-up per distinct block, as any batch.
    other = atlas.AtlasDataset(root)
    other.__getitems__(list(range(16, 32)))  # blocks 2 and 3
    assert lookups(other) == 2
    other.__getitems__(list(range(48, 64)))
    assert lookups(other) == 4


def test_getitems_on_reference_fixtures(atlas, reference_case):
    expected = load_expected(reference_case)
    ds = atlas.AtlasDataset(case_dataset(reference_case))
    n = len(expected)
    rng = random.Random(reference_case)
    indices = [rng.randrange(-n, n) for _ in range(3 * n)]
    for got, i in zip(ds.__getitems__(indices), indices):
        assert_same(got, expected[i], f"{reference_case}[{i}]")


def test_getitems_numpy_and_tensor_indices(atlas, root, expected):
    import numpy as np

    ds = atlas.AtlasDataset(root)
    idx = [4, 290, -3, 100]
    assert ds.__getitems__(np.array(idx)) == [expected[i] for i in idx]
    torch = pytest.importorskip("torch")
    assert ds.__getitems__(torch.tensor(idx)) == [expected[i] for i in idx]


@pytest.mark.parametrize(
    ("bad", "error"),
    [(N, IndexError), (-N - 1, IndexError), (1.0, TypeError), ("3", TypeError), (None, TypeError)],
)
def test_getitems_bad_index_decodes_nothing(atlas, root, bad, error):
    ds = atlas.AtlasDataset(root)
    with pytest.raises(error):
        ds[bad]
    with pytest.raises(error):
        ds.__getitems__([0, 100, 200, bad, 5])
    shard = ds.shards[0]
    with pytest.raises(error):
        shard.__getitems__([0, 10, bad if error is TypeError else len(shard)])
    assert decodes(ds) == 0 and cached(ds) == []


def test_getitems_decodes_each_block_once(atlas, root):
    ds = atlas.AtlasDataset(root)
    batch = [70, 3, 71, 65, 2, 299, 298, 0, 7, 64, 299]  # blocks (0,0) (1,0) (1,0) (4,5)
    got = ds.__getitems__(batch)
    assert decodes(ds) == 3 and sorted(cached(ds)) == [(0, 0), (1, 0), (4, 5)]
    assert got == [ds[i] for i in batch]
    assert ds.cache_info().hits == len(batch)  # ds[i]: all from the cache


def test_getitems_serves_cached_blocks(atlas, root, expected):
    ds = atlas.AtlasDataset(root, cache_blocks=8)
    batch = list(range(0, 40, 3))  # blocks 0..4 of shard 0
    assert ds.__getitems__(batch) == [expected[i] for i in batch]
    assert decodes(ds) == 5
    assert ds.__getitems__(batch[::-1]) == [expected[i] for i in batch[::-1]]
    assert [ds[i] for i in range(39, -1, -1)] == expected[39::-1]
    assert list(ds.shards[0])[:40] == expected[:40]  # a shard object shares the cache
    assert decodes(ds) == 5 + 3  # iterating the shard decoded its blocks 5, 6, 7


# -- the block cache ------------------------------------------------------------------------


def test_default_cache_is_bounded_in_bytes(atlas, root, expected):
    ds = atlas.AtlasDataset(root)
    info = ds.cache_info()
    assert info.max_bytes == atlas_fast.DEFAULT_CACHE_BYTES == 32 << 20
    assert info.max_blocks is None and info.currsize == 0
    order = list(range(N))[::-1]
    for _ in range(3):
        assert [ds[i] for i in order] == expected[::-1]  # the whole dataset fits: decoded once
    info = ds.cache_info()
    assert (info.misses, info.hits, info.blocks) == (38, 3 * N - 38, 38)
    sizes = [len(s._block_bytes(b)) for s in ds.shards for b in range(-(-len(s) // 8))]
    # A block counts what its objects take: these small dicts, more than their pickle.
    assert sum(sizes) < info.currsize <= info.max_bytes


def _rows(i: int) -> dict:
    """A table row: many small objects, which take several times their pickle's size."""
    return {"id": i, "x": i * 0.5, "flag": i % 3 == 0, "name": f"r{i % 1000}", "k": i % 7}


@pytest.fixture(scope="module")
def rows_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("rows") / "ds"
    with atlas_fast.AtlasDatasetWriter(root, 4000, 50, compression_strategy=1) as w:
        for i in range(8000):
            w.add_example(_rows(i))
    return root


def test_cache_counts_what_the_examples_take_in_memory(atlas, rows_root):
    """``currsize`` is about the memory the cached examples take, as tracemalloc measures
    their unpickling (not the pickle's size, a few times smaller for rows like these)."""
    import tracemalloc

    ds = atlas.AtlasDataset(rows_root, cache_bytes=1 << 30)
    n_blocks = len(ds) // 50
    pickles = sum(len(s._block_bytes(b)) for s in ds.shards for b in range(len(s) // 50))
    held = []
    tracemalloc.start()
    try:
        for b in range(n_blocks):
            before = tracemalloc.get_traced_memory()[0]
            held.append(pickle.loads(ds.shards[b // 80]._block_bytes(b % 80)))
            if b == 0:
                first = tracemalloc.get_traced_memory()[0] - before
        taken = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert first > 0
    assert [x for block in held for x in block] == [_rows(i) for i in range(8000)]
    for i in range(len(ds)):
        ds[i]
    info = ds.cache_info()
    assert info.blocks == n_blocks
    assert info.currsize > 3 * pickles
    assert 0.7 * taken < info.currsize < 1.6 * taken


def test_a_byte_budget_bounds_what_the_examples_take(atlas, rows_root):
    ds = atlas.AtlasDataset(rows_root, cache_bytes=1 << 20)
    for i in range(len(ds)):
        assert ds[i] == _rows(i)
    info = ds.cache_info()
    assert info.currsize <= 1 << 20
    per_block = info.currsize / info.blocks
    assert 1 << 19 < info.currsize and info.blocks < len(ds) // 50
    # Each block is charged about the same (the rows are alike): several times its pickle.
    assert per_block > 3 * len(ds.shards[0]._block_bytes(0))


# Every kind of pass in order, read by one rule (see atlas_fast._contract).
PASSES = {
    "iter": list,
    "ds[i] in order": lambda ds: [ds[i] for i in range(len(ds))],
    "batches in order": lambda ds: [
        x for k in range(0, len(ds), 50) for x in ds.__getitems__(list(range(k, len(ds))[:50]))
    ],
}


@pytest.mark.parametrize("budget", [{"cache_bytes": 1 << 30}, {"cache_blocks": 38}])
@pytest.mark.parametrize("read", sorted(PASSES))
def test_one_pass_in_order_fills_a_cache_the_user_sized(atlas, root, expected, read, budget):
    ds = atlas.AtlasDataset(root, **budget)  # room for the whole dataset
    assert PASSES[read](ds) == expected
    info = ds.cache_info()
    assert (info.misses, info.blocks) == (38, 38)  # every block decoded once, and kept
    order = list(range(N))
    random.Random(3).shuffle(order)
    assert [ds[i] for i in order] == [expected[i] for i in order]
    assert decodes(ds) == 38  # uniform random afterwards: every read served from the cache


@pytest.mark.parametrize("read", sorted(PASSES))
def test_a_pass_in_order_fills_only_the_room_there_is(atlas, root, expected, read):
    ds = atlas.AtlasDataset(root, cache_blocks=6)
    ds[100], ds[200]  # blocks others read: (1, 4) and (3, 1)
    assert PASSES[read](ds) == expected
    # The pass kept its first blocks while there was room and evicted nothing for them;
    # ds[i] (and its batches) holds the block it reads last too, for its next hits.
    kept = {(0, 0), (0, 1), (0, 2), (0, 3)} if read == "iter" else {(0, 0), (0, 1), (0, 2)}
    held = set(cached(ds))
    assert held == {(1, 4), (3, 1)} | kept | (set() if read == "iter" else {(4, 5)})


@pytest.mark.parametrize("read", sorted(PASSES))
def test_a_pass_in_order_at_the_default_budget_keeps_none_of_its_blocks(
    atlas, root, expected, read
):
    ds = atlas.AtlasDataset(root)  # the default budget holds this dataset many times over
    ds[100], ds[200]  # blocks others read: (1, 4) and (3, 1), read through by the pass too
    assert PASSES[read](ds) == expected
    assert ds.cache_info().misses == 2 + 36  # the others' two blocks: hits of the pass
    # What others read stays; of the pass's blocks, only the one ds[i] reads last.
    held = sorted(cached(ds))
    assert held == ([(1, 4), (3, 1)] if read == "iter" else [(1, 4), (3, 1), (4, 5)])


@pytest.mark.parametrize("read", sorted(PASSES))
def test_a_pass_in_order_evicts_nothing_from_a_full_cache(atlas, root, expected, read, monkeypatch):
    """At the default budget (made small here: three blocks), a cache full of blocks others
    read loses none to a pass: ds[i] holds the block it reads over the budget, until it moves
    on; iter holds its blocks itself."""
    # Two reads of each block: held whole (one read leaves the compiled core's cache its
    # pickle only, which a second read, the pass's too, unpickles and charges anew).
    others = (100, 101, 200, 201, 250, 251)  # blocks (1, 4), (3, 1) and (3, 7)
    probe = atlas.AtlasDataset(root, cache_bytes=1 << 30)
    for i in others:
        probe[i]
    monkeypatch.setattr(atlas_fast._contract, "DEFAULT_CACHE_BYTES", probe.cache_info().currsize)
    ds = atlas.AtlasDataset(root)
    for i in others:  # the cache is full
        ds[i]
    others = sorted(cached(ds))
    assert len(others) == 3
    assert PASSES[read](ds) == expected
    held = sorted(cached(ds))
    assert held == sorted([*others, *([] if read == "iter" else [(4, 5)])])


def test_a_pass_in_order_in_a_full_cache_keeps_only_its_current_blocks(atlas, root, expected):
    ds = atlas.AtlasDataset(root, cache_blocks=4)
    ds[100], ds[200]  # blocks of others: (1, 4) and (3, 1)
    assert [ds[i] for i in range(N)] == expected
    # Once the cache is full, each block the pass read through to its end is dropped when the
    # pass moves on to the next, so the blocks read before the pass stay (block 4 of shard 1
    # and block 1 of shard 3 were read through as well: they go too).
    held = cached(ds)
    assert len(held) == 4 and held[-1] == (4, 5)  # the pass's current block, most recent
    ds2 = atlas.AtlasDataset(root, cache_blocks=4)
    ds2[3], ds2[5], ds2[4]  # not in order: block 0 is kept
    ds2[8]
    assert (0, 0) in cached(ds2) and (0, 1) in cached(ds2)
    ds3 = atlas.AtlasDataset(root, cache_blocks=3)
    ds3[250], ds3[20]  # another reader's blocks: (3, 7) and (0, 2)
    assert [ds3[i] for i in range(64, 128)] == expected[64:128]  # all of shard 1, in order
    assert (3, 7) in cached(ds3) and (0, 2) in cached(ds3)  # not pushed out by the pass


def test_cache_blocks_bounds_an_lru(atlas, root, expected):
    ds = atlas.AtlasDataset(root, cache_blocks=4)
    assert ds.cache_info().max_bytes is None and ds.cache_info().max_blocks == 4
    for b in range(4):
        assert ds[8 * b] == expected[8 * b]
    for b in (3, 2, 1, 0, 2):
        assert ds[8 * b + 1] == expected[8 * b + 1]
    assert decodes(ds) == 4
    assert cached(ds) == [(0, 3), (0, 1), (0, 0), (0, 2)]  # least recently used first
    ds[8 * 4]  # a fifth block evicts the least recently used: block 3
    assert cached(ds) == [(0, 1), (0, 0), (0, 2), (0, 4)]
    assert decodes(ds) == 5
    for b in (0, 1, 2, 4):
        ds[8 * b + 2]
    assert decodes(ds) == 5
    ds[8 * 3]
    assert decodes(ds) == 6 and cached(ds)[-1] == (0, 3) and cached(ds)[0] == (0, 1)
    assert ds.cache_info().blocks == 4


def test_cache_is_shared_by_the_shards_of_a_dataset(atlas, root):
    ds = atlas.AtlasDataset(root, cache_blocks=3)
    for i in (0, 64, 128, 0, 64, 128):
        ds[i]
    assert decodes(ds) == 3
    assert ds.shards[1][1] == ds[65] and decodes(ds) == 3
    ds[192]
    assert cached(ds) == [(2, 0), (1, 0), (3, 0)]


def test_cache_bytes_bounds_the_decoded_size(atlas, root):
    # What each block is charged (what its objects take, see test_cache_counts_...), read
    # off a cache without bound filled in the same order: the charges depend only on it.
    probe = atlas.AtlasDataset(root, cache_bytes=1 << 30)
    sizes = []
    for b in range(8):
        before = probe.cache_info().currsize
        probe[8 * b]
        sizes.append(probe.cache_info().currsize - before)
    assert all(size > 0 for size in sizes)
    limit = sizes[0] + sizes[1] + sizes[2]
    ds = atlas.AtlasDataset(root, cache_bytes=limit)
    assert ds.cache_info().max_bytes == limit and ds.cache_info().max_blocks is None
    held = []
    for b in range(8):
        ds[8 * b]
        held.append(b)
        while sum(sizes[k] for k in held) > limit and len(held) > 1:
            held.pop(0)  # least recently used first
        assert cached(ds) == [(0, k) for k in held]
        assert ds.cache_info().currsize == sum(sizes[k] for k in held) <= max(limit, sizes[b])
    ds[8 * 7 + 1]
    assert decodes(ds) == 8
    tiny = atlas.AtlasDataset(root, cache_bytes=0, cache_blocks=10)
    tiny[0], tiny[8], tiny[9]
    assert tiny.cache_info().blocks == 1  # the most recent block is always kept


def test_reserved_blocks_are_kept_whatever_the_budget(atlas, root, expected):
    ds = atlas.AtlasDataset(root, cache_bytes=0)
    ds.cache_reserve(4)
    ds.cache_reserve(2)  # never lowers it
    for b in range(6):
        ds[8 * b]
    assert cached(ds) == [(0, 2), (0, 3), (0, 4), (0, 5)]
    again = pickle.loads(pickle.dumps(ds))  # what DataLoader workers receive
    for b in range(6):
        again[8 * b]
    assert again.cache_info().blocks == 4
    atlas_fast.BlockShuffleSampler(again, window_blocks=5)
    for b in range(12):
        again[8 * b]
    assert again.cache_info().blocks == 10


def test_close_drops_cached_blocks(atlas, root, expected):
    ds = atlas.AtlasDataset(root, cache_blocks=10)
    ds.__getitems__([0, 64, 128])
    ds.shards[1].close()
    assert sorted(k[0] for k in cached(ds)) == [0, 2]
    ds.close()
    assert cached(ds) == [] and ds.cache_info().currsize == 0
    assert ds[64] == expected[64]


def test_cache_settings_pickle_and_are_checked(atlas, root):
    ds = atlas.AtlasDataset(root, cache_blocks=7, cache_bytes=1 << 20)
    again = pickle.loads(pickle.dumps(ds))
    assert (again.cache_blocks, again.cache_bytes) == (7, 1 << 20)
    assert again.cache_info()[2:] == (1 << 20, 0, 0, 7)
    shard = atlas.AtlasDatasetShard(
        ds.shards[0].root,
        compression_dict_bytes=ds.shards[0].compression_dict_bytes,
        cache_blocks=3,
    )
    assert pickle.loads(pickle.dumps(shard)).cache_blocks == 3
    for kwargs, error in [
        ({"cache_blocks": 0}, ValueError),
        ({"cache_blocks": -1}, ValueError),
        ({"cache_blocks": 2.0}, TypeError),
        ({"cache_blocks": True}, TypeError),
        ({"cache_bytes": -5}, ValueError),
        ({"cache_bytes": 1.5}, TypeError),
    ]:
        with pytest.raises(error):
            atlas.AtlasDataset(root, **kwargs)
    with pytest.raises(TypeError):
        atlas.AtlasDataset(root, True, 4)  # keyword-only


# -- __iter__ -------------------------------------------------------------------------------


def test_iter_reads_everything_in_order(atlas, root, expected):
    ds = atlas.AtlasDataset(root)
    assert list(ds) == expected
    assert list(ds.shards[4]) == expected[256:]
    assert list(iter(ds)) == expected  # again, after a full pass


def test_iter_on_reference_fixtures(atlas, reference_case):
    expected = load_expected(reference_case)
    ds = atlas.AtlasDataset(case_dataset(reference_case))
    got = list(ds)
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert_same(a, b, f"{reference_case}[{i}]")


def test_iter_stops_cleanly_when_closed_or_dropped(atlas, root, expected):
    ds = atlas.AtlasDataset(root)
    it = iter(ds)
    assert [next(it) for _ in range(10)] == expected[:10]
    it.close()
    with pytest.raises(StopIteration):
        next(it)
    assert decodes(ds) <= 2 + atlas_fast._core._pool.READ_AHEAD  # bounded read-ahead
    it = iter(ds)
    next(it)
    del it
    unstarted = iter(ds)  # never started: nothing read
    del unstarted
    assert list(ds) == expected


def test_reads_without_the_pool_at_interpreter_shutdown(atlas, root, expected, monkeypatch):
    def refuse():
        raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    monkeypatch.setattr(atlas_fast._core._pool, "_thread_pool", refuse)
    ds = atlas.AtlasDataset(root)
    batch = [299, 0, 150, 7, 64]
    assert ds.__getitems__(batch) == [expected[i] for i in batch]
    assert list(ds) == expected


@pytest.mark.only(backend="python")
def test_iter_decodes_on_the_iterating_thread(atlas, backend, root, expected, monkeypatch):
    """The Python backend's ``iter`` decodes every block on the iterating thread, whatever
    its size (a block decoded on the pool while the iterating thread unpickles waits for the
    GIL); batches still use the pool. (The compiled backend reads ahead on its own C thread:
    tests/test_readahead.py.)"""
    submitted = []
    submit = atlas_fast._core._pool._submit

    def counting(fn, *args):
        submitted.append(args)
        return submit(fn, *args)

    monkeypatch.setattr(atlas_fast._core._pool, "_submit", counting)
    monkeypatch.setattr(atlas_fast._core._pool, "POOL_MIN_BLOCK_BYTES", 1)
    ds = atlas.AtlasDataset(root)  # the default budget: a pass keeps no block for the next
    assert list(ds) == expected
    assert submitted == []
    batch = [0, 100, 200, 299]
    assert ds.__getitems__(batch) == [expected[i] for i in batch]
    assert len(submitted) >= 1


def test_empty_batch_and_empty_iteration(atlas, tmp_path):
    root = write_dataset(tmp_path / "empty", 0, 10, 4, CompressionStrategy.STANDARD_COMPRESSION)
    ds = atlas.AtlasDataset(root)
    assert ds.__getitems__([]) == []
    assert list(ds) == []
    with pytest.raises(IndexError):
        ds.__getitems__([0])


def test_threads_read_concurrently(atlas, root, expected):
    ds = atlas.AtlasDataset(root, cache_blocks=3)
    failures = []

    def batches(seed):
        rng = random.Random(seed)
        for _ in range(20):
            batch = [rng.randrange(-N, N) for _ in range(rng.randrange(1, 60))]
            if ds.__getitems__(batch) != [expected[i] for i in batch]:
                failures.append(("batch", seed))

    def passes(seed):
        for _ in range(3):
            if list(ds) != expected:
                failures.append(("iter", seed))
            if list(ds.shards[seed % 5]) != expected[64 * (seed % 5) : 64 * (seed % 5 + 1)]:
                failures.append(("shard iter", seed))

    threads = [threading.Thread(target=(batches, passes)[k % 2], args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_uncompressed_and_plain_zstd(atlas, tmp_path):
    for strategy in (CompressionStrategy.NO_COMPRESSION, CompressionStrategy.STANDARD_COMPRESSION):
        root = write_dataset(tmp_path / f"s{int(strategy)}", 50, 20, 3, strategy)
        ds = atlas.AtlasDataset(root, cache_blocks=2)
        want = [example(i) for i in range(50)]
        assert list(ds) == want
        idx = list(range(49, -51, -3))
        assert ds.__getitems__(idx) == [want[i] for i in idx]
