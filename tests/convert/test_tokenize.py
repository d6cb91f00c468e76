"""``atlas_fast.convert.tokenize`` and ``atlas-fast tokenize``: documents of every source into
token arrays equal to calling the tokenizer by hand, the same bytes for any ``workers``,
nothing left behind by a failure. The tokenizers are trained here, from a small corpus."""

from __future__ import annotations

import filecmp
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from convert_helpers import assert_absent, documents, read_back, write_jsonl
from helpers import reference_examples
from tokenizer_helpers import by_hand, train_bpe

import atlas_fast
from atlas_fast.convert import (
    FORMATS,
    TOKENIZE_FORMATS,
    SourceError,
    TokenizerError,
    TokenizeSummary,
    tokenize,
)
from atlas_fast.convert import _tokenize as tokenize_module
from atlas_fast.convert._tokenize import token_dtype

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers  # noqa: E402

DOCS = documents(240, seed=7)
TEXTS = [d["text"] for d in DOCS]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> Path:
    """A byte-level BPE of 400 ids (uint16), "<eos>" id 0 and "<bos>" id 1."""
    return train_bpe(tmp_path_factory.mktemp("tokenizers") / "bpe.json", TEXTS * 3)


@pytest.fixture(scope="module")
def words(tmp_path_factory) -> Path:
    """A word-level tokenizer of a few dozen ids (uint8)."""
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["<unk>", "<eos>"], show_progress=False)
    tok.train_from_iterator(TEXTS, trainer)
    assert tok.get_vocab_size() < 256
    path = tmp_path_factory.mktemp("tokenizers") / "words.json"
    tok.save(str(path))
    return path


def assert_tokens(atlas, dst, expected, dtype) -> None:
    got = read_back(atlas, dst)
    assert len(got) == len(expected)
    for k, (array, ids) in enumerate(zip(got, expected)):
        assert type(array) is np.ndarray and array.ndim == 1, k
        assert array.dtype == dtype, k
        assert array.tolist() == ids, k


def same_files(a: Path, b: Path) -> None:
    """The two trees hold the same files with the same bytes."""
    names_a = sorted(p.relative_to(a).as_posix() for p in a.rglob("*"))
    names_b = sorted(p.relative_to(b).as_posix() for p in b.rglob("*"))
    assert names_a == names_b
    for name in names_a:
        if (a / name).is_file():
            assert filecmp.cmp(a / name, b / name, shallow=False), name


# -- sources ---------------------------------------------------------------------------------


def _jsonl(root: Path) -> Path:
    src = root / "jsonl"
    for k in range(3):
        write_jsonl(src / f"{k}.jsonl", DOCS[k * 80 : (k + 1) * 80])
    return src


def _parquet(root: Path) -> Path:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    src = root / "parquet"
    src.mkdir()
    for k in range(2):
        rows = [{"id": d["id"], "text": d["text"]} for d in DOCS[k * 120 : (k + 1) * 120]]
        pq.write_table(pa.Table.from_pylist(rows), src / f"{k}.parquet", row_group_size=50)
    return src


def _hf(root: Path) -> Path:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"id": d["id"], "text": d["text"]} for d in DOCS])
    ds.save_to_disk(str(root / "hf"), num_shards=2)
    return root / "hf"


def _dolma(root: Path) -> Path:
    for k in range(2):
        write_jsonl(root / "dolma" / "documents" / f"{k}.jsonl.gz", DOCS[k * 120 : (k + 1) * 120])
    return root / "dolma"


