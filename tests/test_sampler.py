"""BlockShuffleSampler: permutations, block locality, ranks, resuming, no torch needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from loader_helpers import keep_shards, write_dataset

from atlas_fast import BlockShuffleSampler, InvalidArgumentError

N = 300  # shards of 64 (the last 44), blocks of 8 (each shard's last block 8 or 4)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("sampler") / "ds", N, 64, 8)


@pytest.fixture
def ds(atlas, root):
    return atlas.AtlasDataset(root)


def _blocks_of(indices) -> list:
    # Global block of each index: shards of 64 hold 8 whole blocks, so index // 8.
    return [i // 8 for i in indices]


def test_each_epoch_is_a_permutation(ds):
    sampler = BlockShuffleSampler(ds, seed=11)
    orders = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        order = list(sampler)
        assert len(order) == len(sampler) == N
        assert sorted(order) == list(range(N))
        assert all(type(i) is int for i in order)
        orders.append(order)
    assert orders[0] != orders[1] != orders[2]
    sampler.set_epoch(1)
    assert list(sampler) == orders[1]  # deterministic for (seed, epoch)
    again = BlockShuffleSampler(ds, seed=11)
    again.set_epoch(2)
    assert list(again) == orders[2]
    assert list(BlockShuffleSampler(ds, seed=12)) != orders[0]


def _closed_segments(blocks: list) -> list:
    """Split a sequence of block numbers where every block begun so far is complete."""
    remaining = {b: blocks.count(b) for b in set(blocks)}
    segments, current, open_blocks = [], [], set()
    for b in blocks:
        current.append(b)
        open_blocks.add(b)
        remaining[b] -= 1
        if remaining[b] == 0:
            open_blocks.discard(b)
        if not open_blocks:
            segments.append(current)
            current = []
    return segments


@pytest.mark.parametrize("window", [1, 2, 5])
def test_windows_hold_whole_blocks(ds, window):
    order = BlockShuffleSampler(ds, window_blocks=window, seed=4).epoch_indices().tolist()
    assert sorted(order) == list(range(N))
    segments = _closed_segments(_blocks_of(order))
    # Every window is a run of whole blocks, so the order splits into runs of at most
    # `window` blocks; with window 1, exactly one block per run.
    assert max(len(set(seg)) for seg in segments) <= window
    if window == 1:
        assert len(segments) == N // 8 + 1  # 37 full blocks and one of 4
        assert order != sorted(order)  # shuffled within the block
    else:
        assert max(len(set(seg)) for seg in segments) > 1


def test_whole_epoch_window_is_uniform_shuffle(ds):
    order = BlockShuffleSampler(ds, window_blocks=None, seed=0).epoch_indices()
    assert sorted(order.tolist()) == list(range(N))
    same_block = np.mean(np.diff(np.array(_blocks_of(order.tolist()))) == 0)
    assert same_block < 0.1  # neighbours rarely share a block (about 8/300 expected)


@pytest.mark.parametrize("replicas", [2, 3, 7, 301, 400])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_get_disjoint_equal_shares(ds, replicas, drop_last):
    shares = []
    for rank in range(replicas):
        sampler = BlockShuffleSampler(
            ds, window_blocks=3, seed=9, num_replicas=replicas, rank=rank, drop_last=drop_last
        )
        sampler.set_epoch(5)
        share = list(sampler)
        assert len(share) == len(sampler)
        shares.append(share)
    assert len({len(s) for s in shares}) == 1
    flat = [i for s in shares for i in s]
    whole = BlockShuffleSampler(ds, window_blocks=3, seed=9)
    whole.set_epoch(5)
    order = list(whole)
    if drop_last:
        assert len(shares[0]) == N // replicas
        assert len(set(flat)) == len(flat)
        assert flat == order[: len(flat)]  # contiguous slices of the epoch order
    else:
        assert len(shares[0]) == -(-N // replicas)
        assert set(flat) == set(range(N))
        padded = (order * (1 + len(flat) // N))[: len(flat)]
        assert flat == padded  # padded by repeating the order from its start
        assert len(flat) - N < replicas


def test_ranks_on_a_node_holding_some_shards(atlas, root, tmp_path):
    ds = atlas.AtlasDataset(keep_shards(root, tmp_path / "node", [0, 2, 4]))
    n = len(ds)
    assert n == 64 + 64 + 44
    shares = [list(BlockShuffleSampler(ds, num_replicas=4, rank=r, seed=1)) for r in range(4)]
    assert sorted(i for s in shares for i in s) == list(range(n))


def test_works_on_a_shard_and_an_empty_dataset(atlas, ds, tmp_path):
    from atlas_fast import CompressionStrategy

    shard = ds.shards[4]
    order = list(BlockShuffleSampler(shard, window_blocks=2))
    assert sorted(order) == list(range(len(shard)))
    empty = atlas.AtlasDataset(
        write_dataset(tmp_path / "e", 0, 5, 2, CompressionStrategy.STANDARD_COMPRESSION)
    )
    sampler = BlockShuffleSampler(empty, num_replicas=3, rank=2)
    assert len(sampler) == 0
    assert list(sampler) == []


@pytest.mark.parametrize("replicas", [1, 3])
def test_resume_mid_epoch(ds, replicas):
    rank = replicas - 1
    sampler = BlockShuffleSampler(ds, window_blocks=2, seed=3, num_replicas=replicas, rank=rank)
    sampler.set_epoch(4)
    full = list(sampler)
    for done in (0, 1, 37, len(full) - 1, len(full)):
        sampler.set_epoch(4)
        it = iter(sampler)
        head = [next(it) for _ in range(done)]
        state = sampler.state_dict()
        assert state["epoch"] == 4 and state["seed"] == 3 and state["yielded"] == done
        fresh = BlockShuffleSampler(ds, window_blocks=2, seed=0, num_replicas=replicas, rank=rank)
        fresh.load_state_dict(state)
        assert fresh.state_dict()["yielded"] == done
        fresh.set_epoch(4)  # a training loop sets the epoch it resumes: still resumes
        assert head + list(fresh) == full
        fresh.set_epoch(4)
        assert list(fresh) == full  # the next pass starts the epoch from its beginning


def test_resume_from_the_step_alone(ds):
    batch = 16
    sampler = BlockShuffleSampler(ds, seed=8)
    sampler.set_epoch(2)
    full = list(sampler)
    resumed = BlockShuffleSampler(ds, seed=8)
    resumed.load_state_dict({"epoch": 2, "yielded": 5 * batch})
    assert list(resumed) == full[5 * batch :]
    resumed.set_epoch(3)
    assert sorted(resumed) == list(range(N))


def test_resume_refuses_another_configuration(ds):
    state = BlockShuffleSampler(ds, window_blocks=2, num_replicas=2, rank=0).state_dict()
    for kwargs in ({"window_blocks": 3}, {"rank": 1}, {"drop_last": True}):
        args = {"window_blocks": 2, "num_replicas": 2, "rank": 0, **kwargs}
        with pytest.raises(ValueError, match="cannot resume"):
            BlockShuffleSampler(ds, **args).load_state_dict(state)
    sampler = BlockShuffleSampler(ds)
    with pytest.raises(ValueError, match="cannot resume"):
        sampler.load_state_dict({"epoch": 0, "yielded": N + 1})


def test_bad_arguments(ds):
    for kwargs, error in [
        ({"window_blocks": 0}, ValueError),
        ({"window_blocks": 1.5}, TypeError),
        ({"seed": -1}, ValueError),
        ({"num_replicas": 0, "rank": 0}, ValueError),
        ({"num_replicas": 2, "rank": 2}, ValueError),
        ({"num_replicas": 2, "rank": -1}, ValueError),
    ]:
        with pytest.raises(error):
            BlockShuffleSampler(ds, **kwargs)
    with pytest.raises(TypeError, match="AtlasDataset"):
        BlockShuffleSampler(list(range(10)))
    with pytest.raises(TypeError):
        BlockShuffleSampler(ds, 8)  # keyword-only


def test_is_a_torch_sampler_and_defaults_to_one_rank(ds):
    torch = pytest.importorskip("torch")
    sampler = BlockShuffleSampler(ds)
    assert isinstance(sampler, torch.utils.data.Sampler)
    assert (sampler.num_replicas, sampler.rank) == (1, 0)


def test_works_without_torch(root, tmp_path):
    # A site-packages without torch: every entry of the real one but torch's.
    import numpy

    site = Path(numpy.__file__).resolve().parents[1]
    fake = tmp_path / "site"
    fake.mkdir()
    for entry in site.iterdir():
        if not entry.name.lower().startswith(("torch", "functorch")):
            (fake / entry.name).symlink_to(entry)
    code = (
        "import sys\n"
        f"sys.path = [p for p in sys.path if p != {str(site)!r}] + [{str(fake)!r}]\n"
        "import atlas_fast\nimport atlas_fast._python\n"
        f"ds = atlas_fast._python.AtlasDataset({str(root)!r})\n"
        "s = atlas_fast.BlockShuffleSampler(ds, num_replicas=2, rank=1)\n"
        "assert len(list(s)) == len(s) == 150\n"
        "assert len(ds.__getitems__([1, 2, 3])) == 3 and len(list(ds)) == 300\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "print('no torch ok')\n"
    )
    env = dict(os.environ, ATLAS_FAST_NO_EXTENSIONS="1", PYTHONNOUSERSITE="1")
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "no torch ok" in out.stdout


def _blocks_in(batches) -> set:
    return {b for batch in batches for b in _blocks_of(batch)}


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("batch", [1, 5, 16])
@pytest.mark.parametrize(("replicas", "rank"), [(1, 0), (3, 2)])
def test_windows_dealt_to_dataloader_workers(ds, workers, batch, replicas, rank):
    """batch_size/num_workers: batch t comes from worker t % num_workers's windows alone (as a
    DataLoader hands it out), so the workers share almost no block; the same indices as the
    plain order, every epoch, and any resume point continues it exactly."""
    kw = {"window_blocks": 2, "seed": 5, "num_replicas": replicas, "rank": rank}
    dealt = BlockShuffleSampler(ds, batch_size=batch, num_workers=workers, **kw)
    plain = BlockShuffleSampler(ds, **kw)
    for epoch in (0, 1):
        dealt.set_epoch(epoch)
        plain.set_epoch(epoch)
        order = list(dealt)
        assert sorted(order) == sorted(plain) and len(order) == len(dealt)
        assert order != list(plain)
        batches = [order[t : t + batch] for t in range(0, len(order), batch)]
        per_worker = [_blocks_in(batches[w::workers]) for w in range(workers)]
        blocks = set(_blocks_of(order))
        pairs = [(a, b) for k, a in enumerate(per_worker) for b in per_worker[k + 1 :]]
        # Only where a worker's windows have run out and its batches come from another's (the
        # last two windows of a worker at most).
        assert all(len(a & b) <= 2 * 2 for a, b in pairs), [len(a & b) for a, b in pairs]
        plain_batches = [list(plain)[t : t + batch] for t in range(0, len(order), batch)]
        plain_shared = [_blocks_in(plain_batches[w::workers]) for w in range(2)]
        if batch < 8:  # a window of 2 blocks spans several batches: plain shares most blocks
            assert len(plain_shared[0] & plain_shared[1]) > len(blocks) // 3
        for k in (1, batch, 3 * batch + 1, len(order) - 1, len(order)):
            state = dict(dealt.state_dict(), yielded=k)
            resumed = BlockShuffleSampler(ds, batch_size=batch, num_workers=workers, **kw)
            resumed.load_state_dict(state)
            assert list(resumed) == order[k:]
        assert dealt.epoch_indices().tolist() == order


@pytest.mark.parametrize("window", [None, 3])
def test_dealing_a_whole_epoch_window_or_an_empty_dataset(atlas, ds, tmp_path, window):
    """One window for the whole epoch (window_blocks=None) goes to one worker's windows, the
    others' batches are filled from it: every index once; an empty dataset: nothing."""
    order = list(BlockShuffleSampler(ds, window_blocks=window, batch_size=7, num_workers=2))
    assert sorted(order) == list(range(N))
    empty = write_dataset(tmp_path / "empty", 0, 64, 8)
    sampler = BlockShuffleSampler(
        atlas.AtlasDataset(empty), window_blocks=window, batch_size=7, num_workers=2
    )
    assert list(sampler) == [] and len(sampler) == 0


