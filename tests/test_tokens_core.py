"""The token gather of both cores: the compiled one (a scan of the block's pickle, tokens
copied in C) and the numpy twin give the same rows on every form a block of token documents
takes; the compiled one reads the common forms without unpickling (a private counter of the
blocks it hands to the twin says so: the test is about that core)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from token_helpers import Model, assert_rows, make_docs

import atlas_fast
from atlas_fast import NotTokensError
from atlas_fast._core import _reader_py
from atlas_fast.tokens import TokenSequences

compiled = None
if atlas_fast.BACKEND == "cython":
    compiled = pytest.importorskip("atlas_fast._core._reader")


def _write_blocks(root, blocks, protocol, strategy=0, block_size=None):
    """A one-shard dataset of ``blocks`` (lists of examples), each pickled with ``protocol``."""
    block_size = block_size or max(len(b) for b in blocks)
    with atlas_fast.AtlasDatasetWriter(
        root, shard_size=10**6, block_size=block_size, compression_strategy=strategy
    ) as w:
        shard = w.current_shard
        for b in blocks:
            shard.add_pickled_block(pickle.dumps(b, protocol=protocol), len(b))
        w._tokens = None  # examples added as blocks: the index is built on first use
    return root


def _forms(seed):
    """Documents in every form the scanner follows, and some it hands to the twin."""
    rng = np.random.default_rng(seed)
    base = make_docs(seed, 30, np.uint16, long=1)
    shared = rng.integers(0, 500, 7).astype(np.int32)
    docs = [
        *base[:6],
        np.array([], np.uint8),
        rng.integers(0, 255, 9).astype(np.uint8),
        rng.integers(-(2**40), 2**40, 5),  # int64, negative ids too
        rng.integers(0, 2**31, 6).astype(">u4"),  # big-endian
        np.arange(20, dtype=np.int16)[::3],  # not contiguous: another pickle form
        shared,
        shared,  # the same array twice: the second is a memo reference
        [1, 2, 300, 70000, 2**33, -5, 0],  # a list of ints, every int opcode
        list(range(2500)),  # over 1000 items: several APPENDS
        [],
        *base[6:],
    ]
    return docs


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("wrap", [None, "dict"])
def test_both_cores_read_every_form_alike(tmp_path, protocol, wrap):
    docs = _forms(protocol)
    field = "ids" if wrap else None
    examples = [{"ids": d, "n": 1} for d in docs] if wrap else docs
    blocks = [examples[k : k + 7] for k in range(0, len(examples), 7)]
    root = _write_blocks(tmp_path / "ds", blocks, protocol, strategy=1, block_size=7)
    model = Model(docs)
    before = compiled._token_scan_fallbacks() if compiled else 0
    results = []
    for module in ([atlas_fast.atlas] if compiled else []) + [atlas_fast._python]:
        ds = module.AtlasDataset(root)
        for seq_len in (1, 7, 64):
            ts = TokenSequences(ds, seq_len, field=field, index="rebuild", progress=False)
            got = ts.__getitems__(list(range(len(ts))))
            assert_rows(got, model.windows(seq_len))
            results.append(got)
        docs_ts = TokenSequences(ds, 16, field=field, packed=False)
        assert_rows(docs_ts.__getitems__(list(range(len(docs)))), model.documents(16))
    if compiled:
        fallbacks = compiled._token_scan_fallbacks() - before
        # numpy arrays pickled with protocol 2 carry their data as latin-1 text: the twin's
        if protocol >= 3:
            assert fallbacks == 0
        else:
            assert fallbacks > 0


@pytest.mark.skipif(compiled is None, reason="the compiled core is not built")
@pytest.mark.parametrize(
    "bad",
    [
        "text",
        np.array([1.5]),
        np.zeros((2, 2), np.int32),
        [1, True],
        [1, 2.0],
        np.array([2**63], np.uint64),
        {"ids": np.arange(3)},
        np.array([True]),
    ],
)
def test_what_the_scanner_does_not_follow_is_the_twins_to_refuse(tmp_path, bad):
    blocks = [[np.arange(4), bad, np.arange(3)]]
    root = _write_blocks(tmp_path / "ds", blocks, 4)
    for module in (atlas_fast.atlas, atlas_fast._python):
        with pytest.raises(NotTokensError, match="example 1"):
            TokenSequences(module.AtlasDataset(root), 2, progress=False)


@pytest.mark.skipif(compiled is None, reason="the compiled core is not built")
def test_output_dtypes_convert_alike(tmp_path):
    docs = make_docs(11, 200, np.uint16, long=2)
    root = _write_blocks(tmp_path / "ds", [docs[k : k + 10] for k in range(0, 200, 10)], 4)
    with pytest.raises(atlas_fast.InvalidArgumentError, match="do not fit"):
        TokenSequences(atlas_fast._python.AtlasDataset(root), 33, dtype=np.int16)
    for dtype in (np.int64, np.int32, np.uint16, np.uint32):
        rows = [
            TokenSequences(m.AtlasDataset(root), 33, dtype=dtype, progress=False).__getitems__(
                list(range(50))
            )
            for m in (atlas_fast.atlas, atlas_fast._python)
        ]
        for key in rows[0]:
            assert rows[0][key].dtype == rows[1][key].dtype
            np.testing.assert_array_equal(rows[0][key], rows[1][key])


def test_the_twin_is_the_python_cores():
    assert atlas_fast._python.AtlasDataset._backend.gather_tokens is _reader_py.gather_tokens


def test_token_pieces_cut_ranges_at_blocks(atlas):
    """``token_pieces``: each range of the concatenation cut at block ends (blocks without a
    token passed over), the blocks read ascending, each piece naming its block's slot; the
    compiled core's against this plain model, on random block tables and ranges."""
    token_pieces = atlas.AtlasDataset._backend.token_pieces
    rng = np.random.default_rng(7)
    for _ in range(400):
        counts = rng.integers(0, 5, int(rng.integers(1, 9)))
        counts[rng.random(len(counts)) < 0.3] = 0
        cum = np.concatenate(([0], np.cumsum(counts))).astype(np.uint64)
        total = int(cum[-1])
        if not total:
            continue
        starts = rng.integers(0, total, int(rng.integers(0, 6)))
        lengths = np.array([rng.integers(0, total - s + 1) for s in starts], dtype=np.int64)
        out = rng.integers(0, 100, len(starts))
        blocks, pieces = token_pieces(cum, starts, lengths, out)
        want = []
        for s, c, o in zip(starts.tolist(), lengths.tolist(), out.tolist()):
            for t in range(s, s + c):
                g = int(np.searchsorted(cum, t, side="right")) - 1
                if t > s and want[-1][0] == g:
                    want[-1][2] += 1
                else:
                    want.append([g, t - int(cum[g]), 1, o + t - s])
        assert blocks.tolist() == sorted({w[0] for w in want})
        got = [[int(blocks[p[0]]), *p[1:]] for p in pieces.tolist()]
        assert got == want
    with pytest.raises(IndexError):
        token_pieces(np.array([0, 4], dtype=np.uint64), [3], [2], [0])
