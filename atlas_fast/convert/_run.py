"""Running a conversion: each source's parts written to shards by the worker processes, in
a staging directory (``_staging``), committed, verified if asked, and moved in to DST.

The pieces: ``_workers`` (the processes and how tasks reach them), ``_write`` (the task of
a run: the parts it claims, written into shards), ``_claims`` (which part a run writes next,
work stealing), ``_dictionary`` (the strategy-2 dictionary handed from run 0 to the others),
``_spill`` (shards filled before that dictionary is known), ``_verify`` (``verify=True``).
"""

from __future__ import annotations

import bisect
import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path

from .._writing.options import WriterOptions
from ._dictionary import DictionaryHandOver
from ._on_ray import write_with_ray
from ._progress import Progress
from ._source import Source, SourceError
from ._staging import Staging, check_destination
from ._verify import VerifyError, verify_source
from ._workers import Serial, Workers
from ._write import WriteJob, write_run

__all__ = ["ConvertSummary", "VerifyError", "WRITER_DEFAULTS", "run_conversion", "split_runs"]

# The writer options of a conversion and their defaults: WriterOptions' (workers, the
# writer's threads, is convert's own argument: processes).
WRITER_DEFAULTS = WriterOptions.defaults(exclude=("workers",))


@dataclass
class ConvertSummary:
    """What a conversion did; ``str()`` is the one-line summary the command prints."""

    fmt: str
    dst: Path
    examples: int = 0
    shards: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    verified: bool = False
    datasets: list = field(default_factory=list)  # (split or None, examples, shards)
    strategy: int | None = None  # the compression strategy asked
    strategies: list = field(default_factory=list)  # the one each dataset was written with
    appended: bool = False  # append=True: the shards were added to the dataset(s) at dst

    def __str__(self) -> str:
        rate = self.examples / self.seconds if self.seconds > 0 else 0.0
        splits = [s for s, _, _ in self.datasets if s is not None]
        where = f"{self.dst}" + (
            f" ({_count(len(splits), 'split')}: {', '.join(splits)})" if splits else ""
        )
        return (
            f"converted {_count(self.examples, 'example')} ({self.fmt}) into "
            f"{_count(self.shards, 'shard')}{self._strategy_text()} "
            f"{'appended to' if self.appended else 'at'} {where}: "
            f"{_size(self.bytes_in)} in, {_size(self.bytes_out)} out, "
            f"{self.seconds:.1f} s ({rate:,.0f} examples/s)"
            + (", verified" if self.verified else "")
        )

    def _strategy_text(self) -> str:
        """`` (strategy 2)``; the strategy written where it is not the one asked (strategy 2
        with too few examples to train its dictionary: as the writer, zstd without one)."""
        if self.strategy is None:
            return ""
        other = [
            (split, written)
            for (split, _, _), written in zip(self.datasets, self.strategies)
            if written != self.strategy
        ]
        if not other:
            return f" (strategy {self.strategy})"
        why = "too few examples to train a dictionary"
        if len(self.datasets) == 1:
            return f" (strategy {other[0][1]}, not the {self.strategy} asked: {why})"
        which = ", ".join(f"{written} for {split}" for split, written in other)
        return f" (strategy {self.strategy}; {which}: {why})"