def test_dealing_needs_both_and_is_checked_on_resume(ds):
    with pytest.raises(InvalidArgumentError, match=r"^batch_size given without num_workers"):
        BlockShuffleSampler(ds, batch_size=8)
    with pytest.raises(ValueError, match="num_workers"):
        BlockShuffleSampler(ds, batch_size=8, num_workers=-1)
    one = BlockShuffleSampler(ds, seed=2, batch_size=8, num_workers=1)
    assert list(one) == list(BlockShuffleSampler(ds, seed=2))  # one worker: nothing to deal
    state = BlockShuffleSampler(ds, batch_size=8, num_workers=2).state_dict()
    with pytest.raises(
        ValueError, match="dealt to 2 workers in batches of 8, this sampler's dealt to 3"
    ):
        BlockShuffleSampler(ds, batch_size=8, num_workers=3).load_state_dict(state)
    # A state from before dealing existed (no such keys) is a plain order's: refused by a
    # dealt sampler, taken by a plain one; one worker deals nothing, whatever the batch size.
    old = {
        k: v
        for k, v in BlockShuffleSampler(ds).state_dict().items()
        if k not in ("batch_size", "num_workers")
    }
    with pytest.raises(ValueError, match="not dealt, this sampler's dealt"):
        BlockShuffleSampler(ds, batch_size=8, num_workers=2).load_state_dict(old)
    BlockShuffleSampler(ds).load_state_dict(old)
    BlockShuffleSampler(ds).load_state_dict(
        BlockShuffleSampler(ds, batch_size=8, num_workers=1).state_dict()
    )


