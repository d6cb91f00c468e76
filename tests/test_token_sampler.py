"""TokenShuffleSampler: every token once per epoch, ranks disjoint, resume from the step alone
with another number of workers, a seq_len changed mid-epoch, and a DataLoader reading it."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
from loader_helpers import counted_read_ahead
from token_helpers import Model, make_docs, write_docs

from atlas_fast import InvalidArgumentError, TokenSequences
from atlas_fast.token_sampler import TokenShuffleSampler


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    docs = make_docs(21, 400, np.uint16, long=3)
    root = tmp_path_factory.mktemp("sampler") / "ds"
    write_docs(root, docs, strategy=1, shard_size=90, block_size=9)
    return root, docs


def _coverage(n: int, batches) -> np.ndarray:
    seen = np.zeros(n, dtype=np.int64)
    for keys in batches:
        for key in keys:
            for s, c in zip(key[::2], key[1::2]):
                seen[s : s + c] += 1
    return seen


def _bound(sampler) -> int:
    """Tokens an epoch may leave out: under two batches per lane, and the shares' rounding."""
    longest = max(length for _, length in sampler.schedule)
    return 2 * sampler.lanes * sampler.batch_size * longest + sampler.lanes * sampler.num_replicas


@pytest.mark.parametrize("lanes", [1, 3])
def test_every_token_once_per_epoch_and_rows_are_the_models(atlas, corpus, lanes):
    root, docs = corpus
    ts = TokenSequences(atlas.AtlasDataset(root), 16)
    sampler = TokenShuffleSampler(ts, batch_size=4, lanes=lanes, seed=3)
    batches = list(sampler.batches())
    assert len(batches) == sampler.steps() and len(list(sampler)) == len(sampler)
    assert all(len(keys) == 4 and all(sum(k[1::2]) == 16 for k in keys) for keys in batches)
    seen = _coverage(ts.num_tokens, batches)
    assert seen.max() == 1
    assert (seen == 0).sum() <= _bound(sampler)
    model = Model(docs)
    for keys in batches[:: max(1, len(batches) // 7)]:
        got = ts.__getitems__(keys)
        for r, key in enumerate(keys):
            want = model.ranges(list(zip(key[::2], key[1::2])))
            for name in want:
                np.testing.assert_array_equal(got[name][r], want[name])
    # Deterministic in (seed, epoch); another epoch, another order.
    assert list(TokenShuffleSampler(ts, batch_size=4, lanes=lanes, seed=3).batches()) == batches
    sampler.set_epoch(1)
    assert list(sampler.batches()) != batches


def test_rows_of_whole_pieces_are_contiguous_in_the_epochs_stream(corpus, atlas):
    root, _ = corpus
    ts = TokenSequences(atlas.AtlasDataset(root), 32)
    sampler = TokenShuffleSampler(ts, batch_size=2, lanes=2, group_pieces=4)
    layout = sampler._layout(0)
    # Each row is one piece: its ranges follow each other in the permuted blocks' stream.
    position = {int(b): k for k, b in enumerate(layout.perm)}
    cum = np.asarray(ts._index.cum, dtype=np.int64)
    for keys in list(sampler.batches())[:40]:
        for key in keys:
            blocks = [int(np.searchsorted(cum, s, side="right") - 1) for s in key[::2]]
            order = [position[b] for b in blocks]
            assert order == list(range(order[0], order[0] + len(order)))


def test_ranks_are_disjoint_and_cover_the_epoch(atlas, corpus):
    root, _ = corpus
    ts = TokenSequences(atlas.AtlasDataset(root), 8)
    samplers = [
        TokenShuffleSampler(ts, batch_size=3, lanes=2, num_replicas=3, rank=r, seed=1)
        for r in range(3)
    ]
    steps = {s.steps() for s in samplers}
    assert len(steps) == 1  # every rank takes as many steps
    seen = _coverage(ts.num_tokens, [k for s in samplers for k in s.batches()])
    assert seen.max() == 1
    assert (seen == 0).sum() <= 3 * _bound(samplers[0])


@pytest.mark.parametrize("step", [0, 1, 7, 23])
def test_resume_from_the_step_with_another_number_of_workers(atlas, corpus, step):
    root, _ = corpus
    ts = TokenSequences(atlas.AtlasDataset(root), 16)
    first = TokenShuffleSampler(ts, batch_size=4, num_workers=2, seed=5)
    first.set_epoch(2)
    whole = list(first.batches())
    state = first.state_dict()
    state["step"] = step
    later = TokenShuffleSampler(ts, batch_size=4, num_workers=3, seed=0)
    later.load_state_dict(state)
    assert later.lanes == 2 and later.seed == 5
    rest = list(later)
    assert rest == [k for keys in whole[step:] for k in keys]
    # and the state of a sampler that yielded some batches is where it stands
    it = iter(first)
    for _ in range(4 * 3):
        next(it)
    assert first.state_dict()["step"] == 3


def test_a_seq_len_change_mid_epoch_repeats_and_skips_nothing(atlas, corpus):
    root, _ = corpus
    ts = TokenSequences(atlas.AtlasDataset(root), 16)
    plain = TokenShuffleSampler(ts, batch_size=4, lanes=2, seed=2)
    change = 9
    curriculum = TokenShuffleSampler(
        ts, batch_size=4, lanes=2, seed=2, schedule=[(0, 16), (change, 40)]
    )
    before = list(plain.batches())
    after = list(curriculum.batches())
    assert after[:change] == before[:change]  # the order before the change is untouched
    assert all(sum(k[1::2]) == 40 for keys in after[change:] for k in keys)
    seen = _coverage(ts.num_tokens, after)
    assert seen.max() == 1
    assert (seen == 0).sum() <= _bound(curriculum)
    # Each lane goes on where it stood: a lane's tokens up to any step are a prefix of its
    # stream, the same with or without the change.
    for lane in range(2):
        stream = [k for t, keys in enumerate(before) if t % 2 == lane for k in keys]
        flat = np.concatenate(
            [np.arange(s, s + c) for k in stream for s, c in zip(k[::2], k[1::2])]
        )
        got = [k for t, keys in enumerate(after) if t % 2 == lane for k in keys]
        mine = np.concatenate([np.arange(s, s + c) for k in got for s, c in zip(k[::2], k[1::2])])
        n = min(len(flat), len(mine))
        np.testing.assert_array_equal(mine[:n], flat[:n])
    # Resuming after the change from the step alone.
    resumed = TokenShuffleSampler(
        ts, batch_size=4, lanes=2, seed=2, schedule=[(0, 16), (change, 40)]
    )
    resumed.set_step(change + 2)
    assert list(resumed) == [k for keys in after[change + 2 :] for k in keys]


def test_cu_seqlens_of_sampled_rows_split_at_their_ranges(atlas, corpus):
    root, docs = corpus
    ts = TokenSequences(atlas.AtlasDataset(root), 16, varlen=True)
    sampler = TokenShuffleSampler(ts, batch_size=4, lanes=1, piece_tokens=5)
    model = Model(docs)
    doc_starts = set(model.doc_starts.tolist())
    for keys in list(sampler.batches())[:10]:
        batch = ts.__getitems__(keys)
        want = {len(keys) * 16}
        for r, key in enumerate(keys):
            at = r * 16
            for s, c in zip(key[::2], key[1::2]):
                want.add(at)
                want.update(at + t - s for t in range(s, s + c) if t in doc_starts)
                at += c
        assert batch["cu_seqlens"].tolist() == sorted(want)


def _rows(loader) -> list:
    return [b["targets"].numpy().copy() for b in loader]


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")
@pytest.mark.parametrize("workers, start", [(0, None), (2, "fork"), (2, "spawn")])
def test_a_dataloader_reads_the_sampled_rows(atlas, corpus, workers, start):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from atlas_fast.tokens import collate

    root, docs = corpus
    ts = TokenSequences(atlas.AtlasDataset(root), 16)
    sampler = TokenShuffleSampler(ts, batch_size=4, num_workers=workers, seed=9)
    kwargs = {"num_workers": workers, "pin_memory": True}
    if workers:
        kwargs["multiprocessing_context"] = multiprocessing.get_context(start)
    loader = DataLoader(ts, batch_size=4, sampler=sampler, collate_fn=collate, **kwargs)
    model = Model(docs)
    got = list(loader)
    batches = list(sampler.batches())
    assert len(got) == len(batches)
    for batch, keys in zip(got, batches):
        assert isinstance(batch["targets"], torch.Tensor) and batch["targets"].shape == (4, 16)
        for r, key in enumerate(keys):
            want = model.ranges(list(zip(key[::2], key[1::2])))
            np.testing.assert_array_equal(batch["targets"][r].numpy(), want["targets"])
            np.testing.assert_array_equal(batch["inputs"][r].numpy(), want["inputs"])


def test_bad_arguments(atlas, corpus):
    root, _ = corpus
    ts = TokenSequences(atlas.AtlasDataset(root), 16)
    for kwargs in (
        {"batch_size": 0},
        {"batch_size": 2, "schedule": [(1, 16)]},
        {"batch_size": 2, "schedule": [(0, 16), (0, 8)]},
        {"batch_size": 2, "schedule": [(0, 0)]},
        {"batch_size": 2, "num_replicas": 2, "rank": 2},
        {"batch_size": 2, "lanes": 0},
    ):
        with pytest.raises(InvalidArgumentError):
            TokenShuffleSampler(ts, **kwargs)
    with pytest.raises(InvalidArgumentError):
        TokenShuffleSampler(
            TokenSequences(atlas.AtlasDataset(root), 16, packed=False), batch_size=2
        )
    sampler = TokenShuffleSampler(ts, batch_size=2)
    with pytest.raises(InvalidArgumentError):
        sampler.set_step(sampler.steps() + 1)
    with pytest.raises(InvalidArgumentError):
        sampler.load_state_dict({"epoch": 0, "step": 0, "batch_size": 3})


def test_reads_ahead_the_blocks_of_the_next_batches(atlas, backend, tmp_path, monkeypatch):
    """Read in this process (no workers), the sampler names the blocks of the batches ahead
    to the dataset (``prefetch``) before they are read, and the core decodes them ahead (the
    compiled core on its read-ahead thread: its jobs taken are counted; the Python core on
    its pool: a private name, since the pool is not observable otherwise). Rows unchanged."""
    import itertools

    docs = make_docs(4, 600, np.uint16, long=4)
    root = write_docs(tmp_path / "ds", docs, strategy=1, shard_size=200, block_size=20)
    with counted_read_ahead(backend, monkeypatch) as ahead:
        ds = atlas.AtlasDataset(root)
        ts = TokenSequences(ds, 16)
        named = []
        real_prefetch = ds.prefetch
        ds.prefetch = lambda indices: named.append(list(indices)) or real_prefetch(indices)
        sampler = TokenShuffleSampler(ts, batch_size=4, seed=1, group_pieces=6)
        batches = list(sampler.batches())
        model = Model(docs)
        before = ahead()
        it = iter(sampler)
        firsts = None
        for t, keys in enumerate(batches):
            got = list(itertools.islice(it, 4))
            assert got == keys
            if t == 0:
                firsts = ts._block_examples
                assert named, "no block named before the first batch was read"
            # every block this batch reads was named before it was read
            cum = np.asarray(ts._index.cum, dtype=np.int64)
            wanted = {int(np.searchsorted(cum, s, side="right") - 1) for k in keys for s in k[::2]}
            told = {b for call in named for b in np.searchsorted(firsts, call, side="right") - 1}
            assert wanted <= told, (t, wanted - told)
            batch = ts.__getitems__(got)
            for r, key in enumerate(keys):
                want = model.ranges(list(zip(key[::2], key[1::2])))
                np.testing.assert_array_equal(batch["targets"][r], want["targets"])
                np.testing.assert_array_equal(batch["inputs"][r], want["inputs"])
        assert ahead() - before >= len(cum) // 2, (ahead() - before, len(cum))
        # With workers the keys are read elsewhere: nothing is named here.
        named.clear()
        list(TokenShuffleSampler(ts, batch_size=4, seed=1, num_workers=2))
        assert named == []
