"""Mixtures of token sources: MixtureDataset/MixtureSampler over packed TokenSequences.

Exact token proportions per global batch, each source read in the token order of
TokenShuffleSampler (every token at most once per pass, nothing repeated or skipped across a
seq_len change), resume at random steps, and the same stream whatever the number of workers
or ranks. Both backends."""

from __future__ import annotations

import multiprocessing
import pickle

import numpy as np
import pytest
from token_helpers import Model, make_docs, write_docs

from atlas_fast import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    MixtureDataset,
    MixtureSampler,
    TokenSequences,
    TokenShuffleSampler,
)
from atlas_fast.mix import _token_seed, from_config

SEQ = 16
SIZES = {"web": 400, "code": 160, "books": 60}  # documents; books is read pass after pass


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    base = tmp_path_factory.mktemp("mixtok")
    out = {}
    for k, (name, n) in enumerate(SIZES.items()):
        docs = make_docs(40 + k, n, np.uint16, long=1 if name == "code" else 0)
        write_docs(base / name, docs, strategy=k % 4, shard_size=70, block_size=7)
        out[name] = (base / name, Model(docs))
    return out


def _mixture(atlas, corpora, seq_len=SEQ, **kwargs):
    return MixtureDataset(
        {
            n: TokenSequences(atlas.AtlasDataset(root), seq_len, **kwargs)
            for n, (root, _) in corpora.items()
        }
    )


def _tokens(key) -> np.ndarray:
    """The token numbers (in its source's concatenation) of a row's key."""
    return np.concatenate([np.arange(s, s + c) for s, c in zip(key[::2], key[1::2])])


def _check_rows(batch, keys, corpora) -> None:
    for r, (name, key) in enumerate(keys):
        want = corpora[name][1].ranges(list(zip(key[::2], key[1::2])))
        for field in ("targets", "inputs", "positions"):
            np.testing.assert_array_equal(np.asarray(batch[field][r]), want[field])


WEIGHTS = {"web": 0.5, "code": 0.25, "books": 0.25}


def test_a_global_batch_holds_the_exact_tokens_of_each_source(atlas, corpora):
    mixture = _mixture(atlas, corpora)
    sampler = MixtureSampler(mixture, WEIGHTS, global_batch_size=8, seed=1)
    keys = sampler.epoch_indices()
    assert len(keys) == len(sampler) and len(keys) % 8 == 0
    for t in range(0, len(keys), 8):
        step = keys[t : t + 8]
        tokens = {n: sum(sum(k[1::2]) for m, k in step if m == n) for n in SIZES}
        assert tokens == {"web": 4 * SEQ, "code": 2 * SEQ, "books": 2 * SEQ}
    for t in (0, 8, len(keys) - 8):
        step = keys[t : t + 8]
        batch = mixture.__getitems__(step)
        assert set(batch) == {"inputs", "targets", "positions"}
        assert batch["targets"].shape == (8, SEQ) and batch["targets"].dtype == np.int64
        _check_rows(batch, step, corpora)
    assert (
        mixture[keys[3]]["targets"].tolist()
        == mixture.__getitems__([keys[3]])["targets"][0].tolist()
    )


def test_proportions_that_are_not_whole_rows_never_drift_by_a_row(atlas, corpora):
    mixture = _mixture(atlas, corpora)
    weights = {"web": 0.6, "code": 0.3, "books": 0.1}
    sampler = MixtureSampler(mixture, weights, global_batch_size=8, seed=0)
    keys = sampler.epoch_indices()
    rows = dict.fromkeys(SIZES, 0)
    for t in range(0, len(keys), 8):
        for name, key in keys[t : t + 8]:
            rows[name] += 1
            assert sum(key[1::2]) == SEQ
        done = t // 8 + 1
        for name, w in weights.items():
            exact = w * 8 * done * SEQ  # tokens
            assert abs(rows[name] * SEQ - exact) < SEQ  # within one row


def _passes(rows: list, tokens: int) -> list:
    """The rows of one source in order, grouped by pass: a row that would run past the
    pass's end starts the next (a plain model of the rule)."""
    out, offset = [[]], 0
    for key in rows:
        n = sum(key[1::2])
        if offset + n > tokens:
            out.append([])
            offset = 0
        out[-1].append(key)
        offset += n
    return out


CURRICULUM = [(0, SEQ), (9, 40), (20, 8)]