def _tar(path: Path, members: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def _wds(root: Path) -> Path:
    for k in range(2):
        members = [(f"{d['id']}.txt", d["text"].encode()) for d in DOCS[k * 120 : (k + 1) * 120]]
        _tar(root / "wds" / f"shard-{k}.tar", members)
    return root / "wds"


def _atlas(root: Path) -> Path:
    with atlas_fast.AtlasDatasetWriter(root / "atlas", 50, 8) as writer:
        for d in DOCS:
            writer.add_example(d)
    return root / "atlas"


SOURCES = {
    "jsonl": (_jsonl, {}, "text"),
    "parquet": (_parquet, {}, "text"),
    "hf": (_hf, {}, "text"),
    "dolma": (_dolma, {}, "text"),
    "wds": (_wds, {"decode": True}, "txt"),
    "atlas": (_atlas, {}, "text"),
}


def test_formats_are_convert_s_but_flat_tokens_and_atlas():
    from atlas_fast.cli.tokenize import FORMAT_NAMES

    assert FORMAT_NAMES == TOKENIZE_FORMATS
    assert set(TOKENIZE_FORMATS) == (set(FORMATS) - {"flat-tokens"}) | {"atlas"}


@pytest.mark.parametrize("fmt", list(SOURCES))
def test_every_source_gives_the_tokenizer_s_ids(atlas, bpe, tmp_path, fmt):
    build, options, text_field = SOURCES[fmt]
    src = build(tmp_path)
    dst = tmp_path / "tokens"
    summary = tokenize(
        src, dst, bpe, fmt=fmt, field=text_field, workers=2, shard_size=70, block_size=9, **options
    )
    expected = by_hand(bpe, TEXTS)
    assert_tokens(atlas, dst, expected, np.uint16)
    assert isinstance(summary, TokenizeSummary)
    assert (summary.documents, summary.tokens) == (len(DOCS), sum(map(len, expected)))
    assert (summary.shards, summary.dtype, summary.fmt) == (4, "uint16", fmt)
    assert str(dst) in str(summary) and "tokens/s" in str(summary)
    assert_absent_staging(dst)


def assert_absent_staging(dst: Path) -> None:
    assert [p.name for p in dst.parent.iterdir() if p.name.startswith(f".{dst.name}.")] == []


def test_an_atlas_dataset_is_the_default_source_and_strings_need_no_field(atlas, words, tmp_path):
    src = tmp_path / "strings"
    with atlas_fast.AtlasDatasetWriter(src, 100, 10) as writer:
        for text in TEXTS:
            writer.add_example(text)
    tokenize(src, tmp_path / "a", words, field=None, workers=1)
    assert_tokens(atlas, tmp_path / "a", by_hand(words, TEXTS), np.uint8)
    with pytest.raises(SourceError, match="not an Atlas dataset"):
        tokenize(_jsonl(tmp_path), tmp_path / "b", words, workers=1)
    assert_absent(tmp_path / "b")


def test_splits_become_datasets_of_their_own(atlas, bpe, tmp_path):
    datasets = pytest.importorskip("datasets")
    parts = {"train": DOCS[:200], "test": DOCS[200:]}
    dd = datasets.DatasetDict(
        {k: datasets.Dataset.from_list([{"text": d["text"]} for d in v]) for k, v in parts.items()}
    )
    dd.save_to_disk(str(tmp_path / "hf"))
    summary = tokenize(tmp_path / "hf", tmp_path / "out", bpe, fmt="hf", workers=2)
    for split, docs in parts.items():
        assert_tokens(
            atlas, tmp_path / "out" / split, by_hand(bpe, [d["text"] for d in docs]), np.uint16
        )
    assert sorted(s for s, *_ in summary.datasets) == ["test", "train"]
    assert summary.documents == len(DOCS)


# -- what each document becomes ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_id", "dtype"),
    [
        (0, np.uint8),
        (255, np.uint8),
        (256, np.uint16),
        (65535, np.uint16),
        (65536, np.uint32),
        (2**32 - 1, np.uint32),
        (2**32, np.uint64),
    ],
)
def test_the_smallest_unsigned_dtype_holding_the_vocabulary(max_id, dtype):
    assert token_dtype(max_id) == np.dtype(dtype)


def test_a_vocabulary_beyond_uint16_gives_uint32(atlas, tmp_path):
    vocab = {f"w{i}": i for i in range(70_000)}
    vocab["<unk>"] = 70_000
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "big.json"
    tok.save(str(path))
    texts = ["w0 w69999 w65536", "nothing known", "", "w255 w256 w65535"]
    src = write_jsonl(tmp_path / "src.jsonl", [{"text": t} for t in texts])
    summary = tokenize(src, tmp_path / "out", path, fmt="jsonl", eos_token="w7", workers=2)
    expected = by_hand(path, texts, eos=7)
    assert expected[0] == [0, 69999, 65536, 7] and expected[2] == [7]
    assert_tokens(atlas, tmp_path / "out", expected, np.uint32)
    assert summary.dtype == "uint32" and summary.vocab_size == 70_001


