"""``atlas_fast.ray.write_atlas`` to S3 (moto) on a local Ray cluster: 4 write tasks upload
their shards, the driver commits them; the objects are those of a write to a local path, and
a task that fails once and is retried leaves no duplicate, missing or staging object."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import reference_read, same
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
    options = {"shard_size": 2_000, "block_size": 50}
    local = write_atlas(ds, tmp_path / "local", **options)
    s3.proxy.set(fault_rate=0.05)
    s3.proxy.fault_methods = (b"GET", b"PUT", b"POST", b"DELETE")
    meta = write_atlas(ds, s3.url("ray"), storage_options=task_options(s3), **options)
    s3.proxy.set(fault_rate=0.0)
    assert sum(s3.proxy.stats()["faults"].values()) > 0
    assert meta == local and len(meta.shard_sizes) == 12  # 3 shards from each of 4 tasks
    objects = stored(s3, "ray")
    assert objects == local_files(tmp_path / "local")  # no staging object left either
    assert open_uploads(s3) == []
    with atlas.AtlasDataset(s3.url("ray")) as got:
        assert len(got) == len(data)
        assert all(same(a, b) for a, b in zip(iter(got), data))
    ref = reference_read(download(objects, tmp_path / "down"))
    assert len(ref) == len(data) and all(same(a, b) for a, b in zip(ref, data))


def flaky(marker: Path, task: int, **kwargs):
    """An AtlasDatasink whose task ``task`` raises after one shard is uploaded (and the next
    half written), until ``marker`` exists."""
    from ray.data.block import BlockAccessor

    from atlas_fast.ray import AtlasDatasink

    class FlakyDatasink(AtlasDatasink):
        def write(self, blocks, ctx):
            def split(blocks):
                for block in blocks:
                    rows = BlockAccessor.for_block(block)
                    yield rows.slice(0, 3_000)
                    if ctx.task_idx == task and not marker.exists():
                        marker.touch()
                        raise RuntimeError("injected failure")
                    yield rows.slice(3_000, rows.num_rows())

            return super().write(split(blocks), ctx)

    return FlakyDatasink(**kwargs)


def test_a_task_failing_once_and_retried_leaves_the_dataset_of_a_clean_write(ray, s3, tmp_path):
    data = examples(20_000)
    ds = ray.data.from_items(data, override_num_blocks=4)
    options = {"shard_size": 2_000, "block_size": 50, "compression_strategy": 1}
    clean = flaky(tmp_path / "never", -1, path=tmp_path / "local", **options)
    ds.write_datasink(clean)
    marker = tmp_path / "failed-once"
    sink = flaky(marker, 1, path=s3.url("retried"), storage_options=task_options(s3), **options)
    ds.write_datasink(sink, ray_remote_args={"max_retries": 1, "retry_exceptions": True})
    assert marker.exists()  # the first attempt of task 1 did fail
    assert sink.metadata.shard_sizes == [2_000, 2_000, 1_000] * 4
    assert stored(s3, "retried") == local_files(tmp_path / "local")
    assert open_uploads(s3) == []


def test_a_failed_job_leaves_nothing(ray, s3, tmp_path):
    from atlas_fast import AtlasDataset, AtlasFormatError

    ds = ray.data.from_items(examples(20_000), override_num_blocks=4)
    sink = flaky(
        tmp_path / "never-made",
        1,
        path=s3.url("failed"),
        storage_options=task_options(s3),
        shard_size=2_000,
        block_size=50,
        compression_strategy=1,
    )
    with pytest.raises(Exception, match="injected failure"):
        ds.write_datasink(sink, concurrency=1)
    assert stored(s3, "failed") == {}
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
    # Uploaded by the tasks, under write_atlas's staging prefix: not from a local copy.
    assert any("/conv-ray/.atlas-staging-" in path for path in s3.proxy.stats()["paths"])
