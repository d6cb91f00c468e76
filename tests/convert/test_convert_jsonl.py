"""--from jsonl: JSON lines in every compression, each line an example; bad lines named."""

from __future__ import annotations

import gzip
import json

import pytest
from convert_helpers import assert_absent, documents, read_back, write_jsonl

from atlas_fast.convert import SourceError, convert, convert_jsonl


def test_every_compression_in_path_order(tmp_path, atlas):
    src = tmp_path / "src"
    docs = documents(400)
    files = [
        write_jsonl(src / "a" / "0.jsonl", docs[:100]),
        write_jsonl(src / "a" / "1.jsonl.gz", docs[100:200], blank_lines=True),
        write_jsonl(src / "b.json.zst", docs[200:300]),
        write_jsonl(src / "c.ndjson.bz2", docs[300:]),
    ]
    (src / "notes.txt").write_text("not a JSON lines file")
    summary = convert_jsonl(src, tmp_path / "out", shard_size=64, block_size=8, workers=1)
    assert read_back(atlas, tmp_path / "out") == docs
    assert summary.examples == 400
    assert summary.shards == 7
    assert summary.bytes_in == sum(p.stat().st_size for p in files)


def test_any_json_value_per_line(tmp_path, atlas):
    values = [1, "two", [3, None], {"four": 4.5}, True, None]
    write_jsonl(tmp_path / "values.jsonl", values)
    convert(tmp_path / "values.jsonl", tmp_path / "out", "jsonl")
    assert read_back(atlas, tmp_path / "out") == values


def test_bad_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"a": 1}\n{"a": 2}\n{"a": 3\n{"a": 4}\n'))
    with pytest.raises(SourceError, match=rf"^{path}: line 3: not valid JSON"):
        convert(path, tmp_path / "out", "jsonl", workers=1)
    assert_absent(tmp_path / "out")


def test_truncated_gzip_names_file(tmp_path):
    path = tmp_path / "cut.jsonl.gz"
    write_jsonl(path, documents(500))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(SourceError, match=rf"^{path}: line \d+: cannot read the file"):
        convert(path, tmp_path / "out", "jsonl")
    assert_absent(tmp_path / "out")


def test_missing_and_empty_sources(tmp_path):
    with pytest.raises(SourceError, match=rf"^{tmp_path / 'nope'}: no such file or directory"):
        convert(tmp_path / "nope", tmp_path / "out", "jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="no JSON lines files in it"):
        convert(tmp_path / "empty", tmp_path / "out", "jsonl")
    assert_absent(tmp_path / "out")


def test_empty_file_gives_an_empty_dataset(tmp_path, atlas):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    summary = convert(tmp_path / "empty.jsonl", tmp_path / "out", "jsonl")
    assert summary.examples == 0
    assert read_back(atlas, tmp_path / "out") == []


def test_big_plain_file_in_line_ranges(tmp_path, atlas, monkeypatch):
    from atlas_fast.convert import _files, _jsonl

    docs = documents(1500)
    path = write_jsonl(tmp_path / "big.jsonl", docs, blank_lines=True)
    monkeypatch.setattr(_files, "PART_BYTES", 10_000)
    (source,) = _jsonl.sources(path)
    assert len(source.parts) > 5
    assert source.parts[0].label.startswith(f"{path} (bytes 0-")
    assert sum(p.nbytes for p in source.parts) == path.stat().st_size
    convert(path, tmp_path / "serial", "jsonl", shard_size=200, workers=1)
    convert(path, tmp_path / "two", "jsonl", shard_size=200, workers=2)
    assert read_back(atlas, tmp_path / "serial") == docs
    assert read_back(atlas, tmp_path / "two") == docs


def test_bad_line_in_a_later_line_range_names_its_line(tmp_path, monkeypatch):
    from atlas_fast.convert import _files

    lines = [json.dumps(d) for d in documents(1000)]
    lines[876] = '{"broken": '
    path = tmp_path / "big.jsonl"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(_files, "PART_BYTES", 5_000)
    with pytest.raises(SourceError, match=rf"^{path}: line 877: not valid JSON"):
        convert(path, tmp_path / "out", "jsonl")
    assert_absent(tmp_path / "out")


def test_byte_order_mark_and_bad_utf8(tmp_path, atlas):
    (tmp_path / "bom.jsonl").write_bytes(b'\xef\xbb\xbf{"a": "\xc3\xa9"}\n{"b": 2}\n')
    convert(tmp_path / "bom.jsonl", tmp_path / "out", "jsonl")
    assert read_back(atlas, tmp_path / "out") == [{"a": "é"}, {"b": 2}]
    (tmp_path / "bad.jsonl").write_bytes(b'{"a": 1}\n{"a": "\xff"}\n')
    with pytest.raises(SourceError, match=rf"^{tmp_path / 'bad.jsonl'}: line 2: not valid JSON"):
        convert(tmp_path / "bad.jsonl", tmp_path / "out2", "jsonl")
