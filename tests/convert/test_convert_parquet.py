"""--from parquet: files written by pyarrow, each row a dict, in order; corrupt files named."""

from __future__ import annotations

import pytest
from convert_helpers import arrow_rows, arrow_table, assert_absent, documents, read_back

from atlas_fast.convert import SourceError, convert, convert_parquet

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def test_files_and_directories(tmp_path, atlas):
    rows = arrow_rows(900)
    src = tmp_path / "src"
    (src / "part-b").mkdir(parents=True)
    pq.write_table(arrow_table(rows[:300]), src / "a.parquet", row_group_size=128)
    pq.write_table(arrow_table(rows[300:600]), src / "part-b" / "0.parquet", compression="zstd")
    pq.write_table(arrow_table(rows[600:]), src / "part-b" / "1.parquet", row_group_size=50)
    summary = convert_parquet(src, tmp_path / "out", shard_size=250, block_size=20)
    assert read_back(atlas, tmp_path / "out") == rows
    assert summary.examples == 900
    convert(src / "a.parquet", tmp_path / "one", "parquet")
    assert read_back(atlas, tmp_path / "one") == rows[:300]


def test_big_files_split_by_row_groups(tmp_path, atlas, monkeypatch):
    from atlas_fast.convert import _files, _parquet

    docs = documents(2000)
    table = pa.Table.from_pylist([{"id": d["id"], "text": d["text"]} for d in docs])
    pq.write_table(table, tmp_path / "big.parquet", row_group_size=100)
    monkeypatch.setattr(_files, "PART_BYTES", 8_000)
    (source,) = _parquet.sources(tmp_path / "big.parquet")
    assert len(source.parts) > 4
    assert "row groups 0-" in source.parts[0].label
    convert_parquet(tmp_path / "big.parquet", tmp_path / "serial", shard_size=300, workers=1)
    convert_parquet(tmp_path / "big.parquet", tmp_path / "two", shard_size=300, workers=2)
    expected = table.to_pylist()
    assert read_back(atlas, tmp_path / "serial") == expected
    assert read_back(atlas, tmp_path / "two") == expected


def test_row_groups_shared_by_two_workers_keep_the_serial_result(tmp_path, atlas, monkeypatch):
    """A file of several row groups cut into parts that know their rows: with strategy 2 the
    others may take every part after the one that completes run 0's first shard at once
    (no estimate, no margin), and the dataset, dictionary included, is a serial run's."""
    from atlas_fast.convert import _files, _parquet

    docs = documents(1200)
    table = pa.Table.from_pylist([{"id": d["id"], "text": d["text"]} for d in docs])
    pq.write_table(table, tmp_path / "big.parquet", row_group_size=100)
    monkeypatch.setattr(_files, "PART_BYTES", 1)  # a part per row group
    (source,) = _parquet.sources(tmp_path / "big.parquet")
    assert len(source.parts) == 12
    assert [p.examples for p in source.parts] == [100] * 12
    assert [len(list(p.read())) for p in source.parts] == [100] * 12
    options = {"shard_size": 250, "block_size": 10, "compression_strategy": 2}
    convert_parquet(tmp_path / "big.parquet", tmp_path / "serial", workers=1, **options)
    expected = table.to_pylist()
    assert read_back(atlas, tmp_path / "serial") == expected
    serial_dict = (tmp_path / "serial" / "zstd_dict.bin").read_bytes()
    for k in range(3):  # whatever the timing
        out = tmp_path / f"two{k}"
        convert_parquet(tmp_path / "big.parquet", out, workers=2, **options)
        assert read_back(atlas, out) == expected
        assert (out / "zstd_dict.bin").read_bytes() == serial_dict


def test_a_bad_row_group_in_a_later_part_is_named(tmp_path, monkeypatch):
    from atlas_fast.convert import _files

    bad = tmp_path / "big.parquet"
    pq.write_table(arrow_table(arrow_rows(2000)), bad, compression="none", row_group_size=250)
    data = bytearray(bad.read_bytes())
    middle = 2 * len(data) // 3  # in a row group of the second half
    data[middle : middle + 3000] = b"\xff" * 3000
    bad.write_bytes(bytes(data))
    monkeypatch.setattr(_files, "PART_BYTES", 1)
    with pytest.raises(SourceError, match=rf"^{bad}: "):
        convert(bad, tmp_path / "out", "parquet", workers=2)
    assert_absent(tmp_path / "out")


@pytest.mark.parametrize("damage", ["garbage", "truncated", "page"])
def test_corrupt_file_is_named(tmp_path, damage):
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(arrow_table(arrow_rows(50)), src / "0.parquet")
    bad = src / "1.parquet"
    pq.write_table(arrow_table(arrow_rows(2000)), bad, compression="none")
    data = bytearray(bad.read_bytes())
    if damage == "garbage":
        data = bytearray(b"not parquet at all" * 10)
    elif damage == "truncated":
        data = data[: len(data) // 2]
    else:  # overwrite the middle of the data pages, keeping the footer
        middle = len(data) // 3
        data[middle : middle + 3000] = b"\xff" * 3000
    bad.write_bytes(bytes(data))
    with pytest.raises(SourceError, match=rf"^{bad}: "):
        convert(src, tmp_path / "out", "parquet", verify=True)
    assert_absent(tmp_path / "out")


def test_not_parquet_files(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(SourceError, match="no Parquet files in it"):
        convert(tmp_path, tmp_path / "out", "parquet")


def test_rows_are_to_pylist(tmp_path):
    """Rows are built column by column; the same dicts as to_pylist, odd schemas included."""
    from atlas_fast.convert._arrow import _row_dicts

    batches = [
        pa.RecordBatch.from_pylist(arrow_rows(40), schema=arrow_table(arrow_rows(1)).schema),
        pa.record_batch([pa.array([1, 2]), pa.array(["a", "b"])], names=["x", "x"]),
        pa.RecordBatch.from_pylist([{}, {}, {}]),
        pa.RecordBatch.from_pylist([], schema=pa.schema([("a", pa.int8())])),
        pa.RecordBatch.from_pylist(
            [{"m": [("k", 1)]}], schema=pa.schema([("m", pa.map_(pa.string(), pa.int8()))])
        ),
    ]
    for batch in batches:
        assert _row_dicts(batch) == batch.to_pylist()
