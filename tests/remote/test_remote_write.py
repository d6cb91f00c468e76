"""Datasets written to S3 (moto, through the fault-injecting proxy) are the bytes of a local
write, read back example for example by both backends and by the reference package (the
suite's own reading algorithm where it is absent); a write that fails, raises or is killed
leaves no root meta.json and no open upload."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
from helpers import make_examples, reference_examples, same, write_dataset

import atlas_fast
from atlas_fast import AtlasDatasetWriter, AtlasFormatError, StorageError

HERE = Path(__file__).parent


def local_files(root: Path) -> dict:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def stored(s3, prefix: str) -> dict:
    """Every object under ``prefix/`` (read from moto directly, not through the proxy)."""
    out = {}
    pages = s3.client.get_paginator("list_objects_v2").paginate(
        Bucket=s3.bucket, Prefix=prefix + "/"
    )
    for page in pages:
        for item in page.get("Contents", ()):
            body = s3.client.get_object(Bucket=s3.bucket, Key=item["Key"])["Body"].read()
            out[item["Key"][len(prefix) + 1 :]] = body
    return out


def open_uploads(s3) -> list:
    return s3.client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", [])


def download(objects: dict, root: Path) -> Path:
    for name, data in objects.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def check_read_back(atlas, url, examples, tmp_path) -> None:
    with atlas.AtlasDataset(url) as ds:
        assert len(ds) == len(examples)
        assert all(same(a, b) for a, b in zip(iter(ds), examples))


OPTIONS = [
    pytest.param({"shard_size": 40, "block_size": 4}, id="s2-5shards"),
    pytest.param(
        {"shard_size": 30, "block_size": 4, "compression_strategy": 3, "workers": 2},
        id="s3-workers2",
    ),
    pytest.param(
        {"shard_size": 15, "block_size": 5, "compression_strategy": 1, "checksums": True},
        id="s1-checksums-12shards",
    ),
    pytest.param({"shard_size": 50, "block_size": 10, "compression_strategy": 0}, id="s0"),
]


@pytest.mark.parametrize("options", OPTIONS)
def test_writer_to_s3_stores_the_bytes_of_a_local_write(s3, atlas, tmp_path, options):
    examples = make_examples(175)
    write_dataset(tmp_path / "local", examples, **options)
    write_dataset(s3.url("ds"), examples, **options)
    objects = stored(s3, "ds")
    assert objects == local_files(tmp_path / "local")
    assert open_uploads(s3) == []
    check_read_back(atlas, s3.url("ds"), examples, tmp_path)
    # What the reference reads: the objects downloaded, read its way.
    got = reference_examples(download(objects, tmp_path / "down"))
    assert all(same(a, b) for a, b in zip(got, examples)) and len(got) == len(examples)


def test_large_shards_go_up_as_multipart_uploads(s3, tmp_path):
    # 3 shards of ~20 MB (incompressible): data.bin in parts, the shards while others write.
    examples = make_examples(60, big=1 << 20)
    options = {"shard_size": 20, "block_size": 4, "compression_strategy": 0}
    write_dataset(tmp_path / "local", examples, **options)
    s3.proxy.reset_stats()
    write_dataset(s3.url("big"), examples, **options, staging_bytes=1)
    assert stored(s3, "big") == local_files(tmp_path / "local")
    methods = s3.proxy.stats()["methods"]
    assert methods.get("POST", 0) >= 6  # create and complete, per data.bin
    assert open_uploads(s3) == []


def test_faults_on_every_request_give_the_same_bytes(s3, atlas, tmp_path):
    # 15 shards: shards 0-9 are renamed at the commit (their names get a second digit).
    examples = make_examples(300, big=20_000)
    options = {"shard_size": 20, "block_size": 4, "compression_strategy": 2}
    write_dataset(tmp_path / "local", examples, **options)
    s3.proxy.set(fault_rate=0.05)
    s3.proxy.fault_methods = (b"GET", b"PUT", b"POST", b"DELETE", b"HEAD")
    write_dataset(s3.url("faulty"), examples, **options)
    s3.proxy.set(fault_rate=0.0)
    stats = s3.proxy.stats()
    assert sum(stats["faults"].values()) > 0, stats
    assert stored(s3, "faulty") == local_files(tmp_path / "local")
    assert open_uploads(s3) == []
    check_read_back(atlas, s3.url("faulty"), examples, tmp_path)


def test_a_with_block_that_raises_leaves_no_dataset(s3, atlas, tmp_path):
    examples = make_examples(90, big=300_000)
    staging = tmp_path / "staging"
    with pytest.raises(KeyError), pytest.warns(RuntimeWarning, match="incomplete"):
        with AtlasDatasetWriter(
            s3.url("broken"),
            shard_size=20,
            block_size=4,
            compression_strategy=0,
            staging_dir=staging,
        ) as writer:
            for example in examples:
                writer.add_example(example)
            raise KeyError("the user's error")
    assert stored(s3, "broken") == {}
    assert open_uploads(s3) == []
    assert list(staging.iterdir()) == []  # the local staging directory removed
    with pytest.raises(AtlasFormatError, match="incomplete"):
        atlas.AtlasDataset(s3.url("broken"))


def test_shards_without_a_root_meta_json_read_as_incomplete(s3, atlas, tmp_path):
    examples = make_examples(50)
    write_dataset(tmp_path / "local", examples, shard_size=20, block_size=5)
    for name, data in local_files(tmp_path / "local").items():
        if name != "meta.json":
            s3.client.put_object(Bucket=s3.bucket, Key=f"part/{name}", Body=data)
    with pytest.raises(AtlasFormatError, match="incomplete dataset"):
        atlas.AtlasDataset(s3.url("part"))


def test_an_existing_destination_is_refused_unless_overwrite(s3, atlas, tmp_path):
    first, second = make_examples(30, seed=1), make_examples(45, seed=2)
    write_dataset(s3.url("ds"), first, shard_size=20, block_size=5)
    with pytest.raises(FileExistsError, match=r"already exists.*AtlasDatasetWriter") as info:
        AtlasDatasetWriter(s3.url("ds"), shard_size=20, block_size=5)
    assert s3.url("ds") in str(info.value)
    # The same wording as a local destination's.
    (tmp_path / "there").mkdir()
    with pytest.raises(FileExistsError, match=r"already exists.*creates the directory"):
        AtlasDatasetWriter(tmp_path / "there", shard_size=20, block_size=5)
    write_dataset(s3.url("ds"), second, shard_size=10, block_size=5, overwrite=True)
    write_dataset(tmp_path / "local", second, shard_size=10, block_size=5)
    assert stored(s3, "ds") == local_files(tmp_path / "local")
    check_read_back(atlas, s3.url("ds"), second, tmp_path)


def test_url_only_options_are_refused_for_a_local_path(tmp_path):
    with pytest.raises(ValueError, match="for a URL"):
        AtlasDatasetWriter(tmp_path / "x", shard_size=5, block_size=5, overwrite=True)


def test_file_url_writes_the_local_path(tmp_path, atlas):
    examples = make_examples(20)
    write_dataset(f"file://{tmp_path / 'viaurl'}", examples, shard_size=8, block_size=4)
    write_dataset(tmp_path / "plain", examples, shard_size=8, block_size=4)
    assert local_files(tmp_path / "viaurl") == local_files(tmp_path / "plain")


def test_an_http_url_cannot_be_written(tmp_path):
    with pytest.raises(ValueError, match="can be read but not written"):
        AtlasDatasetWriter("http://127.0.0.1:9/ds", shard_size=5, block_size=5)


def test_a_missing_bucket_is_a_clear_error(s3):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        AtlasDatasetWriter("s3://no-such-bucket-here/ds", shard_size=5, block_size=5)


def test_what_cannot_be_written_raises_one_error_naming_object_and_attempts(s3, tmp_path):
    s3.proxy.fault_methods = (b"PUT", b"POST")
    with AtlasDatasetWriter(
        s3.url("down"),
        shard_size=10,
        block_size=5,
        storage_options={"max_attempts": 2, "deadline": 20},
    ) as writer:
        s3.proxy.set(fault_rate=1.0, faults=("503",))
        for example in make_examples(10):
            writer.add_example(example)
        with pytest.raises(StorageError) as info, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            writer.close()
    s3.proxy.set(fault_rate=0.0)
    assert "s3://" in str(info.value) and "attempts" in str(info.value)
    assert info.value.url.startswith(s3.url("down"))
    assert info.value.attempts == 2
    assert open_uploads(s3) == []


_KILLED = textwrap.dedent(
    """
    import sys
    import numpy as np
    from atlas_fast import AtlasDatasetWriter
    rng = np.random.default_rng(0)
    with AtlasDatasetWriter(sys.argv[1], shard_size=10, block_size=2, compression_strategy=0,
                            workers=1) as w:
        for i in range(200):
            w.add_example({"i": i, "blob": rng.bytes(1 << 20)})
            if i == 20:
                print("writing", flush=True)
    print("done", flush=True)
    """
)


def test_a_writer_killed_mid_upload_leaves_no_root_meta_json(s3, tmp_path):
    s3.proxy.set(latency=0.05)
    env = dict(os.environ)
    env["TMPDIR"] = str(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED, s3.url("killed")],
        stdout=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    try:
        assert proc.stdout.readline().strip() == b"writing"
        deadline = time.monotonic() + 60
        shard = f"/{s3.bucket}/killed/0/meta.json"
        while shard not in s3.proxy.stats()["paths"]:  # shard 0 stored, others going up
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    s3.proxy.set(latency=0.0)
    objects = stored(s3, "killed")
    assert "0/meta.json" in objects and "meta.json" not in objects
    with pytest.raises(AtlasFormatError, match="incomplete"):
        atlas_fast.AtlasDataset(s3.url("killed"))


def test_datasets_under_neighbouring_prefixes_stay_apart(s3, atlas, tmp_path):
    first, second = make_examples(40, seed=3), make_examples(25, seed=4)
    write_dataset(s3.url("sets/a"), first, shard_size=15, block_size=5)
    # "sets/a" begins the second one's name
    write_dataset(s3.url("sets/a-2"), second, shard_size=15, block_size=5)
    write_dataset(tmp_path / "a", first, shard_size=15, block_size=5)
    write_dataset(tmp_path / "a-2", second, shard_size=15, block_size=5)
    assert stored(s3, "sets/a") == local_files(tmp_path / "a")
    assert stored(s3, "sets/a-2") == local_files(tmp_path / "a-2")
    check_read_back(atlas, s3.url("sets/a"), first, tmp_path)


def test_a_shard_writer_refuses_a_url(tmp_path):
    from atlas_fast import AtlasDatasetShardWriter

    with pytest.raises(ValueError, match="writes a local directory"):
        AtlasDatasetShardWriter("s3://bucket/ds/0", block_size=5)
    with AtlasDatasetShardWriter(f"file://{tmp_path / 'shard'}", block_size=5) as shard:
        shard.add_example(1)
    assert (tmp_path / "shard" / "meta.json").is_file()


@pytest.mark.parametrize("expected", [None, 300, 50, 4000], ids=str)
def test_a_writer_told_its_count_stores_shards_under_their_final_names(s3, tmp_path, expected):
    # 15 shards. Not told: shards 0-8 go up as "0" ... "8" (shard 9 finishes once the 11th
    # began: "09") and are copied to "00" ... "08" at the commit (3 objects each). Told the
    # right count: no copy. Told a wrong one: the shards whose names differ are copied (all
    # 15 for 4000 examples: "000" ...), and the dataset is right all the same.
    examples = make_examples(300)
    options = {"shard_size": 20, "block_size": 4, "workers": 1}
    write_dataset(tmp_path / "local", examples, **options)
    s3.proxy.reset_stats()
    write_dataset(s3.url("told"), examples, **options, expected_examples=expected)
    assert stored(s3, "told") == local_files(tmp_path / "local")
    copies = s3.proxy.stats()["copies"]
    assert copies == {None: 27, 300: 0, 50: 27, 4000: 45}[expected]


def test_expected_examples_is_checked(tmp_path):
    with pytest.raises(ValueError, match="expected_examples"):
        AtlasDatasetWriter(tmp_path / "x", shard_size=5, block_size=5, expected_examples=-1)
    with AtlasDatasetWriter(tmp_path / "y", shard_size=5, block_size=5, expected_examples=99) as w:
        w.add_example(1)  # a hint only: locally it changes nothing
    assert (tmp_path / "y" / "meta.json").is_file()
