"""The conversion framework: staging and commit, workers, verify, options, progress."""

from __future__ import annotations

import errno
import inspect
import json
import os
import tempfile
import time
from functools import partial

import numpy as np
import pytest
from convert_helpers import assert_absent, documents, read_back, write_jsonl
from hypothesis import example, given
from hypothesis import strategies as st

import atlas_fast
import atlas_fast.convert as conv
from atlas_fast.convert import (
    FORMATS,
    FormatUnavailableError,
    Part,
    Source,
    SourceError,
    VerifyError,
    convert,
)
from atlas_fast.convert._claims import Claims
from atlas_fast.convert._compare import difference
from atlas_fast.convert._run import split_runs
from atlas_fast.convert._workers import Worker
from atlas_fast.convert._write import WriteJob, write_run


def _jsonl_tree(root, files=5, per_file=230):
    docs = documents(files * per_file)
    for k in range(files):
        write_jsonl(root / f"{k:02d}.jsonl.gz", docs[k * per_file : (k + 1) * per_file])
    return docs


def _meta(path):
    return json.loads((path / "meta.json").read_text())


@pytest.mark.parametrize("strategy", [0, 1, 2, 3])
def test_two_workers_give_the_serial_result(tmp_path, atlas, strategy):
    docs = _jsonl_tree(tmp_path / "src")
    options = {"shard_size": 200, "block_size": 10, "compression_strategy": strategy}
    serial = convert(tmp_path / "src", tmp_path / "one", "jsonl", workers=1, **options)
    two = convert(tmp_path / "src", tmp_path / "two", "jsonl", workers=2, **options)
    assert read_back(atlas, tmp_path / "one") == docs
    assert read_back(atlas, tmp_path / "two") == docs
    assert serial.examples == two.examples == len(docs)
    assert _meta(tmp_path / "one")["compression_strategy"] == strategy
    assert _meta(tmp_path / "two")["compression_strategy"] == strategy
    assert sum(_meta(tmp_path / "two")["shard_sizes"]) == len(docs)
    assert (tmp_path / "two" / "zstd_dict.bin").exists() == (strategy == 2)


@pytest.mark.parametrize("strategy", [1, 2])
def test_serial_matches_the_dataset_writer(tmp_path, strategy):
    """One worker writes what AtlasDatasetWriter writes: the same shards (strategy 1: the
    same bytes; zstd gives each trained dictionary a random id, so strategy 2 differs there)."""
    docs = _jsonl_tree(tmp_path / "src")
    options = {"shard_size": 300, "block_size": 10, "compression_strategy": strategy}
    convert(tmp_path / "src", tmp_path / "conv", "jsonl", workers=1, **options)
    with atlas_fast.AtlasDatasetWriter(tmp_path / "ref", **options) as writer:
        for doc in docs:  # as parsed from its own line (pickle's memo sees the same objects)
            writer.add_example(json.loads(json.dumps(doc)))
    assert _meta(tmp_path / "conv") == _meta(tmp_path / "ref")
    for shard in ("0", "3"):
        conv_shard, ref_shard = tmp_path / "conv" / shard, tmp_path / "ref" / shard
        assert _meta(conv_shard) == _meta(ref_shard)
        if strategy == 1:
            for name in ("data.bin", "index.npy"):
                assert (conv_shard / name).read_bytes() == (ref_shard / name).read_bytes()


def test_small_first_shard_falls_back_to_strategy_1(tmp_path, atlas):
    docs = _jsonl_tree(tmp_path / "src", files=2, per_file=30)
    for workers in (1, 2):
        dst = tmp_path / f"w{workers}"
        convert(tmp_path / "src", dst, "jsonl", shard_size=50, block_size=10, workers=workers)
        assert _meta(dst)["compression_strategy"] == 1
        assert not (dst / "zstd_dict.bin").exists()
        assert read_back(atlas, dst) == docs


def _summary_head(summary) -> str:
    """The summary line up to its sizes and times."""
    return str(summary).rsplit(": ", 1)[0]