@pytest.mark.parametrize("how", ["token", "id"])
def test_an_end_of_document_id_is_appended_on_request(atlas, bpe, tmp_path, how):
    src = _jsonl(tmp_path)
    asked = {"eos_token": "<eos>"} if how == "token" else {"eos_id": 0}
    summary = tokenize(src, tmp_path / "out", bpe, fmt="jsonl", workers=2, **asked)
    expected = by_hand(bpe, TEXTS, eos=0)
    assert_tokens(atlas, tmp_path / "out", expected, np.uint16)
    assert summary.eos_id == 0 and summary.tokens == sum(map(len, expected))
    empty = TEXTS.index("")
    assert read_back(atlas, tmp_path / "out")[empty].tolist() == [0]


def test_add_special_tokens_applies_the_post_processor(atlas, bpe, tmp_path):
    tok = Tokenizer.from_file(str(bpe))
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", 1)]
    )
    path = tmp_path / "with_bos.json"
    tok.save(str(path))
    src = _jsonl(tmp_path)
    tokenize(src, tmp_path / "plain", path, fmt="jsonl", workers=1)
    tokenize(src, tmp_path / "bos", tok, fmt="jsonl", workers=1, add_special_tokens=True, eos_id=0)
    assert_tokens(atlas, tmp_path / "plain", by_hand(path, TEXTS), np.uint16)
    with_bos = by_hand(path, TEXTS, eos=0, special=True)
    assert all(ids[0] == 1 for ids in with_bos)
    assert_tokens(atlas, tmp_path / "bos", with_bos, np.uint16)


# -- the same bytes whatever the workers ----------------------------------------------------------


@pytest.mark.parametrize("strategy", [0, 2, 3])
def test_workers_1_and_2_write_the_same_bytes(atlas, bpe, tmp_path, monkeypatch, strategy):
    # Small batches: many in flight at once, finished out of order by the two processes.
    monkeypatch.setattr(tokenize_module, "BATCH_DOCUMENTS", 7)
    src = _jsonl(tmp_path)
    options = {"fmt": "jsonl", "shard_size": 60, "block_size": 5, "compression_strategy": strategy}
    tokenize(src, tmp_path / "one", bpe, workers=1, eos_token="<eos>", **options)
    tokenize(src, tmp_path / "two", bpe, workers=2, eos_token="<eos>", **options)
    tokenize(src, tmp_path / "three", bpe, workers=3, eos_token="<eos>", **options)
    same_files(tmp_path / "one", tmp_path / "two")
    same_files(tmp_path / "one", tmp_path / "three")
    assert_tokens(atlas, tmp_path / "two", by_hand(bpe, TEXTS, eos=0), np.uint16)


