"""Mixtures: exact proportions per window, the same stream whatever the workers or ranks,
exact resumes (also across a weight change), sources read in their block-shuffled order, and
bad weights refused. Tests that read data run on both backends (``atlas``); the order itself
depends on no backend."""

from __future__ import annotations

import hashlib
import json
import math
import pickle
import random
from fractions import Fraction

import numpy as np
import pytest
from loader_helpers import counted_read_ahead, example, write_dataset

import atlas_fast
from atlas_fast import MixtureDataset, MixtureSampler
from atlas_fast.mix import from_config

SIZES = {"web": 1500, "code": 700, "books": 260, "wiki": 90}  # blocks of 10, shards of 400


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("mix")
    return {name: write_dataset(base / name, n, 400, 10) for name, n in SIZES.items()}


@pytest.fixture
def mixture(atlas, roots):
    return MixtureDataset({name: atlas.AtlasDataset(root) for name, root in roots.items()})


@pytest.fixture(scope="module")
def plain(roots):
    """A mixture on the default backend, for tests of the order alone."""
    return MixtureDataset({name: atlas_fast.AtlasDataset(root) for name, root in roots.items()})


def _sources_of(mix: MixtureDataset, indices: np.ndarray) -> np.ndarray:
    """The source (its position in mix.names) of each mixture index."""
    ends = np.array([mix.source_range(n).stop for n in mix.names])
    return np.searchsorted(ends, indices, side="right")


def _pairs(mix: MixtureDataset, indices) -> list:
    return [mix.locate(i) for i in indices]


def _located(mix: MixtureDataset, indices) -> np.ndarray:
    """``(source position in mix.names, index within it)`` of each mixture index: (n, 2)."""
    indices = np.asarray(indices, dtype=np.int64)
    sources = _sources_of(mix, indices)
    starts = np.array([mix.source_range(n).start for n in mix.names])
    return np.stack([sources, indices - starts[sources]], axis=1)


def _digest(located: np.ndarray) -> str:
    """SHA-256 of the (source, index) pairs, in order."""
    return hashlib.sha256(np.ascontiguousarray(located, dtype="<i8").tobytes()).hexdigest()


# -- the dataset --------------------------------------------------------------------------------


def test_mixture_dataset_maps_indices_onto_sources(mixture):
    assert len(mixture) == sum(SIZES.values())
    assert mixture.names == tuple(SIZES)
    assert mixture.locate(0) == ("web", 0)
    assert mixture.locate(1500) == ("code", 0)
    assert mixture.locate(-1) == ("wiki", 89)
    assert mixture.index("books", 7) == 1500 + 700 + 7
    assert mixture.source_range("code") == range(1500, 2200)
    rng = random.Random(1)
    picks = [rng.randrange(len(mixture)) for _ in range(300)] + [-1, -2550, 0]
    expected = [example(mixture.locate(i)[1]) for i in picks]
    assert [mixture[i] for i in picks] == expected
    assert mixture.__getitems__(picks) == expected
    assert mixture.__getitems__([1501, 1502]) == [example(1), example(2)]  # one source
    assert mixture.__getitems__([]) == []
    assert mixture.__getitems__(np.array(picks[:10])) == expected[:10]
    for bad, error in ((len(mixture), IndexError), (-len(mixture) - 1, IndexError)):
        with pytest.raises(error):
            mixture[bad]
        with pytest.raises(error):
            mixture.__getitems__([0, bad])
    with pytest.raises(TypeError):
        mixture["1"]
    with pytest.raises(TypeError):
        mixture.__getitems__([0, 1.5])
    with pytest.raises(KeyError, match=r"'news'.*'web', 'code'"):
        mixture.index("news", 0)
    with pytest.raises(IndexError):
        mixture.index("wiki", 90)
    again = pickle.loads(pickle.dumps(mixture))
    assert again.__getitems__(picks) == expected and again.names == mixture.names
    assert "web=1500" in repr(mixture)
    assert mixture.prefetch([0, 1600, 2500]) in (True, False)


def test_mixture_dataset_refuses_what_is_not_a_dict_of_datasets():
    with pytest.raises(ValueError, match="at least one"):
        MixtureDataset({})
    with pytest.raises(TypeError, match="dict"):
        MixtureDataset([("a", [1])])
    with pytest.raises(TypeError, match="names"):
        MixtureDataset({3: [1, 2]})
    with pytest.raises(TypeError, match=r"'a'.*__getitem__"):
        MixtureDataset({"a": 5})
    mix = MixtureDataset({"a": [1, 2], "b": [3]})  # any sized dataset reads...
    assert mix.__getitems__([2, 0]) == [3, 1]
    with pytest.raises(TypeError, match="source 'a': MixtureSampler needs an AtlasDataset"):
        MixtureSampler(mix, {"a": 1}, global_batch_size=2)  # ...the sampler needs blocks