@pytest.mark.parametrize("workers", [1, 2])
def test_the_summary_of_an_empty_conversion(tmp_path, atlas, workers):
    """No examples: 0 examples, 0 shards, and the strategy asked (2, the default) beside
    the one written (1: no dictionary can be trained without examples, as the writer does)."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.jsonl").write_text("")
    (tmp_path / "src" / "b.jsonl").write_text("")
    dst = tmp_path / "out"
    summary = convert(tmp_path / "src", dst, "jsonl", workers=workers)
    assert (summary.examples, summary.shards) == (0, 0)
    assert (summary.strategy, summary.strategies) == (2, [1])
    assert _meta(dst) == {"version": 1, "shard_sizes": [], "compression_strategy": 1}
    assert read_back(atlas, dst) == []
    assert _summary_head(summary) == (
        "converted 0 examples (jsonl) into 0 shards (strategy 1, not the 2 asked: too few "
        f"examples to train a dictionary) at {dst}"
    )
    summary = convert(tmp_path / "src", tmp_path / "s3", "jsonl", compression_strategy=3)
    assert _summary_head(summary) == (
        f"converted 0 examples (jsonl) into 0 shards (strategy 3) at {tmp_path / 's3'}"
    )


def test_the_summary_counts_in_words(tmp_path, monkeypatch, atlas):
    """One example, one shard, one split: singular; more: plural, with thousands marked."""
    (tmp_path / "one").mkdir()
    write_jsonl(tmp_path / "one" / "a.jsonl", [{"text": "only"}])
    summary = convert(tmp_path / "one", tmp_path / "out1", "jsonl", compression_strategy=1)
    assert _summary_head(summary) == (
        f"converted 1 example (jsonl) into 1 shard (strategy 1) at {tmp_path / 'out1'}"
    )
    assert read_back(atlas, tmp_path / "out1") == [{"text": "only"}]
    _fake_format(monkeypatch, [Source([_ok_part("t0", 1200)], "train")])
    summary = convert("x", tmp_path / "out2", "fake", workers=1, shard_size=1000)
    assert _summary_head(summary) == (
        "converted 1,200 examples (fake) into 2 shards (strategy 2) at "
        f"{tmp_path / 'out2'} (1 split: train)"
    )
    assert read_back(atlas, tmp_path / "out2" / "train") == _examples(1200)


def test_more_workers_than_parts_and_empty_parts(tmp_path, atlas):
    docs = _jsonl_tree(tmp_path / "src", files=2, per_file=40)
    (tmp_path / "src" / "99.jsonl").write_text("")
    convert(tmp_path / "src", tmp_path / "out", "jsonl", workers=4, shard_size=25)
    assert read_back(atlas, tmp_path / "out") == docs


def test_destination_must_be_new_or_empty(tmp_path, atlas):
    _jsonl_tree(tmp_path / "src", files=1, per_file=10)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError) as info:
        convert(tmp_path / "src", tmp_path / "full", "jsonl")
    # The writer's sentence (one helper), saying what to do; errno as the writer's.
    assert info.value.errno == errno.EEXIST
    assert info.value.strerror == (
        f"{tmp_path / 'full'}: already exists and is not empty; convert writes a new dataset "
        "into an absent or empty directory: remove it or choose another path"
    )
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="already exists and is not a directory; convert"):
        convert(tmp_path / "src", tmp_path / "file", "jsonl")
    (tmp_path / "empty").mkdir()
    convert(tmp_path / "src", tmp_path / "empty", "jsonl")
    assert len(read_back(atlas, tmp_path / "empty")) == 10
    convert(tmp_path / "src", tmp_path / "new" / "nested", "jsonl")
    assert len(read_back(atlas, tmp_path / "new" / "nested")) == 10


def _read_then_fail(n, error):
    for i in range(n):
        yield {"i": i}
    raise error


def _fake_format(monkeypatch, sources):
    """Make every format name read ``sources`` (in this process: workers=1 only)."""
    import types

    module = types.ModuleType("fake")
    module.sources = lambda src: sources
    monkeypatch.setattr(conv, "format_module", lambda fmt: module)


def _examples(n, offset=0):
    return [{"i": i + offset} for i in range(n)]


def _ok_part(label, n, offset=0):
    return Part(label, 100, partial(iter, _examples(n, offset)))


@pytest.mark.parametrize("error", [SourceError("part-2: row 7: broken"), KeyboardInterrupt()])
def test_a_failure_leaves_nothing(tmp_path, monkeypatch, error):
    parts = [
        _ok_part("part-0", 500),
        _ok_part("part-1", 500),
        Part("part-2", 100, partial(_read_then_fail, 300, error)),
    ]
    _fake_format(monkeypatch, [Source(parts)])
    with pytest.raises(type(error)):
        convert("anything", tmp_path / "out", "fake", shard_size=100, workers=1)
    assert_absent(tmp_path / "out")
    (tmp_path / "empty").mkdir()  # a pre-existing empty destination stays as it was
    with pytest.raises(type(error)):
        convert("anything", tmp_path / "empty", "fake", shard_size=100, workers=1)
    assert list((tmp_path / "empty").iterdir()) == []


def test_a_failure_in_a_worker_process(tmp_path):
    src = tmp_path / "src"
    _jsonl_tree(src, files=4, per_file=100)
    bad = src / "03.jsonl.gz"
    write_jsonl(bad, [{"ok": 1}] * 20)
    bad.write_bytes(bad.read_bytes() + b"garbage after the gzip member")
    with pytest.raises(SourceError, match=rf"^{bad}: line \d+: cannot read the file"):
        convert(src, tmp_path / "out", "jsonl", workers=2, shard_size=64)
    assert_absent(tmp_path / "out")


def test_verify_passes_and_catches_a_mismatch(tmp_path, monkeypatch):
    docs = _jsonl_tree(tmp_path / "src", files=3, per_file=50)
    summary = convert(tmp_path / "src", tmp_path / "ok", "jsonl", verify=True, shard_size=40)
    assert summary.verified
    assert str(summary).endswith(", verified")

    real = atlas_fast.atlas.AtlasDataset

    class Tampered(real):
        def __getitem__(self, i):
            example = super().__getitem__(i)
            if i == 57:
                example = dict(example, text=example["text"] + "!")
            return example

    monkeypatch.setattr(atlas_fast.atlas, "AtlasDataset", Tampered)
    part = tmp_path / "src" / "01.jsonl.gz"
    with pytest.raises(VerifyError) as info:
        convert(tmp_path / "src", tmp_path / "bad", "jsonl", verify=True, shard_size=40, workers=1)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'bad'}: example 57 (example 7 of part {part})")
    assert "['text']" in message
    assert_absent(tmp_path / "bad")
    assert docs[57]["id"] == "doc-57"


def test_verify_catches_a_missing_example(tmp_path, monkeypatch):
    _jsonl_tree(tmp_path / "src", files=1, per_file=30)
    real = atlas_fast.atlas.AtlasDataset

    class Short(real):
        def __len__(self):
            return super().__len__() - 1

    monkeypatch.setattr(atlas_fast.atlas, "AtlasDataset", Short)
    with pytest.raises(VerifyError, match=r"example 29 .* missing, the dataset holds 29"):
        convert(tmp_path / "src", tmp_path / "out", "jsonl", verify=True, workers=1)
    assert_absent(tmp_path / "out")


def test_splits_and_progress(tmp_path, monkeypatch, atlas):
    train = Source([_ok_part("t0", 120), _ok_part("t1", 80, 120)], "train")
    _fake_format(monkeypatch, [train, Source([_ok_part("v0", 30)], "validation")])
    seen = []
    summary = convert(
        "x", tmp_path / "out", "fake", workers=1, progress=lambda e, b: seen.append((e, b))
    )
    assert read_back(atlas, tmp_path / "out" / "train") == _examples(200)
    assert read_back(atlas, tmp_path / "out" / "validation") == _examples(30)
    assert sum(e for e, _ in seen) == 230
    assert sum(b for _, b in seen) == 300
    assert summary.bytes_in == 300
    assert summary.datasets == [("train", 200, 1), ("validation", 30, 1)]
    assert "2 splits: train, validation" in str(summary)


def test_progress_bar(tmp_path, capsys):
    pytest.importorskip("tqdm")  # the `convert` extra's; test-core environments lack it
    _jsonl_tree(tmp_path / "src", files=2, per_file=20)
    convert(tmp_path / "src", tmp_path / "bar", "jsonl", progress=True)
    assert "converting" in capsys.readouterr().err


def test_no_tqdm_no_bar(tmp_path, capsys, monkeypatch):
    _jsonl_tree(tmp_path / "src", files=2, per_file=20)
    monkeypatch.setitem(__import__("sys").modules, "tqdm", None)
    summary = convert(tmp_path / "src", tmp_path / "plain", "jsonl", progress=True)
    assert capsys.readouterr().err == ""
    assert summary.examples == 40


def test_registry_and_options(tmp_path, monkeypatch):
    assert set(FORMATS) == {
        "parquet", "hf", "jsonl", "dolma", "mds", "wds", "energon", "flat-tokens"
    }  # fmt: skip
    for fmt in FORMATS:
        assert callable(getattr(conv, f"convert_{fmt.replace('-', '_')}"))
    with pytest.raises(ValueError, match="unknown format 'csv'"):
        convert(tmp_path, tmp_path / "out", "csv")
    monkeypatch.setitem(FORMATS, "later", "_not_written_yet")
    with pytest.raises(FormatUnavailableError, match=r"--from later: .* no converter for it yet"):
        convert(tmp_path, tmp_path / "out", "later")
    with pytest.raises(TypeError, match="unexpected option 'attributes'"):
        convert(tmp_path, tmp_path / "out", "jsonl", attributes="a")
    for bad in (
        {"shard_size": 0},
        {"block_size": 1.5},
        {"compression_strategy": 4},
        {"compression_dict_size": 2},
        {"workers": 0},
    ):
        with pytest.raises(ValueError):
            convert(tmp_path, tmp_path / "out", "jsonl", **bad)
    assert_absent(tmp_path / "out")


def test_split_runs_are_contiguous_and_balanced():
    parts = [Part(str(i), size, iter) for i, size in enumerate([10, 10, 10, 10, 50, 5, 5])]
    runs = split_runs(parts, 2)
    assert [p for run in runs for p in run] == parts
    assert [len(r) for r in runs] == [4, 3]
    assert split_runs(parts[:1], 4) == [parts[:1]]
    assert [len(r) for r in split_runs(parts, 7)] == [1] * 7
    assert [len(r) for r in split_runs(parts, 3)] == [3, 2, 2]


def test_difference():
    assert difference({"a": [1, b"x", (2.0, None)]}, {"a": [1, b"x", (2.0, None)]}) is None
    assert difference(float("nan"), float("nan")) is None
    assert difference({"a": [1, 2]}, {"a": [1, 3]}) == "['a'][1]: 2 != 3"
    assert difference([1], (1,)) == "the example: list != tuple"
    assert difference(1, True) == "the example: int != bool"
    assert "keys" in difference({"a": 1}, {"b": 1})
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert difference({"x": a}, {"x": a.copy()}) is None
    assert "dtype" in difference(a, a.astype(np.float64))
    assert "shape" in difference(a, a.reshape(3, 2))
    b = a.copy()
    b[1, 2] = np.nan
    assert difference(b, b.copy()) is None
    assert difference(a, b) is not None
    assert difference(np.array([{"k": 1}], dtype=object), np.array([{"k": 2}], dtype=object))
    assert difference(np.int64(3), np.int64(3)) is None


def test_interrupt_with_workers_running(tmp_path):
    _jsonl_tree(tmp_path / "src", files=4, per_file=300)
    calls = []

    def interrupt(examples, nbytes):
        calls.append(examples)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert(tmp_path / "src", tmp_path / "out", "jsonl", workers=2, progress=interrupt)
    assert_absent(tmp_path / "out")


@pytest.mark.parametrize(("fmt", "extra"), [("parquet", "parquet"), ("hf", "hf")])
def test_a_missing_dependency_names_its_extra(tmp_path, monkeypatch, fmt, extra):
    from atlas_fast._extras import MissingExtraError

    (tmp_path / "x.parquet").write_bytes(b"")
    (tmp_path / "x.arrow").write_bytes(b"")
    for name in ("pyarrow", "pyarrow.parquet", "pyarrow.ipc"):
        monkeypatch.setitem(__import__("sys").modules, name, None)
    with pytest.raises(MissingExtraError, match=rf"pip install 'atlas-fast\[{extra}\]'"):
        convert(tmp_path / f"x.{'parquet' if fmt == 'parquet' else 'arrow'}", tmp_path / "o", fmt)
    assert_absent(tmp_path / "o")


def test_run_0_shorter_than_a_shard_still_trains_the_dictionary(tmp_path, atlas):
    docs = _jsonl_tree(tmp_path / "src", files=2, per_file=100)
    options = {"shard_size": 150, "block_size": 10, "workers": 2}
    convert(tmp_path / "src", tmp_path / "out", "jsonl", **options)
    meta = _meta(tmp_path / "out")
    # [100, 100] when each process writes its file; [150, 50] when run 0 took the second
    # file too (work stealing: the other process had not started yet).
    assert meta["shard_sizes"] in ([100, 100], [150, 50])
    assert meta["compression_strategy"] == 2
    assert (tmp_path / "out" / "zstd_dict.bin").exists()
    assert _meta(tmp_path / "out" / "1")["compression_strategy"] == 2
    assert read_back(atlas, tmp_path / "out") == docs


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=1000), min_size=1, max_size=30),
    n=st.integers(min_value=1, max_value=8),
)
def test_split_runs_properties(sizes, n):
    parts = [Part(str(i), size, iter) for i, size in enumerate(sizes)]
    runs = split_runs(parts, n)
    assert [p for run in runs for p in run] == parts  # contiguous, in order, all of them
    assert len(runs) == min(n, len(parts))
    assert all(runs)


def _shared_claims(parts, ranges, *, settled=True):
    """Claims of each run on one table, as the worker processes share it (``settled``: run 0's
    first shard is closed, nothing of its range is kept)."""
    import threading

    claims = [Claims(parts, ranges, k) for k in range(len(ranges))]
    lock = threading.Lock()
    for c in claims:
        c.table, c.lock = claims[0].table, lock
    if settled:
        claims[0].first_shard_settled()
    return claims


def test_claims_take_own_parts_then_steal_from_the_back():
    parts = [Part(str(i), size, iter) for i, size in enumerate([10, 10, 10, 10, 50, 10])]
    run0, run1 = _shared_claims(parts, ((0, 2), (2, 6)))
    assert [run0.next(), run0.next()] == [0, 1]  # its own parts, in order
    assert run1.next() == 2
    assert run0.next() == 5  # then the back half (by bytes) of the other run's, at least a part
    assert run0.next() == 4
    assert run1.next() == 3
    assert run0.next() is None and run1.next() is None
    # Nobody takes part 0 from run 0, even when it has not begun.
    run0, run1 = _shared_claims(parts, ((0, 1), (1, 6)))
    assert [run1.next() for _ in range(6)] == [1, 2, 3, 4, 5, None]
    assert run0.next() == 0


def test_stolen_parts_become_the_thiefs_range():
    """A thief takes the back half of the victim's unclaimed parts as its own range: it writes
    them in order (into the same shards), and they can be stolen back from its end."""
    parts = [Part(str(i), 10, iter) for i in range(8)]
    run0, run1 = _shared_claims(parts, ((0, 2), (2, 8)))
    assert [run0.next(), run0.next()] == [0, 1]
    assert run0.next() == 5  # 5, 6, 7: the back half of parts 2-7
    assert run0.table[:4] == [6, 8, 2, 5]
    assert [run1.next(), run1.next(), run1.next()] == [2, 3, 4]
    assert run1.next() == 7  # the back half of what run 0 has left (6, 7)
    assert [run0.next(), run0.next(), run1.next()] == [6, None, None]


def test_spilled_shards_go_to_whoever_asks_own_first():
    parts = [Part(str(i), 10, iter) for i in range(4)]
    run0, run1 = _shared_claims(parts, ((0, 2), (2, 4)))
    assert run0.next_spilled() is None
    run1.spilled(0)
    run1.spilled(1)
    assert run0.next_spilled() == (1, 0)
    run0.spilled(0)  # (run 0 spills nothing in a conversion; the table does not care)
    assert run1.next_spilled() == (1, 1)
    assert run1.next_spilled() == (0, 0)
    assert run0.next_spilled() is None and run1.next_spilled() is None
    run1.spilled(2)
    assert run0.next_spilled() == (1, 2)


def test_two_workers_train_the_dictionary_a_serial_run_trains(tmp_path, atlas):
    docs = _jsonl_tree(tmp_path / "src", files=8, per_file=100)
    options = {"shard_size": 250, "block_size": 10, "compression_strategy": 2}
    convert(tmp_path / "src", tmp_path / "one", "jsonl", workers=1, **options)
    for k in range(3):  # whatever the timing: run 0's first shard is a serial run's first
        out = tmp_path / f"two{k}"
        convert(tmp_path / "src", out, "jsonl", workers=2, **options)
        assert (out / "zstd_dict.bin").read_bytes() == (
            tmp_path / "one" / "zstd_dict.bin"
        ).read_bytes()
        assert _meta(out / "0")["stored_examples"] == 250
        assert read_back(atlas, out) == docs


@pytest.mark.parametrize("checksums", [False, True])
def test_a_spilled_shard_is_the_shard_its_writer_writes(tmp_path, checksums):
    """A shard filled before the dictionary is known, spilled and compressed later (by any
    run), is byte for byte the shard a strategy-2 writer with that dictionary writes."""
    import zstandard

    from atlas_fast.convert._spill import SpilledShard, compress_spilled
    from atlas_fast.writer import AtlasDatasetShardWriter

    docs = documents(95)
    zdict = zstandard.train_dictionary(2048, [json.dumps(d).encode() for d in docs * 3])

    def make_writer(path):
        return AtlasDatasetShardWriter(
            path, 10, compression_strategy=2, compression_dict=zdict, checksums=checksums
        )

    spilled = SpilledShard(tmp_path / "spill", tmp_path / "spilled", 0, 10)
    direct = make_writer(tmp_path / "direct")
    for doc in docs:
        spilled.add_example(doc)
        direct.add_example(doc)
    spilled.close()
    direct.close()
    assert not (tmp_path / "spilled").exists()  # nothing there until it is compressed
    compress_spilled(tmp_path / "spill", tmp_path / "spilled", make_writer)
    assert not (tmp_path / "spill").exists()
    names = sorted(f.name for f in (tmp_path / "direct").iterdir())
    assert sorted(f.name for f in (tmp_path / "spilled").iterdir()) == names
    for name in names:
        assert (tmp_path / "spilled" / name).read_bytes() == (
            tmp_path / "direct" / name
        ).read_bytes()


def test_shards_spilled_while_the_dictionary_trains(tmp_path, monkeypatch, atlas):
    """While run 0 trains the strategy-2 dictionary (slowly, here), run 1 reads on: its own
    parts wait in its memory, those it takes from run 0 are spilled, for whichever run is
    free once the dictionary is published: the serial run's examples and dictionary."""
    from atlas_fast import writer
    from atlas_fast.convert import _write

    if not hasattr(os, "fork"):
        pytest.skip("the patches reach a forked worker only")
    docs = _jsonl_tree(tmp_path / "src", files=8, per_file=100)
    options = {"shard_size": 250, "block_size": 10, "compression_strategy": 2}
    convert(tmp_path / "src", tmp_path / "one", "jsonl", workers=1, **options)
    train = writer.train_dictionary

    def slow_training(blocks, **options):
        time.sleep(1.0)  # so that run 1 has read its parts before the dictionary exists
        return train(blocks, **options)

    log = tmp_path / "compressed"
    compress = _write.compress_spilled

    def recording(spill, shard, make_writer):
        with open(log, "a") as f:
            f.write(f"{spill}\n")
        return compress(spill, shard, make_writer)

    monkeypatch.setattr(writer, "train_dictionary", slow_training)
    monkeypatch.setattr(_write, "compress_spilled", recording)
    monkeypatch.setenv("ATLAS_FAST_CONVERT_START", "fork")  # the patches reach the worker
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # TMPDIR, as it were
    (tmp_path / "tmp").mkdir()
    convert(tmp_path / "src", tmp_path / "two", "jsonl", workers=2, **options)
    spilled = log.read_text().splitlines()
    # Run 1 holds its own parts (files 4-7) in memory and spills what it takes from run 0's
    # beyond what run 0's first shard needs (file 3 at least).
    assert spilled and all(os.path.basename(path).startswith("1-") for path in spilled)
    assert all(path.startswith(str(tmp_path / "tmp")) for path in spilled)
    assert not any((tmp_path / "tmp").iterdir())  # removed with the worker processes
    assert (tmp_path / "two" / "zstd_dict.bin").read_bytes() == (
        tmp_path / "one" / "zstd_dict.bin"
    ).read_bytes()
    assert read_back(atlas, tmp_path / "two") == docs
    assert _meta(tmp_path / "two")["compression_strategy"] == 2


