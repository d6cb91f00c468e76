"""``export --to mds``: read back by mosaicml-streaming itself (its reader and
``convert --from mds``), marked ``mds`` (the library lives in a venv of its own: see
tests/convert/test_convert_mds.py); the index's layout is checked everywhere."""

from __future__ import annotations

import json

import numpy as np
import pytest
from export_helpers import assert_absent, mds_samples, read_back, write
from helpers import same

from atlas_fast.export import PICKLED, ExportError, export_mds


def test_the_index_lists_every_shard_in_order(tmp_path, exporting):
    samples = mds_samples(900)
    summary = export_mds(write(tmp_path / "src", samples, shard_size=400), tmp_path / "out")
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index["version"] == 2 and summary.files[-1] == "index.json"
    shards = index["shards"]
    assert [s["raw_data"]["basename"] for s in shards] == summary.files[:-1]
    assert sum(s["samples"] for s in shards) == 900
    first = shards[0]
    assert first["column_names"] == sorted(samples[0])
    encodings = dict(zip(first["column_names"], first["column_encodings"]))
    assert encodings == {
        "arr": "ndarray",
        "bytes": "bytes",
        "dec": "str_decimal",
        "f32": "float32",
        "float": "str_float",
        "huge": "str_int",
        "int": "int",
        "json": "json",
        "str": "str",
        "u8": "uint8",
    }
    for shard in shards:
        path = tmp_path / "out" / shard["raw_data"]["basename"]
        data = path.read_bytes()
        assert len(data) == shard["raw_data"]["bytes"]
        count = int(np.frombuffer(data, np.uint32, 1)[0])
        offsets = np.frombuffer(data, np.uint32, count + 1, 4)
        assert count == shard["samples"] and offsets[-1] == len(data)


def test_mds_names_what_it_cannot_hold(tmp_path, exporting):
    src = write(tmp_path / "src", [{"a": 1}] * 10 + [{"a": {1, 2}}])
    with pytest.raises(ExportError, match=r"example 10 .*\['a'\] is set"):
        export_mds(src, tmp_path / "out")
    assert_absent(tmp_path / "out")
    src = write(tmp_path / "src2", [{"a": 1}, [1, 2]])
    with pytest.raises(ExportError, match=r"example 1 .*list, not a dict"):
        export_mds(src, tmp_path / "out")
    assert_absent(tmp_path / "out")


@pytest.mark.mds
@pytest.mark.parametrize("workers", [1, 2])
def test_streaming_reads_the_export_and_convert_gives_the_dataset(tmp_path, exporting, workers):
    from streaming import LocalDataset

    from atlas_fast.convert import convert

    samples = mds_samples(1000)
    export_mds(write(tmp_path / "src", samples, shard_size=300), tmp_path / "out", workers=workers)
    local = LocalDataset(str(tmp_path / "out"))
    assert len(local) == 1000
    for i in (0, 1, 499, 999):
        assert local[i].keys() == samples[i].keys()
        assert all(same(local[i][k], samples[i][k]) for k in samples[i]), i
    convert(tmp_path / "out", tmp_path / "back", "mds")
    got = read_back(exporting, tmp_path / "back")
    assert len(got) == 1000 and all(same(a, b) for a, b in zip(got, samples))


@pytest.mark.mds
def test_pickle_goes_into_pkl_columns(tmp_path, exporting):
    from atlas_fast.convert import SourceError, convert

    samples = [{"a": i, "t": (i, "x")} for i in range(50)] + [{3}, "plain", {"a": 1, "t": 2}]
    export_mds(write(tmp_path / "src", samples), tmp_path / "out", pickle=True)
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert ["pkl"] in [s["column_encodings"] for s in index["shards"]]
    assert any(s["column_names"] == [PICKLED] for s in index["shards"])
    with pytest.raises(SourceError, match="allow_unsafe_types"):
        convert(tmp_path / "out", tmp_path / "refused", "mds")
    convert(tmp_path / "out", tmp_path / "back", "mds", allow_unsafe_types=True)
    got = read_back(exporting, tmp_path / "back")
    assert len(got) == len(samples) and all(same(a, b) for a, b in zip(got, samples))