@pytest.mark.parametrize("seq_lens, pieces", [(None, None), (CURRICULUM, None), (CURRICULUM, 40)])
def test_each_source_is_read_in_the_token_order_of_token_shuffle_sampler(
    atlas, corpora, seq_lens, pieces
):
    mixture = _mixture(atlas, corpora)
    sampler = MixtureSampler(
        mixture,
        WEIGHTS,
        global_batch_size=8,
        seed=3,
        seq_len_schedule=seq_lens,
        piece_tokens=pieces,
    )
    keys = sampler.epoch_indices() + sampler.epoch_indices(epoch=1)
    lengths = dict(seq_lens or [(0, SEQ)])
    for t in range(0, len(keys), 8):  # every row of a step has the step's length
        length = [v for s, v in sorted(lengths.items()) if s <= t // 8][-1]
        assert {sum(k[1::2]) for _, k in keys[t : t + 8]} == {length}
    for name in SIZES:
        ts = mixture.sources[name]
        rows = [k for n, k in keys if n == name]
        assert rows == sampler.source_order(name, 0, len(rows))
        passes = _passes(rows, ts.num_tokens)
        if name == "books":
            assert len(passes) >= 3  # a small source is read pass after pass
        order = sampler._token_source(name).order
        # The pass's stream: one row of all its tokens, from an independent sampler.
        alone = TokenShuffleSampler(
            ts,
            batch_size=1,
            lanes=1,
            seed=_token_seed(3, name),
            piece_tokens=order.piece_tokens,
            group_pieces=order.group_pieces,
            schedule=[(0, ts.num_tokens)],
        )
        assert order.piece_tokens == (pieces or lengths[0])
        for e, got in enumerate(passes):
            stream = _tokens(next(alone.batches(epoch=e))[0])
            flat = np.concatenate([_tokens(k) for k in got])
            np.testing.assert_array_equal(flat, stream[: len(flat)])  # at most once each
            if e + 1 < len(passes):  # a pass ends when the next row does not fit
                nxt = sum(passes[e + 1][0][1::2])
                assert ts.num_tokens - nxt < len(flat) <= ts.num_tokens
        # The rows read the tokens the model has.
        batch = ts.__getitems__(rows[:5]) if len({sum(k[1::2]) for k in rows[:5]}) == 1 else None
        if batch is not None:
            for r, key in enumerate(rows[:5]):
                want = corpora[name][1].ranges(list(zip(key[::2], key[1::2])))
                np.testing.assert_array_equal(batch["targets"][r], want["targets"])


def test_a_seq_len_change_leaves_the_steps_before_it_as_they_were(atlas, corpora):
    mixture = _mixture(atlas, corpora)
    plain = MixtureSampler(mixture, WEIGHTS, global_batch_size=8, seed=2)
    change = MixtureSampler(
        mixture, WEIGHTS, global_batch_size=8, seed=2, seq_len_schedule=[(0, SEQ), (11, 24)]
    )
    a, b = plain.epoch_indices(), change.epoch_indices()
    assert b[: 11 * 8] == a[: 11 * 8]
    # From the change on, each source goes on where it stood in its token stream.
    for name in SIZES:
        before = np.concatenate([_tokens(k) for n, k in a if n == name])
        after = np.concatenate([_tokens(k) for n, k in b if n == name])
        # Rows of at most 24 tokens starting before total - 24 are all in the first pass.
        n = min(len(before), len(after), mixture.sources[name].num_tokens - 24)
        assert n > 40
        np.testing.assert_array_equal(after[:n], before[:n])


def test_resume_at_random_steps_with_a_schedule_and_other_ranks(atlas, corpora):
    mixture = _mixture(atlas, corpora)
    schedule = [(0, {"web": 0.75, "code": 0.25}), (6, WEIGHTS)]
    seq_lens = [(0, SEQ), (10, 24)]

    def make(**kwargs):
        return MixtureSampler(
            mixture,
            schedule=schedule,
            global_batch_size=8,
            seed=4,
            seq_len_schedule=seq_lens,
            **kwargs,
        )

    fresh = make()
    whole = fresh.epoch_indices()
    steps = len(whole) // 8
    rng = np.random.default_rng(0)
    for step in sorted({*rng.integers(1, steps, 5).tolist(), 6, 10}):
        state = fresh.state_dict(step=step)
        # A sampler made without the schedules adopts them (and the seed) from the state.
        resumed = MixtureSampler(mixture, schedule[0][1], global_batch_size=8, seed=0)
        resumed.load_state_dict(state)
        assert list(resumed) == whole[step * 8 :]
        assert resumed.seq_len_schedule == tuple(seq_lens)
        # On two ranks from the same state: each takes its half of every global batch.
        halves = []
        for rank in range(2):
            r = make(num_replicas=2, rank=rank)
            r.load_state_dict(state)
            halves.append(list(r))
        together = [k for t in range(0, len(halves[0]), 4) for h in halves for k in h[t : t + 4]]
        assert together == whole[step * 8 :]


def test_the_stream_is_the_same_for_any_world_size(atlas, corpora):
    mixture = _mixture(atlas, corpora)
    one = MixtureSampler(mixture, WEIGHTS, global_batch_size=8, seed=5).epoch_indices()
    for world in (2, 4):
        shares = [
            MixtureSampler(
                mixture, WEIGHTS, global_batch_size=8, seed=5, num_replicas=world, rank=r
            ).epoch_indices()
            for r in range(world)
        ]
        b = 8 // world
        together = [k for t in range(0, len(shares[0]), b) for s in shares for k in s[t : t + b]]
        assert together == one


@pytest.mark.parametrize("workers, start", [(0, None), (2, "fork")])
def test_a_dataloader_reads_the_mixture_with_any_workers(atlas, corpora, workers, start):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from atlas_fast.tokens import collate

    mixture = _mixture(atlas, corpora)
    sampler = MixtureSampler(mixture, WEIGHTS, global_batch_size=8, seed=6)
    # Blocks reserved in each source's cache when the sampler is made: the workers copy that.
    for ts in mixture.sources.values():
        assert pickle.loads(pickle.dumps(ts.dataset))._pickled_state()["cache_reserved"] > 2
    kwargs = {"num_workers": workers}
    if workers:
        kwargs["multiprocessing_context"] = multiprocessing.get_context(start)
    loader = DataLoader(
        mixture, batch_size=sampler.batch_size, sampler=sampler, collate_fn=collate, **kwargs
    )
    keys = sampler.epoch_indices()
    got = list(loader)
    assert len(got) == len(keys) // 8
    for t, batch in enumerate(got):
        assert isinstance(batch["targets"], torch.Tensor)
        assert batch["targets"].shape == (8, SEQ)
        if t % 5 == 0:
            _check_rows({f: v.numpy() for f, v in batch.items()}, keys[8 * t : 8 * t + 8], corpora)
    # Stopped after some steps, resumed from the training step with another number of workers.
    state = sampler.state_dict(step=7)
    resumed = MixtureSampler(mixture, WEIGHTS, global_batch_size=8, seed=6)
    resumed.load_state_dict(state)
    loader = DataLoader(
        mixture, batch_size=8, sampler=resumed, collate_fn=collate, num_workers=2 - workers
    )
    rest = [b["targets"].numpy() for b in loader]
    assert len(rest) == len(got) - 7
    for a, b in zip(rest, got[7:]):
        np.testing.assert_array_equal(a, b["targets"].numpy())


def test_varlen_gives_cu_seqlens_of_the_whole_batch(atlas, corpora):
    mixture = _mixture(atlas, corpora, varlen=True)
    sampler = MixtureSampler(
        mixture, WEIGHTS, global_batch_size=8, seed=7, seq_len_schedule=[(0, 40)]
    )
    keys = sampler.epoch_indices()
    for t in (0, 8, 24):
        step = keys[t : t + 8]
        batch = mixture.__getitems__(step)
        want = [0]
        for r, (name, key) in enumerate(step):  # each row alone, from its source
            cu = mixture.sources[name].__getitems__([key])["cu_seqlens"]
            want += (cu[1:] + r * 40).tolist()
        assert batch["cu_seqlens"].tolist() == want
        assert batch["cu_seqlens"].dtype == np.int32
        assert batch["max_seqlen"] == int(np.diff(want).max())


def test_weights_changed_during_training_and_from_plain_data(atlas, corpora):
    mixture = _mixture(atlas, corpora)
    staged = MixtureSampler(
        mixture,
        schedule=[(0, {"web": 0.75, "code": 0.25}), (5, WEIGHTS)],
        global_batch_size=8,
        seed=8,
        seq_len_schedule=[(0, SEQ), (3, 8)],
    )
    live = MixtureSampler(
        mixture,
        {"web": 0.75, "code": 0.25},
        global_batch_size=8,
        seed=8,
        seq_len_schedule=[(0, SEQ), (3, 8)],
    )
    it = iter(live)
    head = [next(it) for _ in range(8 * 2)]  # two steps handed out
    live.set_weights(WEIGHTS, at_step=5)
    rest = list(it)
    assert head + rest == staged.epoch_indices()
    config = staged.config()
    assert config["unit"] == "tokens" and config["seq_len_schedule"] == [[0, SEQ], [3, 8]]
    config["sources"] = {n: str(root) for n, (root, _) in corpora.items()}
    again, sampler = from_config(
        config, open_dataset=lambda p: TokenSequences(atlas.AtlasDataset(p), SEQ)
    )
    assert again.token_rows and again.names == tuple(SIZES)
    assert sampler.epoch_indices() == staged.epoch_indices()


def test_max_repeats_counts_passes_over_the_tokens(atlas, corpora):
    mixture = _mixture(atlas, corpora)
    books = mixture.sources["books"].num_tokens
    # books at half of every batch of 8 rows: 4 rows of SEQ tokens a step.
    steps = 3 * books // (4 * SEQ) + 1

    def capped(cap):
        return MixtureSampler(
            mixture,
            {"web": 1, "books": 1},
            global_batch_size=8,
            max_repeats={"books": cap},
            total_steps=steps,
        )

    with pytest.raises(ValueError, match=r"'books' \(\d+ tokens\) would be read 3\.0"):
        capped(3)
    assert capped(4).consumed(steps)["books"] == 4 * steps  # rows


def test_bad_token_mixtures_are_refused(atlas, corpora, tmp_path):
    (web, _), (code, _) = corpora["web"], corpora["code"]
    ts = TokenSequences(atlas.AtlasDataset(web), SEQ)
    with pytest.raises(InvalidArgumentTypeError, match="'code' is not a TokenSequences"):
        MixtureDataset({"web": ts, "code": atlas.AtlasDataset(code)})
    with pytest.raises(InvalidArgumentError, match=r"'code'.*packed=False"):
        MixtureDataset(
            {"web": ts, "code": TokenSequences(atlas.AtlasDataset(code), SEQ, packed=False)}
        )
    with pytest.raises(InvalidArgumentError, match="'code' has dtype=dtype\\('int32'\\)"):
        MixtureDataset(
            {"web": ts, "code": TokenSequences(atlas.AtlasDataset(code), SEQ, dtype=np.int32)}
        )
    with pytest.raises(InvalidArgumentError, match="varlen"):
        MixtureDataset(
            {"web": ts, "code": TokenSequences(atlas.AtlasDataset(code), SEQ, varlen=True)}
        )
    differ = MixtureDataset({"web": ts, "code": TokenSequences(atlas.AtlasDataset(code), 8)})
    with pytest.raises(InvalidArgumentError, match="seq_len differ"):
        MixtureSampler(differ, {"web": 1, "code": 1}, global_batch_size=4)
    sampler = MixtureSampler(
        differ, {"web": 1, "code": 1}, global_batch_size=4, seq_len_schedule=[(0, 12)]
    )
    assert {sum(k[1::2]) for _, k in sampler.epoch_indices(stop=40)} == {12}
    mixture = MixtureDataset({"web": ts})
    for kwargs, error in (
        ({"unit": "examples"}, InvalidArgumentError),
        ({"tokens": {"web": 10}}, InvalidArgumentError),
        ({"seq_len_schedule": [(1, 8)]}, InvalidArgumentError),
        ({"seq_len_schedule": [(0, 8), (0, 16)]}, InvalidArgumentError),
        ({"seq_len_schedule": [(0, 10**9)]}, InvalidArgumentError),
    ):
        with pytest.raises(error):
            MixtureSampler(mixture, {"web": 1}, global_batch_size=4, **kwargs)
    with pytest.raises(InvalidArgumentError, match="seq_len_schedule and piece_tokens are for"):
        MixtureSampler(
            MixtureDataset({"code": atlas.AtlasDataset(code)}),
            {"code": 1},
            global_batch_size=4,
            seq_len_schedule=[(0, 8)],
        )
    # Keys: rows of one length per batch, names the mixture has.
    keys = MixtureSampler(mixture, {"web": 1}, global_batch_size=4).epoch_indices(stop=4)
    with pytest.raises(InvalidArgumentError, match="one length"):
        mixture.__getitems__([keys[0], ("web", (0, 3))])
    with pytest.raises(KeyError, match="no source named 'nope'"):
        mixture.__getitems__([("nope", (0, SEQ))])
    with pytest.raises(InvalidArgumentTypeError):
        mixture.__getitems__([("web", (0, SEQ), 1)])
    # A window number reads as the source's window.
    np.testing.assert_array_equal(mixture[1]["targets"], ts[1]["targets"])
    np.testing.assert_array_equal(mixture[("web", 1)]["targets"], ts[1]["targets"])