# -- exact proportions --------------------------------------------------------------------------


def _check_windows(sources: np.ndarray, window: int, shares: list) -> None:
    """Every window's count of each source is its carried target rounded down or up (so
    within one of it), within two of window * share, and the cumulative count never drifts
    by one or more from the exact proportion (exact rational arithmetic)."""
    m = len(shares)
    rows = len(sources) // window
    row = np.arange(rows * window, dtype=np.int64) // window
    counts = np.bincount(row * m + sources[: rows * window], minlength=rows * m).reshape(rows, m)
    denominator = math.lcm(*(s.denominator for s in shares))
    per_window = np.array([int(s * window * denominator) for s in shares], dtype=np.int64)
    made = np.cumsum(counts, axis=0) * denominator  # scaled by the denominator: exact
    target = np.arange(1, rows + 1, dtype=np.int64)[:, None] * per_window
    drift = made - target
    assert np.abs(drift).max() < denominator, "the cumulative count drifted by one or more"
    carried = np.vstack([np.zeros((1, m), dtype=np.int64), drift[:-1]])  # the remainder in
    entitled = per_window - carried  # this window's target plus what was carried
    low = np.floor_divide(entitled, denominator)
    assert ((counts == low) | (counts == low + 1)).all(), "a window strayed from its target"
    assert (np.abs(counts * denominator - per_window) < 2 * denominator).all()


def _check_ten_million(mix, weights, window) -> None:
    total = 10_000_000
    sampler = MixtureSampler(
        mix, weights, global_batch_size=window, seed=3, epoch_length=total // window * window
    )
    sources = _sources_of(mix, sampler.epoch_indices())
    assert len(sources) == total // window * window
    given = {
        n: Fraction(repr(w)) if isinstance(w, float) else Fraction(w) for n, w in weights.items()
    }
    shares = [given.get(n, Fraction(0)) / sum(given.values()) for n in mix.names]
    _check_windows(sources, window, shares)


def test_every_window_holds_its_quota_over_ten_million_positions(mixture):
    _check_ten_million(mixture, {"web": 0.6, "code": 0.25, "books": 0.1, "wiki": 0.05}, 256)


@pytest.mark.parametrize(
    ("weights", "window"),
    [
        ({"web": 1, "code": 1, "books": 1}, 100),  # thirds of 100
        ({"web": 0.123457, "code": "3/10", "books": Fraction(2, 7), "wiki": 0.01}, 1000),
    ],
)
def test_every_window_holds_other_quotas_over_ten_million_positions(plain, weights, window):
    """Weights whose windows do not divide evenly (the order depends on no backend: the
    stream is the same over either backend's datasets, test_stream_is_the_same_...)."""
    _check_ten_million(plain, weights, window)


def test_a_window_of_several_steps_and_rank_shares(plain):
    """window=4 steps: the quota holds per window of 4 global batches; each rank's share of a
    step holds about its proportion too (the sources interleave evenly)."""
    weights = {"web": 5, "code": 3, "books": 2}
    sampler = MixtureSampler(
        plain, weights, global_batch_size=64, window=256, seed=1, epoch_length=64 * 4000
    )
    sources = _sources_of(plain, sampler.epoch_indices())
    _check_windows(sources, 256, [Fraction(5, 10), Fraction(3, 10), Fraction(2, 10), Fraction(0)])
    ranks = 4
    for r in range(ranks):
        share = MixtureSampler(
            plain,
            weights,
            global_batch_size=64,
            window=256,
            seed=1,
            epoch_length=64 * 4000,
            num_replicas=ranks,
            rank=r,
        )
        mine = _sources_of(plain, share.epoch_indices()).reshape(-1, 16)
        for s, w in enumerate((0.5, 0.3, 0.2)):
            assert np.abs((mine == s).sum(axis=1) - 16 * w).max() <= 2


# -- the same stream whatever the workers and ranks ---------------------------------------------