def test_parts_run_0_may_need_for_its_first_shard_are_kept_from_the_others():
    """With the keep slot of a shared table, the others take from run 0's range only the parts run
    0 does not expect to need for its first shard (the strategy-2 dictionary's sample): all of
    them before it has read one, those past twice its estimate after, any once it is closed."""
    parts = [Part(str(i), 10, iter) for i in range(6)]
    run0, run1 = _shared_claims(parts, ((0, 4), (4, 6)), settled=False)
    assert run0.next() == 0
    assert [run1.next(), run1.next()] == [4, 5]
    assert run1.next() is None  # run 0 has read nothing yet: all of its range is kept
    run0.keep_for_first_shard(0.5, 5)  # 5 examples missing, 5 per part: twice that is 2 parts
    assert run1.next() == 3
    assert run1.next() is None  # parts 1 and 2 are kept
    run0.first_shard_settled()
    assert run1.next() == 2
    assert [run0.next(), run0.next()] == [1, None]


def test_parts_that_know_their_examples_are_kept_exactly():
    """Parts whose source gives their examples (row groups, record batches): run 0 keeps
    exactly the ones its first shard needs, before it has read anything to estimate from."""
    parts = [Part(str(i), 10, iter, 100) for i in range(6)]
    run0, run1 = _shared_claims(parts, ((0, 4), (4, 6)), settled=False)
    assert run0.next() == 0
    run0.keep_for_first_shard(0.0, 250 - 100)  # a shard of 250: parts 1 and 2 (half of it)
    assert [run1.next(), run1.next(), run1.next(), run1.next()] == [4, 5, 3, None]
    run0.keep_for_first_shard(0.0, 250 - 300)  # part 0 alone would complete it: none kept
    assert run1.next() == 2


