"""Compact batches (``TokenSequences(..., compact=True)``) and ``expand``: the stored tokens
and where each sequence starts, handed over in one buffer, rebuilt into exactly the rows a
plain ``TokenSequences`` gives. Every test runs against both backends (the ``atlas``
fixture)."""

from __future__ import annotations

import itertools
import multiprocessing
import pickle

import numpy as np
import pytest
from token_helpers import CASES, Model, make_docs, write_case, write_docs

from atlas_fast import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    MixtureDataset,
    TokenShuffleSampler,
)
from atlas_fast.tokens import TokenSequences, collate, expand


@pytest.fixture(scope="module", params=range(len(CASES)), ids=lambda k: f"s{CASES[k][0]}")
def case(request, tmp_path_factory):
    return write_case(tmp_path_factory.mktemp("compact"), request.param, 70 + request.param)


def _assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for key, value in want.items():
        if key == "max_seqlen":
            assert got[key] == value
            continue
        mine = np.asarray(got[key])
        assert mine.dtype == value.dtype, key
        np.testing.assert_array_equal(mine, value, err_msg=key)


def _keys(ts, seed: int) -> list:
    """Batches of window numbers, and of the range keys the sampler makes."""
    rng = np.random.default_rng(seed)
    batches = [rng.choice(len(ts), size=min(5, len(ts)), replace=False).tolist()]
    batches.append([len(ts) - 1, 0])
    sampler = TokenShuffleSampler(ts, batch_size=3, seed=seed)
    batches += list(itertools.islice(sampler.batches(), 4))
    return batches