class _Locate:
    """A map-style dataset answering where each mixture index is: (source, index within it)
    rows (what the DataLoader's workers hand back, without reading examples: the stream is
    what is checked here)."""

    def __init__(self, mix) -> None:
        self.mix = mix

    def __len__(self) -> int:
        return len(self.mix)

    def __getitems__(self, indices) -> np.ndarray:
        return _located(self.mix, indices)


def _share(mix, weights, batch, ranks, rank, count) -> MixtureSampler:
    return MixtureSampler(
        mix,
        weights,
        global_batch_size=batch,
        seed=11,
        num_replicas=ranks,
        rank=rank,
        epoch_length=count,
    )


def _global(shares: list, per_rank: int) -> np.ndarray:
    """The global stream rebuilt from the ranks' shares: step by step, rank after rank."""
    shares = [np.asarray(s).reshape(-1, per_rank, *np.shape(s)[1:]) for s in shares]
    assert len({len(s) for s in shares}) == 1
    return np.concatenate(shares, axis=1).reshape(-1, *shares[0].shape[2:])


MILLION = {"weights": {"web": 0.5, "code": 0.3, "books": 0.15, "wiki": 0.05}, "batch": 1024}
MILLION_COUNT = 1_000_448  # 977 global batches of 1024: at least 10**6 positions


def _million(mix) -> tuple:
    """The sampler of the first 10**6 positions (world size 1), and its digest."""
    whole = _share(mix, MILLION["weights"], MILLION["batch"], 1, 0, MILLION_COUNT)
    return whole, _digest(_located(mix, whole.epoch_indices()))


