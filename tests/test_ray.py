"""Ray Data: ``write_atlas`` / ``read_atlas`` on a local Ray cluster that this module starts.

The cluster (2 CPUs) is started once for the module and shut down at its end. What needs no
cluster (the missing extra, the read planner, the commit helper) runs without Ray too.
Every written dataset is read back by both atlas_fast backends and by the reference package
(its wheel beside the checkout, ../shared/peers, put on sys.path when not installed; the
suite's independent reference algorithm where torch, which it imports, is absent).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers import BAD_WRITER_OPTIONS, assert_same, reference_examples

import atlas_fast
import atlas_fast._python
import atlas_fast.atlas
from atlas_fast import AtlasDatasetShardWriter, InvalidArgumentError
from atlas_fast._extras import MissingExtraError
from atlas_fast._writing.commit import commit_staged_shards
from atlas_fast.ray import example_to_row, row_to_example
from atlas_fast.ray._rows import plan_read_tasks as _plan_read_tasks


def assert_reads_back(root, examples, reference=True) -> None:
    """``root`` holds ``examples``, in order, for both backends and the reference.

    Both backends are read here rather than through the ``atlas`` fixture, so that each
    dataset is written on the cluster once.
    """
    for module in {atlas_fast.atlas, atlas_fast._python}:
        with module.AtlasDataset(root) as ds:
            got = ds.__getitems__(list(range(len(ds))))
        assert len(got) == len(examples)
        for i, (a, b) in enumerate(zip(got, examples)):
            assert_same(a, b, f"{module.__name__}, example {i}")
    if not reference:
        return
    ref = reference_examples(root)
    assert len(ref) == len(examples)
    for i, (a, b) in enumerate(zip(ref, examples)):
        assert_same(a, b, f"reference, example {i}")


def dict_examples(n: int) -> list:
    return [
        {
            "id": i,
            "text": f"document {i} " * (i % 5 + 1),
            "tokens": np.arange(i % 7, dtype=np.int32),
        }
        for i in range(n)
    ]


def item_examples(n: int) -> list:
    """Examples that are not dicts with string keys: Ray rows with one "item" column."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        kind = i % 5
        if kind == 0:
            out.append(rng.integers(0, 50000, size=int(rng.integers(1, 64)), dtype=np.uint16))
        elif kind == 1:
            out.append((i, bytes(rng.integers(0, 256, size=i % 50, dtype=np.uint8))))
        elif kind == 2:
            out.append([float(i), None, "x" * (i % 7)])
        elif kind == 3:
            out.append(frozenset({i, -i}))
        else:
            out.append(f"text {i} " * (i % 9))
    return out


# -- without Ray ------------------------------------------------------------------------------


