"""``tokenize`` into S3 and from an Atlas dataset in S3 (moto): the objects are the files of a
local run; a run that fails leaves nothing in the store."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import reference_examples
from test_remote_write import download, local_files, open_uploads, stored
from tokenizer_helpers import by_hand, train_bpe

import atlas_fast
from atlas_fast.convert import SourceError, tokenize

pytest.importorskip("tokenizers")

TEXTS = [" ".join(["word", "other", "ünïcode", "日本"][: i % 5] * (i % 7)) for i in range(300)]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return train_bpe(tmp_path_factory.mktemp("tokenizer") / "bpe.json", TEXTS * 2)


def _jsonl(tmp_path, texts=TEXTS):
    src = tmp_path / "src"
    src.mkdir()
    for k in range(3):
        part = texts[k * len(texts) // 3 : (k + 1) * len(texts) // 3]
        (src / f"{k}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in part))
    return src


def _tokens(atlas, where) -> list:
    with atlas.AtlasDataset(where) as ds:
        return [a.tolist() for a in ds]


@pytest.mark.parametrize("workers", [1, 2])
def test_tokenize_to_s3_stores_the_bytes_of_a_local_run(
    s3, atlas, bpe, tmp_path, workers, monkeypatch
):
    src = _jsonl(tmp_path)
    options = {"fmt": "jsonl", "shard_size": 70, "block_size": 8, "eos_token": "<eos>"}
    tokenize(src, tmp_path / "local", bpe, workers=1, **options)
    staging = tmp_path / "staging"
    summary = tokenize(src, s3.url("tok"), bpe, workers=workers, staging_dir=staging, **options)
    assert summary.documents == len(TEXTS) and s3.url("tok") in str(summary)
    objects = stored(s3, "tok")
    local = local_files(tmp_path / "local")
    # The token index goes up with the shards, the same bytes as the local run's.
    assert "tokens.idx" in objects and objects == local
    assert summary.bytes_out == sum(map(len, objects.values()))
    assert open_uploads(s3) == [] and list(staging.iterdir()) == []
    expected = by_hand(bpe, TEXTS, eos=0)
    assert _tokens(atlas, s3.url("tok")) == expected
    got = reference_examples(download(objects, tmp_path / "down"))
    assert [a.tolist() for a in got] == expected and got[0].dtype == np.uint16
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # where the index is kept
    with atlas.AtlasDataset(s3.url("tok")) as ds:
        rows = atlas_fast.TokenSequences(ds, 7)
        flat = [t for ids in expected for t in ids]
        assert len(rows) == len(flat) // 7 and rows[3]["targets"].tolist() == flat[21:28]


def test_an_atlas_dataset_in_s3_is_a_source(s3, atlas, bpe, tmp_path):
    with atlas_fast.AtlasDatasetWriter(s3.url("docs"), 100, 10) as writer:
        for i, text in enumerate(TEXTS):
            writer.add_example({"id": i, "text": text})
    tokenize(s3.url("docs"), tmp_path / "out", bpe, workers=2)
    assert _tokens(atlas, tmp_path / "out") == by_hand(bpe, TEXTS)


def test_a_failed_run_leaves_nothing_in_the_store(s3, bpe, tmp_path):
    texts = list(TEXTS)
    src = _jsonl(tmp_path, texts)
    with open(src / "2.jsonl", "a") as f:  # after 200 documents: shards of 20 uploaded
        f.write(json.dumps({"body": "no text"}) + "\n")
    with pytest.raises(SourceError, match="no field 'text'"):
        tokenize(src, s3.url("bad"), bpe, fmt="jsonl", workers=2, shard_size=20, block_size=5)
    assert stored(s3, "bad") == {} and open_uploads(s3) == []


def test_a_failed_split_removes_the_splits_written_before(s3, bpe, tmp_path, monkeypatch):
    from atlas_fast.convert import _tokenize

    monkeypatch.setattr(_tokenize, "BATCH_DOCUMENTS", 4)  # progress reported within split b
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict(
        {
            "a": datasets.Dataset.from_list([{"text": t} for t in TEXTS[:50]]),
            "b": datasets.Dataset.from_list([{"text": t, "n": 1} for t in TEXTS[50:60]]),
        }
    )
    dd.save_to_disk(str(tmp_path / "hf"))
    summary = tokenize(tmp_path / "hf", s3.url("splits"), bpe, fmt="hf", workers=1)
    assert sorted(s for s, *_ in summary.datasets) == ["a", "b"]
    assert {n.split("/")[0] for n in stored(s3, "splits")} == {"a", "b"}
    # Split b's 30th text is null: refused after split a is stored, which goes too.
    dd["b"] = datasets.Dataset.from_list([{"text": t} for t in TEXTS[:29]] + [{"text": None}])
    dd.save_to_disk(str(tmp_path / "hf2"))
    seen = []  # the splits stored in the bucket, at each progress report

    def look(documents, nbytes):
        seen.append({n.split("/")[0] for n in stored(s3, "splits2")})

    with pytest.raises(SourceError, match="a NoneType, not a string"):
        tokenize(tmp_path / "hf2", s3.url("splits2"), bpe, fmt="hf", workers=1, progress=look)
    assert seen[-1] == {"a"}  # a was stored whole while b was written
    assert stored(s3, "splits2") == {} and open_uploads(s3) == []


def test_objects_in_the_way_and_overwrite(s3, atlas, bpe, tmp_path):
    src = _jsonl(tmp_path)
    s3.client.put_object(Bucket=s3.bucket, Key="taken/x", Body=b"x")
    with pytest.raises(FileExistsError, match="--overwrite"):
        tokenize(src, s3.url("taken"), bpe, fmt="jsonl", workers=1)
    assert stored(s3, "taken") == {"x": b"x"}
    tokenize(src, s3.url("taken"), bpe, fmt="jsonl", workers=1, overwrite=True)
    assert "x" not in stored(s3, "taken")
    assert _tokens(atlas, s3.url("taken")) == by_hand(bpe, TEXTS)
