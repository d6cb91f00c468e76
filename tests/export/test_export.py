"""``export``: convert(export(ds)) == ds example for example, for each format both ways;
examples a target cannot hold named; DST complete or as it was; all cores, same result."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from convert_helpers import arrow_rows
from export_helpers import assert_absent, json_values, read_back, wds_samples, write
from helpers import same

from atlas_fast import AtlasFormatError
from atlas_fast.convert import SourceError, convert
from atlas_fast.export import (
    PICKLED,
    TARGETS,
    ExportError,
    export,
    export_hf,
    export_jsonl,
    export_parquet,
    export_webdataset,
)

pytest.importorskip("pyarrow")

# target -> (convert's format, examples it holds, convert's options)
CASES = {
    "parquet": ("parquet", arrow_rows(1500), {}),
    "hf": ("hf", arrow_rows(1500), {}),
    "jsonl": ("jsonl", json_values(1500), {}),
    "webdataset": ("wds", wds_samples(700), {"decode": True}),
}


def _same_all(got: list, expected: list) -> None:
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert same(a, b), f"example {i}: {a!r:.300} != {b!r:.300}"


def _without_url(examples: list) -> list:
    return [{k: v for k, v in e.items() if k != "__url__"} for e in examples]


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("target", list(CASES))
def test_convert_of_export_is_the_dataset(tmp_path, exporting, target, workers):
    fmt, examples, options = CASES[target]
    src = write(tmp_path / "src", examples, shard_size=400)
    summary = export(src, tmp_path / "out", target, workers=workers)
    assert summary.examples == len(examples) and summary.shards == -(-len(examples) // 400)
    assert summary.files and all((tmp_path / "out" / n).is_file() for n in summary.files)
    assert str(tmp_path / "out") in str(summary)
    convert(tmp_path / "out", tmp_path / "back", fmt, workers=workers, **options)
    got = read_back(exporting, tmp_path / "back")
    if target == "webdataset":  # convert says which shard each sample came from
        assert {g["__url__"] for g in got} == set(summary.files)
        got = _without_url(got)
    _same_all(got, examples)
    assert_absent(tmp_path / "other")  # nothing but DST was made next to it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["back", "out", "src"]


def test_the_files_are_in_the_order_of_the_examples_whatever_the_workers(tmp_path, exporting):
    rows = arrow_rows(5000)
    src = write(tmp_path / "src", rows, shard_size=2500)  # two shards: cut for 2 workers
    one = export_parquet(src, tmp_path / "one", workers=1)
    two = export_parquet(src, tmp_path / "two", workers=2)
    assert len(one.files) == 2 and len(two.files) > 2
    assert two.files == sorted(two.files)
    for name in ("one", "two"):
        convert(tmp_path / name, tmp_path / f"back-{name}", "parquet")
        _same_all(read_back(exporting, tmp_path / f"back-{name}"), rows)


def test_a_column_whose_type_changes_starts_a_new_file(tmp_path, exporting):
    # ints, then floats, then nulls only, then strings: each read back as it was
    values = [1, 2] * 200 + [2.5, 3.0] * 200 + [None] * 300 + ["x", None] * 100
    rows = [{"v": v, "k": i} for i, v in enumerate(values)]
    rows[1000:1010] = [{"other": i} for i in range(10)]  # other keys: a file of their own
    src = write(tmp_path / "src", rows, shard_size=5000)
    summary = export_parquet(src, tmp_path / "out", workers=1)
    assert len(summary.files) >= 4
    convert(tmp_path / "out", tmp_path / "back", "parquet")
    _same_all(read_back(exporting, tmp_path / "back"), rows)


def test_hf_export_loads_in_datasets_and_unifies_null_columns(tmp_path, exporting):
    datasets = pytest.importorskip("datasets")
    rows = [{"a": i, "b": None if i < 2000 else f"s{i}"} for i in range(3000)]
    src = write(tmp_path / "src", rows, shard_size=1000)
    export_hf(src, tmp_path / "out", workers=2)
    state = json.loads((tmp_path / "out" / "state.json").read_text())
    assert len(state["_data_files"]) >= 3
    loaded = datasets.load_from_disk(str(tmp_path / "out"))
    assert loaded.num_rows == 3000 and loaded[2500] == rows[2500] and loaded[5] == rows[5]
    assert [loaded[i] for i in range(0, 3000, 97)] == rows[::97]
    convert(tmp_path / "out", tmp_path / "back", "hf")
    _same_all(read_back(exporting, tmp_path / "back"), rows)


def test_hf_refuses_a_column_of_two_types_across_files(tmp_path, exporting):
    rows = [{"a": i} for i in range(1500)] + [{"a": i / 2} for i in range(1500)]
    src = write(tmp_path / "src", rows, shard_size=1500)
    with pytest.raises(ExportError, match=r"example 1500 .*column 'a' is double"):
        export_hf(src, tmp_path / "out", workers=1)
    assert_absent(tmp_path / "out")


def test_parquet_files_read_with_pyarrow_as_a_table(tmp_path, exporting):
    import pyarrow.dataset as pads

    rows = [{"id": i, "text": f"t{i}"} for i in range(2000)]
    export_parquet(write(tmp_path / "src", rows, shard_size=700), tmp_path / "out")
    assert pads.dataset(tmp_path / "out").to_table().to_pylist() == rows


@pytest.mark.parametrize("target", ["parquet", "hf", "jsonl", "webdataset", "mds"])
def test_an_example_the_target_cannot_hold_is_named(tmp_path, exporting, target):
    ok = {"__key__": "k", "a": b"x"} if target == "webdataset" else {"a": 1}
    examples = [dict(ok, __key__=f"k{i}") if target == "webdataset" else ok for i in range(700)]
    examples[613] = {"__key__": "k613", "a": (1, 2)} if target == "webdataset" else {"a": (1, 2)}
    src = write(tmp_path / "src", examples, shard_size=300)
    with pytest.raises(ExportError) as info:
        export(src, tmp_path / "out", target, workers=2)
    message = str(info.value)
    assert "example 613 (shard 2, its example 13)" in message and "tuple" in message
    assert str(src) in message and "pickle=True" in message
    assert_absent(tmp_path / "out")


@pytest.mark.parametrize(
    "value, what",
    [
        (np.arange(3), "numpy.ndarray"),
        ({1: "int key"}, "key of type int"),
        (float("nan"), "float nan"),
        ({"t": (1,)}, "tuple"),
        (b"bytes", "bytes"),
    ],
)
def test_jsonl_names_what_json_cannot_hold(tmp_path, exporting, value, what):
    src = write(tmp_path / "src", [{"ok": 1}, {"x": value}])
    with pytest.raises(ExportError, match="example 1 ") as info:
        export_jsonl(src, tmp_path / "out")
    assert what in str(info.value)


def test_parquet_names_what_arrow_cannot_hold(tmp_path, exporting):
    for k, (value, what) in enumerate(
        [(2**64, "beyond int64"), ({3}, "set"), ("not a dict", "str, not a dict"), ({}, "empty")]
    ):
        examples = [{"a": 1}] * 5 + [value if what != "beyond int64" else {"a": value}]
        src = write(tmp_path / f"src{k}", examples)
        with pytest.raises(ExportError, match="example 5 ") as info:
            export_parquet(src, tmp_path / f"out{k}")
        assert what in str(info.value)
        assert_absent(tmp_path / f"out{k}")


OBJECTS = [
    {"a": 1, "b": "x"},
    {"a": (1, 2), "b": "tuple"},
    __import__("fractions").Fraction(1, 3),
    {"a": {1, 2}, "b": "set"},
    "a plain string",
    {"a": 3, "b": "y"},
    np.arange(4),
]


@pytest.mark.parametrize(
    "target, fmt", [("parquet", "parquet"), ("hf", "hf"), ("jsonl", "jsonl"), ("webdataset", "wds")]
)
def test_pickle_stores_what_cannot_be_held_and_unpickle_reads_it(tmp_path, exporting, target, fmt):
    examples = OBJECTS * 200
    if target == "webdataset":
        examples = [
            {"__key__": f"{i:05d}", "bin": b"%d" % i} if i % 7 == 0 else e
            for i, e in enumerate(examples)
        ]
    src = write(tmp_path / "src", examples, shard_size=500)
    summary = export(src, tmp_path / "out", target, pickle=True, workers=2)
    assert summary.pickled > 0 and "pickled" in str(summary)
    convert(tmp_path / "out", tmp_path / "back", fmt, unpickle=True)
    got = read_back(exporting, tmp_path / "back")
    if target == "webdataset":
        got = [_without_url([g])[0] if type(g) is dict and "bin" in g else g for g in got]
    _same_all(got, examples)
    with pytest.raises(SourceError, match="unpickle=True"):
        convert(tmp_path / "out", tmp_path / "refused", fmt)
    assert_absent(tmp_path / "refused")


def test_the_reserved_field_is_not_taken_for_data(tmp_path, exporting):
    src = write(tmp_path / "src", [{"a": 1}, {PICKLED: "sneaky"}])
    for target in ("parquet", "jsonl"):
        with pytest.raises(ExportError, match=f"example 1 .*{PICKLED}"):
            export(src, tmp_path / target, target)


def test_webdataset_refuses_what_it_would_read_back_otherwise(tmp_path, exporting):
    cases = [
        ([{"__key__": "a", "x": b"1"}, {"__key__": "a", "y": b"2"}], "the one of the example"),
        ([{"__key__": "a.b", "x": b"1"}], "dot"),
        ([{"__key__": "__meta__", "x": b"1"}], "starts with"),
        ([{"__key__": "k", "TXT": b"1"}], "extension"),
        ([{"__key__": "k", "txt": 5}], "int"),
        ([{"__key__": "k"}], "no extension"),
    ]
    for k, (examples, what) in enumerate(cases):
        src = write(tmp_path / f"src{k}", examples)
        with pytest.raises(ExportError, match=what):
            export_webdataset(src, tmp_path / f"out{k}")
        assert_absent(tmp_path / f"out{k}")


def test_webdataset_keys_default_to_the_index(tmp_path, exporting):
    examples = [{"bin": b"%d" % i} for i in range(1200)]
    export_webdataset(write(tmp_path / "src", examples), tmp_path / "out")
    convert(tmp_path / "out", tmp_path / "back", "wds")
    got = read_back(exporting, tmp_path / "back")
    assert [g["__key__"] for g in got[:2]] == ["0000", "0001"]
    _same_all([{"bin": g["bin"]} for g in got], examples)


# -- the destination: complete or as it was ------------------------------------------------


def test_an_existing_destination_is_refused_unless_overwrite(tmp_path, exporting):
    src = write(tmp_path / "src", [{"a": i} for i in range(50)])
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"dst: already exists .*overwrite") as info:
        export_parquet(src, dst)
    assert info.value.errno == 17
    assert sorted(os.listdir(dst)) == ["keep.txt"]
    assert [p.name for p in tmp_path.iterdir() if "exporting" in p.name] == []
    (tmp_path / "file").write_text("a file")
    with pytest.raises(FileExistsError, match="a file"):
        export_parquet(src, tmp_path / "file")
    summary = export_parquet(src, dst, overwrite=True)
    assert sorted(os.listdir(dst)) == summary.files == ["part-00000.parquet"]
    summary = export_jsonl(src, tmp_path / "file", overwrite=True)
    assert sorted(os.listdir(tmp_path / "file")) == summary.files
    (tmp_path / "empty").mkdir()
    export_jsonl(src, tmp_path / "empty")  # an empty directory is taken
    assert os.listdir(tmp_path / "empty") == ["part-00000.jsonl"]


def test_a_failed_overwrite_leaves_the_old_destination(tmp_path, exporting):
    src = write(tmp_path / "src", [{"a": 1}, {"a": (2,)}])
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "old.txt").write_text("old")
    with pytest.raises(ExportError):
        export_parquet(src, dst, overwrite=True)
    assert os.listdir(dst) == ["old.txt"]
    assert [p.name for p in tmp_path.iterdir() if "exporting" in p.name] == []


def test_unknown_target_and_not_a_dataset_write_nothing(tmp_path, exporting):
    src = write(tmp_path / "src", [{"a": 1}])
    with pytest.raises(ValueError, match=r"unknown target format 'csv'.*parquet"):
        export(src, tmp_path / "out", "csv")
    assert_absent(tmp_path / "out")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "x.txt").write_text("x")
    with pytest.raises(AtlasFormatError, match=r"plain.*meta\.json"):
        export(tmp_path / "plain", tmp_path / "out", "parquet")
    with pytest.raises(AtlasFormatError, match="does not exist"):
        export(tmp_path / "missing", tmp_path / "out", "jsonl")
    assert_absent(tmp_path / "out")
    with pytest.raises(ValueError, match="inside it"):
        export(src, src / "inside", "jsonl")
    assert not (src / "inside").exists()
    with pytest.raises(ValueError, match="workers"):
        export(src, tmp_path / "out", "jsonl", workers=0)


def test_an_interrupted_export_removes_its_staging(tmp_path, exporting, monkeypatch):
    from atlas_fast.export import _jsonl

    src = write(tmp_path / "src", [{"a": i} for i in range(3000)], shard_size=500)

    def interrupted(self, example, where, index):
        if index == 1777:
            raise KeyboardInterrupt
        original(self, example, where, index)

    original = _jsonl.PartWriter.add
    monkeypatch.setattr(_jsonl.PartWriter, "add", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_jsonl(src, tmp_path / "out", workers=1)
    assert_absent(tmp_path / "out")


def test_an_empty_dataset_exports_to_an_empty_directory(tmp_path, exporting):
    src = write(tmp_path / "src", [])
    for target in TARGETS:
        summary = export(src, tmp_path / target, target)
        assert summary.examples == 0
        assert sorted(os.listdir(tmp_path / target)) == sorted(summary.files)


def test_progress_counts_every_example(tmp_path, exporting):
    src = write(tmp_path / "src", [{"a": i} for i in range(2500)], shard_size=600)
    seen = []
    export_jsonl(src, tmp_path / "out", workers=2, progress=lambda e, b: seen.append(e))
    assert sum(seen) == 2500