def test_the_result_carries_its_token_index_for_token_sequences(atlas, bpe, tmp_path):
    dst = tmp_path / "out"
    tokenize(_jsonl(tmp_path), dst, bpe, fmt="jsonl", workers=2, eos_id=0, shard_size=70)
    assert (dst / "tokens.idx").is_file()
    with atlas.AtlasDataset(dst) as ds:
        ts = atlas_fast.TokenSequences(ds, 16, index="require")  # refuses to build one
        flat = [t for ids in by_hand(bpe, TEXTS, eos=0) for t in ids]
        assert ts.num_tokens == len(flat) and len(ts) == len(flat) // 16
        for k in (0, 1, len(ts) // 2, len(ts) - 1):
            assert ts[k]["targets"].tolist() == flat[k * 16 : (k + 1) * 16]


def test_the_reference_package_reads_the_result(bpe, tmp_path):
    dst = tmp_path / "out"
    tokenize(_jsonl(tmp_path), dst, bpe, fmt="jsonl", workers=2, shard_size=100, block_size=7)
    got = reference_examples(dst)
    expected = by_hand(bpe, TEXTS)
    assert len(got) == len(expected)
    assert all(a.dtype == np.uint16 and a.tolist() == e for a, e in zip(got, expected))


def test_progress_reports_every_document_and_byte(bpe, tmp_path):
    src = _jsonl(tmp_path)
    seen = []
    tokenize(src, tmp_path / "out", bpe, fmt="jsonl", workers=2, progress=lambda *a: seen.append(a))
    assert sum(d for d, _ in seen) == len(DOCS)
    assert sum(b for _, b in seen) == sum(p.stat().st_size for p in src.iterdir())


# -- bad input, and nothing written ----------------------------------------------------------------


def test_a_missing_field_names_the_file_and_example_and_writes_nothing(bpe, tmp_path, monkeypatch):
    monkeypatch.setattr(tokenize_module, "BATCH_DOCUMENTS", 5)
    docs = [{"text": t} for t in TEXTS]
    docs[200] = {"id": "x", "body": "no text here"}
    src = write_jsonl(tmp_path / "src" / "docs.jsonl", docs)
    dst = tmp_path / "out"
    # Shards of 20: nine shards are finished before the bad document is read.
    with pytest.raises(SourceError) as info:
        tokenize(src, dst, bpe, fmt="jsonl", workers=2, shard_size=20, block_size=4)
    message = str(info.value)
    assert str(src) in message and "example 200" in message and "'text'" in message
    assert "'id', 'body'" in message
    assert_absent(dst)


@pytest.mark.parametrize(
    ("value", "found"),
    [(17, "an int"), (None, "a NoneType"), (["a"], "a list"), ({"t": "x"}, "a dict")],
)
def test_a_text_that_is_not_a_string_is_refused(bpe, tmp_path, value, found):
    docs = [{"text": "fine"}, {"text": value}]
    src = write_jsonl(tmp_path / "src.jsonl", docs)
    with pytest.raises(SourceError, match=f"example 1 .*'text' is {found}, not a string"):
        tokenize(src, tmp_path / "out", bpe, fmt="jsonl", workers=1)
    assert_absent(tmp_path / "out")


def test_undecoded_webdataset_members_are_bytes_and_said_so(bpe, tmp_path):
    src = _wds(tmp_path)
    with pytest.raises(SourceError, match=r"'txt' is a bytes, not a string .*decode"):
        tokenize(src, tmp_path / "out", bpe, fmt="wds", field="txt", workers=1)
    assert_absent(tmp_path / "out")


def test_an_example_that_is_not_a_mapping(bpe, tmp_path):
    src = write_jsonl(tmp_path / "src.jsonl", [{"text": "a"}, "just a string"])
    with pytest.raises(SourceError, match=r"example 1 .*: a str, not a mapping with a field 'te"):
        tokenize(src, tmp_path / "out", bpe, fmt="jsonl", workers=1)
    assert_absent(tmp_path / "out")


@pytest.mark.parametrize("content", [b"", b"not json", b'{"model": 3}', None])
def test_a_tokenizer_file_that_does_not_load(tmp_path, content):
    path = tmp_path / "tokenizer.json"
    if content is not None:
        path.write_bytes(content)
    src = _jsonl(tmp_path)
    with pytest.raises(TokenizerError, match=str(path)):
        tokenize(src, tmp_path / "out", path, fmt="jsonl", workers=1)
    assert isinstance(TokenizerError("x"), atlas_fast.InvalidArgumentError)
    assert_absent(tmp_path / "out")


def test_a_tokenizer_that_fails_on_a_document(tmp_path, monkeypatch):
    monkeypatch.setattr(tokenize_module, "BATCH_DOCUMENTS", 3)
    # A word-level model whose unknown token is not in its vocabulary fails on a new word.
    tok = Tokenizer(models.WordLevel({"known": 0, "words": 1}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tok.json"
    tok.save(str(path))
    texts = ["known words"] * 10 + ["known surprise"] + ["words"] * 10
    src = write_jsonl(tmp_path / "src.jsonl", [{"text": t} for t in texts])
    with pytest.raises(TokenizerError) as info:
        tokenize(src, tmp_path / "out", path, fmt="jsonl", workers=2, shard_size=2)
    message = str(info.value)
    assert str(path) in message and "Missing [UNK]" in message
    assert f"{src}: example 9 (document 9 of the source)" in message  # its batch's first
    assert_absent(tmp_path / "out")


@pytest.mark.parametrize(
    ("asked", "match"),
    [
        ({"eos_token": "</s>"}, "eos_token '</s>': not in the vocabulary"),
        ({"eos_id": 400}, "eos_id 400: not an id of the vocabulary"),
        ({"eos_id": -1}, "eos_id"),
        ({"eos_token": "<eos>", "eos_id": 0}, "exclude each other"),
    ],
)
def test_an_eos_outside_the_vocabulary_is_refused(bpe, tmp_path, asked, match):
    with pytest.raises(atlas_fast.InvalidArgumentError, match=match):
        tokenize(_jsonl(tmp_path), tmp_path / "out", bpe, fmt="jsonl", workers=1, **asked)
    assert_absent(tmp_path / "out")


def test_bad_arguments(bpe, tmp_path):
    src = _jsonl(tmp_path)
    cases = [
        ({"fmt": "flat-tokens"}, atlas_fast.InvalidArgumentError, "token ids already"),
        ({"fmt": "csv"}, atlas_fast.InvalidArgumentError, "unknown format 'csv'"),
        ({"fmt": "jsonl", "workers": 0}, ValueError, "workers"),
        ({"fmt": "jsonl", "field": 3}, atlas_fast.InvalidArgumentError, "field"),
        ({"fmt": "jsonl", "block_size": 0}, atlas_fast.InvalidArgumentError, "block_size"),
        ({"fmt": "jsonl", "decode": True}, TypeError, "unexpected option 'decode'"),
        ({"fmt": "jsonl", "staging_bytes": 5}, atlas_fast.InvalidArgumentError, "URL"),
    ]
    for kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            tokenize(src, tmp_path / "out", bpe, **kwargs)
        assert_absent(tmp_path / "out")
    with pytest.raises(atlas_fast.InvalidArgumentError, match="tokenizer must be"):
        tokenize(src, tmp_path / "out", 42, fmt="jsonl")


def test_an_interrupt_mid_way_leaves_nothing(bpe, tmp_path, monkeypatch):
    monkeypatch.setattr(tokenize_module, "BATCH_DOCUMENTS", 10)
    calls = []

    def interrupt(documents, nbytes):
        calls.append(documents)
        if len(calls) == 8:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tokenize(
            _jsonl(tmp_path),
            tmp_path / "out",
            bpe,
            fmt="jsonl",
            workers=2,
            shard_size=20,
            progress=interrupt,
        )
    assert_absent(tmp_path / "out")


def test_a_destination_in_the_way_and_overwrite(atlas, bpe, words, tmp_path):
    src = _jsonl(tmp_path)
    dst = tmp_path / "out"
    tokenize(src, dst, bpe, fmt="jsonl", workers=1)
    with pytest.raises(FileExistsError, match="--overwrite"):
        tokenize(src, dst, words, fmt="jsonl", workers=1)
    assert_tokens(atlas, dst, by_hand(bpe, TEXTS), np.uint16)
    tokenize(src, dst, words, fmt="jsonl", workers=2, overwrite=True)
    assert_tokens(atlas, dst, by_hand(words, TEXTS), np.uint8)
    assert_absent_staging(dst)
    # A failed overwrite leaves the old dataset as it was.
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"text": "a"}, {"nope": 1}])
    with pytest.raises(SourceError):
        tokenize(bad, dst, bpe, fmt="jsonl", workers=1, overwrite=True)
    assert_tokens(atlas, dst, by_hand(words, TEXTS), np.uint8)
    assert_absent_staging(dst)
    # overwrite replaces a dataset, never other files.
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not an Atlas dataset"):
        tokenize(src, other, bpe, fmt="jsonl", workers=1, overwrite=True)
    assert (other / "notes.txt").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    tokenize(src, tmp_path / "empty", bpe, fmt="jsonl", workers=1)
    assert_tokens(atlas, tmp_path / "empty", by_hand(bpe, TEXTS), np.uint16)