def test_without_ray_the_module_imports_and_each_name_says_which_extra():
    # A fresh interpreter in which `import ray` fails, as where the extra is not installed.
    code = textwrap.dedent(
        """
        import sys
        sys.modules["ray"] = None
        import atlas_fast.ray as r
        from atlas_fast._extras import MissingExtraError
        for use in (
            lambda: r.write_atlas(None, "x", shard_size=1, block_size=1),
            lambda: r.read_atlas("x"),
            lambda: r.AtlasDatasink,
            lambda: r.AtlasDatasource,
        ):
            try:
                use()
            except MissingExtraError as exc:
                print(exc)
            else:
                raise SystemExit("no MissingExtraError")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.splitlines()
    assert len(out) == 4
    for line in out:
        assert "pip install 'atlas-fast[ray]'" in line
    assert out[0].startswith("atlas_fast.ray.write_atlas needs ray")
    assert out[2].startswith("atlas_fast.ray.AtlasDatasink needs ray")


def test_a_missing_ray_is_noticed_at_use_even_after_an_import(monkeypatch):
    import atlas_fast.ray as r

    for name in ("ray", "ray.data"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(MissingExtraError, match=r"atlas-fast\[ray\]"):
        r.AtlasDatasource  # noqa: B018
    with pytest.raises(MissingExtraError, match=r"atlas-fast\[ray\]"):
        r.read_atlas("anywhere")
    with pytest.raises(AttributeError):
        r.NoSuchName  # noqa: B018


@pytest.mark.parametrize(
    ("shard_sizes", "block_sizes", "parallelism"),
    [
        ([1000], [100], 1),
        ([1000], [100], 3),
        ([1000], [100], 10),
        ([1000], [100], 50),
        ([95, 0, 7, 300], [10, 4, 3, 100], 4),
        ([95, 0, 7, 300], [10, 4, 3, 100], 1000),
        ([10_000] * 7 + [3], [64] * 8, 5),
        ([], [], 4),
        ([0, 0], [8, 8], 2),
    ],
)
def test_read_tasks_are_contiguous_runs_of_whole_blocks(shard_sizes, block_sizes, parallelism):
    # A private helper, tested on its own: the split over many shapes needs no cluster.
    tasks = _plan_read_tasks(shard_sizes, block_sizes, parallelism)
    blocks = sum(-(-n // b) for n, b in zip(shard_sizes, block_sizes))
    assert len(tasks) == min(parallelism, blocks)
    covered = [(s, i) for ranges in tasks for s, a, z in ranges for i in range(a, z)]
    assert covered == [(s, i) for s, n in enumerate(shard_sizes) for i in range(n)]
    for ranges in tasks:
        assert ranges
        for s, start, _ in ranges:
            assert start % block_sizes[s] == 0
    if tasks:  # as even as whole blocks allow: no task beyond the ideal by a block or more
        rows = [sum(z - a for _, a, z in ranges) for ranges in tasks]
        ideal = sum(shard_sizes) / len(tasks)
        assert max(rows) < ideal + max(block_sizes)


def test_commit_discards_the_staging_area_before_meta_json(tmp_path):
    staging = tmp_path / "root" / ".atlas-staging-x"
    with AtlasDatasetShardWriter(staging / "a" / "0", 4, compression_strategy=0) as w:
        for i in range(10):
            w.add_example(i)
    (staging / "a" / "leftover").mkdir()
    meta = commit_staged_shards(
        tmp_path / "root", [staging / "a" / "0"], compression_strategy=0, discard=[staging]
    )
    assert meta.shard_sizes == [10]
    assert sorted(p.name for p in (tmp_path / "root").iterdir()) == ["0", "meta.json"]


# -- on a local Ray cluster -------------------------------------------------------------------


@pytest.fixture(scope="module")
def written(ray, tmp_path_factory):
    """100k examples written by 4 tasks: (root, examples, metadata)."""
    from atlas_fast.ray import write_atlas

    examples = dict_examples(100_000)
    root = tmp_path_factory.mktemp("ray") / "ds"
    ds = ray.data.from_items(examples, override_num_blocks=4)
    meta = write_atlas(ds, root, shard_size=10_000, block_size=100)
    return root, examples, meta


def test_round_trip_of_100k_examples_written_from_4_blocks(written):
    root, examples, meta = written
    # Cut as AtlasDatasetWriter cuts them, across the 4 blocks of 25,000 rows.
    assert meta.shard_sizes == [10_000] * 10
    assert meta.compression_strategy == 2
    names = sorted(p.name for p in root.iterdir())
    assert names == [str(n) for n in range(10)] + ["meta.json", "zstd_dict.bin"]
    assert atlas_fast.AtlasDataset(root).metadata == meta
    assert_reads_back(root, examples)


def test_read_atlas_yields_the_examples_in_order(written, atlas):
    from atlas_fast.ray import read_atlas

    root, examples, _ = written
    rows = read_atlas(atlas.AtlasDataset(root), override_num_blocks=7).take_all()
    assert len(rows) == len(examples)
    for i, (row, example) in enumerate(zip(rows, examples)):
        assert_same(dict(row), example, f"row {i}")


def test_read_tasks_follow_the_requested_parallelism(written):
    from atlas_fast.ray import AtlasDatasource

    root, examples, _ = written
    source = AtlasDatasource(root)
    for parallelism in (1, 7, 12, 5000):
        tasks = source.get_read_tasks(parallelism)
        assert len(tasks) == min(parallelism, 1000)  # 1000 blocks of 100
        assert sum(t.metadata.num_rows for t in tasks) == len(examples)
    assert source.estimate_inmemory_data_size() > 0


@pytest.mark.parametrize("strategy", [0, 1, 2, 3])
def test_every_strategy_round_trips_examples_of_every_kind(ray, tmp_path, strategy):
    from atlas_fast.ray import read_atlas, write_atlas

    examples = item_examples(3000)
    ds = ray.data.from_items(examples, override_num_blocks=3)
    meta = write_atlas(
        ds, tmp_path / "ds", shard_size=500, block_size=20, compression_strategy=strategy
    )
    assert meta.shard_sizes == [500] * 6
    assert meta.compression_strategy == strategy
    shards = atlas_fast.AtlasDataset(tmp_path / "ds").shards
    assert {s.metadata.compression_strategy for s in shards} == {strategy}
    assert ((tmp_path / "ds" / "zstd_dict.bin").exists()) == (strategy == 2)
    assert_reads_back(tmp_path / "ds", examples)
    rows = read_atlas(tmp_path / "ds", override_num_blocks=4).take_all()
    assert [r.keys() for r in rows] == [{"item"}] * len(examples)
    assert_same([r["item"] for r in rows], examples, "read_atlas")


def test_a_dictionary_needs_seven_sample_blocks_else_strategy_1(ray, tmp_path):
    from atlas_fast.ray import write_atlas

    examples = dict_examples(600)
    ds = ray.data.from_items(examples, override_num_blocks=2)
    meta = write_atlas(ds, tmp_path / "ds", shard_size=300, block_size=50, dict_sample_rows=300)
    assert meta.compression_strategy == 1  # 6 blocks in the sample: the reference's rule
    assert not (tmp_path / "ds" / "zstd_dict.bin").exists()
    assert_reads_back(tmp_path / "ds", examples)


def test_the_shared_dictionary_is_the_dataset_writers(ray, tmp_path):
    """Trained from the sample's examples as AtlasDatasetWriter trains its first shard's
    (the last block short, too): the same dictionary bytes."""
    from atlas_fast.ray._data import train_shared_dictionary

    examples = dict_examples(430)
    with atlas_fast.AtlasDatasetWriter(tmp_path / "ds", 430, 50, workers=1) as w:
        for example in examples:
            w.add_example(example)
    trained = train_shared_dictionary(
        iter(examples), block_size=50, compression_level=3, compression_dict_size=0.01
    )
    assert trained == (tmp_path / "ds" / "zstd_dict.bin").read_bytes()


def test_shards_are_cut_across_blocks_as_the_dataset_writer_cuts_them(ray, tmp_path):
    from atlas_fast.ray import write_atlas

    # Blocks of 500 rows (range() is a read, fused with the map), shards of 300: each shard
    # takes its rows from one block or two, the last holds the remaining 100.
    ds = ray.data.range(1000, override_num_blocks=2).map(
        lambda r: {"id": r["id"], "sq": r["id"] ** 2}
    )
    meta = write_atlas(ds, tmp_path / "ds", shard_size=300, block_size=16, compression_strategy=3)
    assert meta.shard_sizes == [300, 300, 300, 100]
    assert_reads_back(tmp_path / "ds", [{"id": i, "sq": i * i} for i in range(1000)])


def test_an_empty_dataset_is_a_dataset_of_no_shards(ray, tmp_path):
    from atlas_fast.ray import write_atlas

    ds = ray.data.from_items([{"id": 1}]).filter(lambda row: False)
    meta = write_atlas(ds, tmp_path / "ds", shard_size=10, block_size=2)
    assert meta.shard_sizes == []
    assert meta.compression_strategy == 1
    # The reference cannot open a root without shards (its known defect 5), even its own.
    assert_reads_back(tmp_path / "ds", [], reference=False)


def test_the_destination_must_be_new(ray, tmp_path):
    from atlas_fast.ray import write_atlas

    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "something").write_text("")
    with pytest.raises(FileExistsError, match="into an absent or empty directory"):
        write_atlas(ray.data.range(3), tmp_path / "ds", shard_size=2, block_size=1)


def test_block_rows_are_the_rows_ray_iterates(ray):
    import datetime

    from ray.data.block import BlockAccessor

    from atlas_fast.ray._data import block_rows

    def column(values):
        out = np.empty(len(values), dtype=object)
        for i, value in enumerate(values):
            out[i] = value
        return out

    n = 50
    batches = [
        {
            "id": column(list(range(n))),
            "text": column([f"t{i}" for i in range(n)]),
            "bytes": column([b"x" * (i % 3) for i in range(n)]),
            "float": column([float(i) if i % 3 else None for i in range(n)]),
            "list": column([[i, i + 1] for i in range(n)]),
            "struct": column([{"a": i, "b": [1]} for i in range(n)]),
            "time": column([datetime.datetime(2020, 1, 1, second=i % 60) for i in range(n)]),
        },
        {
            "fixed": column([np.arange(4, dtype=np.float32) + i for i in range(n)]),
            "ragged": column([np.arange(i % 5, dtype=np.int16) for i in range(n)]),
            "image": column([np.full((2, 3), i, dtype=np.uint8) for i in range(n)]),
            "objects": column([frozenset({i}) if i % 2 else "a" for i in range(n)]),
        },
    ]
    for batch in batches:
        block = BlockAccessor.batch_to_block(batch)
        expected = [
            dict(r) for r in BlockAccessor.for_block(block).iter_rows(public_row_format=True)
        ]
        assert_same(list(block_rows(block)), expected, str(block.schema))
    frame = BlockAccessor.for_block(BlockAccessor.batch_to_block(batches[0])).to_pandas()
    expected = [dict(r) for r in BlockAccessor.for_block(frame).iter_rows(public_row_format=True)]
    assert_same(list(block_rows(frame)), expected, "pandas block")


def test_bad_arguments_are_refused_before_anything_runs(ray, tmp_path):
    from atlas_fast.ray import AtlasDatasink, write_atlas

    ds = ray.data.range(3)
    # The writer's options: the writer's errors, word for word.
    for option, value, kind, message in BAD_WRITER_OPTIONS:
        if option == "workers":
            continue  # not an argument here: Ray decides
        kwargs = {"shard_size": 2, "block_size": 1, "compression_strategy": 1, option: value}
        for make in (write_atlas, lambda _, path, **kw: AtlasDatasink(path, **kw)):
            with pytest.raises(kind) as info:
                make(ds, tmp_path / "ds", **kwargs)
            assert type(info.value) is kind and str(info.value) == message
    assert not (tmp_path / "ds").exists()
    for kwargs, match in [
        ({"shard_size": 0, "block_size": 1}, "shard_size must be a positive integer"),
        ({"shard_size": 2, "block_size": 1.5}, "block_size must be a positive integer"),
        ({"shard_size": 2, "block_size": 1, "compression_dict_size": 2}, "within \\[0, 1\\]"),
        ({"shard_size": 2, "block_size": 1, "dict_sample_rows": 0}, "dict_sample_rows"),
        ({"shard_size": 2, "block_size": 1, "expected_examples": -1}, "expected_examples"),
    ]:
        with pytest.raises(ValueError, match=match):
            write_atlas(ds, tmp_path / "ds", **kwargs)
    with pytest.raises(TypeError, match="expected_examples"):
        AtlasDatasink(
            tmp_path / "ds",
            shard_size=2,
            block_size=1,
            compression_strategy=1,
            expected_examples="10",
        )
    with pytest.raises(ValueError, match="needs compression_dict"):
        AtlasDatasink(tmp_path / "ds", shard_size=2, block_size=1)
    with pytest.raises(ValueError, match="only for compression_strategy 2"):
        AtlasDatasink(
            tmp_path / "ds",
            shard_size=2,
            block_size=1,
            compression_strategy=1,
            compression_dict=b"",
        )
    assert not (tmp_path / "ds").exists()


def flaky_datasink(marker: Path | None, task: int, **kwargs):
    """An AtlasDatasink whose write task ``task`` raises after 15,000 rows (one whole shard
    of 10,000 staged, the next one half written), until ``marker`` exists."""
    from ray.data.block import BlockAccessor

    from atlas_fast.ray import AtlasDatasink

    class FlakyDatasink(AtlasDatasink):  # local: pickled by value to the workers
        def write(self, blocks, ctx):
            def split(blocks):
                for block in blocks:
                    rows = BlockAccessor.for_block(block)
                    yield rows.slice(0, 15_000)
                    if ctx.task_idx == task and not (marker and marker.exists()):
                        if marker:
                            marker.touch()
                        staged = len(list(self.staging.glob("*/*/meta.json")))
                        raise RuntimeError(f"injected failure with {staged} staged shard(s)")
                    yield rows.slice(15_000, rows.num_rows())

            return super().write(split(blocks), ctx)

    return FlakyDatasink(**kwargs)


def test_a_task_that_raises_mid_write_leaves_no_dataset(ray, tmp_path):
    ds = ray.data.from_items(dict_examples(100_000), override_num_blocks=4)
    sink = flaky_datasink(
        None, 1, path=tmp_path / "ds", shard_size=10_000, block_size=100, compression_strategy=1
    )
    with pytest.raises(Exception, match=r"injected failure with [1-9][0-9]* staged shard"):
        # Tasks run side by side: those still writing when the job fails are waited for.
        ds.write_datasink(sink)
    assert not (tmp_path / "ds").exists()  # no meta.json, no staging, not even the folder


def test_a_retried_task_leaves_no_duplicate_shard(ray, tmp_path):
    marker = tmp_path / "failed-once"
    examples = dict_examples(100_000)
    ds = ray.data.from_items(examples, override_num_blocks=4)
    sink = flaky_datasink(
        marker, 1, path=tmp_path / "ds", shard_size=10_000, block_size=100, compression_strategy=1
    )
    ds.write_datasink(sink, ray_remote_args={"max_retries": 1, "retry_exceptions": True})
    assert marker.exists()  # the first attempt of task 1 did fail
    assert sink.metadata.shard_sizes == [10_000, 10_000, 5_000] * 4
    assert sorted(os.listdir(tmp_path / "ds")) == [f"{n:02d}" for n in range(12)] + ["meta.json"]
    assert_reads_back(tmp_path / "ds", examples)


def test_rows_and_examples_map_as_from_items_does(ray):
    for example in ({"a": 1, "b": "x"}, 5, "text", [1, 2]):
        (row,) = ray.data.from_items([example]).take_all()
        assert example_to_row(example) == dict(row)
        assert row_to_example(row) == example
    # Dicts that cannot be columns stay whole, under the item column.
    assert example_to_row({}) == {"item": {}}
    assert example_to_row({1: 2}) == {"item": {1: 2}}
    assert example_to_row([1, 2], item_column="value") == {"value": [1, 2]}
    assert row_to_example({"item": 3, "other": 4}) == {"item": 3, "other": 4}
    assert row_to_example({"item": 3}, item_column=None) == {"item": 3}


def test_dicts_that_cannot_be_columns_are_read_under_the_item_column(ray, tmp_path, atlas):
    from atlas_fast.ray import read_atlas

    examples = [{i: "an int key"} for i in range(50)] + [{}] * 50
    with atlas_fast.AtlasDatasetWriter(tmp_path / "ds", shard_size=40, block_size=8) as w:
        for example in examples:
            w.add_example(example)
    rows = read_atlas(atlas.AtlasDataset(tmp_path / "ds")).take_all()
    assert [dict(r) for r in rows] == [{"item": e} for e in examples]


def test_a_failed_write_waits_for_its_straggler_and_leaves_nothing_for_the_next(ray, tmp_path):
    # Task 0 is still about to write its shard when task 1 fails the job. write_atlas must
    # not return before task 0 has stopped: a second write to the same path, started at
    # once, must be a clean dataset of its own examples, with nothing of the first inside.
    from helpers import straggling_datasink, wait_for_straggler

    from atlas_fast.ray import write_atlas

    signals = tmp_path / "signals"
    signals.mkdir()
    root = tmp_path / "ds"
    options = {"shard_size": 200, "block_size": 50, "compression_strategy": 1}
    first = ray.data.from_items(dict_examples(400), override_num_blocks=2)
    sink = straggling_datasink(signals, path=root, **options)
    try:
        with pytest.raises(Exception, match="injected failure"):
            first.write_datasink(sink, concurrency=2)
        stopped = (signals / "done").exists()  # before the failure was raised
        left = sorted(os.listdir(root)) if root.exists() else None

        second = [{"id": -i, "text": f"second {i}"} for i in range(400)]
        meta = write_atlas(ray.data.from_items(second), root, **options)
    finally:
        (signals / "release").touch()
    wait_for_straggler(signals)
    assert meta.shard_sizes == [200, 200]
    assert sorted(os.listdir(root)) == ["0", "1", "meta.json"]  # no staging of the first
    assert_reads_back(root, second)
    assert left is None  # the failed write left nothing, not even the folder
    assert stopped, "write_datasink raised while a write task of the job was still running"


def test_a_straggler_outliving_the_wait_keeps_the_destination_refused(ray, tmp_path, monkeypatch):
    # A task that has not stopped when the failed job's wait ends (STOP_WAIT, made short
    # here) may still write: the job warns and keeps its staging area, and a new write there
    # refuses, naming the path, what is left and what to do.
    import re

    from helpers import straggling_datasink, wait_for_straggler

    import atlas_fast.ray._data as ray_data
    from atlas_fast.ray import write_atlas

    monkeypatch.setattr(ray_data, "STOP_WAIT", 0.5)
    signals = tmp_path / "signals"
    signals.mkdir()
    root = tmp_path / "ds"
    options = {"shard_size": 200, "block_size": 50, "compression_strategy": 1}
    first = ray.data.from_items(dict_examples(400), override_num_blocks=2)
    sink = straggling_datasink(signals, heed_failure=False, path=root, **options)
    try:
        with pytest.warns(RuntimeWarning, match=r"1 of its tasks had not stopped after 0.5 s"):
            with pytest.raises(Exception, match="injected failure"):
                first.write_datasink(sink, concurrency=2)
        assert os.listdir(root) == [sink.job]
        refused = (
            f"{re.escape(str(root))}: already exists and holds {re.escape(sink.job)}, left by "
            "a failed Ray Data write whose tasks may still be running"
        )
        with pytest.raises(FileExistsError, match=refused):
            write_atlas(ray.data.range(3), root, shard_size=2, block_size=1)
    finally:
        (signals / "release").touch()
    wait_for_straggler(signals)
    assert os.listdir(root) == [sink.job]  # what it wrote stayed in the staging area


def test_an_attempt_started_after_a_failed_job_cleaned_up_writes_nothing(tmp_path):
    """A task attempt Ray starts once the failed job has cleaned up (a retry that raced the
    failure) stops before writing, whether the job made the root or found it empty: nothing
    is left under it, no staging folder remade."""
    from types import SimpleNamespace

    pytest.importorskip("ray", reason="the atlas-fast[ray] extra is not installed")
    from atlas_fast.ray import AtlasDatasink

    for root, made in ((tmp_path / "new", True), (tmp_path / "empty", False)):
        if not made:
            root.mkdir()
        sink = AtlasDatasink(root, shard_size=10, block_size=5, compression_strategy=1)
        sink.on_write_start()
        sink.on_write_failed(RuntimeError("a task failed"))
        with pytest.raises(RuntimeError, match="the write job has failed"):
            sink.write([{"item": list(range(10))}], SimpleNamespace(task_idx=0))
        assert (not root.exists()) if made else list(root.iterdir()) == []


def test_write_atlas_appends_in_runs_crossing_ten_shards(ray, tmp_path):
    """mode="append": the shards of each run numbered after the last, the shared dictionary
    of the first run reused, the names widened when the count reaches 10; nothing is left
    beside the dataset, and another strategy is refused with the dataset unchanged."""
    from atlas_fast._writing.grow import wait_for_removals
    from atlas_fast.ray import write_atlas

    examples = dict_examples(3_000)
    root = tmp_path / "ds"
    runs = [examples[:1_200], examples[1_200:1_900], examples[1_900:]]
    write_atlas(
        ray.data.from_items(runs[0], override_num_blocks=2), root, shard_size=300, block_size=20
    )
    dictionary = (root / "zstd_dict.bin").read_bytes()
    for run in runs[1:]:
        ds = ray.data.from_items(run, override_num_blocks=2)
        meta = write_atlas(ds, root, shard_size=300, block_size=20, mode="append")
    assert meta.shard_sizes == [300] * 4 + [300, 300, 100] + [300, 300, 300, 200]
    assert meta.compression_strategy == 2
    assert (root / "zstd_dict.bin").read_bytes() == dictionary
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [f"{k:02d}" for k in range(11)]
    assert_reads_back(root, examples)
    wait_for_removals()  # private: the old trees are removed on a thread after the commit
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]
    with pytest.raises(InvalidArgumentError, match="compression_strategy 2"):
        write_atlas(
            ray.data.from_items(runs[0]),
            root,
            shard_size=300,
            block_size=20,
            compression_strategy=0,
            mode="append",
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]