# -- extents (the default order of a dataset in object storage) ----------------------------


def _extent_bytes(root, blocks: int) -> int:
    """``extent_bytes`` giving extents of ``blocks`` blocks (shard 0's average block)."""
    return round(blocks * (root / "0" / "data.bin").stat().st_size / 8)


def _extent_of(i: int, k: int) -> tuple:
    """(shard, extent in the shard) of index ``i``: shards of 64 (8 blocks of 8)."""
    return i // 64, (i % 64) // 8 // k


def test_extent_order_is_a_permutation_of_runs_of_neighbouring_blocks(ds, root):
    sampler = BlockShuffleSampler(ds, seed=4, extent_bytes=_extent_bytes(root, 3))
    assert sampler.extent_blocks == 3 and sampler.window_extents == 4
    orders = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        order = list(sampler)
        assert sorted(order) == list(range(N))
        orders.append(order)
        # Windows of at most 4 extents (runs of 3 blocks of a shard, from its block 0) follow
        # each other: split where every extent begun is complete.
        for segment in _closed_segments([_extent_of(i, 3) for i in order]):
            assert len(set(segment)) <= 4
        # Within them, groups of window_blocks (8) blocks, each shuffled on its own.
        assert max(len(set(s)) for s in _closed_segments(_blocks_of(order))) <= 8
    assert orders[0] != orders[1] != orders[2]
    again = BlockShuffleSampler(ds, seed=4, extent_bytes=_extent_bytes(root, 3))
    again.set_epoch(2)
    assert list(again) == orders[2]  # deterministic for (seed, epoch)
    other = BlockShuffleSampler(ds, seed=5, extent_bytes=_extent_bytes(root, 3))
    assert list(other) != orders[0]