def _count(n: int, noun: str) -> str:
    """``1 shard``, ``1,000 shards``."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""  # unreachable


def split_runs(parts: list, n: int) -> list:
    """Cut ``parts`` into at most ``n`` contiguous, non-empty runs of about equal bytes."""
    n = max(1, min(n, len(parts)))
    if n == 1:
        return [list(parts)]
    cumulative, total = [], 0
    for part in parts:
        total += max(part.nbytes, 1)
        cumulative.append(total)
    cuts = [0]
    for k in range(1, n):
        target = total * k / n
        i = bisect.bisect_left(cumulative, target)
        if i > 0 and target - cumulative[i - 1] < cumulative[i] - target:
            i -= 1
        cut = min(max(i + 1, cuts[-1] + 1), len(parts) - (n - k))
        cuts.append(cut)
    cuts.append(len(parts))
    return [list(parts[a:b]) for a, b in itertools.pairwise(cuts)]


def _check_sources(sources: list) -> None:
    if not sources:
        raise SourceError("the source holds no dataset")
    splits = [s.split for s in sources]
    if None in splits and len(splits) > 1:
        raise ValueError("a format gave several sources, not all of them with a split name")
    if len(set(splits)) != len(splits):
        raise ValueError(f"a format gave two sources of one split: {splits}")
    for split in splits:
        if split is not None and (not split or "/" in split or split in (".", "..")):
            raise SourceError(f"split {split!r}: not usable as a directory name")


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run_conversion(
    list_sources,
    dst,
    *,
    fmt: str,
    workers: int,
    verify: bool,
    progress,
    options: dict,
    ray: bool = False,
    storage_options: dict | None = None,
    overwrite: bool = False,
    staging_dir=None,
    staging_bytes=None,
    append: bool = False,
) -> ConvertSummary:
    """Convert the sources ``list_sources()`` returns into DST (see ``convert``)."""
    from .._writing.upload import is_remote
    from ..storage import local_path

    if append and ray:
        raise ValueError(
            f"{dst}: append=True does not run on Ray here: append a Ray Dataset with "
            "atlas_fast.ray.write_atlas(..., mode='append')"
        )
    if append and overwrite:
        raise ValueError(f"{dst}: append=True and overwrite=True: choose one")
    if is_remote(dst):
        from ._upload import RemoteDestination

        remote = RemoteDestination(
            dst, storage_options, overwrite, staging_dir, staging_bytes, append=append
        )
        try:
            return _run(
                list_sources,
                remote.local,
                remote,
                fmt,
                workers,
                verify,
                progress,
                options,
                ray,
                append,
            )
        finally:
            remote.remove()
    if storage_options is not None or overwrite or staging_dir is not None:
        raise ValueError(
            f"{dst}: storage_options, overwrite, staging_dir and staging_bytes are for a URL DST"
        )
    if staging_bytes is not None:
        raise ValueError(f"{dst}: staging_bytes is for a URL DST")
    dst = Path(local_path(dst))
    if not append:
        check_destination(dst)
    return _run(list_sources, dst, None, fmt, workers, verify, progress, options, ray, append)


def _run(list_sources, dst, remote, fmt, workers, verify, progress, options, ray, append=False):
    from .._format import read_dataset_metadata

    started = time.monotonic()
    pool = Serial(1 if ray else workers)
    staging = None
    streamed: list = []  # a conversion to a URL: the strategy each dataset was written with
    growths = None  # append=True: the datasets grown (``_append.Growths``)
    bytes_out = None
    ok = False
    try:
        sources = list_sources()
        _check_sources(sources)
        if append:  # every dataset opened and checked before anything is read or written
            from ._append import Growths

            splits = [source.split for source in sources]
            growths = Growths(dst, splits, options["compression_strategy"], remote)
            if remote is not None:
                remote.growths = growths
        # The worker processes start now, with the format's modules imported (pyarrow: a
        # fifth of a second in each), and no more of them than the parts to share.
        processes = min(pool.cores, max(len(source.parts) for source in sources))
        if processes > 1:
            pool = Workers(processes, pool.cores)
        staging = Staging(dst)
        summary = ConvertSummary(fmt, dst if remote is None else remote.url)
        for s, source in enumerate(sources):
            root = staging.out if source.split is None else staging.out / source.split
            label = dst if source.split is None else dst / source.split
            if remote is not None:
                label = remote.label(source.split)
            if ray and remote is not None and not verify:
                # The tasks upload (no data through here): write_atlas to the URL.
                examples, shards, written = write_with_ray(
                    source, remote.label(source.split), options, remote.storage_options
                )
                streamed.append(written)
            elif ray:
                examples, shards, _ = write_with_ray(source, root, options)
                if verify:
                    phase = _phase_name("verifying", source)
                    # [examples]: checked against the count verify_source makes
                    verify_source(
                        pool, source, [source.parts], [examples], root, label, phase, progress
                    )
            else:
                stream = None
                known = None
                source_options = options
                if growths is not None:
                    source_options = growths.options(source.split, options)
                    known = growths.dict_bytes(source.split)
                if remote is not None:  # each shard uploaded once named (see _stream)
                    work = staging.work(s)
                    stream = remote.stream(source, pool.gate, source_options, verify, work / "dict")
                examples, shards, written = _convert_source(
                    pool,
                    source,
                    staging.work(s),
                    root,
                    label,
                    verify,
                    progress,
                    source_options,
                    stream,
                    remote,
                    known,
                )
                streamed.append(written)
            summary.datasets.append((source.split, examples, shards))
        if growths is not None and remote is None:
            bytes_out = _tree_bytes(staging.out)
            for source in sources:
                out = staging.out if source.split is None else staging.out / source.split
                growths.commit_local(source.split, out, fmt)
        elif remote is None or (ray and verify):
            staging.move_in()
        if remote is not None:
            if ray and verify:
                remote.upload([split for split, _, _ in summary.datasets])
            elif not ray:
                remote.commit()
        ok = True
    finally:
        if not ok and remote is not None:
            pool.gate.fail()
        if not ok and growths is not None:
            growths.abandon()
        pool.close(kill=not ok)
        if staging is not None:
            staging.remove()
        if not ok and remote is not None:
            remote.fail()
    summary.strategy = int(options["compression_strategy"])
    if streamed:
        summary.strategies = streamed
    else:
        summary.strategies = [
            read_dataset_metadata(dst if split is None else dst / split).compression_strategy
            for split, _, _ in summary.datasets
        ]
    summary.examples = sum(e for _, e, _ in summary.datasets)
    summary.shards = sum(n for _, _, n in summary.datasets)
    summary.bytes_in = sum(p.nbytes for source in sources for p in source.parts)
    if bytes_out is None:
        bytes_out = _tree_bytes(dst) if remote is None else remote.stored_bytes(ray, verify)
    summary.bytes_out = bytes_out
    summary.verified = bool(verify)
    summary.appended = bool(append)
    summary.seconds = time.monotonic() - started
    return summary


def _convert_source(
    pool, source, work, root, label, verify, progress, options, stream=None, remote=None, known=None
):
    """Write ``source`` with the pool's workers (into ``work``), commit it at ``root`` and
    verify it if asked, or (``stream``, a ``_stream.ShardStream``: a URL DST) upload its
    shards as they come and store all of it but the root meta.json; returns (examples,
    shards, the compression strategy written). ``known``: the strategy-2 dictionary of the
    dataset appended to (see ``_write_stealing``)."""
    from .._format import CompressionStrategy
    from .._writing.commit import commit_staged_shards

    parts = list(source.parts)
    runs = split_runs(parts, len(pool.processes) + 1)
    strategy = CompressionStrategy(options["compression_strategy"])
    bar = Progress(progress, sum(p.nbytes for p in parts), _phase_name("converting", source))
    try:
        results, shared = _write_stealing(pool, parts, runs, work, options, bar, stream, known)
    except BaseException:
        if stream is not None:
            stream.close()  # its verification stops
        raise
    finally:
        bar.close()
    # Groups of consecutive parts, from whichever run wrote them, in the order of the parts.
    groups = sorted(g for run_groups, _ in results for g in run_groups)
    staged = [d for _, dirs in groups for d in dirs]
    written = dict(c for _, part_counts in results for c in part_counts)
    if sorted(written) != list(range(len(parts))):  # every part exactly once
        raise RuntimeError(f"parts written: {sorted(written)}, expected {len(parts)} of them")
    counts = [written[i] for i in range(len(parts))]
    if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION and shared is None:
        strategy = CompressionStrategy.STANDARD_COMPRESSION
    examples = sum(counts)
    if stream is not None:
        sizes = stream.finish()  # verified too, if asked
        if len(sizes) != len(staged) or sum(sizes) != examples:
            raise RuntimeError(
                f"convert: {len(sizes)} shards of {sum(sizes)} examples named, {len(staged)} "
                f"of {examples} written"
            )
        remote.seal(stream, sizes, strategy, shared)
        return examples, len(staged), int(strategy)
    commit_staged_shards(root, staged, compression_strategy=strategy, shared_dict=shared)
    if verify:
        phase = _phase_name("verifying", source)
        verify_source(pool, source, runs, counts, root, label, phase, progress)
    return examples, len(staged), int(strategy)


def _ranges(runs: list) -> tuple:
    """The ``(start, stop)`` part indices of each of ``runs``."""
    ranges, start = [], 0
    for run in runs:
        ranges.append((start, start + len(run)))
        start += len(run)
    return tuple(ranges)


def _threads(pool, runs: int) -> int:
    # ``workers`` is cores in total: one process per run, whose shard writers compress on its
    # share of them (one thread each when every process has a run; all of them for a source
    # of one part). The output does not depend on it (the writers' files are byte-identical
    # whatever their threads), only the time does.
    return max(1, pool.cores // runs)


def _write_stealing(pool, parts, runs, work, options, bar, stream=None, known=None):
    """Every run starts at once (work stealing, spill files, the dictionary handed over by
    files); returns (the runs' results, the shared dictionary or None). ``known``: the
    strategy-2 dictionary of the dataset appended to, used by every run (none trained)."""
    from .._format import CompressionStrategy

    dict_dir = work / "dict"
    dict_dir.mkdir(parents=True)
    if known is not None:
        DictionaryHandOver(dict_dir).publish(known)
    ranges = _ranges(runs)
    threads = _threads(pool, len(runs))
    strategy = CompressionStrategy(options["compression_strategy"])
    spill_dir = None
    shared = strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
    if len(runs) > 1 and shared and known is None:
        spill_dir = pool.spill_dir(work.name)
    tasks = [
        (
            write_run,
            WriteJob(
                parts,
                ranges,
                k,
                str(work / str(k)),
                str(dict_dir),
                options,
                threads,
                spill_dir,
                stream is not None,
                known is not None,
            ),
        )
        for k in range(len(runs))
    ]
    results = pool.run(tasks, bar, ranges, None if stream is None else stream.on_event)
    shared = DictionaryHandOver(dict_dir).published()
    return results, (None if shared is ... else shared)


def _phase_name(what: str, source: Source) -> str:
    return what if source.split is None else f"{what} {source.split}"
