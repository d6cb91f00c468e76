"""The flat-tokens converter source, against zarr groups written with zarr itself."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from helpers import same

from atlas_fast.convert import _flat_tokens
from atlas_fast.convert._flat_tokens import sources
from atlas_fast.convert._source import SourceError

zarr = pytest.importorskip("zarr", reason="zarr (the `test` extra) writes the groups")


def _array(group, name, data, chunks):
    if hasattr(group, "create_array"):  # zarr 3
        group.create_array(name, data=data, chunks=(chunks,))
    else:  # zarr 2
        group.create_dataset(name, data=data, chunks=(chunks,))


def _write(group, seqs, max_token_id, *, chunks=(64, 8), starts=None, encoded=None):
    lengths = [len(s) for s in seqs]
    if starts is None:
        starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint64)
    if encoded is None:
        encoded = np.concatenate([np.asarray(s, np.uint32) for s in seqs] or [np.zeros(0)])
        encoded = encoded.astype(np.uint32) * 2
        encoded[starts[:-1].astype(np.int64)] += 1
    _array(group, "encoded_tokens", encoded, chunks[0])
    _array(group, "seq_starts", starts, chunks[1])
    group.attrs["max_token_id"] = max_token_id


def _seqs(n, vocab, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab + 1, size=int(rng.integers(1, 40))) for _ in range(n)]


def _read_all(srcs):
    out = {}
    for src in srcs:
        examples = []
        for part in src.parts:
            examples.extend(pickle.loads(pickle.dumps(part.read))())
        out[src.split] = examples
    return out


def test_spec_example(tmp_path):
    """The seed's example: [[1, 2], [3, 4, 5], [6, 7, 8]] as [3, 4, 7, 8, 10, 13, 14, 16]."""
    g = zarr.open_group(str(tmp_path / "ft"), mode="w")
    _write(
        g,
        [],
        8,
        starts=np.array([0, 2, 5, 8], np.uint64),
        encoded=np.array([3, 4, 7, 8, 10, 13, 14, 16], np.uint32),
    )
    (src,) = sources(tmp_path / "ft")
    assert src.split is None
    got = _read_all([src])[None]
    assert same(got, [np.array(s, np.uint8) for s in ([1, 2], [3, 4, 5], [6, 7, 8])])


@pytest.mark.parametrize(
    ("vocab", "dtype"),
    [(255, np.uint8), (256, np.uint16), (65_535, np.uint16), (70_000, np.uint32)],
)
def test_two_splits_equal_what_was_written(tmp_path, monkeypatch, vocab, dtype):
    monkeypatch.setattr(_flat_tokens, "_PART_TOKENS", 300)  # several parts on small data
    g = zarr.open_group(str(tmp_path / "ft"), mode="w")
    written = {"train": _seqs(200, vocab, 1), "validation": _seqs(37, vocab, 2)}
    for split, seqs in written.items():
        _write(g.create_group(split), seqs, vocab)
    srcs = sources(tmp_path / "ft")
    assert [s.split for s in srcs] == ["train", "validation"]
    assert len(srcs[0].parts) > 3
    got = _read_all(srcs)
    for split, seqs in written.items():
        assert same(got[split], [np.asarray(s).astype(dtype) for s in seqs]), split
    assert (
        sum(p.nbytes for p in srcs[0].parts)
        == sum(map(len, written["train"])) * 4 + (200 + len(srcs[0].parts)) * 8
    )


def test_parts_follow_seq_starts_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(_flat_tokens, "_PART_TOKENS", 100)
    g = zarr.open_group(str(tmp_path / "ft"), mode="w")
    _write(g, _seqs(100, 50, 3), 50, chunks=(32, 8))
    (src,) = sources(tmp_path / "ft")
    firsts = [int(p.label.rsplit(" ", 1)[1].split("-")[0]) for p in src.parts]
    assert firsts[0] == 0 and all(f % 8 == 0 for f in firsts)


