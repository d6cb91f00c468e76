"""``convert`` and ``atlas-fast convert`` into S3 (moto): the objects are the files of a
conversion to a local DST; a conversion that fails leaves nothing in the store."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import reference_read, same
from test_remote_write import download, local_files, open_uploads, stored

from atlas_fast.convert import SourceError, convert

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _documents(n: int) -> list:
    return [
        {"id": f"doc-{i}", "text": "word " * (i % 37), "meta": {"n": i, "tags": ["a", i % 5]}}
        for i in range(n)
    ]


def _jsonl(tmp_path, docs):
    src = tmp_path / "src-jsonl"
    src.mkdir()
    for k in range(3):
        part = docs[k * len(docs) // 3 : (k + 1) * len(docs) // 3]
        (src / f"{k}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in part))
    return src


def _parquet(tmp_path, docs):
    src = tmp_path / "src-parquet"
    src.mkdir()
    rows = [{"id": d["id"], "text": d["text"], "n": d["meta"]["n"]} for d in docs]
    for k in range(2):
        part = rows[k * len(rows) // 2 : (k + 1) * len(rows) // 2]
        pq.write_table(pa.Table.from_pylist(part), src / f"{k}.parquet")
    return src, rows


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
@pytest.mark.parametrize("workers", [1, 2])
def test_convert_to_s3_stores_the_bytes_of_a_local_conversion(s3, atlas, tmp_path, fmt, workers):
    docs = _documents(600)
    if fmt == "jsonl":
        src, expected = _jsonl(tmp_path, docs), docs
    else:
        src, expected = _parquet(tmp_path, docs)
    options = {"shard_size": 100, "block_size": 10, "workers": workers}
    convert(src, tmp_path / "local", fmt, **options)
    staging = tmp_path / "staging"
    summary = convert(src, s3.url("conv"), fmt, staging_dir=staging, **options)
    assert summary.examples == len(expected) and s3.url("conv") in str(summary)
    objects = stored(s3, "conv")
    assert objects == local_files(tmp_path / "local")
    assert open_uploads(s3) == [] and list(staging.iterdir()) == []
    with atlas.AtlasDataset(s3.url("conv")) as ds:
        assert all(same(a, b) for a, b in zip(iter(ds), expected)) and len(ds) == len(expected)
    got = reference_read(download(objects, tmp_path / "down"))
    assert len(got) == len(expected) and all(same(a, b) for a, b in zip(got, expected))


def test_a_failed_conversion_leaves_nothing_in_the_store(s3, tmp_path):
    src = _jsonl(tmp_path, _documents(90))
    with open(src / "1.jsonl", "a") as f:
        f.write('{"broken": \n')
    with pytest.raises(SourceError, match="line"):
        convert(src, s3.url("bad"), "jsonl", shard_size=20, block_size=5)
    assert stored(s3, "bad") == {}


def test_convert_refuses_a_destination_holding_objects(s3, tmp_path):
    src = _jsonl(tmp_path, _documents(30))
    s3.client.put_object(Bucket=s3.bucket, Key="taken/x", Body=b"x")
    with pytest.raises(FileExistsError, match="already exists"):
        convert(src, s3.url("taken"), "jsonl")
    convert(src, s3.url("taken"), "jsonl", overwrite=True, shard_size=10, block_size=5)
    assert "x" not in stored(s3, "taken") and "meta.json" in stored(s3, "taken")


def test_the_command_converts_to_a_url(s3, tmp_path):
    src = _jsonl(tmp_path, _documents(120))
    command = [sys.executable, "-m", "atlas_fast", "convert", str(src), s3.url("cli")]
    command += ["--from", "jsonl", "--shard-size", "50", "--block-size", "10", "--workers", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    convert(src, tmp_path / "local", "jsonl", shard_size=50, block_size=10, workers=1)
    assert stored(s3, "cli") == local_files(tmp_path / "local")
