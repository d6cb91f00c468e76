"""The Ray Data classes behind ``atlas_fast.ray`` (imported only once Ray is there)."""

from __future__ import annotations

import functools
import math
import os
import shutil
import time
import uuid
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import ray
import zstandard
from ray.data import Datasink, Datasource, ReadTask, read_datasource
from ray.data.block import BlockAccessor, BlockMetadata

from .. import atlas
from .._checks import check_int
from .._errors import destination_exists
from .._format import (
    DATA_FILE,
    META_FILE,
    VERSION,
    AtlasDatasetMetadata,
    CompressionStrategy,
    read_shard_metadata,
)
from .._writing.commit import commit_staged_shards
from .._writing.grow_remote import RemoteGrowth, commit_remote_append, remove_remote_leftovers
from .._writing.options import WriterOptions
from .._writing.upload import (
    STAGING_PREFIX,
    commit_uploaded,
    is_remote,
    open_destination,
    remove_objects,
    staging_left,
    upload_shard,
)
from ..writer import AtlasDatasetShardWriter, pickle_block, train_dictionary
from ._rows import example_to_row, plan_read_tasks, row_to_example

__all__ = [
    "AtlasDatasink",
    "AtlasDatasource",
    "block_rows",
    "check_destination",
    "known_count",
    "read_datasource",
    "train_shared_dictionary",
]

# Under the job's staging area (a folder of path, or a prefix of the URL): LIVE exists from
# the job's start (on_write_start, on the driver) until the driver gives the job up, and
# RUNNING/<attempt> while a task attempt runs. An attempt registers itself, then looks for
# LIVE (stopping if it is gone); a failed job removes LIVE, then waits for the registered
# attempts to end: either the driver sees an attempt's mark and waits for it, or the attempt
# sees LIVE gone, also an attempt that Ray starts after the cleanup (a retry), which a mark
# of failure would not stop once the cleanup had removed it. So no attempt writes anything
# after the driver has cleaned up and write_atlas has raised.
RUNNING = "running"
LIVE = "live"
# How long a failed job waits for its cancelled tasks to stop (seconds) before it cleans up
# what it can and leaves the staging area (with the markers of the attempts still running).
STOP_WAIT = 120.0
# A dictionary sample of one shard, at most this many blocks: the driver holds it in memory.
MAX_SAMPLE_BLOCKS = 256
# The LocalAppend of each local append under way on this driver, by job (see AtlasDatasink).
_GROWING: dict = {}
# Examples per Ray block a read task yields (whole Atlas blocks, at least one).
ROWS_PER_RAY_BLOCK = 4096