@pytest.mark.parametrize("seq_len", [1, 2, 7, 64, 2048])
def test_expand_gives_the_rows_of_a_plain_token_sequences(atlas, case, seq_len):
    root, docs, field = case
    ds = atlas.AtlasDataset(root)
    plain = TokenSequences(ds, seq_len, field=field, varlen=True)
    compact = TokenSequences(ds, seq_len, field=field, compact=True)
    assert len(plain) >= 2  # every corpus holds two windows of the longest length
    model = Model(docs)
    windows = model.windows(seq_len)
    for keys in _keys(plain, seq_len):
        batch = compact.__getitems__(keys)
        assert batch["targets"].dtype == compact.dtype
        rows = expand(batch)
        for r, key in enumerate(keys):  # against the plain-numpy model too
            want = (
                {k: v[key] for k, v in windows.items()}
                if isinstance(key, int)
                else model.ranges(list(zip(key[::2], key[1::2])))
            )
            for name in ("targets", "inputs", "positions"):
                np.testing.assert_array_equal(rows[name][r], want[name])
        assert batch["starts"].dtype == np.int32 and batch["start_positions"].dtype == np.int64
        _assert_same(expand(batch, varlen=True), plain.__getitems__(keys))
        narrow = expand(batch, dtype=np.int32)
        assert narrow["inputs"].dtype == narrow["positions"].dtype == np.int32
        np.testing.assert_array_equal(narrow["targets"], plain.__getitems__(keys)["targets"])
    # One item: the batch of one key.
    item = compact[len(compact) // 2]
    assert item["targets"].shape == (seq_len,)


def test_the_seed_example_compact(atlas, tmp_path):
    root = write_docs(
        tmp_path / "ds", [np.array(d, np.uint16) for d in ([1, 2], [3, 4, 5], [6, 7, 8])]
    )
    batch = TokenSequences(atlas.AtlasDataset(root), 8, compact=True).__getitems__([0])
    assert batch["targets"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]
    assert batch["starts"].tolist() == [0, 2, 5]
    assert batch["start_inputs"].tolist() == [0, 0, 0]
    assert batch["start_positions"].tolist() == [0, 0, 0]
    row = expand(batch)
    assert row["inputs"].tolist() == [[0, 1, 0, 3, 4, 0, 6, 7]]
    assert row["positions"].tolist() == [[0, 1, 0, 1, 2, 0, 1, 2]]


def test_a_window_inside_a_document_starts_with_the_token_before_it(atlas, tmp_path):
    root = write_docs(tmp_path / "ds", [np.arange(10, 30, dtype=np.uint16)])
    ts = TokenSequences(atlas.AtlasDataset(root), 4, start_input=9, compact=True)
    batch = ts.__getitems__([2, (1, 2, 11, 2)])
    assert batch["targets"].tolist() == [[18, 19, 20, 21], [11, 12, 21, 22]]
    assert batch["starts"].tolist() == [0, 4, 6]
    assert batch["start_inputs"].tolist() == [17, 10, 20]
    assert batch["start_positions"].tolist() == [8, 1, 11]
    rows = expand(batch)
    assert rows["inputs"].tolist() == [[17, 18, 19, 20], [10, 11, 20, 21]]
    assert rows["positions"].tolist() == [[8, 9, 10, 11], [1, 2, 11, 12]]


def test_the_token_dtype_is_the_smallest_that_holds_the_ids(atlas, tmp_path):
    def dtype_of(tokens, **kwargs):
        root = write_docs(tmp_path / f"ds{len(list(tmp_path.iterdir()))}", [tokens])
        return TokenSequences(atlas.AtlasDataset(root), 2, compact=True, **kwargs).dtype

    assert dtype_of(np.arange(5, dtype=np.uint8)) == np.uint16
    assert dtype_of(np.array([0, 65535, 3], dtype=np.uint32)) == np.uint16
    assert dtype_of(np.array([0, 65536, 3], dtype=np.uint32)) == np.int32
    assert dtype_of(np.array([0, 5, 3], dtype=np.uint16), start_input=-1) == np.int32
    assert dtype_of(np.array([0, 2**31, 3], dtype=np.int64)) == np.int64
    assert dtype_of(np.array([0, 5, 3], dtype=np.uint16), dtype=np.int64) == np.int64
    # Without compact, the default stays int64, what torch's embedding takes.
    root = write_docs(tmp_path / "plain", [np.arange(5, dtype=np.uint8)])
    assert TokenSequences(atlas.AtlasDataset(root), 2).dtype == np.int64


def test_collate_keeps_a_compact_batch_and_expand_makes_tensors(atlas, case):
    torch = pytest.importorskip("torch")
    root, _, field = case
    ds = atlas.AtlasDataset(root)
    plain = TokenSequences(ds, 64, field=field, varlen=True)
    compact = TokenSequences(ds, 64, field=field, compact=True)
    for keys in _keys(plain, 3):
        batch = compact.__getitems__(keys)
        assert collate(batch) is batch  # numpy through a worker's pipe, no shared memory
        want = plain.__getitems__(keys)
        as_tensors = {k: torch.from_numpy(v) for k, v in batch.items()}
        for given in (batch, as_tensors):
            rows = expand(given, varlen=True, device="cpu")
            assert all(isinstance(rows[k], torch.Tensor) for k in rows if k != "max_seqlen")
            got = {k: v if k == "max_seqlen" else v.numpy() for k, v in rows.items()}
            _assert_same(got, want)
        rows = expand(as_tensors)  # tensors stay where they are
        assert isinstance(rows["inputs"], torch.Tensor)
        np.testing.assert_array_equal(rows["positions"].numpy(), want["positions"])
        assert expand(batch, dtype=torch.int32, device="cpu")["positions"].dtype == torch.int32
        assert expand(batch, dtype=torch.int32)["positions"].dtype == np.int32


@pytest.mark.parametrize("workers, start", [(0, None), (2, "fork"), (2, "spawn")])
def test_a_dataloader_hands_over_compact_batches(atlas, case, workers, start):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    root, docs, field = case
    ts = TokenSequences(atlas.AtlasDataset(root), 16, field=field, compact=True)
    sampler = TokenShuffleSampler(ts, batch_size=4, num_workers=workers, seed=5)
    kwargs = {"num_workers": workers}
    if workers:
        kwargs["multiprocessing_context"] = multiprocessing.get_context(start)
    loader = DataLoader(ts, batch_size=4, sampler=sampler, collate_fn=collate, **kwargs)
    model = Model(docs)
    batches = list(sampler.batches())
    got = list(loader)
    assert len(got) == len(batches)
    for batch, keys in zip(got, batches):
        assert isinstance(batch["targets"], np.ndarray)
        rows = expand(batch, device="cpu")
        assert isinstance(rows["targets"], torch.Tensor)
        for r, key in enumerate(keys):
            want = model.ranges(list(zip(key[::2], key[1::2])))
            for name in ("targets", "inputs", "positions"):
                np.testing.assert_array_equal(rows[name][r].numpy(), want[name])


def test_a_mixture_of_compact_sources(atlas, tmp_path):
    sources = {}
    for k, name in enumerate(("web", "code")):
        docs = make_docs(90 + k, 120, np.uint16, long=k)
        sources[name] = write_docs(tmp_path / name, docs, strategy=k, shard_size=50, block_size=6)

    def mixture(**kwargs):
        return MixtureDataset(
            {n: TokenSequences(atlas.AtlasDataset(r), 8, **kwargs) for n, r in sources.items()}
        )

    plain, compact = mixture(varlen=True), mixture(compact=True)
    keys = [("web", 3), ("code", (5, 4, 100, 4)), ("web", 0), ("code", 2)]
    _assert_same(expand(compact.__getitems__(keys), varlen=True), plain.__getitems__(keys))
    with pytest.raises(InvalidArgumentError, match="compact"):
        MixtureDataset(
            {
                "web": TokenSequences(atlas.AtlasDataset(sources["web"]), 8, compact=True),
                "code": TokenSequences(atlas.AtlasDataset(sources["code"]), 8, dtype=np.uint16),
            }
        )


def test_pickled_compact_sequences_stay_compact(atlas, case):
    root, _, field = case
    ts = TokenSequences(atlas.AtlasDataset(root), 7, field=field, compact=True)
    again = pickle.loads(pickle.dumps(ts))
    assert again.compact and again.dtype == ts.dtype
    _assert_same(again.__getitems__([1, 0]), ts.__getitems__([1, 0]))


def test_bad_arguments(atlas, tmp_path):
    root = write_docs(tmp_path / "ds", [np.arange(10, dtype=np.uint16)] * 3)
    ds = atlas.AtlasDataset(root)
    with pytest.raises(InvalidArgumentError, match="packed"):
        TokenSequences(ds, 4, packed=False, compact=True)
    with pytest.raises(InvalidArgumentError, match="expand"):
        TokenSequences(ds, 4, varlen=True, compact=True)
    with pytest.raises(InvalidArgumentTypeError):
        TokenSequences(ds, 4, compact="yes")
    with pytest.raises(InvalidArgumentError, match="outside dtype"):
        TokenSequences(ds, 4, compact=True, dtype=np.uint16, start_input=-1)
    plain = TokenSequences(ds, 4).__getitems__([0])
    with pytest.raises(InvalidArgumentError, match="compact batch"):
        expand(plain)
    with pytest.raises(InvalidArgumentError, match="compact batch"):
        expand([1, 2])
    # Starts that do not describe the rows: refused before anything is sized from them.
    good = TokenSequences(ds, 4, compact=True).__getitems__([0, 1])
    for starts in ([1, 4], [0, 4, 4], [0, 9], [-(10**12), 4], []):
        bad = dict(good, starts=np.array(starts, np.int64))
        n = len(starts)
        bad["start_inputs"] = np.zeros(n, good["start_inputs"].dtype)
        bad["start_positions"] = np.zeros(n, np.int64)
        with pytest.raises(InvalidArgumentError, match="starts"):
            expand(bad)
    with pytest.raises(InvalidArgumentError, match="start_inputs"):
        expand(dict(good, start_inputs=good["start_inputs"][:-1]))


def test_expand_edge_cases(atlas, case):
    torch = pytest.importorskip("torch")
    root, _, field = case
    ds = atlas.AtlasDataset(root)
    plain = TokenSequences(ds, 7, field=field)
    compact = TokenSequences(ds, 7, field=field, compact=True, pad_value=-100)  # unused
    keys = [3, 0, len(plain) - 1]
    batch, want = compact.__getitems__(keys), plain.__getitems__(keys)
    # One item: 1-D rows.
    for k in keys:
        _assert_same(expand(compact[k]), plain[k])
        got = expand(compact[k], device="cpu")
        np.testing.assert_array_equal(got["positions"].numpy(), plain[k]["positions"])
    # An empty batch.
    empty = compact.__getitems__([])
    _assert_same(expand(empty), plain.__getitems__([]))
    assert (
        tuple(expand(empty, device="cpu")["inputs"].shape) == plain.__getitems__([])["inputs"].shape
    )
    # Unsigned and narrow dtypes that hold the tokens, on both paths.
    wide = np.dtype(np.uint32) if compact.dtype.kind == "u" else np.dtype(np.int64)
    for dtype in (wide, np.int64):
        for device in (None, "cpu"):
            got = expand(batch, dtype=dtype, device=device)
            for name in ("targets", "inputs"):
                mine = got[name] if device is None else got[name].numpy()
                assert mine.dtype == dtype
                np.testing.assert_array_equal(mine, want[name])
    # Arrays a user made, not C-ordered: the same rows.
    fortran = {k: np.asfortranarray(v) for k, v in batch.items()}
    _assert_same(expand(fortran), want)
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}
    tensors["targets"] = tensors["targets"].t().contiguous().t()  # transposed strides
    got = expand(tensors)
    np.testing.assert_array_equal(got["inputs"].numpy(), want["inputs"])
    # The batch is not changed, and the rows do not share its memory.
    before = batch["targets"].copy()
    rows = expand(tensors)
    rows["targets"][...] = 0
    np.testing.assert_array_equal(tensors["targets"].numpy(), before)
    # A dtype that cannot hold the tokens, or is not an integer: refused.
    for bad in (np.float32, np.int8 if compact.dtype != np.int8 else np.bool_):
        with pytest.raises(InvalidArgumentError, match="dtype"):
            expand(batch, dtype=bad)
    with pytest.raises(InvalidArgumentError, match="dtype"):
        expand(batch, dtype=torch.float32, device="cpu")


def test_arguments_are_checked_before_the_dataset_is_opened(tmp_path):
    missing = tmp_path / "nothing here"
    with pytest.raises(InvalidArgumentError, match="start_input"):
        TokenSequences(missing, 4, dtype=np.uint16, start_input=-1, compact=True)
    with pytest.raises(InvalidArgumentError, match="pad_value"):
        TokenSequences(missing, 4, dtype=np.uint16, pad_value=-1, packed=False)