def test_extent_groups_mix_the_extents_of_a_window(ds, root):
    """A group of window_blocks blocks takes blocks of every extent of its window in turn."""
    sampler = BlockShuffleSampler(
        ds, seed=1, window_blocks=4, window_extents=4, extent_bytes=_extent_bytes(root, 4)
    )
    order = list(sampler)
    first = order[:32]  # the first group: 4 blocks of 8, one from each of 4 extents
    assert len({_extent_of(i, 4) for i in first}) == 4
    assert len(set(_blocks_of(first))) == 4


def test_local_default_order_is_the_block_order(ds, root):
    plain = BlockShuffleSampler(ds, seed=6)
    assert plain.extent_blocks == 0
    none = BlockShuffleSampler(ds, seed=6, extent_bytes=0)
    assert list(none) == list(plain)
    extents = BlockShuffleSampler(ds, seed=6, extent_bytes=_extent_bytes(root, 2))
    assert list(extents) != list(plain)


@pytest.mark.parametrize("replicas", [2, 3])
def test_extent_order_ranks_are_disjoint_and_cover_the_epoch(ds, root, replicas):
    kw = {"seed": 2, "extent_bytes": _extent_bytes(root, 2), "num_replicas": replicas}
    whole = list(BlockShuffleSampler(ds, seed=2, extent_bytes=_extent_bytes(root, 2)))
    shares = [list(BlockShuffleSampler(ds, rank=r, drop_last=True, **kw)) for r in range(replicas)]
    seen = [i for share in shares for i in share]
    assert len(seen) == len(set(seen)) == N // replicas * replicas
    assert seen == whole[: len(seen)]  # contiguous slices of the one order
    padded = [list(BlockShuffleSampler(ds, rank=r, **kw)) for r in range(replicas)]
    assert set().union(*map(set, padded)) == set(range(N))


