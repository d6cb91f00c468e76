"""``export`` from and to S3 (moto): a dataset in the store is exported as the local one is;
an export to a URL stores the files of a local export, its index last; a failed one leaves
nothing in the store, and objects already there are refused unless ``overwrite``."""

from __future__ import annotations

import json

import pytest
from convert_helpers import arrow_rows
from export_helpers import write
from helpers import same
from servers import upload_tree
from test_remote_write import download, local_files, stored

import atlas_fast
from atlas_fast.convert import convert
from atlas_fast.export import ExportError, export

pytest.importorskip("pyarrow")


@pytest.fixture
def exporting(atlas, monkeypatch):
    from atlas_fast.export import _run

    monkeypatch.setattr(_run, "READER_MODULE", atlas.__name__)
    return atlas


def _files_but_random(files: dict) -> dict:
    """An HF export's state.json holds a random fingerprint: left out of comparisons."""
    return {k: v for k, v in files.items() if k != "state.json"}


@pytest.mark.parametrize("target", ["parquet", "hf", "jsonl"])
def test_export_from_s3_is_the_local_export(s3, exporting, tmp_path, target):
    rows = arrow_rows(1200) if target != "jsonl" else [{"id": i} for i in range(1200)]
    local = write(tmp_path / "src", rows, shard_size=500)
    upload_tree(s3.client, s3.bucket, local, "ds")
    export(local, tmp_path / "from-local", target, workers=2)
    summary = export(s3.url("ds"), tmp_path / "from-s3", target, workers=2)
    assert summary.examples == 1200
    assert _files_but_random(local_files(tmp_path / "from-s3")) == _files_but_random(
        local_files(tmp_path / "from-local")
    )


@pytest.mark.parametrize("target, fmt", [("parquet", "parquet"), ("hf", "hf")])
def test_export_to_s3_stores_the_files_of_a_local_export(s3, exporting, tmp_path, target, fmt):
    rows = arrow_rows(1500)
    src = write(tmp_path / "src", rows, shard_size=400)
    export(src, tmp_path / "local", target, workers=2)
    summary = export(src, s3.url("exp"), target, workers=2, staging_dir=tmp_path / "staging")
    assert s3.url("exp") in str(summary)
    objects = stored(s3, "exp")
    assert _files_but_random(objects) == _files_but_random(local_files(tmp_path / "local"))
    assert list((tmp_path / "staging").iterdir()) == []
    if target == "hf":
        state = json.loads(objects["state.json"])
        assert [f["filename"] for f in state["_data_files"]] == summary.files[:-2]
    back = download(objects, tmp_path / "downloaded")
    convert(back, tmp_path / "back", fmt)
    with exporting.AtlasDataset(tmp_path / "back") as ds:
        assert all(same(a, b) for a, b in zip(ds, rows)) and len(ds) == len(rows)


def test_the_command_stages_in_staging_dir(s3, exporting, tmp_path):
    """``atlas-fast export --staging-dir DIR`` reaches the export: DIR is made (the export's
    staging directory goes in it) and left empty; the objects are a local export's files."""
    from atlas_fast import cli

    src = write(tmp_path / "src", [{"id": i, "text": f"t{i}"} for i in range(500)])
    export(src, tmp_path / "local", "jsonl")
    staging = tmp_path / "staging" / "deeper"
    argv = ["export", str(src), s3.url("cli"), "--to", "jsonl", "--staging-dir", str(staging)]
    assert cli.main([*argv, "--quiet"]) == 0
    assert stored(s3, "cli") == local_files(tmp_path / "local")
    assert staging.is_dir() and list(staging.iterdir()) == []


def test_s3_to_s3_and_refusals(s3, exporting, tmp_path):
    rows = [{"a": i} for i in range(300)] + [{"a": (1,)}]
    upload_tree(s3.client, s3.bucket, write(tmp_path / "src", rows), "ds")
    with pytest.raises(ExportError, match=r"example 300 .*tuple"):
        export(s3.url("ds"), s3.url("out"), "jsonl")
    assert stored(s3, "out") == {}
    summary = export(s3.url("ds"), s3.url("out"), "jsonl", pickle=True)
    jsonl = ["part-00000.jsonl", "part-00001.jsonl"]
    assert summary.pickled == 1 and sorted(stored(s3, "out")) == summary.files == jsonl
    with pytest.raises(FileExistsError, match="overwrite"):
        export(s3.url("ds"), s3.url("out"), "parquet")
    assert sorted(stored(s3, "out")) == jsonl
    export(s3.url("ds"), s3.url("out"), "parquet", pickle=True, overwrite=True)
    assert sorted(stored(s3, "out")) == ["part-00000.parquet", "part-00001.parquet"]
    with pytest.raises(ExportError):  # fails before its upload: the old objects stay
        export(s3.url("ds"), s3.url("out"), "jsonl", overwrite=True)
    assert sorted(stored(s3, "out")) == ["part-00000.parquet", "part-00001.parquet"]
    with pytest.raises(atlas_fast.AtlasFormatError):
        export(s3.url("nothing"), tmp_path / "out", "jsonl")
    assert not (tmp_path / "out").exists()
