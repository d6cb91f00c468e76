"""``atlas_fast.ray.write_atlas`` to S3 (moto) on a local Ray cluster: the write tasks upload
their shards under their final names, the driver puts the root files (nothing is copied
within the store); the objects are those of a write to a local path, and a task that fails
once and is retried leaves no duplicate, missing or staging object."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import reference_examples, same
from servers import S3_ENV
from test_remote_write import download, local_files, open_uploads, stored


def task_options(s3) -> dict:
    """What the tasks need to reach the server (they do not see the test's environment)."""
    return {
        "endpoint": s3.endpoint,
        "access_key_id": S3_ENV["AWS_ACCESS_KEY_ID"],
        "secret_access_key": S3_ENV["AWS_SECRET_ACCESS_KEY"],
        "region": S3_ENV["AWS_REGION"],
        "client_options": {"allow_http": True},
    }


def examples(n: int) -> list:
    return [
        {"id": i, "text": f"document {i} " * (i % 5 + 1), "tokens": np.arange(i % 7)}
        for i in range(n)
    ]


def test_write_atlas_to_s3_stores_the_bytes_of_a_local_write(ray, s3, atlas, tmp_path):
    from atlas_fast.ray import write_atlas

    data = examples(20_000)
    ds = ray.data.from_items(data, override_num_blocks=4)
    options = {"shard_size": 500, "block_size": 50}
    local = write_atlas(ds, tmp_path / "local", **options)
    s3.proxy.reset_stats()
    s3.proxy.set(fault_rate=0.05)
    s3.proxy.fault_methods = (b"GET", b"PUT", b"POST", b"DELETE")
    meta = write_atlas(ds, s3.url("ray"), storage_options=task_options(s3), **options)
    s3.proxy.set(fault_rate=0.0)
    stats = s3.proxy.stats()
    assert sum(stats["faults"].values()) > 0
    # The shards of AtlasDatasetWriter: shard_size examples each, cut across the 4 blocks.
    assert meta == local and meta.shard_sizes == [500] * 40
    assert stats["copies"] == 0  # every shard went up under its final name
    objects = stored(s3, "ray")
    assert objects == local_files(tmp_path / "local")  # no staging object left either
    assert open_uploads(s3) == []
    with atlas.AtlasDataset(s3.url("ray")) as got:
        assert len(got) == len(data)
        assert all(same(a, b) for a, b in zip(iter(got), data))
    ref = reference_examples(download(objects, tmp_path / "down"))
    assert len(ref) == len(data) and all(same(a, b) for a, b in zip(ref, data))


def test_the_commit_is_a_few_small_requests(ray, s3, tmp_path):
    # The count known (from_items): each task's shard goes up under its final name; the
    # driver lists what failed attempts left and the open uploads, then puts the shared
    # dictionary and meta.json. Not known (a flat_map): only the shards named before the
    # count reached the final width (0-9 of 40) are copied, one request per object.
    from atlas_fast.ray import write_atlas

    data = examples(20_000)
    ds = ray.data.from_items(data, override_num_blocks=4)
    options = {"shard_size": 500, "block_size": 50}
    local = write_atlas(ds, tmp_path / "local", **options)
    for name, dataset, copies in (
        ("known", ds, 0),
        ("unknown", ds.flat_map(lambda row: [row]), 10 * 3),  # data.bin, index, meta.json
        ("told", ds.flat_map(lambda row: [row]), 0),
        ("told wrong", ds.flat_map(lambda row: [row]), 40 * 3),  # "000"... to "00"...
    ):
        s3.proxy.reset_stats()
        told = {"told": len(data), "told wrong": 10 * len(data)}
        expected = {"expected_examples": told[name]} if name in told else {}
        url = s3.url(name.replace(" ", "-"))
        meta = write_atlas(dataset, url, storage_options=task_options(s3), **options, **expected)
        stats = s3.proxy.stats()
        assert meta == local
        assert stats["copies"] == copies, name
        assert stored(s3, name.replace(" ", "-")) == local_files(tmp_path / "local"), name
        if not copies:
            # A PUT per shard file, the dictionary, meta.json; 3 listings. The job puts its
            # live mark (a PUT) and the commit removes it (a DeleteObjects POST); each task
            # marks itself running (a PUT), looks for the live mark (a listing) and removes
            # its mark (a POST): 3 small requests per task.
            tasks = 40
            assert stats["methods"] == {
                "GET": 3 + tasks,
                "PUT": 40 * 3 + 2 + 1 + tasks,
                "POST": 1 + tasks,
            }, name


def flaky(marker: Path, task: int, *, after: int | None = None, **kwargs):
    """An AtlasDatasink whose task ``task`` fails once (until ``marker`` exists): after
    ``after`` of its rows (its first shard uploaded, when it has more than one), or when
    ``after`` is None once its write is done (its shards uploaded, nothing reported)."""
    from ray.data.block import BlockAccessor

    from atlas_fast.ray import AtlasDatasink

    def fail():
        marker.touch()
        raise RuntimeError("injected failure")

    class FlakyDatasink(AtlasDatasink):
        def write(self, blocks, ctx):
            failing = ctx.task_idx == task and not marker.exists()

            def split(blocks):
                for block in blocks:
                    rows = BlockAccessor.for_block(block)
                    if not failing or after is None:
                        yield block
                        continue
                    yield rows.slice(0, after)
                    fail()

            report = super().write(split(blocks), ctx)
            if failing and after is None:
                fail()
            return report

    return FlakyDatasink(**kwargs)


@pytest.mark.parametrize("after", [None, 300])
def test_a_task_failing_once_and_retried_leaves_the_dataset_of_a_clean_write(
    ray, s3, tmp_path, after
):
    # As write_atlas writes: a task per shard, each shard under its final name. The failed
    # attempt either stored its shard and died before reporting it (after=None: the retry
    # puts the same objects again) or failed mid-shard (after=300: it deletes what it put).
    data = examples(20_000)
    ds = ray.data.from_items(data, override_num_blocks=4)
    options = {"shard_size": 2_000, "block_size": 50, "compression_strategy": 1}
    clean = flaky(tmp_path / "never", -1, path=tmp_path / "local", **options)
    shards = ds.repartition(target_num_rows_per_block=2_000, strict=True)
    shards.write_datasink(clean)
    marker = tmp_path / "failed-once"
    sink = flaky(
        marker,
        3,
        after=after,
        path=s3.url("retried"),
        storage_options=task_options(s3),
        expected_examples=len(data),
        **options,
    )
    s3.proxy.reset_stats()
    shards.write_datasink(sink, ray_remote_args={"max_retries": 1, "retry_exceptions": True})
    assert marker.exists()  # the first attempt of task 3 did fail
    assert sink.metadata.shard_sizes == [2_000] * 10
    assert s3.proxy.stats()["copies"] == 0
    assert stored(s3, "retried") == local_files(tmp_path / "local")
    assert open_uploads(s3) == []


def test_a_task_of_several_shards_retried_is_staged_and_copied(ray, s3, tmp_path):
    # Given a Ray Dataset as it is (a task per block of 5,000 rows: shards of 2,000, 2,000
    # and 1,000), the sink stages each task's shards and the commit copies them.
    data = examples(20_000)
    ds = ray.data.from_items(data, override_num_blocks=4)
    options = {"shard_size": 2_000, "block_size": 50, "compression_strategy": 1}
    clean = flaky(tmp_path / "never", -1, path=tmp_path / "local", **options)
    ds.write_datasink(clean)
    marker = tmp_path / "failed-once"
    sink = flaky(
        marker,
        1,
        after=3_000,
        path=s3.url("retried"),
        storage_options=task_options(s3),
        **options,
    )
    s3.proxy.reset_stats()
    ds.write_datasink(sink, ray_remote_args={"max_retries": 1, "retry_exceptions": True})
    assert marker.exists()  # the first attempt of task 1 did fail
    assert sink.metadata.shard_sizes == [2_000, 2_000, 1_000] * 4
    assert s3.proxy.stats()["copies"] == 12 * 3  # data.bin, index, meta.json of each shard
    assert stored(s3, "retried") == local_files(tmp_path / "local")
    assert open_uploads(s3) == []


def test_shards_named_for_other_numbers_are_copied_in_a_safe_order(ray, s3, tmp_path):
    # AtlasDatasink on blocks of 2,000, 5,000, 2,000 and 1,000 rows, a task each: tasks 0, 2
    # and 3 hold one shard and name it "0", "2", "3"; task 1's three are staged. Shards 4 and
    # 5 are stored as "2" and "3", the names that shards 2 and 3 are copied to: "2" and "3"
    # must be copied away first.
    import pandas as pd

    from atlas_fast.ray import AtlasDatasink

    frames, first = [], 0
    for rows in (2_000, 5_000, 2_000, 1_000):
        ids = range(first, first + rows)
        frames.append(pd.DataFrame({"id": list(ids), "text": [f"doc {i} " * 3 for i in ids]}))
        first += rows
    ds = ray.data.from_pandas(frames)
    options = {"shard_size": 2_000, "block_size": 50, "compression_strategy": 1}
    ds.write_datasink(AtlasDatasink(tmp_path / "local", **options))
    sink = AtlasDatasink(
        s3.url("chain"), storage_options=task_options(s3), expected_examples=first, **options
    )
    s3.proxy.reset_stats()
    ds.write_datasink(sink)
    assert sink.metadata.shard_sizes == [2_000, 2_000, 2_000, 1_000, 2_000, 1_000]
    assert s3.proxy.stats()["copies"] == 5 * 3  # all but shard 0
    assert stored(s3, "chain") == local_files(tmp_path / "local")
    assert open_uploads(s3) == []


@pytest.mark.parametrize("repartitioned", [False, True])
def test_a_failed_job_leaves_nothing(ray, s3, tmp_path, repartitioned):
    from atlas_fast import AtlasDataset, AtlasFormatError

    ds = ray.data.from_items(examples(20_000), override_num_blocks=4)
    if repartitioned:  # task 0's shard stored under its final name when task 1 fails
        ds = ds.repartition(target_num_rows_per_block=2_000, strict=True)
    sink = flaky(
        tmp_path / "never-made",
        1,
        after=300 if repartitioned else 3_000,
        path=s3.url("failed"),
        storage_options=task_options(s3),
        shard_size=2_000,
        block_size=50,
        compression_strategy=1,
        expected_examples=20_000,
    )
    with pytest.raises(Exception, match="injected failure"):
        ds.write_datasink(sink)  # tasks side by side: those still writing are waited for
    assert stored(s3, "failed") == {}
    assert open_uploads(s3) == []
    with pytest.raises(AtlasFormatError, match="incomplete"):
        AtlasDataset(s3.url("failed"))


def test_convert_on_ray_to_s3_uploads_from_the_tasks(ray, s3, tmp_path):
    # convert(ray=True) to a URL is write_atlas to the URL: the tasks upload their shards,
    # nothing is staged by the converting process; the objects are a local Ray conversion's.
    import json

    from atlas_fast.convert import convert

    src = tmp_path / "src"
    src.mkdir()
    for k in range(3):
        rows = [{"id": k * 100 + i, "text": "w " * i} for i in range(100)]
        (src / f"{k}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    options = {"shard_size": 40, "block_size": 10, "ray": True}
    convert(src, tmp_path / "local", "jsonl", **options)
    staging = tmp_path / "staging"
    s3.proxy.reset_stats()
    summary = convert(
        src,
        s3.url("conv-ray"),
        "jsonl",
        storage_options=task_options(s3),
        staging_dir=staging,
        **options,
    )
    objects = stored(s3, "conv-ray")
    assert objects == local_files(tmp_path / "local")
    assert summary.examples == 300 and summary.bytes_out == sum(map(len, objects.values()))
    assert list(staging.iterdir()) == []
    # Uploaded by the tasks under the shards' final names (8 shards: no name grows).
    assert s3.proxy.stats()["copies"] == 0


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_convert_on_ray_names_shards_finally_when_the_source_counts(ray, s3, tmp_path, fmt):
    # 13 shards: names of two digits. Parquet announces its row counts, which convert gives
    # write_atlas: no copy. JSONL does not, nor can Ray count a flat_map without running it:
    # shards 0-9 go up as "0" ... "9" and are copied to "00" ... "09" at the commit.
    from test_remote_convert import _copies_test_source

    from atlas_fast.convert import convert

    src = _copies_test_source(tmp_path, fmt)
    options = {"shard_size": 10, "block_size": 5, "ray": True}
    convert(src, tmp_path / "local", fmt, **options)
    s3.proxy.reset_stats()
    convert(src, s3.url("named"), fmt, storage_options=task_options(s3), **options)
    objects = stored(s3, "named")
    assert objects == local_files(tmp_path / "local") and "12/meta.json" in objects
    renamed = [name for name in objects if name[:2] in {f"0{k}" for k in range(10)}]
    assert s3.proxy.stats()["copies"] == (0 if fmt == "parquet" else len(renamed))


def test_a_failed_write_waits_for_its_straggler_and_leaves_nothing_for_the_next(ray, s3, tmp_path):
    # Task 0 is about to write and upload its shard under its final name ("0/...") when
    # task 1 fails the job. write_atlas must not return before task 0 has stopped: a second
    # write to the same URL, started at once, must store exactly a clean write of its own
    # examples, none of the first's (its shard 0 has the same names and sizes).

    from helpers import straggling_datasink, wait_for_straggler

    from atlas_fast.ray import write_atlas

    signals = tmp_path / "signals"
    signals.mkdir()
    options = {"shard_size": 200, "block_size": 50, "compression_strategy": 1}
    first = ray.data.from_items(examples(400), override_num_blocks=2)
    second = [
        {"id": -i, "text": f"second {i} " * (i % 5 + 1), "tokens": np.arange(i % 7)}
        for i in range(400)
    ]
    local = write_atlas(ray.data.from_items(second), tmp_path / "local", **options)
    sink = straggling_datasink(
        signals,
        path=s3.url("again"),
        storage_options=task_options(s3),
        expected_examples=400,
        **options,
    )
    try:
        with pytest.raises(Exception, match="injected failure"):
            first.write_datasink(sink, concurrency=2)
        stopped = (signals / "done").exists()  # before the failure was raised
        left = stored(s3, "again")
        meta = write_atlas(
            ray.data.from_items(second),
            s3.url("again"),
            storage_options=task_options(s3),
            **options,
        )
    finally:
        (signals / "release").touch()
    wait_for_straggler(signals)
    assert meta == local
    assert stored(s3, "again") == local_files(tmp_path / "local")
    assert open_uploads(s3) == []
    assert left == {}  # the failed write left no object
    assert stopped, "write_datasink raised while a write task of the job was still uploading"


def test_a_straggler_outliving_the_wait_keeps_the_destination_refused(
    ray, s3, tmp_path, monkeypatch
):
    # A task that has not stopped when the failed job's wait ends (STOP_WAIT, made short
    # here) may still upload: the job warns, keeps its staging prefix, and a new write there
    # refuses, naming the URL, what is left and what to do; once the task has stopped,
    # overwrite=True writes a clean dataset.
    import re

    from helpers import straggling_datasink, wait_for_straggler

    import atlas_fast.ray._data as ray_data
    from atlas_fast.ray import write_atlas

    monkeypatch.setattr(ray_data, "STOP_WAIT", 0.5)
    signals = tmp_path / "signals"
    signals.mkdir()
    options = {"shard_size": 200, "block_size": 50, "compression_strategy": 1}
    first = ray.data.from_items(examples(400), override_num_blocks=2)
    second = ray.data.from_items([{"id": -i} for i in range(400)])
    local = write_atlas(second, tmp_path / "local", **options)
    url = s3.url("late")
    task_options_ = task_options(s3)
    sink = straggling_datasink(
        signals,
        heed_failure=False,
        path=url,
        storage_options=task_options_,
        expected_examples=400,
        **options,
    )
    try:
        with pytest.warns(RuntimeWarning, match=r"1 of its tasks had not stopped after 0.5 s"):
            with pytest.raises(Exception, match="injected failure"):
                first.write_datasink(sink, concurrency=2)
        left = sorted(stored(s3, "late"))
        assert left and all(name.startswith(sink.job + "/") for name in left), left
        refused = (
            f"{re.escape(url)}: already exists and holds {re.escape(sink.job)}/.*"
            "left by a failed Ray Data write .*overwrite=True"
        )
        with pytest.raises(FileExistsError, match=refused):
            write_atlas(second, url, storage_options=task_options_, **options)
    finally:
        (signals / "release").touch()
    wait_for_straggler(signals)
    assert "0/data.bin" in stored(s3, "late")  # it did upload after the job gave up
    with pytest.raises(FileExistsError, match=refused):
        write_atlas(second, url, storage_options=task_options_, **options)
    meta = write_atlas(second, url, storage_options=task_options_, overwrite=True, **options)
    assert meta == local
    assert stored(s3, "late") == local_files(tmp_path / "local")
    assert open_uploads(s3) == []


def test_an_attempt_started_after_a_failed_job_cleaned_up_writes_nothing(s3):
    """A task attempt Ray starts once the failed job has cleaned up (a retry that raced the
    failure) finds the job's live mark gone and stops before writing: the destination stays
    empty. A mark of failure, removed by the cleanup, would let it write its shard."""
    from types import SimpleNamespace

    pytest.importorskip("ray", reason="the atlas-fast[ray] extra is not installed")
    from atlas_fast.ray import AtlasDatasink

    sink = AtlasDatasink(
        s3.url("late"),
        storage_options=task_options(s3),
        shard_size=10,
        block_size=5,
        compression_strategy=1,
    )
    sink.on_write_start()
    assert stored(s3, "late") != {}  # the live mark, under the job's staging prefix
    sink.on_write_failed(RuntimeError("a task failed"))
    assert stored(s3, "late") == {}
    with pytest.raises(RuntimeError, match="the write job has failed"):
        sink.write([{"item": list(range(10))}], SimpleNamespace(task_idx=0))
    assert stored(s3, "late") == {}


def test_write_atlas_appends_to_s3_and_widens(ray, s3, tmp_path):
    """mode="append" to a URL: the tasks upload under the numbers after the dataset's, the
    old shards are copied to their wider names, and no staging or old-name object is left."""
    from atlas_fast.ray import write_atlas

    data = examples(1_100)
    url = s3.url("grown")
    options = {"shard_size": 100, "block_size": 10, "storage_options": task_options(s3)}
    write_atlas(ray.data.from_items(data[:900], override_num_blocks=3), url, **options)
    meta = write_atlas(
        ray.data.from_items(data[900:], override_num_blocks=2), url, mode="append", **options
    )
    assert meta.shard_sizes == [100] * 11
    objects = stored(s3, "grown")
    assert sorted({n.split("/")[0] for n in objects if "/" in n}) == [f"{k:02d}" for k in range(11)]
    assert open_uploads(s3) == []
    ref = reference_examples(download(objects, tmp_path / "down"))
    assert len(ref) == len(data) and all(same(a, b) for a, b in zip(ref, data))