@pytest.mark.parametrize(("replicas", "workers"), [(1, None), (3, None), (1, 2), (2, 3)])
def test_extent_order_resumes_mid_epoch(ds, root, replicas, workers):
    kw = {"seed": 3, "extent_bytes": _extent_bytes(root, 3), "num_replicas": replicas}
    kw["rank"] = replicas - 1
    if workers:
        kw.update(batch_size=5, num_workers=workers)
    sampler = BlockShuffleSampler(ds, **kw)
    sampler.set_epoch(2)
    full = list(sampler)
    for done in (0, 1, 37, len(full) - 1, len(full)):
        sampler.set_epoch(2)
        it = iter(sampler)
        head = [next(it) for _ in range(done)]
        state = sampler.state_dict()
        assert state["extent_blocks"] == 3 and state["yielded"] == done
        fresh = BlockShuffleSampler(ds, **dict(kw, seed=0))
        fresh.load_state_dict(state)
        assert head + list(fresh) == full
    with pytest.raises(ValueError, match="extent_blocks"):
        BlockShuffleSampler(ds, **dict(kw, extent_bytes=0)).load_state_dict(state)
    with pytest.raises(ValueError, match="window_extents"):
        BlockShuffleSampler(ds, **dict(kw, window_extents=2)).load_state_dict(state)


@pytest.mark.parametrize("workers", [2, 3])
def test_extent_windows_dealt_whole_to_workers(ds, root, workers):
    """Dealt to DataLoader workers, a window of extents goes to one worker: the workers'
    batches share almost no extent (each is fetched by one worker)."""
    batch = 8
    kw = {"seed": 7, "extent_bytes": _extent_bytes(root, 2), "window_extents": 2}
    order = list(BlockShuffleSampler(ds, batch_size=batch, num_workers=workers, **kw))
    assert sorted(order) == list(range(N))
    batches = [order[t : t + batch] for t in range(0, len(order), batch)]
    per_worker = [
        {_extent_of(i, 2) for b in batches[w::workers] for i in b} for w in range(workers)
    ]
    pairs = [(a, b) for k, a in enumerate(per_worker) for b in per_worker[k + 1 :]]
    # Only where a worker's windows have run out (its last window of 2 extents at most).
    assert all(len(a & b) <= 2 * 2 for a, b in pairs), [len(a & b) for a, b in pairs]


def test_extent_arguments_are_checked(ds):
    with pytest.raises(ValueError, match="extent_bytes"):
        BlockShuffleSampler(ds, extent_bytes=-1)
    with pytest.raises(TypeError, match="extent_bytes"):
        BlockShuffleSampler(ds, extent_bytes=1.5)
    with pytest.raises(ValueError, match="window_extents"):
        BlockShuffleSampler(ds, window_extents=0)
