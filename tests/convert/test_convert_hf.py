"""--from hf: directories written by datasets' save_to_disk (Dataset, DatasetDict), Arrow files."""

from __future__ import annotations

import pytest
from convert_helpers import assert_absent, documents, read_back

from atlas_fast.convert import SourceError, convert, convert_hf

datasets = pytest.importorskip("datasets")


def _records(n, start=0):
    docs = documents(n, start=start)
    return [
        {
            "id": d["id"],
            "text": d["text"],
            "label": i % 3,
            "scores": [d["metadata"]["score"], float(i)],
            "meta": {"source": d["source"], "n": i},
        }
        for i, d in enumerate(docs, start)
    ]


def _features():
    f = datasets.features
    return f.Features(
        {
            "id": f.Value("string"),
            "text": f.Value("string"),
            "label": f.ClassLabel(names=["a", "b", "c"]),
            "scores": f.Sequence(f.Value("float64")),
            "meta": {"source": f.Value("string"), "n": f.Value("int64")},
        }
    )


def _dataset(records):
    return datasets.Dataset.from_list(records, features=_features())


def test_save_to_disk_directory(tmp_path, atlas):
    records = _records(500)
    ds = _dataset(records)
    ds.save_to_disk(str(tmp_path / "hf"), num_shards=3)
    summary = convert_hf(tmp_path / "hf", tmp_path / "out", shard_size=128, workers=2)
    got = read_back(atlas, tmp_path / "out")
    assert got == records
    assert got == [ds[i] for i in range(len(ds))]  # what datasets itself gives
    assert summary.examples == 500


def test_shuffled_selection_is_saved_in_its_order(tmp_path, atlas):
    ds = _dataset(_records(200)).shuffle(seed=3).select(range(50))
    ds.save_to_disk(str(tmp_path / "hf"))
    convert(tmp_path / "hf", tmp_path / "out", "hf")
    assert read_back(atlas, tmp_path / "out") == [ds[i] for i in range(50)]


def test_dataset_dict_gives_a_dataset_per_split(tmp_path, atlas):
    splits = {"train": _records(300), "test": _records(40, start=300)}
    dd = datasets.DatasetDict({k: _dataset(v) for k, v in splits.items()})
    dd.save_to_disk(str(tmp_path / "hf"))
    summary = convert(tmp_path / "hf", tmp_path / "out", "hf", shard_size=100, verify=True)
    for name, records in splits.items():
        assert read_back(atlas, tmp_path / "out" / name) == records
    assert [s for s, _, _ in summary.datasets] == ["train", "test"]
    assert summary.examples == 340
    assert not (tmp_path / "out" / "meta.json").exists()


def test_arrow_files_and_batch_ranges(tmp_path, atlas, monkeypatch):
    from atlas_fast.convert import _files, _hf

    records = _records(3000)
    _dataset(records).save_to_disk(str(tmp_path / "hf"), num_shards=1)
    (arrow,) = tmp_path.joinpath("hf").glob("*.arrow")
    monkeypatch.setattr(_files, "PART_BYTES", 20_000)
    (source,) = _hf.sources(arrow)
    assert len(source.parts) > 2
    assert "record batches 0-" in source.parts[0].label
    convert(arrow, tmp_path / "serial", "hf", shard_size=700, workers=1)
    convert(arrow, tmp_path / "two", "hf", shard_size=700, workers=2)
    assert read_back(atlas, tmp_path / "serial") == records
    assert read_back(atlas, tmp_path / "two") == records


def _batch_parts(path, monkeypatch):
    from atlas_fast.convert import _files, _hf

    monkeypatch.setattr(_files, "PART_BYTES", 1)  # a part per record batch
    (source,) = _hf.sources(path)
    return source.parts


@pytest.mark.parametrize("layout", ["stream", "file", "dictionary"])
def test_each_part_reads_its_own_record_batches(tmp_path, atlas, monkeypatch, layout):
    """A part of an Arrow stream starts at its first batch's message (no reading through the
    batches before it); a stream with dictionary batches, which a batch needs, is read from
    its start, and an Arrow file by batch number. Each part knows its rows; shared by two
    workers, the examples are the serial run's, in order."""
    pa = pytest.importorskip("pyarrow")
    rows = [{"id": i, "text": f"row {i}", "kind": ["a", "b", "c"][i % 3]} for i in range(1000)]
    table = pa.Table.from_pylist(rows)
    if layout == "dictionary":
        table = table.set_column(2, "kind", pa.compute.dictionary_encode(table["kind"]))
    path = tmp_path / "data.arrow"
    with pa.OSFile(str(path), "wb") as sink:
        new = pa.ipc.new_file if layout == "file" else pa.ipc.new_stream
        with new(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=64):
                writer.write_batch(batch)
    parts = _batch_parts(path, monkeypatch)
    assert len(parts) == 16
    assert [p.examples for p in parts] == [64] * 15 + [40]
    offsets = [p.read.args[3] for p in parts]
    assert (None in offsets) == (layout != "stream")
    got = [list(p.read()) for p in parts]
    assert [len(g) for g in got] == [p.examples for p in parts]
    assert [r for g in got for r in g] == rows
    options = {"shard_size": 150, "block_size": 10}
    convert(path, tmp_path / "two", "hf", workers=2, **options)
    assert read_back(atlas, tmp_path / "two") == rows


def test_a_damaged_batch_in_a_later_part_is_named(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    table = pa.Table.from_pylist([{"id": i, "text": f"row {i}"} for i in range(1000)])
    path = tmp_path / "data.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=100):
            writer.write_batch(batch)
    data = path.read_bytes()
    path.write_bytes(data[: 2 * len(data) // 3])  # cut inside batch 6
    with pytest.raises(SourceError, match=rf"^{path}: record batch 6: cannot read"):
        _batch_parts(path, monkeypatch)
    with pytest.raises(SourceError, match=rf"^{path}: "):
        convert(path, tmp_path / "out", "hf", workers=2)
    assert_absent(tmp_path / "out")


def test_missing_data_file_and_corrupt_arrow(tmp_path):
    _dataset(_records(100)).save_to_disk(str(tmp_path / "hf"), num_shards=2)
    files = sorted(tmp_path.joinpath("hf").glob("*.arrow"))
    files[1].unlink()
    with pytest.raises(SourceError, match=rf"^{files[1]}: missing \(listed in .*state.json\)"):
        convert(tmp_path / "hf", tmp_path / "out", "hf")
    files[0].write_bytes(files[0].read_bytes()[:200])
    with pytest.raises(SourceError, match=rf"^{files[0]}: "):
        convert(files[0], tmp_path / "out", "hf")
    assert_absent(tmp_path / "out")


@pytest.mark.parametrize(
    "text, problem",
    [(b"{not json", "not valid JSON"), (b"[1, 2]", "expected a JSON object, found list")],
)
def test_a_state_json_that_is_not_an_object_is_named(tmp_path, text, problem):
    _dataset(_records(20)).save_to_disk(str(tmp_path / "hf"))
    state = tmp_path / "hf" / "state.json"
    state.write_bytes(text)
    with pytest.raises(SourceError, match=rf"^{state}: {problem}"):
        convert(tmp_path / "hf", tmp_path / "out", "hf")
    assert_absent(tmp_path / "out")