# -- the command ------------------------------------------------------------------------------


def _main(capsys, *args) -> tuple:
    """``atlas-fast tokenize ARGS`` in this process: (exit status, stdout, stderr)."""
    from atlas_fast import cli

    try:
        status = cli.main(["tokenize", *map(str, args)])
    except SystemExit as exc:  # argparse's usage errors
        status = exc.code
    out, err = capsys.readouterr()
    return status, out, err


def test_the_command_writes_the_dataset_and_says_so(bpe, tmp_path):
    src = _jsonl(tmp_path)
    dst = tmp_path / "out"
    args = [src, dst, "--tokenizer", bpe, "--from", "jsonl", "--eos-token", "<eos>"]
    args += ["--workers", "2", "--shard-size", "100", "--strategy", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "atlas_fast", "tokenize", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "ATLAS_FAST_NO_TORCH": "1"},  # a fifth of the start-up time
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"tokenized {len(DOCS)} documents (jsonl) into ")
    assert_tokens(atlas_fast.atlas, dst, by_hand(bpe, TEXTS, eos=0), np.uint16)
    assert atlas_fast.AtlasDataset(dst).metadata.compression_strategy == 1


def test_the_command_s_exit_codes(bpe, tmp_path, capsys):
    src = _jsonl(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    dst = tmp_path / "out"
    usage = [
        [src, dst, "--from", "jsonl"],  # no --tokenizer
        [src, dst, "--tokenizer", bpe, "--eos-token", "<eos>", "--eos-id", "0"],
        [src, dst, "--tokenizer", bpe, "--from", "csv"],
        [src, dst, "--tokenizer", bpe, "--from", "jsonl", "--workers", "0"],
    ]
    for args in usage:
        status, _, err = _main(capsys, *args)
        assert status == 2 and "error" in err, (args, err)
    failing = [
        ([src, dst, "--tokenizer", bad, "--from", "jsonl"], "not a tokenizer file"),
        ([src, dst, "--tokenizer", bpe, "--from", "jsonl", "--field", "body"], "no field 'body'"),
        ([src, dst, "--tokenizer", bpe, "--from", "jsonl", "--eos-token", "</s>"], "</s>"),
        ([src, dst, "--tokenizer", bpe, "--from", "jsonl", "--decode"], "--decode applies"),
        ([src, dst, "--tokenizer", bpe, "--from", "jsonl", "--staging-dir", tmp_path], "URL"),
        ([src, dst, "--tokenizer", bpe], "not an Atlas dataset"),
    ]
    for args, said in failing:
        status, out, err = _main(capsys, *args)
        assert status == 1 and said in err and out == "", (args, err)
        assert_absent(dst)
    status, out, _ = _main(capsys, src, dst, "--tokenizer", bpe, "--from", "jsonl", "--quiet")
    assert status == 0 and out.startswith(f"tokenized {len(DOCS)} documents")
    status, _, err = _main(capsys, src, dst, "--tokenizer", bpe, "--from", "jsonl")
    assert status == 1 and "--overwrite" in err
    # The result as the source of another run: its examples are arrays, not documents.
    status, _, err = _main(capsys, dst, tmp_path / "again", "--tokenizer", bpe)
    assert status == 1 and "not a mapping with a field 'text'" in err
    assert_absent(tmp_path / "again")
    status, _, err = _main(capsys, src, dst, "--tokenizer", bpe, "--from", "jsonl", "--overwrite")
    assert status == 0, err


def test_without_the_tokenizers_library_the_extra_is_named(bpe, tmp_path, monkeypatch):
    from atlas_fast._extras import MissingExtraError

    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if not installed
    with pytest.raises(MissingExtraError, match=r"atlas-fast\[tokenize\]"):
        tokenize(_jsonl(tmp_path), tmp_path / "out", bpe, fmt="jsonl", workers=1)
    assert_absent(tmp_path / "out")