def _write_run_1_then_0(tmp_path, ranges) -> dict:
    """Runs 1 then 0 of a strategy-1 conversion of the JSON lines under tmp_path/src, split
    into ``ranges`` of parts, over a claim table of their own (nothing kept for run 0's first
    shard), shards of 50 in blocks of 10: ``{run: write_run's result}``."""
    import multiprocessing

    from atlas_fast.convert import _jsonl

    parts = _jsonl.sources(tmp_path / "src")[0].parts
    layout = Claims.layout(ranges)
    layout[4] = -1  # nothing kept for run 0's first shard (strategy 1)
    table = multiprocessing.get_context("spawn").Array("q", layout)
    options = {**conv.WRITER_DEFAULTS, "shard_size": 50, "block_size": 10}
    options["compression_strategy"] = 1
    (tmp_path / "dict").mkdir()
    results = {}
    for run in (1, 0):
        job = WriteJob(
            parts, ranges, run, str(tmp_path / f"w{run}"), str(tmp_path / "dict"), options, 1
        )
        results[run] = write_run(job, Worker(run, lambda examples, nbytes: None, table))
    return results


def test_a_stolen_run_of_parts_shares_shards(tmp_path, atlas):
    """A run that steals several consecutive parts at once writes them into the same shards;
    every group is committed in part order."""

    from atlas_fast._writing.commit import commit_staged_shards

    docs = _jsonl_tree(tmp_path / "src", files=8, per_file=30)
    # run 1 first: it takes its own parts, then steals from run 0's
    results = _write_run_1_then_0(tmp_path, ((0, 6), (6, 8)))
    assert [first for first, _ in results[1][0]] == [6, 4, 3, 2, 1]  # 4-5 stolen at once
    assert [first for first, _ in results[0][0]] == [0]
    assert [len(dirs) for _, dirs in results[1][0]] == [2, 2, 1, 1, 1]
    groups = sorted(g for groups, _ in results.values() for g in groups)
    staged = [d for _, dirs in groups for d in dirs]
    commit_staged_shards(tmp_path / "out", staged, compression_strategy=1)
    assert read_back(atlas, tmp_path / "out") == docs
    sizes = json.loads((tmp_path / "out" / "meta.json").read_text())["shard_sizes"]
    assert sizes == [30, 30, 30, 30, 50, 10, 50, 10]


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=100), min_size=1, max_size=20),
    n=st.integers(min_value=1, max_value=4),
    order=st.lists(st.integers(min_value=0, max_value=3), max_size=60),
)
# Run 2's range (parts 2-4) is taken whole by runs 0 and 1 before it claims: it steals 4 back.
@example(sizes=[0, 5, 2, 0, 0], n=3, order=[0, 0])
def test_claims_hand_out_every_part_once(sizes, n, order):
    parts = [Part(str(i), size, iter) for i, size in enumerate(sizes)]
    runs = split_runs(parts, n)
    ranges, start = [], 0
    for run in runs:
        ranges.append((start, start + len(run)))
        start += len(run)
    claims = _shared_claims(parts, tuple(ranges))
    taken = [[] for _ in claims]
    # Some claims in any order, then every run in turn until done.
    steps = [k % len(claims) for k in order]
    for k in steps + [k for _ in parts for k in range(len(claims))]:
        table = list(claims[0].table)
        index = claims[k].next()
        if index is not None:
            # Its own range's first part, or the first of the back of another run's range.
            first, stop = table[2 * k : 2 * k + 2]
            stolen = [j for j in range(len(claims)) if table[2 * j + 1] > index >= table[2 * j]]
            assert index == first < stop or (first >= stop and stolen and stolen != [k])
            if not taken[k] and first < stop:
                # A run with parts of its own left begins with the first of its range (its
                # range may have been stolen whole before it claimed: then it steals, maybe
                # back a part of its own range from the thief).
                assert index == ranges[k][0]
            taken[k].append(index)
    assert sorted(i for t in taken for i in t) == list(range(len(parts)))
    assert 0 in taken[0]  # part 0 is never stolen from run 0


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_worker_start_methods(tmp_path, monkeypatch, atlas, method):
    """Workers forked (the default on Linux when no other thread runs) or spawned (elsewhere,
    or ATLAS_FAST_CONVERT_START=spawn) write the same examples in the same order."""
    docs = _jsonl_tree(tmp_path / "src")
    monkeypatch.setenv("ATLAS_FAST_CONVERT_START", method)
    options = {"shard_size": 200, "block_size": 10, "workers": 2}
    convert(tmp_path / "src", tmp_path / "out", "jsonl", **options)
    assert read_back(atlas, tmp_path / "out") == docs
    monkeypatch.setenv("ATLAS_FAST_CONVERT_START", "teleport")
    with pytest.raises(ValueError, match="ATLAS_FAST_CONVERT_START='teleport'"):
        convert(tmp_path / "src", tmp_path / "bad", "jsonl", **options)
    assert_absent(tmp_path / "bad")


