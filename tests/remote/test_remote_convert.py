"""``convert`` and ``atlas-fast convert`` into S3 (moto): the objects are the files of a
conversion to a local DST; a conversion that fails leaves nothing in the store."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import reference_examples, same
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
    got = reference_examples(download(objects, tmp_path / "down"))
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


def _blobs(tmp_path, files: int, rows: int, size: int):
    """Parquet files of rows holding ``size`` incompressible bytes each (the row counts are
    known before reading: parquet announces them)."""
    import numpy as np

    src = tmp_path / "src-blobs"
    src.mkdir()
    rng = np.random.default_rng(7)
    for k in range(files):
        rows_k = [{"n": k * rows + i, "blob": rng.bytes(size)} for i in range(rows)]
        pq.write_table(pa.Table.from_pylist(rows_k), src / f"{k}.parquet")
    return src


class _Peak:
    """The most bytes seen under a directory, looked at every few milliseconds."""

    def __init__(self, root):
        import threading

        self.root, self.peak, self.looks = root, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        import os

        while not self._stop.is_set():
            total = 0
            for top, _, files in os.walk(self.root):
                for name in files:
                    try:
                        total += os.stat(os.path.join(top, name)).st_size
                    except FileNotFoundError:
                        pass
            self.peak = max(self.peak, total)
            self.looks += 1
            self._stop.wait(0.002)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


@pytest.mark.parametrize("workers", [1, 2])
def test_convert_to_s3_stages_a_few_shards_not_the_dataset(s3, tmp_path, workers):
    # 240 rows of 40 KB that do not compress: 24 shards of ~400 KB, staging_bytes=1 (every
    # shard waits alone). Each run holds at most the shard it writes and one finished shard
    # waiting for its upload (whether it is on its way up or its name is not known yet).
    src = _blobs(tmp_path, files=4, rows=60, size=40_000)
    options = {"shard_size": 10, "block_size": 5, "compression_strategy": 1}
    convert(src, tmp_path / "local", "parquet", workers=workers, **options)
    staging = tmp_path / "staging"
    staging.mkdir()
    s3.proxy.set(latency=0.01)  # uploads slower than writes: shards would pile up
    with _Peak(staging) as peak:
        convert(
            src,
            s3.url("conv"),
            "parquet",
            workers=workers,
            staging_dir=staging,
            staging_bytes=1,
            **options,
        )
    s3.proxy.set(latency=0.0)
    local = local_files(tmp_path / "local")
    shard = max(len(data) for name, data in local.items() if name.endswith("data.bin"))
    dataset = sum(len(data) for data in local.values())
    assert dataset > 20 * shard and peak.looks > 10
    assert 0 < peak.peak <= (2 * workers + 0.5) * shard, (peak.peak, shard, dataset)
    if workers == 1:  # with more, shard sizes depend on which process took which part
        assert stored(s3, "conv") == local
    assert list(staging.iterdir()) == []


def _copies_test_source(tmp_path, fmt):
    docs = _documents(130)
    if fmt == "jsonl":
        return _jsonl(tmp_path, docs)
    return _parquet(tmp_path, docs)[0]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_shards_are_uploaded_under_their_final_names_when_the_count_is_known(s3, tmp_path, fmt):
    # 13 shards: names of two digits. Parquet announces its row counts, so every shard is
    # named finally from the start: no copy in the store. JSONL does not: shards 0-9 are
    # stored as "0" ... "9" before the eleventh begins, then copied to "00" ... "09".
    src = _copies_test_source(tmp_path, fmt)
    options = {"shard_size": 10, "block_size": 5, "workers": 1}
    convert(src, tmp_path / "local", fmt, **options)
    s3.proxy.reset_stats()
    convert(src, s3.url("named"), fmt, **options)
    objects = stored(s3, "named")
    assert objects == local_files(tmp_path / "local") and "12/meta.json" in objects
    copies = s3.proxy.stats()["copies"]
    if fmt == "parquet":
        assert copies == 0
    else:
        renamed = [name for name in objects if name[:2] in {f"0{k}" for k in range(10)}]
        assert copies == len(renamed) > 0


def test_convert_to_s3_verifies_each_shard_before_it_goes_up(s3, tmp_path, monkeypatch):
    import atlas_fast.convert as conv
    from atlas_fast.convert import Part, Source, VerifyError

    reads = {"n": 0}

    def read(n):
        reads["n"] += 1
        second = reads["n"] > 1  # the verification's read: example 37 differs
        return iter([{"i": i, "x": "changed" if second and i == 37 else "same"} for i in range(n)])

    import functools
    import types

    module = types.ModuleType("fake")
    module.sources = lambda src: [Source([Part("the-part", 100, functools.partial(read, 90))])]
    monkeypatch.setattr(conv, "format_module", lambda fmt: module)
    with pytest.raises(VerifyError, match=r"example 37 \(example 37 of part the-part\)"):
        convert("x", s3.url("checked"), "fake", verify=True, workers=1, shard_size=10)
    assert stored(s3, "checked") == {} and open_uploads(s3) == []
    reads["n"] = -(10**6)  # both reads the same now
    summary = convert("x", s3.url("checked"), "fake", verify=True, workers=1, shard_size=10)
    assert summary.verified and summary.examples == 90 and "meta.json" in stored(s3, "checked")


@pytest.mark.parametrize("workers", [1, 2])
def test_verified_conversions_to_s3_store_the_bytes_of_a_local_one(s3, tmp_path, workers):
    src, _ = _parquet(tmp_path, _documents(400))
    options = {"shard_size": 30, "block_size": 5, "workers": workers}
    convert(src, s3.url("v"), "parquet", verify=True, **options)
    with_verify = stored(s3, "v")
    assert len(with_verify) > 13 * 2 and with_verify["meta.json"]
    if workers == 1:
        convert(src, tmp_path / "local", "parquet", **options)
        assert with_verify == local_files(tmp_path / "local")


def _fake_sources(monkeypatch, sources):
    """Every format name reads ``sources`` (in this process: workers=1 only)."""
    import types

    import atlas_fast.convert as conv

    module = types.ModuleType("fake")
    module.sources = lambda src: sources
    monkeypatch.setattr(conv, "format_module", lambda fmt: module)


def test_splits_go_up_each_with_its_root_meta_json_last(s3, atlas, tmp_path, monkeypatch):
    import functools

    from atlas_fast.convert import Part, Source

    def part(label, n, offset):
        return Part(label, 100, functools.partial(iter, [{"i": offset + i} for i in range(n)]))

    train = Source([part("t0", 120, 0), part("t1", 80, 120)], "train")
    _fake_sources(monkeypatch, [train, Source([part("v0", 30, 500)], "validation")])
    options = {"shard_size": 25, "block_size": 5, "workers": 1}
    convert("x", tmp_path / "local", "fake", **options)
    s3.proxy.reset_stats()
    summary = convert("x", s3.url("splits"), "fake", **options)
    assert stored(s3, "splits") == local_files(tmp_path / "local")
    assert summary.examples == 230 and "2 splits" in str(summary)
    # Both root meta.jsons are the last two objects put.
    puts = [p for p in s3.proxy.stats()["paths"] if p.endswith("/meta.json")]
    assert puts[-2:] == [f"/{s3.bucket}/splits/{s}/meta.json" for s in ("train", "validation")]
    with atlas.AtlasDataset(s3.url("splits/validation")) as ds:
        assert [ds[i]["i"] for i in range(len(ds))] == list(range(500, 530))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_conversion_whose_uploads_fail_raises_and_leaves_nothing(s3, tmp_path, workers):
    from atlas_fast import StorageError

    src = _blobs(tmp_path, files=4, rows=30, size=20_000)
    s3.proxy.fault_methods = (b"PUT", b"POST")
    s3.proxy.set(fault_rate=1.0, faults=("503",))
    with pytest.raises(StorageError, match="attempts"):
        convert(
            src,
            s3.url("down"),
            "parquet",
            workers=workers,
            shard_size=10,
            block_size=5,
            staging_bytes=1,
            storage_options={"max_attempts": 2, "deadline": 20},
        )
    s3.proxy.set(fault_rate=0.0)
    assert stored(s3, "down") == {} and open_uploads(s3) == []


def _command(src, dst, *flags):
    command = [sys.executable, "-m", "atlas_fast", "convert", str(src), dst, "--from", "jsonl"]
    command += ["--shard-size", "50", "--block-size", "10", "--workers", "1", *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_the_command_stages_where_asked_and_overwrites_when_asked(s3, tmp_path):
    src = _jsonl(tmp_path, _documents(220))
    convert(src, tmp_path / "local", "jsonl", shard_size=50, block_size=10, workers=1)
    s3.client.put_object(Bucket=s3.bucket, Key="cli/old", Body=b"x")
    staging = tmp_path / "staging"
    flags = ["--staging-dir", str(staging), "--staging-bytes", "1K"]
    done = _command(src, s3.url("cli"), *flags)
    assert done.returncode == 1 and "--overwrite" in done.stderr, done.stderr
    assert stored(s3, "cli") == {"old": b"x"}
    done = _command(src, s3.url("cli"), *flags, "--overwrite")
    assert done.returncode == 0, done.stderr
    assert stored(s3, "cli") == local_files(tmp_path / "local")
    assert staging.is_dir() and list(staging.iterdir()) == []
    assert s3.url("cli") in done.stdout


@pytest.mark.parametrize(
    "flags",
    [["--overwrite"], ["--staging-dir", "somewhere"], ["--staging-bytes", "1M"]],
    ids=["overwrite", "staging-dir", "staging-bytes"],
)
def test_the_object_storage_flags_are_refused_for_a_local_dst(tmp_path, flags):
    src = _jsonl(tmp_path, _documents(20))
    done = _command(src, str(tmp_path / "out"), *flags)
    assert done.returncode == 1 and f"{flags[0]}: for a DST in object storage" in done.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "somewhere").exists()


@pytest.mark.parametrize("size", ["0", "-5", "lots", "1.5G", ""])
def test_a_bad_staging_size_is_a_usage_error(tmp_path, size):
    done = _command(tmp_path, "s3://bucket/x", "--staging-bytes", size)
    assert done.returncode == 2 and "not a size" in done.stderr, done.stderr


def test_staging_sizes_take_binary_suffixes():
    # The flag's parser (private): every suffix checked without a conversion each.
    from atlas_fast.cli.convert import _size

    assert [_size(t) for t in ("1", "4096", "1K", "512M", "2G", "1T", "3GiB", "2g")] == [
        1,
        4096,
        1 << 10,
        512 << 20,
        2 << 30,
        1 << 40,
        3 << 30,
        2 << 30,
    ]
