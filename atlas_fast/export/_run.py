"""Running an export: the dataset cut into parts, written by the worker processes of
``convert`` (``convert._workers``, work stealing with ``convert._claims``), each part into
files of its own in a staging directory next to DST; the target's ``finish`` names them in
the dataset's order and writes its index, and the whole moves to DST at once (or is
uploaded, DST a URL).

The staging directory, ``.<DST name>.exporting-XXXX`` next to DST::

    work/<part>/     the files the worker that took part <part> wrote
    out/             what becomes DST: the files renamed in order, the target's index

Nothing at DST changes until the final rename (with ``overwrite``, an exchange of the two
directories where the system has one: Linux's ``renameat2(RENAME_EXCHANGE)``); a failed or
interrupted export removes the staging directory.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..convert._claims import Claims
from ..convert._progress import Emitter, Progress
from ..convert._run import _count, _ranges, _size, split_runs
from ..convert._workers import Serial, Workers

__all__ = ["TARGETS", "ExportSummary", "run_export", "target_module"]

# Target name -> module of this package with ``PartWriter(out, options)`` and
# ``finish(out, parts, options)``.
TARGETS = {
    "parquet": "_parquet",
    "jsonl": "_jsonl",
    "hf": "_hf",
    "webdataset": "_wds",
    "mds": "_mds",
}


def target_module(target: str):
    if target not in TARGETS:
        raise ValueError(f"unknown target format {target!r}; known: {', '.join(TARGETS)}")
    return importlib.import_module(f"{__package__}.{TARGETS[target]}")


@dataclass
class ExportSummary:
    """What an export did; ``str()`` is the one-line summary the command prints."""

    target: str
    dst: str
    examples: int = 0
    shards: int = 0  # of the source dataset
    files: list = None  # the names written under DST, in order
    pickled: int = 0  # examples stored pickled (``pickle=True``)
    bytes_out: int = 0
    seconds: float = 0.0

    def __str__(self) -> str:
        rate = self.examples / self.seconds if self.seconds > 0 else 0.0
        pickled = f", {_count(self.pickled, 'example')} pickled" if self.pickled else ""
        return (
            f"exported {_count(self.examples, 'example')} ({_count(self.shards, 'shard')}) to "
            f"{self.target} at {self.dst}: {_count(len(self.files or ()), 'file')}, "
            f"{_size(self.bytes_out)}, {self.seconds:.1f} s ({rate:,.0f} examples/s){pickled}"
        )


@dataclass(frozen=True)
class Part:
    """Examples ``start`` to ``stop`` of shard ``shard``; ``first`` is the dataset's index of
    the first. ``nbytes`` and ``examples`` are what ``Claims`` balances the runs on."""

    shard: int
    start: int
    stop: int
    first: int

    @property
    def examples(self) -> int:
        return self.stop - self.start

    @property
    def nbytes(self) -> int:
        return self.stop - self.start


# The module whose AtlasDataset reads the source: the facade's backend. (The tests set the
# pure-Python one's, atlas_fast._python, to export through each backend.)
READER_MODULE = "atlas_fast.atlas"


@dataclass(frozen=True)
class ExportJob:
    src: str
    reader_module: str  # READER_MODULE when the export started
    reader: dict  # AtlasDataset's keyword arguments
    parts: list
    ranges: tuple
    run: int
    work: str
    target: str
    options: dict


# A shard is cut into parts of at least this many examples (a part is a file or more).
MIN_PART = 1024


def plan_parts(sizes: list, workers: int) -> list:
    """Each shard's examples as one part, or, when there are few shards for the workers, as
    several (about ``2 * workers`` parts in all, of ``MIN_PART`` examples at least), so that
    every worker has some to take."""
    total = sum(sizes)
    most = max(MIN_PART, -(-total // (2 * workers))) if workers > 1 else max(sizes, default=1)
    most = max(most, 1)
    parts, first = [], 0
    for k, size in enumerate(sizes):
        pieces = max(1, -(-size // most))
        for p in range(pieces):
            start, stop = size * p // pieces, size * (p + 1) // pieces
            if stop > start:
                parts.append(Part(k, start, stop, first + start))
        first += size
    return parts


def _examples(ds, part: Part):
    shard = ds.shards[part.shard]
    if part.start == 0 and part.stop == len(shard):
        yield from shard
        return
    batch = 1024
    for start in range(part.start, part.stop, batch):
        yield from shard.__getitems__(range(start, min(start + batch, part.stop)))


def export_run(job: ExportJob, worker) -> list:
    """The task of a run: the parts it claims written; ``(part index, finish's result)``."""
    module = target_module(job.target)
    AtlasDataset = importlib.import_module(job.reader_module).AtlasDataset
    claims = Claims(job.parts, job.ranges, job.run, worker.table, worker.watch)
    if job.run == 0:
        claims.first_shard_settled()  # nothing to keep for a dictionary here
    progress = Emitter(worker.emit)
    results = []
    with AtlasDataset(job.src, **job.reader) as ds:
        while (i := claims.next()) is not None:
            part = job.parts[i]
            out = Path(job.work) / str(i)
            out.mkdir()
            writer = module.PartWriter(out, job.options)
            try:
                index = part.first
                for example in _examples(ds, part):
                    writer.add(example, _Where(job.src, part, index), index)
                    index += 1
                    progress.example()
                results.append((i, writer.close()))
            except BaseException:
                writer.abort()
                raise
    progress.flush(0)
    return results


class _Where:
    """Names example ``index`` of the dataset ``src`` for an error (made only then)."""

    __slots__ = ("index", "part", "src")

    def __init__(self, src, part, index):
        self.src, self.part, self.index = src, part, index

    def __call__(self) -> str:
        part = self.part
        offset = part.start + self.index - part.first
        return f"{self.src}: example {self.index} (shard {part.shard}, its example {offset})"


def _exchange(a: Path, b: Path) -> bool:
    """Swap the directories ``a`` and ``b`` at once (Linux: renameat2 RENAME_EXCHANGE);
    False where the system cannot."""
    import sys

    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    done = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    if done == 0:
        return True
    errno = ctypes.get_errno()
    if errno in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: not on this file system
        return False
    raise OSError(errno, os.strerror(errno), str(b))


def _check_destination(dst: Path, overwrite: bool) -> None:
    """Refuse a DST that is there (other than an empty directory) unless ``overwrite``."""
    import errno

    present = dst.exists() or dst.is_symlink()
    if present and not overwrite and not (dst.is_dir() and not any(dst.iterdir())):
        what = "a non-empty directory" if dst.is_dir() else "a file"
        raise FileExistsError(
            errno.EEXIST,
            f"{dst}: already exists ({what}); export writes into an absent or empty "
            "directory: pass overwrite=True (--overwrite) to replace it, or choose another path",
        )


def _move_in(out: Path, dst: Path, staging: Path, overwrite: bool) -> None:
    """``out`` becomes DST: renamed, or exchanged with what is there (``overwrite``), which is
    then removed."""
    _check_destination(dst, overwrite)
    if dst.is_dir() and not dst.is_symlink() and not any(dst.iterdir()):
        dst.rmdir()
    if not (dst.exists() or dst.is_symlink()):
        os.rename(out, dst)
        return
    if not _exchange(out, dst):  # the old one aside, then the new one in: DST briefly absent
        os.rename(dst, staging / "old")
        os.rename(out, dst)
        out = staging / "old"
    if out.is_dir() and not out.is_symlink():
        shutil.rmtree(out)
    else:
        out.unlink()


def _same_or_inside(a: Path, b: Path) -> bool:
    a, b = a.resolve(), b.resolve()
    return a == b or b in a.parents


def run_export(
    src,
    dst,
    target: str,
    *,
    workers: int,
    progress,
    overwrite: bool,
    options: dict,
    reader: dict,
    staging_dir=None,
) -> ExportSummary:
    """Export the dataset ``src`` to ``dst`` (see ``export``)."""
    from .._writing.upload import is_remote
    from ..storage import local_path

    module = target_module(target)
    if module.EXTRA is not None:  # the one-line error for a missing dependency, up front
        from .._extras import require

        require("pyarrow", module.EXTRA, f"exporting to {target}")
    started = time.monotonic()
    src_text = src if is_remote(src) else str(local_path(src))
    reader_module = READER_MODULE
    AtlasDataset = importlib.import_module(reader_module).AtlasDataset
    with AtlasDataset(src_text, **reader) as ds:
        sizes = [int(s) for s in ds.actual_shard_sizes]
    remote = None
    if is_remote(dst):
        from .._writing.upload import open_destination
        from ..storage import Location
        from ..storage._upload import Destination

        options_of_dst = reader.get("storage_options")
        if overwrite:  # what is there is deleted only once the export is ready to upload
            remote = Destination(Location(dst, options_of_dst))
        else:
            remote = open_destination(dst, options_of_dst, overwrite=False, who="export")
        if staging_dir is not None:
            Path(staging_dir).mkdir(parents=True, exist_ok=True)
        top = Path(tempfile.mkdtemp(prefix="atlas-fast-export-", dir=staging_dir))
        dst_text = remote.location.url
    else:
        if staging_dir is not None:
            raise ValueError(f"{dst}: staging_dir is for a URL DST")
        dst = Path(local_path(dst))
        if not is_remote(src_text) and (
            _same_or_inside(dst, Path(src_text)) or _same_or_inside(Path(src_text), dst)
        ):
            raise ValueError(
                f"{dst}: the destination is {src_text} or inside it, or holds it: export elsewhere"
            )
        _check_destination(dst, overwrite)
        dst.parent.mkdir(parents=True, exist_ok=True)
        top = Path(tempfile.mkdtemp(prefix=f".{dst.name}.exporting-", dir=dst.parent))
        dst_text = str(dst)
    options = {**options, "key_width": max(1, len(str(max(sum(sizes) - 1, 0))))}
    parts = plan_parts(sizes, workers)
    pool = Serial(workers)
    ok = False
    try:
        work, out = top / "work", top / "out"
        work.mkdir()
        out.mkdir()
        runs = split_runs(parts, workers) if parts else []
        if len(runs) > 1:
            pool = Workers(len(runs), workers)
        bar = Progress(progress, sum(sizes), f"exporting to {target}", unit="examples")
        try:
            tasks = [
                (
                    export_run,
                    ExportJob(
                        src_text,
                        reader_module,
                        reader,
                        parts,
                        _ranges(runs),
                        k,
                        str(work),
                        target,
                        options,
                    ),
                )
                for k in range(len(runs))
            ]
            results = pool.run(tasks, bar, _ranges(runs)) if tasks else []
        finally:
            bar.close()
        done = sorted(r for run in results for r in run)
        if [i for i, _ in done] != list(range(len(parts))):
            raise RuntimeError(f"export: parts written {[i for i, _ in done]}, {len(parts)} made")
        names = module.finish(out, [(work / str(i), result) for i, result in done], options)
        summary = ExportSummary(target, dst_text, sum(sizes), len(sizes), names)
        summary.pickled = sum(result.get("pickled", 0) for _, result in done)
        summary.bytes_out = sum((out / name).stat().st_size for name in names)
        if remote is not None:
            if overwrite:
                from .._writing.upload import remove_objects

                remove_objects(remote, remote.names())
            _upload(remote, out, names, module)
        else:
            _move_in(out, dst, top, overwrite)
        ok = True
    finally:
        pool.close(kill=not ok)
        shutil.rmtree(top, ignore_errors=True)
        if top.exists():
            warnings.warn(
                f"{top}: could not remove this staging directory of the export; remove it by hand",
                RuntimeWarning,
                stacklevel=3,
            )
    summary.seconds = time.monotonic() - started
    return summary


def _upload(dest, out: Path, names: list, module) -> None:
    """The files to DST in object storage, several at once; the target's index (its last
    name, for the targets that have one) after all others. A failure deletes what was put."""
    from concurrent.futures import ThreadPoolExecutor

    from .._writing.upload import UPLOAD_THREADS, remove_objects

    last = getattr(module, "INDEX_FILES", ())
    body = [n for n in names if n not in last]
    tail = [n for n in names if n in last]
    try:
        with ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="atlas-fast-upload") as pool:
            for future in [pool.submit(dest.put_file, n, out / n) for n in body]:
                future.result()
        for name in tail:
            dest.put_file(name, out / name)
    except BaseException:
        try:
            remove_objects(dest, dest.names())  # DST held nothing before: all is ours
            dest.abort_uploads()
        except Exception:
            pass
        raise