def test_stolen_parts_are_committed_in_part_order(tmp_path, atlas):
    """Run 1 writes before run 0 has begun, so it takes its own parts and then every part of
    run 0's but the first (each stolen one a group of its own): committed in part order,
    the examples are the source's, in order, whoever wrote them."""

    from atlas_fast._writing.commit import commit_staged_shards

    docs = _jsonl_tree(tmp_path / "src", files=6, per_file=70)
    results = _write_run_1_then_0(tmp_path, ((0, 3), (3, 6)))
    assert [first for first, _ in results[1][0]] == [3, 2, 1]
    assert [first for first, _ in results[0][0]] == [0]
    groups = sorted(g for groups, _ in results.values() for g in groups)
    staged = [d for _, dirs in groups for d in dirs]
    commit_staged_shards(tmp_path / "out", staged, compression_strategy=1)
    assert read_back(atlas, tmp_path / "out") == docs
    sizes = json.loads((tmp_path / "out" / "meta.json").read_text())["shard_sizes"]
    assert sizes == [50, 20, 50, 20, 50, 20, 50, 50, 50, 50, 10]


def test_a_process_dying_with_the_claim_lock_ends_the_wait():
    """A worker killed while it holds the shared claim table's lock (by the OOM killer, say)
    must not leave the others waiting forever: the wait checks who died, every second."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork" if hasattr(os, "fork") else "spawn")
    table = ctx.Array("q", len(Claims.layout(((0, 2), (2, 4)))))
    parts = [Part(str(i), 10, iter) for i in range(4)]
    watch = []  # what the watch says, once the holder has died
    claims = Claims(parts, ((0, 2), (2, 4)), 1, table, lambda: watch[0] if watch else None)
    holder = ctx.Process(target=_hold_and_die, args=(table,))
    holder.start()
    holder.join(10)
    assert holder.exitcode == 3
    watch.append(f"worker exited ({holder.exitcode})")
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"convert: worker exited \(3\)"):
        claims.next()
    assert time.monotonic() - started < 10


def _hold_and_die(table) -> None:
    table.get_lock().acquire()
    os._exit(3)


def _record_compressors(monkeypatch, log):
    """Make every shard writer's block compressor append ``pid threads`` to ``log`` (the
    worker processes are forked, so they record too)."""
    from atlas_fast import _backend

    real = _backend.compressor.block_compressor

    def recording(level, zdict, workers, **options):
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {workers}\n")
        return real(level, zdict, workers, **options)

    monkeypatch.setattr(_backend.compressor, "block_compressor", recording)
    monkeypatch.setenv("ATLAS_FAST_CONVERT_START", "fork")


def _compressors(log) -> list:
    return [tuple(map(int, line.split())) for line in log.read_text().splitlines()]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the recording reaches workers by fork")
@pytest.mark.parametrize("strategy", [1, 2])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_workers_are_cores_in_total(tmp_path, monkeypatch, atlas, strategy, workers):
    """``workers=N`` is N cores, as ``make -j N``: 1 is serial (the shard writers compress on
    the calling thread), N > 1 is N processes whose writers compress on one thread each, the
    blocks read while the strategy-2 dictionary was trained included; the same examples as a
    serial run."""
    docs = _jsonl_tree(tmp_path / "src", files=6, per_file=100)
    log = tmp_path / "compressors.log"
    _record_compressors(monkeypatch, log)
    options = {"shard_size": 60, "block_size": 10, "compression_strategy": strategy}
    convert(tmp_path / "src", tmp_path / "out", "jsonl", workers=workers, **options)
    assert read_back(atlas, tmp_path / "out") == docs
    made = _compressors(log)
    assert len(made) == len(_meta(tmp_path / "out")["shard_sizes"])  # one per shard
    assert {threads for _, threads in made} == {1}
    pids = {pid for pid, _ in made}
    if workers == 1:
        assert pids == {os.getpid()}
    else:
        assert os.getpid() in pids  # run 0 (and part 0) is always the calling process's
        assert len(pids) <= workers


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the recording reaches workers by fork")
def test_a_source_of_one_part_compresses_on_every_core_given(tmp_path, monkeypatch, atlas):
    """One part is one run: its process gets all N cores, as compression threads (and no
    worker process is started)."""
    from atlas_fast.convert import _run

    docs = documents(300)
    write_jsonl(tmp_path / "one.jsonl", docs)
    log = tmp_path / "compressors.log"
    _record_compressors(monkeypatch, log)
    monkeypatch.setattr(_run, "Workers", None)
    convert(tmp_path / "one.jsonl", tmp_path / "out", "jsonl", workers=3, shard_size=100)
    assert read_back(atlas, tmp_path / "out") == docs
    assert _compressors(log) == [(os.getpid(), 3)] * 3


def test_default_workers_are_the_usable_cores(tmp_path, monkeypatch):
    """No ``workers``: the writer's default_workers() (usable cores, at most 8); with
    ``ray=True`` Ray decides, and only an explicit workers > 1 is refused."""
    from atlas_fast import writer
    from atlas_fast.convert import _run

    assert inspect.signature(convert).parameters["workers"].default is None
    seen = []
    monkeypatch.setattr(_run, "run_conversion", lambda *a, workers, **k: seen.append(workers))
    monkeypatch.setattr(writer, "default_workers", lambda: 5)
    convert(tmp_path, tmp_path / "out", "jsonl")
    convert(tmp_path, tmp_path / "out", "jsonl", workers=1)
    convert(tmp_path, tmp_path / "out", "jsonl", ray=True)
    convert(tmp_path, tmp_path / "out", "jsonl", ray=True, workers=1)
    assert seen == [5, 1, 1, 1]
    with pytest.raises(ValueError, match="ray=True and workers=2 exclude each other"):
        convert(tmp_path, tmp_path / "out", "jsonl", ray=True, workers=2)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="workers must be a positive integer or None"):
            convert(tmp_path, tmp_path / "out", "jsonl", workers=bad)
    assert_absent(tmp_path / "out")
