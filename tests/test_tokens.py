"""TokenSequences: windows and documents against a plain-numpy model, the token index, bad
input. Every test runs against both backends (the ``atlas`` fixture)."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
from token_helpers import CASES, Model, assert_rows, make_docs, write_case, write_docs

from atlas_fast import AtlasFormatError, InvalidArgumentError, NotTokensError, TokenIndexError
from atlas_fast import _token_index as ti
from atlas_fast.tokens import TokenSequences

SEQ_LENS = [1, 2, 7, 64, 2048]


@pytest.fixture(scope="module", params=range(len(CASES)), ids=lambda k: f"s{CASES[k][0]}")
def case(request, tmp_path_factory):
    return write_case(tmp_path_factory.mktemp("tokens"), request.param, request.param)


@pytest.mark.parametrize("seq_len", SEQ_LENS)
def test_every_window_matches_the_model(atlas, case, seq_len):
    root, docs, field = case
    ts = TokenSequences(atlas.AtlasDataset(root), seq_len, field=field)
    model = Model(docs)
    want = model.windows(seq_len)
    assert len(ts) == len(model.tokens) // seq_len == len(want["targets"])
    assert ts.num_tokens == len(model.tokens)
    got = ts.__getitems__(list(range(len(ts))))
    assert_rows(got, want)
    assert got["targets"].dtype == np.int64 and got["targets"].flags.c_contiguous
    for k in {0, len(ts) // 2, len(ts) - 1, -1}:  # single items are the batch's rows
        row = ts[k]
        for key in want:
            np.testing.assert_array_equal(row[key], got[key][k])


@pytest.mark.parametrize("seq_len", [1, 7, 2048])
def test_documents_not_packed_match_the_model(atlas, case, seq_len):
    root, docs, field = case
    ts = TokenSequences(atlas.AtlasDataset(root), seq_len, field=field, packed=False, pad_value=3)
    want = Model(docs).documents(seq_len, pad=3)
    assert len(ts) == len(docs)
    order = np.random.default_rng(seq_len).permutation(len(docs)).tolist()
    got = ts.__getitems__(order)
    assert_rows(got, {k: v[order] for k, v in want.items()})
    assert got["mask"].dtype == bool


def test_the_seed_example(atlas, tmp_path):
    root = write_docs(
        tmp_path / "ds", [np.array(d, np.uint16) for d in ([1, 2], [3, 4, 5], [6, 7, 8])]
    )
    row = TokenSequences(atlas.AtlasDataset(root), 8)[0]
    assert row["inputs"].tolist() == [0, 1, 0, 3, 4, 0, 6, 7]
    assert row["targets"].tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert row["positions"].tolist() == [0, 1, 0, 1, 2, 0, 1, 2]


def test_start_input_dtype_and_ranges_of_keys(atlas, tmp_path):
    docs = make_docs(5, 80, np.uint16, long=1)
    root = write_docs(tmp_path / "ds", docs, strategy=1, shard_size=30, block_size=4)
    ts = TokenSequences(atlas.AtlasDataset(root), 5, start_input=7, dtype=np.int32)
    model = Model(docs, start_input=7)
    batch = ts.__getitems__([3, 0])
    assert batch["targets"].dtype == np.int32 and batch["positions"].dtype == np.int32
    assert_rows(batch, {k: v[[3, 0]] for k, v in model.windows(5).items()})
    # A key of ranges (what TokenShuffleSampler yields): any ranges, one row length.
    n = ts.num_tokens
    keys = [(n - 3, 3, 0, 2), (10, 5), (40, 1, 100, 1, 7, 3)]
    batch = ts.__getitems__(keys)
    for r, key in enumerate(keys):
        want = model.ranges(list(zip(key[::2], key[1::2])))
        for name in want:
            np.testing.assert_array_equal(batch[name][r], want[name])
    with pytest.raises(InvalidArgumentError):
        ts.__getitems__([(0, 5), (0, 4)])
    with pytest.raises(IndexError):
        ts.__getitems__([(n - 2, 5)])
    with pytest.raises(IndexError):
        ts[len(ts)]


def test_cu_seqlens_follow_document_and_row_boundaries(atlas, case):
    root, docs, field = case
    ts = TokenSequences(atlas.AtlasDataset(root), 64, field=field, varlen=True)
    model = Model(docs)
    keys = [5, 2, len(ts) - 1]
    batch = ts.__getitems__(keys)
    starts = set()
    for r, k in enumerate(keys):
        lo = k * 64
        starts.add(r * 64)
        for s in model.doc_starts:
            if lo <= s < lo + 64:
                starts.add(r * 64 + int(s - lo))
    starts.add(3 * 64)
    assert batch["cu_seqlens"].dtype == np.int32
    assert batch["cu_seqlens"].tolist() == sorted(starts)
    assert batch["max_seqlen"] == int(np.diff(sorted(starts)).max())


# -- the index ----------------------------------------------------------------------------------


def test_writer_writes_the_index_and_the_reference_reads_the_dataset(tmp_path):
    torch_atlas_ds = pytest.importorskip("torch_atlas_ds")
    docs = make_docs(1, 120, np.uint16)
    root = write_docs(tmp_path / "ds", docs, strategy=2, shard_size=40, block_size=5)
    assert (root / "tokens.idx").is_file()
    index = ti.TokenIndex(root / "tokens.idx")
    assert index.field is None and index.total == sum(len(d) for d in docs)
    assert len(index.shards) == 3 and len(index.cum) == 3 * 8 + 1
    ref = torch_atlas_ds.AtlasDataset(str(root))
    assert len(ref) == len(docs)
    assert all(np.array_equal(ref[i], docs[i]) for i in range(len(docs)))
    # Not for other examples (automatic), nor when told not to.
    write_docs(tmp_path / "text", [f"doc {i}" for i in range(10)])
    assert not (tmp_path / "text" / "tokens.idx").exists()
    write_docs(tmp_path / "off", docs, token_index=False)
    assert not (tmp_path / "off" / "tokens.idx").exists()
    write_docs(tmp_path / "f", docs, wrap=lambda d: {"ids": d}, token_field="ids")
    assert ti.TokenIndex(tmp_path / "f" / "tokens.ids.idx").field == "ids"
    with pytest.raises(NotTokensError), pytest.warns(RuntimeWarning, match="incomplete"):
        write_docs(tmp_path / "bad", ["text"], token_index=True)


def test_index_built_cached_and_reused(atlas, tmp_path, monkeypatch):
    docs = make_docs(2, 150, np.uint16, long=1)
    root = write_docs(
        tmp_path / "ds", docs, strategy=1, shard_size=50, block_size=6, token_index=False
    )
    assert not (root / "tokens.idx").exists()
    ts = TokenSequences(atlas.AtlasDataset(root), 16, progress=False)
    assert ts.index_path == root / "tokens.idx"  # built, saved beside the dataset
    assert_rows(ts.__getitems__(list(range(len(ts)))), Model(docs).windows(16))
    written = ti.TokenIndex(root / "tokens.idx")
    made = write_docs(tmp_path / "again", docs, strategy=1, shard_size=50, block_size=6)
    assert (root / "tokens.idx").read_bytes() == (made / "tokens.idx").read_bytes()
    assert written.total == ts.num_tokens

    def no_build(*args, **kwargs):
        raise AssertionError("rebuilt")

    monkeypatch.setattr(ti, "build_entries", no_build)
    again = TokenSequences(atlas.AtlasDataset(root), 3)
    assert again.num_tokens == ts.num_tokens
    copy = pickle.loads(pickle.dumps(again))
    assert_rows(
        copy.__getitems__([0, 5]), {k: v[[0, 5]] for k, v in Model(docs).windows(3).items()}
    )


def test_index_in_the_user_cache_when_the_root_is_not_writable(atlas, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    docs = make_docs(3, 60, np.uint8)
    root = write_docs(tmp_path / "ds", docs, token_index=False)
    real = ti.writable_dir
    monkeypatch.setattr(ti, "writable_dir", lambda p: p != root and real(p))
    ts = TokenSequences(atlas.AtlasDataset(root), 4)
    assert ts.index_path == ti.cache_folder(root) / "tokens.idx"
    assert str(ts.index_path).startswith(str(tmp_path / "cache" / "atlas-fast" / "tokens"))
    assert not (root / "tokens.idx").exists()
    assert_rows(ts.__getitems__([0, 1]), {k: v[:2] for k, v in Model(docs).windows(4).items()})
    monkeypatch.setattr(ti, "build_entries", lambda *a, **k: pytest.fail("rebuilt"))
    assert TokenSequences(atlas.AtlasDataset(root), 4).index_path == ts.index_path


def test_a_rewritten_shard_is_an_error_never_other_tokens(atlas, tmp_path):
    docs = make_docs(4, 100, np.uint16)
    root = write_docs(tmp_path / "ds", docs, shard_size=50, block_size=5)
    index_bytes = (root / "tokens.idx").read_bytes()
    # Shard 1 rewritten with other documents of the same count: the index still says
    # the old token counts.
    other = make_docs(40, 100, np.uint16)
    import shutil

    shutil.rmtree(tmp_path / "other", ignore_errors=True)
    write_docs(tmp_path / "other", docs[:50] + other[50:], shard_size=50, block_size=5)
    shutil.rmtree(root / "1")
    shutil.copytree(tmp_path / "other" / "1", root / "1")
    (root / "tokens.idx").write_bytes(index_bytes)
    ts = TokenSequences(atlas.AtlasDataset(root), 4, index="require")
    first = int(ts._index.cum[ts._index.first[1]]) // 4  # the first window in shard 1
    ts.__getitems__([0])  # shard 0 is unchanged
    with pytest.raises(TokenIndexError):
        ts.__getitems__([first + 1])
    # Rebuilt on request, it reads the new documents.
    ts = TokenSequences(atlas.AtlasDataset(root), 4, index="rebuild")
    assert_rows(ts.__getitems__(list(range(len(ts)))), Model(docs[:50] + other[50:]).windows(4))


def test_a_block_holding_other_counts_is_an_error(atlas, tmp_path):
    docs = make_docs(6, 40, np.uint16, empty=0)
    root = write_docs(tmp_path / "ds", docs, shard_size=40, block_size=4)
    entries = [ti.TokenIndex(root / "tokens.idx").entry(0)]
    entries[0].counts = entries[0].counts.copy()
    entries[0].counts[[0, 1]] += [1, -1]  # same shard total, other block counts
    ti.write_index(root / "tokens.idx", None, entries)
    ts = TokenSequences(atlas.AtlasDataset(root), 2)
    with pytest.raises(TokenIndexError):
        ts.__getitems__(list(range(len(ts))))


def test_appended_shards_extend_the_index(atlas, tmp_path, monkeypatch):
    docs = make_docs(7, 90, np.uint16)
    root = write_docs(tmp_path / "ds", docs, shard_size=30, block_size=5)
    bigger = write_docs(
        tmp_path / "big", docs + docs[:40], shard_size=30, block_size=5, token_index=False
    )
    # What an append leaves: the old index carried over, two shards more.
    (bigger / "tokens.idx").write_bytes((root / "tokens.idx").read_bytes())
    built = []
    real = ti.build_entries

    def counting(ds, shards, *args, **kwargs):
        built.extend(shards)
        return real(ds, shards, *args, **kwargs)

    monkeypatch.setattr(ti, "build_entries", counting)
    ts = TokenSequences(atlas.AtlasDataset(bigger), 9)
    assert built == [3, 4]
    assert len(ti.TokenIndex(bigger / "tokens.idx").shards) == 5
    assert_rows(ts.__getitems__(list(range(len(ts)))), Model(docs + docs[:40]).windows(9))


def test_a_malformed_index_is_rebuilt_or_refused(atlas, tmp_path):
    docs = make_docs(8, 30, np.uint16)
    root = write_docs(tmp_path / "ds", docs)
    good = (root / "tokens.idx").read_bytes()
    for damaged in (good[:-8], b"ATLASTOK" + good[8:12][::-1] + good[12:], b"x" * 70):
        (root / "tokens.idx").write_bytes(damaged)
        with pytest.raises(TokenIndexError):
            TokenSequences(atlas.AtlasDataset(root), 2, index="require")
        with pytest.warns(RuntimeWarning):
            ts = TokenSequences(atlas.AtlasDataset(root), 2)
        assert ts.num_tokens == sum(len(d) for d in docs)


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "example, field",
    [
        ("some text", None),
        (np.array([1.0, 2.0]), None),
        (np.zeros((2, 2), np.int64), None),
        ([1, 2, "3"], None),
        ({"other": np.arange(3)}, "input_ids"),
        (np.arange(3), "input_ids"),
        (np.array([True, False]), None),
    ],
)
def test_examples_that_are_not_tokens(atlas, tmp_path, example, field):
    good = np.arange(5, dtype=np.int64)
    examples = (
        [good, good, example, good]
        if field is None
        else [{"input_ids": good}, {"input_ids": good}, example, {"input_ids": good}]
    )
    root = write_docs(tmp_path / "ds", examples, shard_size=10, block_size=2, token_index=False)
    with pytest.raises(NotTokensError) as info:
        TokenSequences(atlas.AtlasDataset(root), 2, field=field, progress=False)
    assert "example 2" in str(info.value) and str(root) in str(info.value)


def test_bad_arguments(atlas, tmp_path):
    root = write_docs(tmp_path / "ds", [np.arange(10, dtype=np.uint16)] * 3)
    ds = atlas.AtlasDataset(root)
    for bad in (
        {"seq_len": 0},
        {"start_input": 70000, "dtype": np.uint16},
        {"start_input": -1, "dtype": np.uint8},
        {"vocab_size": 9},
        {"dtype": np.float32},
        {"index": "sometimes"},
        {"packed": False, "varlen": True},
    ):
        kwargs = {"seq_len": 4, **bad}
        with pytest.raises(InvalidArgumentError):
            TokenSequences(ds, **kwargs)
    assert len(TokenSequences(ds, 4, vocab_size=10)) == 7
    with pytest.raises(TypeError):
        TokenSequences([1, 2, 3], 4)
    with pytest.raises(TypeError):
        TokenSequences(ds, 4)["0"]


def test_fewer_tokens_than_one_window(atlas, tmp_path):
    root = write_docs(tmp_path / "ds", [np.arange(3, dtype=np.uint16), np.zeros(0, np.uint16)])
    with pytest.warns(RuntimeWarning, match="length 0"):
        ts = TokenSequences(atlas.AtlasDataset(root), 4)
    assert len(ts) == 0
    with pytest.raises(IndexError):
        ts[0]
    empty = write_docs(tmp_path / "empty", [])
    with warnings.catch_warnings(record=True):
        assert len(TokenSequences(atlas.AtlasDataset(empty), 1)) == 0


def test_a_damaged_block_is_a_format_error(atlas, tmp_path):
    docs = make_docs(9, 40, np.uint16, empty=0)
    root = write_docs(tmp_path / "ds", docs, strategy=1, shard_size=40, block_size=4)
    data = root / "0" / "data.bin"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2 : len(raw) // 2 + 16] = b"\xff" * 16
    data.write_bytes(bytes(raw))
    ts = TokenSequences(atlas.AtlasDataset(root), 3)
    with pytest.raises(AtlasFormatError):
        ts.__getitems__(list(range(len(ts))))


_OPEN_ONLY = r"""
import os, sys
root = os.path.realpath(sys.argv[1])
seen = []
sys.addaudithook(lambda event, args: event == "open" and seen.append(args[0]))
import atlas_fast
assert atlas_fast.BACKEND == sys.argv[2], atlas_fast.BACKEND
ts = atlas_fast.TokenSequences(root, 16)
assert len(ts) > 0
held = [os.path.realpath(os.path.join("/proc/self/fd", fd)) for fd in os.listdir("/proc/self/fd")]
with open("/proc/self/maps") as f:
    held += [line.split()[-1] for line in f if "/" in line]
for p in seen + held:
    if isinstance(p, (str, bytes, os.PathLike)):
        p = os.path.realpath(os.fsdecode(p))
        if p.startswith(root + os.sep):
            print(os.path.relpath(p, root))
"""


def test_opening_reads_the_index_and_the_metadata_alone(tmp_path, backend):
    """A dataset that carries its token index is opened from its root meta.json and that
    index: no shard file is opened (by Python, and none is left open or mapped), in a fresh
    process of each backend."""
    import os
    import subprocess
    import sys

    docs = make_docs(2, 300, np.uint16, long=2)
    root = write_docs(tmp_path / "ds", docs, strategy=1, shard_size=50, block_size=10)
    env = dict(os.environ)
    env.pop("ATLAS_FAST_NO_EXTENSIONS", None)
    if backend == "python":
        env["ATLAS_FAST_NO_EXTENSIONS"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", _OPEN_ONLY, str(root), backend],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) == {"meta.json", "tokens.idx"}
