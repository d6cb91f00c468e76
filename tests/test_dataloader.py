"""PyTorch's DataLoader over atlas_fast readers: fork and spawn workers, the sampler, nodes
holding some shards."""

from __future__ import annotations

import pytest
from loader_helpers import example, keep_shards, write_dataset

import atlas_fast._core._pool
from atlas_fast import BlockShuffleSampler

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, IterableDataset  # noqa: E402

N = 300  # shards of 64 examples (the last 44), blocks of 8: 38 blocks over 5 shards


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("dataloader") / "ds", N, 64, 8)


@pytest.fixture(scope="module")
def expected():
    return [example(i) for i in range(N)]


# -- DataLoader -----------------------------------------------------------------------------


def _epoch(loader) -> list:
    return [x for batch in loader for x in batch]


def test_dataloader_without_workers(atlas, root, expected):
    ds = atlas.AtlasDataset(root, cache_blocks=16)
    sampler = BlockShuffleSampler(ds, window_blocks=4, seed=3)
    loader = DataLoader(ds, batch_size=32, sampler=sampler, collate_fn=list)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        order = sampler.epoch_indices()
        assert _epoch(loader) == [expected[i] for i in order]


def test_dataloader_fork_workers(atlas, root, expected, monkeypatch):
    # These blocks are small: a batch sends them to the pool anyway, so that the parent has
    # started its thread pool before the fork.
    monkeypatch.setattr(atlas_fast._core._pool, "POOL_MIN_BLOCK_BYTES", 0)
    ds = atlas.AtlasDataset(root, cache_blocks=16)
    ds.__getitems__([0, 100, 200])  # the parent has read (and started its thread pool)
    ds[299]
    sampler = BlockShuffleSampler(ds, window_blocks=2, seed=1)
    loader = DataLoader(
        ds,
        batch_size=20,
        sampler=sampler,
        num_workers=2,
        multiprocessing_context="fork",
        persistent_workers=True,
        collate_fn=list,
    )
    for epoch in range(2):
        sampler.set_epoch(epoch)
        order = sampler.epoch_indices()
        assert sorted(order.tolist()) == list(range(N))
        assert _epoch(loader) == [expected[i] for i in order]


def _worker_misses(batch):
    """collate_fn: the batch, which worker read it and how many blocks it had decoded."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return info.id, info.dataset.cache_info().misses, list(batch)


@pytest.mark.parametrize("dealt", [False, True])
def test_windows_dealt_to_workers_are_decoded_once(atlas, root, expected, dealt):
    """With the DataLoader's batch_size and num_workers given to the sampler, each worker
    decodes only its own windows' blocks: about one decode per block in all (the plain order
    has both workers decode most blocks), and the examples come in the sampler's order."""
    ds = atlas.AtlasDataset(root)  # room for every block: a block is decoded once per worker
    kw = {"batch_size": 5, "num_workers": 2} if dealt else {}
    sampler = BlockShuffleSampler(ds, window_blocks=2, seed=4, **kw)
    loader = DataLoader(
        ds,
        batch_size=5,
        sampler=sampler,
        num_workers=2,
        multiprocessing_context="fork",
        persistent_workers=True,  # the cycle of workers starts again each epoch
        collate_fn=_worker_misses,
    )
    blocks = len({i // 8 for i in range(N)})
    for epoch in range(2):
        sampler.set_epoch(epoch)
        order = sampler.epoch_indices()
        got, misses = [], {}
        for t, (worker, seen, batch) in enumerate(loader):
            assert worker == t % 2  # the DataLoader hands batches out in turn
            misses[worker] = seen  # blocks the worker decoded since it started
            got += batch
        assert got == [expected[i] for i in order]
        if epoch == 0:  # later epochs find blocks in the workers' caches
            if dealt:
                assert sum(misses.values()) <= blocks + 4
            else:
                assert sum(misses.values()) >= blocks * 3 // 2


def test_dataloader_spawn_workers(atlas, root, expected):
    ds = atlas.AtlasDataset(root)
    ds[5]  # read before pickling to the workers
    sampler = BlockShuffleSampler(ds, window_blocks=8, seed=2)
    loader = DataLoader(
        ds,
        batch_size=50,
        sampler=sampler,
        num_workers=2,
        multiprocessing_context="spawn",
        collate_fn=list,
    )
    assert _epoch(loader) == [expected[i] for i in sampler.epoch_indices()]


class _ShardStream(IterableDataset):
    """Each worker streams its own shards with ``iter(shard)``."""

    def __init__(self, ds):
        self.ds = ds

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        k, n = (0, 1) if info is None else (info.id, info.num_workers)
        for shard in self.ds.shards[k::n]:
            yield from shard


def test_iter_in_fork_workers(atlas, root, expected):
    ds = atlas.AtlasDataset(root)
    assert next(iter(ds)) == expected[0]
    loader = DataLoader(
        _ShardStream(ds),
        batch_size=None,
        num_workers=2,
        multiprocessing_context="fork",
    )
    got = list(loader)
    assert sorted(got, key=lambda x: x["id"]) == expected


def test_dataloader_on_a_node_holding_some_shards(atlas, root, tmp_path, expected):
    part = keep_shards(root, tmp_path / "node", [1, 3, 4])
    ds = atlas.AtlasDataset(part)
    present = expected[64:128] + expected[192:]
    assert len(ds) == len(present)
    assert [ds[i] for i in range(len(ds))] == present
    sampler = BlockShuffleSampler(ds, window_blocks=3, num_replicas=2, rank=1)
    loader = DataLoader(ds, batch_size=16, sampler=sampler, collate_fn=list)
    assert _epoch(loader) == [present[i] for i in sampler.epoch_indices()]
    assert list(ds) == present


# -- the collector in DataLoader workers -----------------------------------------------------


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("enabled", [True, False])
def test_workers_freeze_what_they_start_with(atlas, root, monkeypatch, context, enabled):
    """A DataLoader worker's first decode moves the objects it started with (a forked
    worker: the parent's heap) out of the collector's reach, so that its full collections do
    not visit them (nor copy their pages); the parent's collector is untouched, and
    ATLAS_FAST_WORKER_GC_FREEZE=0 turns it off."""
    import gc

    from loader_helpers import FreezeProbe

    if not enabled:
        monkeypatch.setenv("ATLAS_FAST_WORKER_GC_FREEZE", "0")
    ds = atlas.AtlasDataset(root)
    ds[0]  # the parent decodes too: its first decode is not a worker's
    ds.close()
    before = gc.get_freeze_count()
    loader = DataLoader(
        FreezeProbe(ds),
        batch_size=16,
        num_workers=2,
        multiprocessing_context=context,
        collate_fn=list,
    )
    counts = [c for batch in loader for c in batch]
    assert len(counts) == N
    assert gc.get_freeze_count() == before
    inherited = before if context == "fork" else 0
    if enabled:
        assert min(counts) > inherited
    else:
        assert set(counts) == {inherited}