def check_destination(path: Path) -> None:
    """Refuse a destination that is not absent or an empty directory."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        state = None  # looked up
        staging = sorted(path.glob(STAGING_PREFIX + "*")) if path.is_dir() else []
        if staging:
            state = staging_left(staging[0].name, "remove it")
        raise destination_exists(path, "write_atlas", empty_dir_ok=True, state=state)


def known_count(dataset) -> int | None:
    """The rows of ``dataset`` if Ray knows them without running it (from its blocks'
    metadata: ``from_items``, ``range``, a materialized dataset, Parquet footers), or None.

    Ray's ``Dataset.count`` runs the whole dataset when it does not know; its
    ``_meta_count`` (private, read defensively) is the part that never runs anything.
    """
    meta_count = getattr(dataset, "_meta_count", None)
    if meta_count is None:
        return None
    try:
        count = meta_count()
    except Exception:
        return None
    return count if isinstance(count, int) and count >= 0 else None


def _task_cpus() -> int:
    """The CPUs Ray assigned to the running task: the shard writer's compression threads
    (its default, the machine's cores, would oversubscribe a node running a task per CPU)."""
    try:
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
    except Exception:  # outside a task (tests calling write() directly)
        cpus = 1
    return max(1, int(cpus))


def train_shared_dictionary(
    examples, *, block_size: int, compression_level: int, compression_dict_size: float, where=None
) -> bytes | None:
    """The strategy-2 dictionary of ``examples``, trained as the shard writer trains one.

    The examples are pickled in blocks of ``block_size`` (``pickle_block``) and given to
    ``train_dictionary``, the shard writer's own training (zstd on the pickled blocks,
    ``compression_dict_size`` of their size), which gives None when it cannot train one
    (fewer than 7 blocks), as the reference does with a dataset's first shard. Returns the
    dictionary's bytes, or None for that fallback. ``where`` names the dataset in a warning.
    """
    blocks: list = []
    block: list = []
    for example in examples:
        block.append(example)
        if len(block) == block_size:
            blocks.append(pickle_block(block, shard=where, number=len(blocks)))
            block = []
    if block:
        blocks.append(pickle_block(block, shard=where, number=len(blocks)))
    zdict = train_dictionary(
        blocks,
        compression_dict_size=compression_dict_size,
        compression_level=compression_level,
        shard=where,
    )
    return None if zdict is None else zdict.as_bytes()


def block_rows(block):
    """The rows of a Ray block as dicts, as ``BlockAccessor.iter_rows`` gives them.

    An Arrow block is converted a column at a time (plain columns to Python values,
    tensor and object columns through Ray's numpy conversion), which gives the same values
    as Ray's row iterator at a fraction of its per-row cost; other blocks use the iterator.
    """
    if not isinstance(block, pa.Table):
        for row in BlockAccessor.for_block(block).iter_rows(public_row_format=True):
            yield dict(row)
        return
    columns = []
    for name, column in zip(block.column_names, block.columns):
        if isinstance(column.type, pa.ExtensionType):
            one = BlockAccessor.for_block(block.select([name]))
            columns.append(list(one.to_batch_format("numpy")[name]))
        else:
            columns.append(column.to_pylist())
    for values in zip(*columns):
        yield dict(zip(block.column_names, values))


class AtlasDatasink(Datasink):
    """Writes a Ray Dataset as an Atlas dataset at ``path`` (see ``atlas_fast.ray.write_atlas``).

    Each write task writes its rows as shards of ``shard_size`` examples (the last one may be
    smaller) into ``path/.atlas-staging-<job>/<task>-<attempt>/``, a directory no other task
    or attempt uses, and reports the shards it finished. ``on_write_complete`` (on the
    driver) moves the reported shards into ``path`` as ``0..N-1`` in task order, removes the
    staging area and writes the root meta.json last, atomically; ``on_write_failed`` removes
    the staging area and writes no meta.json, once the job's other tasks have stopped (it
    waits for them). Strategy 2 needs ``compression_dict``, the
    bytes of the dictionary every task compresses with (``write_atlas`` trains it). Each
    task receives at least ``shard_size`` rows where the dataset has them
    (``min_rows_per_write``), so tasks write mostly whole shards.

    To a URL, a task whose rows make one shard (``write_atlas`` gives each task exactly one
    shard's rows) uploads it under its final name: its task index, zero-padded to the width
    of the ``expected_examples``' shard count (or of its own index when not given), so that
    the commit copies nothing. A task with more than one shard uploads them under the
    staging prefix; the commit copies to its final name every shard stored under another
    name (staged, or named for a count that turned out wrong).
    """

    def __init__(
        self,
        path,
        *,
        shard_size: int,
        block_size: int,
        compression_strategy: int = CompressionStrategy.SHARED_DICTIONARY_COMPRESSION,
        compression_level: int = 3,
        compression_dict_size: float = 0.01,
        compression_dict: bytes | None = None,
        item_column: str | None = "item",
        storage_options: dict | None = None,
        overwrite: bool = False,
        expected_examples: int | None = None,
        _grow=None,
    ):
        options = WriterOptions.from_arguments(locals())
        if expected_examples is not None:
            expected_examples = check_int("expected_examples", expected_examples, minimum=0)
        self.job = f"{STAGING_PREFIX}{uuid.uuid4().hex}"
        # write_atlas(mode="append"): the dataset grown (a _writing.grow.LocalAppend, held
        # on the driver only, in _GROWING: it holds the dataset's lock; or the picklable
        # _writing.grow_remote.RemoteGrowth of a URL); its shards come first.
        self.first = 0
        self.growth = None  # a URL's RemoteGrowth
        self.aside = None  # a local append's folder, where its shards are staged
        if isinstance(_grow, RemoteGrowth):
            self.growth, self.first = _grow, _grow.count
        elif _grow is not None:
            _GROWING[self.job] = _grow
            self.aside, self.first = _grow.aside.dir, _grow.first
        # A URL: tasks upload their shards (under their final names when they can: see the
        # class), the driver commits them.
        self.remote = None
        if self.growth is not None:
            self.remote = self.growth.dest
        elif self.aside is not None:
            pass  # the dataset was checked, and is locked, by the LocalAppend
        elif is_remote(path):
            self.remote = open_destination(
                path, storage_options, overwrite=bool(overwrite), who="write_atlas"
            )
        elif storage_options is not None or overwrite:
            raise ValueError(f"{path}: storage_options and overwrite are for a URL")
        else:
            check_destination(Path(path))
        strategy = options.compression_strategy
        shared = strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
        if shared and compression_dict is None:
            raise ValueError(
                "compression_strategy 2 (SHARED_DICTIONARY_COMPRESSION) needs compression_dict, "
                "the dictionary every task compresses with (write_atlas trains one)"
            )
        if not shared and compression_dict is not None:
            raise ValueError("compression_dict is only for compression_strategy 2")
        self.path = Path(path) if self.remote is None else self.remote.location.url
        self.shard_size = options.shard_size
        self.block_size = options.block_size
        self.compression_strategy = strategy
        self.compression_level = options.compression_level
        self.compression_dict_size = options.compression_dict_size
        self.compression_dict = None if compression_dict is None else bytes(compression_dict)
        self.item_column = item_column
        # The shards the dataset is expected to have (0: not known): their names' width.
        self.expected_shards = 0
        if expected_examples is not None:
            self.expected_shards = self.first + -(-expected_examples // self.shard_size)
        self.staging = None
        if self.remote is None:  # an append's staging is outside the dataset's root
            self.staging = (self.path if self.aside is None else self.aside) / self.job
        self.metadata = None  # the dataset's AtlasDatasetMetadata, once committed
        self._created_root = False
        self._moved: list = []  # shard directories moved into path by a commit under way

    @property
    def min_rows_per_write(self) -> int:
        return self.shard_size

    def get_name(self) -> str:
        return "Atlas"

    def on_write_start(self, schema=None) -> None:
        if self.remote is not None:
            self.remote.put_bytes(f"{self.job}/{LIVE}/{LIVE}", b"")  # names() lists folders
            return
        if self.aside is None:
            self._make_root()
        self.staging.mkdir(exist_ok=True)
        (self.staging / RUNNING).mkdir(exist_ok=True)
        (self.staging / LIVE).touch()

    def _make_root(self) -> None:
        if not self.path.exists():
            self.path.mkdir(parents=True)
            self._created_root = True

    def _shard_writer(self, path, zdict, threads: int):
        """A shard writer at ``path`` with this datasink's options (``zdict``: the shared
        dictionary, or None; ``threads``: its compression threads)."""
        return AtlasDatasetShardWriter(
            path=path,
            block_size=self.block_size,
            compression_strategy=self.compression_strategy,
            compression_level=self.compression_level,
            compression_dict=zdict,
            compression_dict_size=self.compression_dict_size,
            workers=threads,
        )

    def write(self, blocks, ctx) -> dict:
        """Write this task's rows as shards into a staging directory of this attempt's own."""
        if self.remote is not None:
            return self._write_remote(blocks, ctx)
        attempt = self.staging / f"{ctx.task_idx:06d}-{uuid.uuid4().hex}"
        running = self.staging / RUNNING / attempt.name
        try:
            self._register_local(running)
            return self._write_local(blocks, ctx, attempt)
        finally:
            running.unlink(missing_ok=True)  # the driver waits for this after a failure

    def _register_local(self, running: Path) -> None:
        """Mark the attempt as running (the file ``running``, in ``staging/running/``), then
        stop unless the job is live (``staging/live``): the driver either sees the mark or
        this attempt sees the job given up. The caller removes the mark when the attempt
        ends."""
        failed = RuntimeError(f"{self.staging}: the write job has failed")
        try:
            running.touch(exist_ok=False)  # no folder made: a removed staging area stays so
        except FileNotFoundError:
            raise failed from None
        if not (self.staging / LIVE).exists():
            raise failed

    def _write_local(self, blocks, ctx, attempt: Path) -> dict:
        zdict = None
        if self.compression_dict is not None:
            zdict = zstandard.ZstdCompressionDict(self.compression_dict)
        shards: list = []
        writer = None
        threads = _task_cpus()
        try:
            # Not with parents: a staging area removed by a failed job is not made again.
            attempt.mkdir()
            for block in blocks:
                for row in block_rows(block):
                    if writer is None:
                        if not attempt.is_dir() or not (self.staging / LIVE).exists():
                            raise RuntimeError(f"{attempt}: the write job has failed")
                        shards.append(str(len(shards)))
                        writer = self._shard_writer(attempt / shards[-1], zdict, threads)
                    writer.add_example(row_to_example(row, self.item_column))
                    if len(writer) == self.shard_size:
                        writer.close()
                        writer = None
            if writer is not None:
                writer.close()
        except BaseException:
            # Nothing of a failed attempt is reported, so nothing of it is ever committed.
            shutil.rmtree(attempt, ignore_errors=True)
            raise
        return {"task": ctx.task_idx, "attempt": attempt.name, "shards": shards}

    def final_name(self, task: int) -> str:
        """The name task ``task`` gives its one shard: the task index, zero-padded to the
        width of the expected shard count (or of the index, when that is more); after the
        dataset's shards when appending."""
        number = self.first + task
        return str(number).zfill(len(str(max(self.expected_shards, number + 1) - 1)))

    def _write_remote(self, blocks, ctx) -> dict:
        """A task writing to a URL: each shard written in a local temporary directory,
        uploaded (while the next is written) and removed. A task whose rows make one shard
        uploads it under its final name (``final_name``): it holds its finished shard until
        it knows no second one follows. A task with more shards uploads them under
        ``<job>/<task>-<attempt>/<n>``. A failed attempt deletes what it uploaded."""
        name = f"{ctx.task_idx:06d}-{uuid.uuid4().hex}"
        attempt = f"{self.job}/{name}"
        dest = self.remote
        # Marked as running, then stopped unless the job is live (as _register_local).
        running = f"{self.job}/{RUNNING}/{name}"
        try:
            dest.put_bytes(running, b"")
            if not dest.names(f"{self.job}/{LIVE}", limit=1):
                raise RuntimeError(f"{self.path}: the write job has failed")
            return self._upload_shards(blocks, ctx, attempt)
        finally:
            try:
                dest.delete([running])  # the driver waits for this after a failure
            except Exception:
                pass  # swept with the staging prefix (the driver waits STOP_WAIT for it)

    def _upload_shards(self, blocks, ctx, attempt: str) -> dict:
        import tempfile
        from concurrent.futures import ThreadPoolExecutor

        local = Path(tempfile.mkdtemp(prefix="atlas-fast-task-"))
        zdict = None
        if self.compression_dict is not None:
            zdict = zstandard.ZstdCompressionDict(self.compression_dict)
        dest = self.remote
        shards: list = []  # (number, name, objects, examples)
        pending: list = []
        uploaded: list = []
        held: list = []  # (number, examples) of the first shard, while its name is not known
        final: list = []  # the final name, once this attempt uploads under it

        def upload(number: int, name: str, size: int) -> None:
            objects = upload_shard(dest, local / str(number), name)
            uploaded.extend(objects)
            shutil.rmtree(local / str(number), ignore_errors=True)
            shards.append((number, name, objects, size))

        def submit(number: int, name: str, size: int) -> None:
            while len(pending) >= 2:  # at most two shards wait on local disk
                pending.pop(0).result()
            pending.append(pool.submit(upload, number, name, size))

        def finish(writer, number: int) -> None:
            writer.close()
            if number == 0:
                held.append((number, len(writer)))
            else:
                submit(number, f"{attempt}/{number}", len(writer))

        writer = None
        threads = _task_cpus()
        pool = ThreadPoolExecutor(2, thread_name_prefix="atlas-fast-upload")
        try:
            number = 0
            for block in blocks:
                for row in block_rows(block):
                    if writer is None:
                        if held:  # a second shard: this task's shards are staged
                            first, size = held.pop()
                            submit(first, f"{attempt}/{first}", size)
                        writer = self._shard_writer(local / str(number), zdict, threads)
                    writer.add_example(row_to_example(row, self.item_column))
                    if len(writer) == self.shard_size:
                        finish(writer, number)
                        writer, number = None, number + 1
            if writer is not None:
                finish(writer, number)
            if held:  # the task's only shard: under its final name
                first, size = held.pop()
                final.append(self.final_name(ctx.task_idx))
                submit(first, final[0], size)
            for future in pending:
                future.result()
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            try:  # nothing of a failed attempt is reported, nor kept
                remove_objects(dest, uploaded)
                dest.abort_uploads(attempt)
                if final:  # what a failed upload put there, and its open uploads
                    remove_objects(dest, dest.names(final[0]))
                    dest.abort_uploads(final[0])
            except Exception:
                pass
            raise
        finally:
            pool.shutdown(wait=True)
            shutil.rmtree(local, ignore_errors=True)
        shards.sort()
        return {
            "task": ctx.task_idx,
            "attempt": attempt,
            "shards": [(name, objects) for _, name, objects, _ in shards],
            "sizes": [size for *_, size in shards],
        }

    def on_write_complete(self, write_result) -> None:
        """Commit the reported shards in task order; the root meta.json comes last."""
        reports = sorted(
            (r for r in write_result.write_returns if r is not None), key=lambda r: r["task"]
        )
        tasks = [r["task"] for r in reports]
        if len(set(tasks)) != len(tasks):
            raise RuntimeError(f"{self.path}: a write task reported its shards twice: {tasks}")
        if self.remote is not None:
            self._commit_remote(reports, write_result.num_rows)
            return
        staged = [self.staging / r["attempt"] / name for r in reports for name in r["shards"]]
        stored = sum(read_shard_metadata(p).stored_examples for p in staged)
        if stored != write_result.num_rows:
            raise RuntimeError(
                f"{self.path}: the staged shards hold {stored} examples, "
                f"the write tasks received {write_result.num_rows} rows"
            )
        if self.aside is not None:
            self._commit_append(staged)
            return
        self._make_root()
        width = len(str(len(staged) - 1)) if staged else 1
        self._moved = [self.path / str(n).zfill(width) for n in range(len(staged))]
        self.metadata = commit_staged_shards(
            self.path,
            staged,
            compression_strategy=self.compression_strategy,
            shared_dict=self.compression_dict,
            discard=[self.staging],
        )
        self._moved = []

    def _commit_append(self, staged: list) -> None:
        """A local append: the staged shards moved into the append's folder as the numbers
        after the dataset's, the staging area removed, then the grown dataset swapped in."""
        grow = _GROWING.pop(self.job)
        sizes = [read_shard_metadata(p).stored_examples for p in staged]
        for k, shard in enumerate(staged):
            os.replace(shard, grow.shard_dir(self.first + k))
        shutil.rmtree(self.staging, ignore_errors=True)
        self.metadata = grow.commit(sizes, int(self.compression_strategy))

    def _commit_remote(self, reports: list, rows: int) -> None:
        sizes = [n for r in reports for n in r["sizes"]]
        if sum(sizes) != rows:
            raise RuntimeError(
                f"{self.path}: the staged shards hold {sum(sizes)} examples, "
                f"the write tasks received {rows} rows"
            )
        if self.growth is not None:
            shards = [shard for r in reports for shard in r["shards"]]
            strategy = int(self.compression_strategy)
            self.metadata = commit_remote_append(self.growth, shards, sizes, strategy)
            try:
                remove_objects(self.remote, self.remote.names(self.job))
            except Exception:
                pass  # committed: the staging prefix is swept by the next append
            return
        fields = AtlasDatasetMetadata(VERSION, sizes, int(self.compression_strategy))._asdict()
        commit_uploaded(
            self.remote,
            [shard for r in reports for shard in r["shards"]],
            fields,
            self.compression_dict,
            discard=self.job,
        )
        self.metadata = AtlasDatasetMetadata(**fields)

    def on_write_failed(self, error: Exception) -> None:
        """Stop the job's tasks and wait for them (``STOP_WAIT``), then remove the staging
        area (and what a failed commit moved); write no meta.json.

        Ray cancels the tasks still running without waiting for them, and a task caught in
        an upload (or a file operation) finishes it first: cleaning up at once would let it
        put an object after the cleanup, into the destination a new write may be using.
        So the job's live mark is removed (an attempt starting from now on stops at once),
        and the attempts marked running are waited for. Those still running after STOP_WAIT
        keep the staging area (and their marks) in place, with a warning: the destination
        is not empty, so a new write there refuses until they have stopped."""
        if self.remote is not None:
            self._remote_failed()
            return
        left = []
        if self.staging.is_dir():
            running = self.staging / RUNNING
            try:
                (self.staging / LIVE).unlink(missing_ok=True)
            except OSError as exc:  # the tasks cannot be told: none can be waited for
                left = self._not_stopped(f"the live mark stays ({exc})")
            else:
                left = self._wait_stopped(
                    lambda: sorted(p.name for p in running.iterdir()) if running.is_dir() else []
                )
        grow = _GROWING.pop(self.job, None)
        if left:
            if grow is not None:
                grow.release()  # its folder stays, its tasks still writing; a leftover
            return
        if grow is not None:
            grow.abandon()  # the staging area inside it too
            return
        # Renamed first: an attempt registering now finds no folder to put its mark in, so
        # nothing lands in the staging area while it is being removed.
        removing = self.staging.with_name(self.staging.name + "-removed")
        try:
            os.replace(self.staging, removing)
        except OSError:
            removing = self.staging
        shutil.rmtree(removing, ignore_errors=True)
        if (self.path / META_FILE).exists():
            return
        for shard in self._moved:
            shutil.rmtree(shard, ignore_errors=True)
        self._moved = []
        if self._created_root:
            try:
                self.path.rmdir()  # only if empty: never anything but what this job made
            except OSError:
                pass

    def _remote_failed(self) -> None:
        dest = self.remote
        try:
            dest.delete([f"{self.job}/{LIVE}/{LIVE}"])
        except Exception as exc:  # the tasks cannot be told: none can be waited for
            left = self._not_stopped(f"the live mark stays ({exc})")
        else:
            left = self._wait_stopped(lambda: dest.names(f"{self.job}/{RUNNING}"))
        if left:
            try:  # the staging prefix stays, named in the error of a new write, after the
                # tasks still running have ended (and removed their marks)
                dest.put_bytes(f"{self.job}/failed/failed", b"")
            except Exception:
                pass
        try:
            names = dest.names()
            if self.growth is not None:  # an append: only what this job put there
                keep = f"{self.job}/" if left else "\0"
                remove_remote_leftovers(dest, names, self.first)
                remove_objects(
                    dest,
                    [n for n in names if n.startswith(f"{self.job}/") and not n.startswith(keep)],
                )
            elif META_FILE not in names:
                # The destination held nothing: all under it is this job's. Its staging
                # prefix stays while some of its tasks may still be running.
                keep = f"{self.job}/" if left else None
                remove_objects(dest, [n for n in names if not (keep and n.startswith(keep))])
                dest.abort_uploads()
        except Exception:
            pass

    def _wait_stopped(self, running) -> list:
        """Wait until ``running()`` (the attempts marked running) is empty, at most
        STOP_WAIT seconds: those still running then (a warning names them), or []."""
        deadline = time.monotonic() + STOP_WAIT
        pause = 0.05
        while True:
            try:
                left = running()
            except Exception as exc:  # the marks cannot be listed: none can be waited for
                return self._not_stopped(f"its tasks' marks cannot be listed ({exc})")
            if not left:
                return []
            if time.monotonic() > deadline:
                break
            time.sleep(pause)
            pause = min(pause * 2, 1.0)
        return self._not_stopped(
            f"{len(left)} of its tasks had not stopped after {STOP_WAIT:g} s "
            f"({', '.join(map(str, left[:3]))})"
        )

    def _not_stopped(self, why: str) -> list:
        """Warn that the staging area is left in place (its tasks may still be writing:
        ``why``); the reason, as the attempts not known to have stopped."""
        if self.remote is None:
            where, how = self.path / self.job, "remove the destination"
        else:
            where, how = f"{self.path}/{self.job}", "write there with overwrite=True"
        warnings.warn(
            f"{self.path}: the write failed and {why}: its staging area {where} is left in "
            f"place; once its tasks have stopped (or their workers are gone), {how}",
            RuntimeWarning,
            stacklevel=4,
        )
        return [why]


def _read_ranges(shards, ranges, item_column):
    """Yield the Ray blocks of ``ranges`` (``(shard, start, stop)``, block-aligned)."""
    for s, start, stop in ranges:
        shard = shards[s]
        block_size = shard.metadata.block_size
        step = max(1, ROWS_PER_RAY_BLOCK // block_size) * block_size
        for first in range(start, stop, step):
            examples = shard.__getitems__(list(range(first, min(first + step, stop))))
            yield _examples_to_block(examples, item_column)
        shard.close()


def _examples_to_block(examples: list, item_column: str):
    rows = [example_to_row(example, item_column) for example in examples]
    names: dict = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    batch = {}
    for name in names:
        # Filled one by one: a list of arrays or lists must stay one object per row.
        column = np.empty(len(rows), dtype=object)
        for i, row in enumerate(rows):
            column[i] = row.get(name)
        batch[name] = column
    return BlockAccessor.batch_to_block(batch)


class AtlasDatasource(Datasource):
    """An Atlas dataset as a Ray Data source (see ``atlas_fast.ray.read_atlas``).

    ``dataset`` is a path, opened with ``atlas_fast.AtlasDataset`` (``trusted`` and
    ``allowed_globals`` as there), or an open ``AtlasDataset`` of either backend. Read tasks
    cover contiguous runs of whole blocks; each unpickles the shards it reads (readers pickle
    to their constructor arguments) and yields Ray blocks of whole Atlas blocks.
    """

    def __init__(
        self, dataset, *, item_column: str = "item", trusted: bool = True, allowed_globals=()
    ):
        super().__init__()
        if not isinstance(item_column, str) or not item_column:
            raise ValueError(f"item_column must be a non-empty string, not {item_column!r}")
        if not hasattr(dataset, "shards"):
            dataset = atlas.AtlasDataset(dataset, trusted=trusted, allowed_globals=allowed_globals)
        self.dataset = dataset
        self.item_column = item_column

    def get_name(self) -> str:
        return "Atlas"

    def estimate_inmemory_data_size(self) -> int:
        # The bytes stored: a lower bound for compressed datasets.
        return sum(
            (shard.root / DATA_FILE).stat().st_size for shard in self.dataset.shards if len(shard)
        )

    def get_read_tasks(self, parallelism, per_task_row_limit=None, data_context=None) -> list:
        shards = self.dataset.shards
        plan = plan_read_tasks(
            [len(s) for s in shards], [s.metadata.block_size for s in shards], parallelism
        )
        sizes = [(s.root / DATA_FILE).stat().st_size if len(s) else 0 for s in shards]
        tasks = []
        for ranges in plan:
            used = sorted({s for s, _, _ in ranges})
            local = {s: i for i, s in enumerate(used)}
            rows = sum(stop - start for _, start, stop in ranges)
            size = sum(
                math.ceil(sizes[s] * (stop - start) / len(shards[s])) for s, start, stop in ranges
            )
            read_fn = functools.partial(
                _read_ranges,
                [shards[s] for s in used],
                [(local[s], start, stop) for s, start, stop in ranges],
                self.item_column,
            )
            metadata = BlockMetadata(
                num_rows=rows,
                size_bytes=size,
                exec_stats=None,
                input_files=[str(shards[s].root) for s in used],
            )
            tasks.append(ReadTask(read_fn, metadata, per_task_row_limit=per_task_row_limit))
        return tasks