def test_empty_array(tmp_path):
    g = zarr.open_group(str(tmp_path / "ft"), mode="w")
    _write(g, [], 5, starts=np.zeros(1, np.uint64), encoded=np.zeros(0, np.uint32))
    assert sources(tmp_path / "ft")[0].parts == []


def _bad(tmp_path, **kwargs):
    g = zarr.open_group(str(tmp_path / "ft"), mode="w")
    _write(g.create_group("train"), [[1, 2], [3, 4, 5], [6, 7, 8]], 8, **kwargs)
    return tmp_path / "ft" / "train"


def _error(path) -> str:
    with pytest.raises(SourceError) as info:
        for src in sources(path.parent):
            for part in src.parts:
                list(part.read())
    return str(info.value)


def test_seq_starts_not_ending_at_the_token_count(tmp_path):
    path = _bad(tmp_path, starts=np.array([0, 2, 5, 7], np.uint64))
    assert _error(path) == (
        f"{path}/seq_starts: index 3: the last entry is 7, but encoded_tokens holds 8 tokens"
    )


def test_seq_starts_not_increasing(tmp_path):
    path = _bad(
        tmp_path,
        starts=np.array([0, 5, 2, 8], np.uint64),
        encoded=np.array([3, 4, 7, 8, 10, 13, 14, 16], np.uint32),
    )
    assert _error(path).startswith(f"{path}/seq_starts: index 2: 2 after 5: the starts must")


def test_seq_starts_disagreeing_with_start_flags(tmp_path):
    path = _bad(tmp_path, encoded=np.array([3, 4, 7, 8, 10, 12, 14, 16], np.uint32))
    assert _error(path).startswith(f"{path}/encoded_tokens: index 5: seq_starts[2] starts")
    path = _bad(tmp_path, encoded=np.array([3, 5, 7, 8, 10, 13, 14, 16], np.uint32))
    assert _error(path).startswith(f"{path}/encoded_tokens: index 1: the start flag (low bit)")


def test_token_above_max_token_id_and_bad_attribute(tmp_path):
    path = _bad(tmp_path, encoded=np.array([3, 4, 7, 8, 10, 13, 14, 18], np.uint32))
    assert _error(path).startswith(f"{path}/encoded_tokens: index 7: token id 9 is not within")
    g = zarr.open_group(str(tmp_path / "ft"), mode="r+")
    g["train"].attrs["max_token_id"] = "8"
    with pytest.raises(SourceError, match=r"train: attribute max_token_id is '8'"):
        sources(tmp_path / "ft")


def test_missing_source_and_missing_arrays(tmp_path):
    with pytest.raises(SourceError, match=r"nothing: no such file or directory"):
        sources(tmp_path / "nothing")
    g = zarr.open_group(str(tmp_path / "ft"), mode="w")
    _array(g.create_group("train"), "encoded_tokens", np.zeros(3, np.uint32), 2)
    with pytest.raises(SourceError, match=r"ft: no flat-tokens array"):
        sources(tmp_path / "ft")
    (tmp_path / "plain").mkdir()
    with pytest.raises(SourceError, match=r"plain: not a zarr group"):
        sources(tmp_path / "plain")


def test_convert_writes_the_token_index_of_each_split(tmp_path):
    from atlas_fast import TokenSequences
    from atlas_fast.convert import convert

    g = zarr.open_group(str(tmp_path / "ft"), mode="w")
    written = {"train": _seqs(150, 300, 4), "validation": _seqs(20, 300, 5)}
    for split, seqs in written.items():
        _write(g.create_group(split), seqs, 300)
    convert(
        tmp_path / "ft", tmp_path / "out", "flat-tokens", shard_size=40, block_size=8, workers=2
    )
    for split, seqs in written.items():
        root = tmp_path / "out" / split
        assert (root / "tokens.idx").is_file(), split
        ts = TokenSequences(root, 5, index="require")
        flat = np.concatenate(seqs)
        assert ts.num_tokens == len(flat)
        rows = ts.__getitems__(list(range(len(ts))))["targets"]
        assert np.array_equal(rows.ravel(), flat[: len(ts) * 5])