def test_stream_is_the_same_for_any_world_size(mixture, roots):
    """SHA-256 of the first 10**6 (source, index) pairs: the same for world sizes 1, 2 and 4
    at a fixed global batch, and over either backend's datasets."""
    _, reference = _million(mixture)
    plain = MixtureDataset({name: atlas_fast.AtlasDataset(r) for name, r in roots.items()})
    assert _million(plain)[1] == reference  # the default backend's
    weights, batch = MILLION["weights"], MILLION["batch"]
    for ranks in (2, 4):
        shares = [_share(mixture, weights, batch, ranks, r, MILLION_COUNT) for r in range(ranks)]
        stream = _global([s.epoch_indices() for s in shares], batch // ranks)
        assert _digest(_located(mixture, stream)) == reference, ranks


def test_stream_is_the_same_for_any_workers(plain):
    """The same 10**6 pairs through a DataLoader with 0, 1, 2 or 4 workers, and on each rank
    of two with 2 workers (the loader reads no example here: no backend is involved)."""
    torch = pytest.importorskip("torch")
    whole, reference = _million(plain)

    def read(sampler, workers):
        loader = torch.utils.data.DataLoader(
            _Locate(plain),
            batch_size=sampler.batch_size,
            sampler=sampler,
            num_workers=workers,
            collate_fn=lambda rows: rows,
        )
        return np.concatenate(list(loader))

    for workers in (0, 1, 2, 4):
        assert _digest(read(whole, workers)) == reference, workers
    weights, batch = MILLION["weights"], MILLION["batch"]
    halves = [read(_share(plain, weights, batch, 2, r, MILLION_COUNT), 2) for r in range(2)]
    assert _digest(_global(halves, batch // 2)) == reference


def test_ranks_get_disjoint_shares_of_each_step(plain):
    weights = {"web": 1, "code": 1, "books": 1, "wiki": 1}
    shares = [
        MixtureSampler(
            plain,
            weights,
            global_batch_size=60,
            seed=2,
            num_replicas=3,
            rank=r,
            epoch_length=60 * 40,
        )
        for r in range(3)
    ]
    assert [s.batch_size for s in shares] == [20, 20, 20] and len(shares[0]) == 800
    steps = [s.epoch_indices().reshape(40, 20) for s in shares]
    for t in range(40):
        pairs = [set(_pairs(plain, steps[r][t].tolist())) for r in range(3)]
        assert sum(len(p) for p in pairs) == 60  # no example twice in a global batch
        assert not (pairs[0] & pairs[1] or pairs[0] & pairs[2] or pairs[1] & pairs[2])


# -- reading through a DataLoader (both backends) -----------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_reads_the_mixture(mixture, workers):
    torch = pytest.importorskip("torch")
    sampler = MixtureSampler(
        mixture,
        {"web": 3, "code": 2, "books": 1},
        global_batch_size=48,
        seed=5,
        epoch_length=48 * 60,
    )
    loader = torch.utils.data.DataLoader(
        mixture, batch_size=48, sampler=sampler, num_workers=workers, collate_fn=list
    )
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        order = sampler.epoch_indices()
        got = [x for batch in loader for x in batch]
        assert got == [example(mixture.locate(i)[1]) for i in order]
    assert sampler.epoch_indices(epoch=0).tolist() != sampler.epoch_indices(epoch=1).tolist()


def test_reads_ahead_the_blocks_the_sources_give_next(atlas, backend, roots, monkeypatch):
    """In this process (no workers) the sampler names each window of a source's order to the
    source as it is entered: the core decodes those blocks ahead (the compiled core on its
    read-ahead thread: its jobs taken are counted; the Python core on its pool: a private
    name, since the pool is not observable otherwise)."""
    with counted_read_ahead(backend, monkeypatch) as ahead:
        mix = MixtureDataset({n: atlas.AtlasDataset(r) for n, r in roots.items()})
        sampler = MixtureSampler(
            mix, {"web": 2, "code": 1}, global_batch_size=32, seed=4, epoch_length=32 * 50
        )
        before = ahead()
        it = iter(sampler)
        got = []
        for _ in range(50):
            got += mix.__getitems__([next(it) for _ in range(32)])
        assert got == [example(mix.locate(i)[1]) for i in sampler.epoch_indices()]
        blocks = len({(n, j // 10) for n, j in _pairs(mix, sampler.epoch_indices())})
        assert ahead() - before >= blocks * 3 // 4, (ahead() - before, blocks)


# -- each source in its block-shuffled order ----------------------------------------------------


def test_each_source_reads_its_own_block_shuffled_passes(plain):
    """The small source is upsampled (every pass a new permutation), the large one
    subsampled (no repeat); each source's examples are a prefix of its order, whose windows
    hold whole blocks."""
    sampler = MixtureSampler(
        plain, {"web": 0.5, "wiki": 0.5}, global_batch_size=50, seed=9, epoch_length=50 * 36
    )
    pairs = _pairs(plain, sampler.epoch_indices())
    wiki = [j for name, j in pairs if name == "wiki"]
    web = [j for name, j in pairs if name == "web"]
    assert len(wiki) == len(web) == 900
    assert wiki == sampler.source_order("wiki", 0, 900)
    assert web == sampler.source_order("web", 0, 900)
    passes = [wiki[k : k + 90] for k in range(0, 900, 90)]
    assert all(sorted(p) == list(range(90)) for p in passes)
    assert len({tuple(p) for p in passes}) == 10
    assert len(set(web)) == 900  # 900 of 1500: no repeat
    assert sampler.consumed(36) == {"web": 900, "code": 0, "books": 0, "wiki": 900}
    # Windows of 8 blocks of 10: a run of 80 positions holds exactly 8 whole blocks.
    for k in range(0, 880, 80):
        assert len({j // 10 for j in web[k : k + 80]}) == 8
    other = MixtureSampler(
        plain, {"web": 0.5, "wiki": 0.5}, global_batch_size=50, seed=10, epoch_length=50 * 36
    )
    assert other.source_order("web", 0, 100) != web[:100]


# -- resuming -----------------------------------------------------------------------------------


def test_interrupted_anywhere_the_rest_is_the_same(plain):
    weights = {"web": 0.45, "code": 0.35, "books": 0.2}
    kw = {"global_batch_size": 96, "window": 96, "seed": 21, "epoch_length": 96 * 50}
    rng = random.Random(8)
    for ranks in (1, 3):
        rank = ranks - 1
        full = MixtureSampler(plain, weights, num_replicas=ranks, rank=rank, **kw)
        full.set_epoch(2)
        whole = list(full)
        assert len(whole) == len(full) == 96 * 50 // ranks
        for stop in [0, 1, len(whole) - 1, len(whole), *rng.sample(range(len(whole)), 6)]:
            sampler = MixtureSampler(plain, weights, num_replicas=ranks, rank=rank, **kw)
            sampler.set_epoch(2)
            it = iter(sampler)
            head = [next(it) for _ in range(stop)]
            state = json.loads(json.dumps(sampler.state_dict()))  # plain data
            fresh = MixtureSampler(plain, {"web": 1}, num_replicas=ranks, rank=rank, **kw)
            fresh.load_state_dict(state)
            fresh.set_epoch(2)  # a training loop sets the epoch it resumes: still resumes
            assert head + list(fresh) == whole, stop
            assert list(fresh) == whole  # the next iteration starts the epoch over


def test_resume_with_other_workers_and_ranks_from_the_step(plain):
    """Behind a DataLoader the sampler runs ahead: the training loop's step count gives the
    state (state_dict(step=k)); resumed with another number of workers, or of ranks at a
    step boundary, the stream goes on exactly."""
    torch = pytest.importorskip("torch")
    weights = {"web": 2, "code": 1, "wiki": 1}
    kw = {"global_batch_size": 64, "seed": 6, "epoch_length": 64 * 40}
    whole = MixtureSampler(plain, weights, **kw).epoch_indices().tolist()
    sampler = MixtureSampler(plain, weights, **kw)
    loader = torch.utils.data.DataLoader(
        list(range(len(plain))), batch_size=64, sampler=sampler, num_workers=2
    )
    it = iter(loader)
    done = [int(i) for _ in range(13) for i in next(it)]
    state = sampler.state_dict(step=13)
    del it
    assert state["yielded"] == 13 * 64
    resumed = MixtureSampler(plain, weights, **kw)
    resumed.load_state_dict(state)
    loader = torch.utils.data.DataLoader(
        list(range(len(plain))), batch_size=64, sampler=resumed, num_workers=0
    )
    assert done + [int(i) for b in loader for i in b] == whole
    halves = []
    for r in range(2):
        half = MixtureSampler(plain, weights, num_replicas=2, rank=r, **kw)
        half.load_state_dict(state)
        halves.append(np.array(list(half)).reshape(-1, 32))
    assert done + np.concatenate(halves, axis=1).ravel().tolist() == whole
    inside = dict(state, yielded=13 * 64 + 5)
    with pytest.raises(ValueError, match="inside a step"):
        MixtureSampler(plain, weights, num_replicas=2, rank=0, **kw).load_state_dict(inside)


def test_interrupted_at_random_steps_resumes_with_other_workers(mixture):
    """Windows of 3 steps: a run interrupted after random steps (inside a window too),
    resumed by a new sampler with another number of DataLoader workers, reads exactly the
    examples of the uninterrupted run: from the training loop's step count
    (``state_dict(step=k)``, a plain DataLoader); a StatefulDataLoader's state resumes too
    (with as many workers: torchdata refuses another number)."""
    torch = pytest.importorskip("torch")
    stateful = pytest.importorskip(
        "torchdata.stateful_dataloader", reason="torchdata is not installed (pip install torchdata)"
    )
    weights = {"web": 4, "code": 3, "books": 2, "wiki": 1}
    kw = {"global_batch_size": 32, "window": 96, "seed": 17, "epoch_length": 32 * 30}
    whole = [
        example(mixture.locate(i)[1])
        for i in MixtureSampler(mixture, weights, **kw).epoch_indices()
    ]
    rng = random.Random(3)
    steps = [rng.randrange(1, 10) * 3 + 1, rng.randrange(1, 10) * 3 + 2, rng.randrange(1, 10) * 3]
    for k, (before, after) in zip(steps, [(2, 0), (0, 2), (2, 1)]):
        for kind in ("step", "stateful"):
            loader_class = (
                stateful.StatefulDataLoader if kind == "stateful" else torch.utils.data.DataLoader
            )
            sampler = MixtureSampler(mixture, weights, **kw)
            loader = loader_class(
                mixture, batch_size=32, sampler=sampler, num_workers=before, collate_fn=list
            )
            it = iter(loader)
            head = [x for _ in range(k) for x in next(it)]
            state = loader.state_dict() if kind == "stateful" else sampler.state_dict(step=k)
            del it, loader
            resumed = MixtureSampler(mixture, {"web": 1}, **kw)
            workers = before if kind == "stateful" else after  # torchdata refuses another
            again = loader_class(
                mixture, batch_size=32, sampler=resumed, num_workers=workers, collate_fn=list
            )
            if kind == "stateful":
                again.load_state_dict(state)
            else:
                resumed.load_state_dict(state)
            assert head + [x for batch in again for x in batch] == whole, (k, kind, workers)


def test_stateful_dataloader_saves_and_restores_it(plain):
    stateful = pytest.importorskip(
        "torchdata.stateful_dataloader", reason="torchdata is not installed (pip install torchdata)"
    )
    weights = {"web": 3, "books": 1}
    kw = {"global_batch_size": 32, "seed": 2, "epoch_length": 32 * 30}
    whole = MixtureSampler(plain, weights, **kw).epoch_indices().tolist()
    for workers in (0, 2):
        loader = stateful.StatefulDataLoader(
            list(range(len(plain))),
            batch_size=32,
            sampler=MixtureSampler(plain, weights, **kw),
            num_workers=workers,
        )
        it = iter(loader)
        head = [int(i) for _ in range(11) for i in next(it)]
        state = loader.state_dict()
        del it
        again = stateful.StatefulDataLoader(
            list(range(len(plain))),
            batch_size=32,
            sampler=MixtureSampler(plain, {"web": 1}, **kw),
            num_workers=workers,
        )
        again.load_state_dict(state)
        assert head + [int(i) for b in again for i in b] == whole, workers


def test_weight_change_at_a_step(plain):
    """Before step k the stream is the old weights' run; from k it is what a fresh sampler
    with the schedule [(0, old), (k, new)] gives, also resumed from a state after k; each
    source continues its own order (a prefix of it is consumed), sources join and leave."""
    old = {"web": 0.7, "code": 0.3}
    new = {"code": 0.2, "books": 0.5, "wiki": 0.3}
    kw = {"global_batch_size": 40, "seed": 13, "epoch_length": 40 * 60}
    k = 23
    before = MixtureSampler(plain, old, **kw).epoch_indices().tolist()
    planned = MixtureSampler(plain, schedule=[(0, old), (k, new)], **kw)
    expected = planned.epoch_indices().tolist()
    assert expected[: 40 * k] == before[: 40 * k]
    assert expected[40 * k :] != before[40 * k :]
    live = MixtureSampler(plain, old, **kw)
    it = iter(live)
    got = [next(it) for _ in range(40 * (k - 3) + 7)]  # made ahead past step k already
    live.set_weights(new, at_step=k)
    got += list(it)
    assert got == expected
    names = [name for name, _ in _pairs(plain, expected)]
    assert set(names[: 40 * k]) == {"web", "code"}
    assert set(names[40 * k :]) == {"code", "books", "wiki"}
    code = [j for name, j in _pairs(plain, expected) if name == "code"]
    assert code == planned.source_order("code", 0, len(code))
    assert planned.consumed(60)["code"] == len(code)
    # A source that leaves and comes back continues its own order where it stopped.
    back = MixtureSampler(
        plain, schedule=[(0, old), (10, {"code": 1}), (20, {"web": 1, "wiki": 1})], **kw
    )
    web = [j for name, j in _pairs(plain, back.epoch_indices()) if name == "web"]
    assert web == back.source_order("web", 0, len(web)) and len(web) == 400 * 0.7 + 40 * 40 // 2
    # Resumed after the change, by a sampler made with the old weights only.
    mid = MixtureSampler(plain, schedule=[(0, old), (k, new)], **kw)
    it = iter(mid)
    head = [next(it) for _ in range(40 * 31 + 3)]
    resumed = MixtureSampler(plain, old, **kw)
    resumed.load_state_dict(mid.state_dict())
    assert resumed.schedule == [(0, old), (k, new)]
    assert head + list(resumed) == expected
    # The past cannot change.
    with pytest.raises(ValueError, match="handed out indices of step 31"):
        mid.set_weights(old, at_step=30)
    mid.set_weights(old, at_step=32)
    second = MixtureSampler(plain, old, num_replicas=2, rank=1, **kw)
    it = iter(second)
    head = [next(it) for _ in range(20 * 5)]  # steps 0..4 of this rank, nothing of step 5
    second.set_weights(new, at_step=5)
    halves = MixtureSampler(plain, schedule=[(0, old), (5, new)], num_replicas=2, rank=1, **kw)
    assert head + list(it) == halves.epoch_indices().tolist()


def test_resume_at_position_one_billion(plain):
    """load_state_dict at position 10**9 computes each source's place arithmetically: the
    stream there continues every source's order where its exact quota left it."""
    weights = {"web": 0.55, "code": 0.3, "books": Fraction(1, 10), "wiki": Fraction(1, 20)}
    g = 1000
    kw = {"global_batch_size": g, "seed": 4, "epoch_length": 2 * 10**9}
    schedule = [(0, weights), (700_000, {"web": 0.25, "books": 0.75})]
    sampler = MixtureSampler(plain, schedule=schedule, **kw)
    position = 10**9 + 1234  # inside step 10**6
    sampler.load_state_dict({"epoch": 0, "yielded": position})
    after = _pairs(plain, [next(iter(sampler)) for _ in range(1)])
    ahead = MixtureSampler(plain, schedule=schedule, **kw)
    ahead.load_state_dict({"epoch": 0, "yielded": position - 5000})
    it = iter(ahead)
    stream = [next(it) for _ in range(5000 + 3000)]
    assert _pairs(plain, stream[5000:5001]) == after
    # The consumed counts, from first principles: each stage's largest-remainder rounding.
    consumed = sampler.consumed(10**6)
    first = {n: Fraction(repr(w)) if isinstance(w, float) else w for n, w in weights.items()}
    total = sum(first.values())
    expected = {}
    for stage_weights, steps in (
        (first, 700_000),
        ({"web": Fraction(1, 4), "books": Fraction(3, 4)}, 300_000),
    ):
        norm = sum(stage_weights.values())
        exact = {n: steps * g * w / norm for n, w in stage_weights.items()}
        floors = {n: math.floor(x) for n, x in exact.items()}
        short = steps * g - sum(floors.values())
        for n in sorted(exact, key=lambda n: (-(exact[n] - floors[n]), n))[:short]:
            floors[n] += 1
        for n, c in floors.items():
            expected[n] = expected.get(n, 0) + c
    assert total > 0
    assert consumed == {n: expected.get(n, 0) for n in plain.names}
    # Step 10**6 on: web and books continue their orders exactly where they were.
    names = _pairs(plain, ahead.epoch_indices(start=10**6 * g, stop=10**6 * g + 2000))
    for name in ("web", "books"):
        mine = [j for n, j in names if n == name]
        assert mine == sampler.source_order(name, consumed[name], consumed[name] + len(mine))


# -- weights ------------------------------------------------------------------------------------


def test_bad_weights_are_refused_at_construction(plain):
    kw = {"global_batch_size": 10}
    for weights, error, match in [
        ({"web": -1, "code": 2}, ValueError, "'web' must not be negative"),
        ({"web": 0, "code": 0.0}, ValueError, "every weight is zero"),
        ({}, ValueError, "every weight is zero"),
        ({"web": 1, "news": 1}, ValueError, "unknown sources 'news'"),
        ({"web": float("nan")}, ValueError, "finite"),
        ({"web": float("inf")}, ValueError, "finite"),
        ({"web": True}, TypeError, "number"),
        ({"web": "lots"}, TypeError, "a string such as '2/7'"),
        ({"web": None}, TypeError, "number"),
        ([("web", 1)], TypeError, "dict"),
    ]:
        with pytest.raises(error, match=match):
            MixtureSampler(plain, weights, **kw)
    with pytest.raises(ValueError, match=r"'wiki' \(90 examples\) would be read 5.56 times"):
        MixtureSampler(plain, {"web": 1, "wiki": 1}, max_repeats=2, total_steps=100, **kw)
    MixtureSampler(plain, {"web": 1, "wiki": 1}, max_repeats={"wiki": 6}, total_steps=100, **kw)
    with pytest.raises(ValueError, match="'wiki'"):
        MixtureSampler(plain, {"web": 1, "wiki": 1}, max_repeats={"wiki": 5}, total_steps=100, **kw)
    sampler = MixtureSampler(plain, {"web": 1}, max_repeats=1, total_steps=100, **kw)
    with pytest.raises(ValueError, match="max_repeats"):
        sampler.set_weights({"wiki": 1}, at_step=50)
    for schedule, match in [
        ([(5, {"web": 1})], "start at step 0"),
        ([(0, {"web": 1}), (9, {"web": 2}), (4, {"web": 3})], "increase"),
        ([(0, {"web": 1}), (3, {"web": -2})], "negative"),
        ([(0, {"web": 1}, 2)], "step, weights"),
    ]:
        with pytest.raises(ValueError, match=match):
            MixtureSampler(plain, schedule=schedule, **kw)
    with pytest.raises(ValueError, match="window boundary"):
        MixtureSampler(plain, schedule=[(0, {"web": 1}), (3, {"code": 1})], window=40, **kw)
    with pytest.raises(ValueError, match="one of them"):
        MixtureSampler(plain, {"web": 1}, schedule=[(0, {"web": 1})], **kw)
    with pytest.raises(ValueError, match="multiple of num_replicas"):
        MixtureSampler(plain, {"web": 1}, global_batch_size=10, num_replicas=3, rank=0)
    with pytest.raises(ValueError, match="unit='tokens' needs tokens"):
        MixtureSampler(plain, {"web": 1}, unit="tokens", **kw)
    with pytest.raises(ValueError, match="no token count for 'code'"):
        MixtureSampler(plain, {"web": 1, "code": 1}, unit="tokens", tokens={"web": 9}, **kw)


def test_an_empty_source_cannot_have_a_weight(atlas, roots, tmp_path):
    empty = write_dataset(tmp_path / "empty", 0, 10, 5)
    mix = MixtureDataset(
        {"web": atlas.AtlasDataset(roots["web"]), "none": atlas.AtlasDataset(empty)}
    )
    with pytest.raises(ValueError, match="'none' has no examples"):
        MixtureSampler(mix, {"web": 1, "none": 1}, global_batch_size=10)
    sampler = MixtureSampler(mix, {"web": 1, "none": 0}, global_batch_size=10)
    assert {mix.locate(i)[0] for i in sampler.epoch_indices()} == {"web"}


def test_weights_in_tokens(plain):
    """Token weights become example weights through each source's tokens per example: 10
    tokens per web example, 30 per code example, equal token weights: 3 web for 1 code."""
    kw = {"unit": "tokens", "global_batch_size": 40, "epoch_length": 40 * 10}
    for tokens in (
        {"web": 15_000, "code": 21_000, "wiki": 1},
        {"web": lambda x: 10, "code": lambda x: 30},
    ):
        sampler = MixtureSampler(plain, {"web": 1, "code": 1}, tokens=tokens, **kw)
        names = [n for n, _ in _pairs(plain, sampler.epoch_indices())]
        assert names.count("web") == 300 and names.count("code") == 100
    counted = MixtureSampler(plain, {"web": 1}, tokens=lambda x: len(x["text"]), **kw)
    expected = {n: sum(len(example(j)["text"]) for j in range(SIZES[n])) for n in SIZES}
    assert counted.config()["tokens"] == expected
    with pytest.raises(ValueError, match="tokens is for unit='tokens'"):
        MixtureSampler(plain, {"web": 1}, tokens={"web": 1}, global_batch_size=4)
    with pytest.raises(ValueError, match="'code' has no tokens"):
        MixtureSampler(plain, {"web": 1, "code": 1}, tokens={"web": 5, "code": 0}, **kw)


def test_epoch_length_and_epochs(plain):
    sampler = MixtureSampler(
        plain, {"web": 1, "code": 1}, global_batch_size=64, num_replicas=2, rank=1
    )
    assert sampler.epoch_length == (1500 + 700) // 64 * 64  # the first stage's sources
    assert len(sampler) == sampler.epoch_length // 2
    torch = pytest.importorskip("torch")
    assert isinstance(sampler, torch.utils.data.Sampler)
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    assert len(first) == len(second) == len(sampler) and first != second
    with pytest.raises(ValueError, match="multiple of global_batch_size"):
        MixtureSampler(plain, {"web": 1}, global_batch_size=64, epoch_length=100)


# -- plain data ---------------------------------------------------------------------------------


def test_a_mixture_from_plain_data(atlas, roots):
    config = {
        "sources": {
            "web": str(roots["web"]),
            "code": {"path": str(roots["code"]), "window_blocks": 4, "max_repeats": 3},
            "wiki": str(roots["wiki"]),
        },
        "schedule": [
            {"step": 0, "weights": {"web": 0.8, "code": 0.2}},
            {"step": 12, "weights": {"web": "1/2", "code": Fraction(1, 5), "wiki": 0.3}},
        ],
        "global_batch_size": 20,
        "seed": 7,
        "epoch_length": 20 * 30,
    }
    mix, sampler = from_config(config, open_dataset=atlas.AtlasDataset, num_replicas=1, rank=0)
    assert mix.names == ("web", "code", "wiki")
    assert sampler.window_blocks == {"web": 8, "code": 4, "wiki": 8}
    order = sampler.epoch_indices().tolist()
    assert mix.__getitems__(order[:50]) == [example(mix.locate(i)[1]) for i in order[:50]]
    back = json.loads(json.dumps(sampler.config()))
    _, again = from_config(
        {"sources": config["sources"], **back},
        open_dataset=atlas.AtlasDataset,
        num_replicas=1,
        rank=0,
    )
    assert again.epoch_indices().tolist() == order
    for bad, match in [
        ({**config, "weigths": {}}, "unknown mixture config keys: 'weigths'"),
        ({**config, "sources": {}}, "needs sources"),
        ({**config, "sources": {"web": {"pth": "x"}}}, "'web': a path"),
    ]:
        with pytest.raises(ValueError, match=match):
            from_config(bad, open_dataset=atlas.AtlasDataset)
