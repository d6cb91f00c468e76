"""Running a conversion: parts written to shards in staging, committed, verified, moved in.

Layout of the staging directory, ``.<DST name>.converting-XXXX`` next to DST::

    work/<source>/<run>/<n>/     shards written by the worker of that run of parts
    work/<source>/dict/          strategy 2: the shared dictionary, published by run 0
    out/[<split>/]               the committed dataset(s), renamed to DST at the very end

Nothing at DST changes until that final rename, and until then no root meta.json exists
outside the staging directory: a failed, interrupted or mismatching (``verify``) conversion
removes the staging directory and leaves DST as it was.
"""

from __future__ import annotations

import array
import bisect
import contextlib
import itertools
import os
import pickle
import queue
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from .._format import DICT_FILE as _DICT_FILE
from .._writing.options import WriterOptions
from ._compare import difference
from ._source import Source, SourceError

__all__ = ["ConvertSummary", "VerifyError", "WRITER_DEFAULTS", "run_conversion", "split_runs"]

# The writer options of a conversion and their defaults: WriterOptions' (workers, the
# writer's threads, is convert's own argument: processes).
WRITER_DEFAULTS = WriterOptions.defaults(exclude=("workers",))

_NO_DICT = "none"
_PROGRESS_EVERY = 0.1  # seconds between progress messages of a worker


class VerifyError(ValueError):
    """A converted example differs from the source's (``verify=True``)."""


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

    def __str__(self) -> str:
        rate = self.examples / self.seconds if self.seconds > 0 else 0.0
        splits = [s for s, _, _ in self.datasets if s is not None]
        where = f"{self.dst}" + (
            f" ({_count(len(splits), 'split')}: {', '.join(splits)})" if splits else ""
        )
        return (
            f"converted {_count(self.examples, 'example')} ({self.fmt}) into "
            f"{_count(self.shards, 'shard')}{self._strategy_text()} at {where}: "
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


# -- the work of one run (in the calling process or a worker process) ----------------------


@dataclass(frozen=True)
class WriteJob:
    parts: list  # every part of the source
    ranges: tuple  # (start, stop) of the parts each run starts with (see _Claims)
    run: int  # this run's number: 0 starts the source (with strategy 2 it trains the dictionary)
    run_dir: str
    dict_dir: str
    options: dict
    # The shard writers' compression threads (their ``workers=``): the conversion's cores
    # shared out among its runs, so that it uses ``workers`` cores in total (see
    # ``_convert_source``): 1 whenever there is more than one run.
    threads: int = 1
    # Strategy 2 with several runs: where runs > 0 write the pickled blocks of the shards
    # they fill before the dictionary is published (see _SpilledShard); None: not needed.
    spill_dir: str | None = None

    @property
    def first(self) -> bool:
        return self.run == 0


# The claim table of the worker processes (a shared array, see _Claims.layout) in each
# process, set by the pool; None: one process, nobody to share parts with.
_SHARED_CLAIMS = None
# Who may have died holding the claim table's lock: a callable giving what went wrong, or None
# (set by the pool in the parent; a child checks that its parent lives).
_CLAIMS_WATCH = None


class _Claims:
    """Which part a run writes next: its own parts in order while it has some left; then it
    steals from the run with the most bytes left the back half of what that run has not
    claimed (at least its last part), which becomes its own range (work stealing), so a run
    that starts late or has more to do (run 0 trains the strategy-2 dictionary) is helped by
    the others, down to the last part. Each run takes its own parts from the front and
    thieves take from the back, so every run's range stays contiguous and what a run steals
    is consecutive parts (written into the same shards); the order of the dataset is the
    order of the parts whoever writes them (see ``write_run``).

    And which spilled shard a run compresses next (strategy 2): the shards runs > 0 fill
    before the dictionary is published are written uncompressed to spill files, for
    whichever run is free once it is (``next_spilled``)."""

    # The slot after the part ranges: the last part of run 0's range that run 0 may still
    # need for its first shard, from which it trains the strategy-2 dictionary; the others
    # do not take parts up to it. Starts at _KEEP_ALL; -1 once that shard is closed.
    _KEEP_ALL = 1 << 62

    @staticmethod
    def layout(ranges) -> list:
        """A new table: the ``[start, stop)`` of each run's unclaimed parts, the keep slot,
        then each run's ``[first, end)`` spilled shards not yet taken (shard numbers)."""
        return [x for r in ranges for x in r] + [_Claims._KEEP_ALL] + [0, 0] * len(ranges)

    def __init__(self, job: WriteJob):
        self.run = job.run
        self.runs = len(job.ranges)
        self.sizes = [max(p.nbytes, 1) for p in job.parts]
        self.counts = [getattr(p, "examples", None) for p in job.parts]
        self._before = list(itertools.accumulate(self.sizes, initial=0))  # bytes before part i
        shared = _SHARED_CLAIMS
        if shared is None or self.runs == 1:
            self.table, self.lock = _Claims.layout(job.ranges), None
        else:
            self.table, self.lock = shared, shared.get_lock()

    def _bytes(self, start: int, stop: int) -> int:
        return self._before[stop] - self._before[start] if stop > start else 0

    def keep_for_first_shard(self, examples_per_byte: float, missing: int) -> None:
        """Run 0, before its first shard is closed: keep its next parts that may still hold
        the ``missing`` examples that shard lacks after the parts it has claimed (a part's
        own count when the source gives it, else an estimate from what it has read with a
        margin of two), so that the shard holds what a serial run's first shard holds while
        the others still take the rest of run 0's range (``missing`` <= 0: nothing to keep)."""
        with self._locked():
            table = self.table
            until = -1
            if missing > 0:
                need, k = missing, table[0]
                while k < table[1] and need > 0:
                    if self.counts[k] is not None:
                        need -= self.counts[k]
                    elif examples_per_byte > 0:
                        need -= self.sizes[k] * examples_per_byte / 2
                    else:  # nothing read yet to estimate from: keep them all
                        k = table[1]
                        break
                    k += 1
                until = k - 1
            table[2 * self.runs] = until

    def first_shard_settled(self) -> None:
        """Run 0's first shard holds its last example (it is being closed, the dictionary
        not trained yet): the others may take from all of run 0's range."""
        self.keep_for_first_shard(0.0, 0)

    def next(self):
        """The index of the next part to write, or None when none is left."""
        with self._locked():
            return self._next()

    def spilled(self, number: int) -> None:
        """This run's shard ``number`` is spilled: the one after its last spilled one, or,
        when none is left to take, any later one (the shards between are not spilled)."""
        with self._locked():
            slot = 2 * self.runs + 2 * self.run + 1
            if self.table[slot] == self.table[slot + 1]:
                self.table[slot] = number
            self.table[slot + 1] = number + 1

    def next_spilled(self):
        """``(run, shard number)`` of a spilled shard to compress (this run's own first),
        taken off the table; None when there is none."""
        with self._locked():
            base = 2 * self.runs + 1
            for j in [self.run, *(j for j in range(self.runs) if j != self.run)]:
                first, end = self.table[base + 2 * j], self.table[base + 2 * j + 1]
                if first < end:
                    self.table[base + 2 * j] = first + 1
                    return j, first
            return None

    @contextlib.contextmanager
    def _locked(self):
        """The table's lock, shared by the processes: a process killed while holding it (by
        the OOM killer, say) would leave the others waiting forever, so waiting checks, every
        second, that nobody died."""
        if self.lock is None:
            yield
            return
        while not self.lock.acquire(timeout=1.0):
            watch = _CLAIMS_WATCH
            problem = watch() if watch is not None else None
            if problem:
                raise RuntimeError(f"convert: {problem}")
        try:
            yield
        finally:
            self.lock.release()

    def _next(self):
        table, k = self.table, self.run
        start, stop = table[2 * k], table[2 * k + 1]
        if start < stop:
            table[2 * k] = start + 1
            return start
        kept = table[2 * self.runs]
        victim, most, low = None, 0, 0
        for j in range(self.runs):
            # Part 0 is run 0's, whenever it gets to it: the source's first shard, from which
            # run 0 trains the strategy-2 dictionary, starts there; nor is what run 0 may
            # still need for that shard taken.
            first, end = max(table[2 * j], 1, kept + 1 if j == 0 else 0), table[2 * j + 1]
            left = self._bytes(first, end)
            if left > most:
                victim, most, low = j, left, first
        if victim is None:
            return None
        end = table[2 * victim + 1]
        cut = end - 1  # the back half, or the last part
        while cut > low and self._bytes(cut - 1, end) <= most / 2:
            cut -= 1
        table[2 * victim + 1] = cut
        table[2 * k], table[2 * k + 1] = cut + 1, end
        return cut


@dataclass(frozen=True)
class VerifyJob:
    dataset: str
    label: str  # what errors call the dataset (DST, not the staging path)
    start: int  # index of this run's first example in the dataset
    parts: list


class _Emitter:
    """Batches progress for ``emit(examples, nbytes)`` to at most one call per 0.1 s."""

    def __init__(self, emit):
        self.emit, self.examples, self.last = emit, 0, time.monotonic()

    def example(self) -> None:
        self.examples += 1
        if not self.examples & 63 and time.monotonic() - self.last > _PROGRESS_EVERY:
            self.flush(0)

    def flush(self, nbytes: int) -> None:
        self.emit(self.examples, nbytes)
        self.examples, self.last = 0, time.monotonic()


def _shared_dict(dict_dir: Path):
    """The published strategy-2 dictionary (bytes), None when run 0 fell back to strategy 1,
    or ``...`` while not published yet."""
    path = dict_dir / _DICT_FILE
    if path.exists():
        return path.read_bytes()
    if (dict_dir / _NO_DICT).exists():
        return None
    return ...


def _publish(dict_dir: Path, data) -> None:
    if data is None:
        (dict_dir / _NO_DICT).touch()
        return
    tmp = dict_dir / f".{_DICT_FILE}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, dict_dir / _DICT_FILE)


def _await_dict(dict_dir: Path):
    """The strategy-2 dictionary run 0 publishes (a ``ZstdCompressionDict``, or None when it
    fell back to strategy 1), once it is published."""
    import zstandard

    parent = os.getppid()
    while (data := _shared_dict(dict_dir)) is ...:
        if os.getppid() != parent:  # the converting process is gone
            raise SystemExit(1)
        time.sleep(0.005)
    return None if data is None else zstandard.ZstdCompressionDict(data)


def _writer_classes():
    from ..writer import AtlasDatasetShardWriter, train_dictionary

    class AwaitingDictShardWriter(AtlasDatasetShardWriter):
        """A strategy-3 shard whose dictionary is not trained but awaited: the one run 0
        publishes from the source's first shard (the rule of ``AtlasDatasetWriter``)."""

        dict_dir: Path

        def __init__(self, *args, **kwargs):
            super().__init__(*args, dictionary_source=self._awaited, **kwargs)

        def _awaited(self, blocks):
            return _await_dict(self.dict_dir)

    class PublishingShardWriter(AtlasDatasetShardWriter):
        """Run 0's first shard under strategy 2: it publishes the dictionary it trains as
        soon as it is trained, so that the others compress with it while this shard still
        compresses its own blocks (None, strategy 1, when it cannot be trained)."""

        dict_dir: Path

        def __init__(self, *args, **kwargs):
            super().__init__(*args, dictionary_source=self._trained, **kwargs)

        def _trained(self, blocks):
            zdict = train_dictionary(
                blocks,
                compression_dict_size=self.metadata.compression_dict_size,
                compression_level=self.metadata.compression_level,
                shard=self.path,
            )
            _publish(self.dict_dir, None if zdict is None else zdict.as_bytes())
            return zdict

    return AtlasDatasetShardWriter, AwaitingDictShardWriter, PublishingShardWriter


# A run > 0 spills at most this many bytes of pickled blocks while it waits for the
# strategy-2 dictionary; then it waits without reading on.
SPILL_LIMIT = 1 << 30
_SPILL_FOOTER = struct.Struct("<QQ")  # blocks, examples


class _SpilledShard:
    """A shard a run > 0 fills before the strategy-2 dictionary is published: its blocks,
    pickled as its writer pickles them, go to a spill file (then their lengths and a footer)
    instead of waiting in this process's memory, so that whichever run is free once the
    dictionary is there compresses them into the shard (``_compress_spilled``)."""

    def __init__(self, spill: Path, shard: Path, number: int, block_size: int):
        self.spill, self.shard, self.number, self.block_size = spill, shard, number, block_size
        self.file = open(spill, "wb")
        self.lengths = array.array("Q")
        self.examples: list = []  # of the block being filled
        self.stored_examples = 0
        self.nbytes = 0

    def add_example(self, example) -> None:
        self.examples.append(example)
        self.stored_examples += 1
        if len(self.examples) == self.block_size:
            self._flush()

    def _flush(self) -> None:
        from ..writer import pickle_block

        block = pickle_block(self.examples, shard=self.shard, number=len(self.lengths))
        self.examples = []
        self._write(block)
        self.lengths.append(len(block))
        self.nbytes += len(block)

    def _write(self, data: bytes) -> None:
        try:
            self.file.write(data)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"{self.spill}: cannot spill the blocks read while the strategy-2 dictionary "
                f"is trained ({exc.strerror or exc}; TMPDIR chooses where they go)",
            ) from exc

    def close(self) -> None:
        if self.examples:
            self._flush()
        self._write(self.lengths.tobytes())
        self._write(_SPILL_FOOTER.pack(len(self.lengths), self.stored_examples))
        self.file.close()


def _compress_spilled(spill: Path, shard: Path, make_writer) -> None:
    """Write the shard a run spilled (``_SpilledShard``) with ``make_writer(shard)``'s
    writer (the shared dictionary known), then remove the spill file."""
    with open(spill, "rb") as f:
        f.seek(-_SPILL_FOOTER.size, os.SEEK_END)
        blocks, examples = _SPILL_FOOTER.unpack(f.read(_SPILL_FOOTER.size))
        lengths = array.array("Q")
        f.seek(-_SPILL_FOOTER.size - 8 * blocks, os.SEEK_END)
        lengths.frombytes(f.read(8 * blocks))
        f.seek(0)
        w = make_writer(shard)
        try:
            left = examples
            for length in lengths:
                count = min(left, w.metadata.block_size)
                w.add_pickled_block(f.read(length), count)
                left -= count
            w.close()
        except BaseException:
            w.abort()
            raise
    spill.unlink()


def write_run(job: WriteJob, emit) -> tuple:
    """Write the parts this run claims (``_Claims``) into shards ``run_dir/0, 1, ...`` of
    ``shard_size`` examples. Consecutive parts share shards; a part that does not follow the
    one before (a stolen range) starts a new group of shards. Returns (groups, counts):
    groups ``(first part index, shard dirs)`` whose parts are consecutive from that index,
    and ``(part index, examples)`` for every part written.

    Strategy 2: run 0 trains the dictionary from its first shard (``PublishingShardWriter``);
    until it is published, the others read on: the blocks of their own parts (their share)
    wait in memory for them to compress (``AwaitingDictShardWriter``), those of parts taken
    from other runs go to spill files (``_SpilledShard``) that any run compresses once it
    knows the dictionary, before it claims another part. Every shard holds the examples it
    would hold had its run written it at once, and the same bytes."""
    import zstandard

    from .._format import META_FILE, CompressionStrategy, dump_meta

    opts = job.options
    run_dir, dict_dir = Path(job.run_dir), Path(job.dict_dir)
    shard_writer, awaiting_writer, publishing_writer = _writer_classes()
    strategy = CompressionStrategy(opts["compression_strategy"])
    shared = strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
    zdict = None  # the shared dictionary, once known
    known = not shared  # whether zdict is settled (strategy 2)
    shard_dirs: list = []
    groups: list = []  # (first part index, shard dirs of the group)
    counts: list = []
    writer = None
    spilled = 0  # bytes this run has spilled

    def learn_dict(wait: bool) -> None:
        """A run > 0: the published dictionary, once it is (``wait``: waits for it)."""
        nonlocal zdict, known
        data = _shared_dict(dict_dir)
        if data is ... and wait:
            data = _await_dict(dict_dir)
            data = None if data is None else data.as_bytes()
        if data is not ...:
            zdict = None if data is None else zstandard.ZstdCompressionDict(data)
            known = True

    def make_writer(path, cls=None, chosen=None):
        if chosen is None:
            chosen = strategy
            if shared and zdict is None:
                chosen = CompressionStrategy.STANDARD_COMPRESSION
        w = (cls or shard_writer)(
            path,
            opts["block_size"],
            compression_strategy=chosen,
            compression_level=opts["compression_level"],
            compression_dict=zdict,
            compression_dict_size=opts["compression_dict_size"],
            checksums=opts["checksums"],
            workers=job.threads,
        )
        w.dict_dir = dict_dir
        return w

    def open_shard():
        path = run_dir / str(len(shard_dirs))
        shard_dirs.append(str(path))
        groups[-1][1].append(str(path))
        if not known and not job.first:
            learn_dict(False)
        if known or job.first:
            if not known:  # run 0's first shard: strategy 3, publishing its dictionary
                return make_writer(
                    path, publishing_writer, CompressionStrategy.DICTIONARY_COMPRESSION
                )
            return make_writer(path)
        own = job.ranges[job.run]
        if job.spill_dir is None or own[0] <= groups[-1][0] < own[1]:
            # Its own parts (its share): their blocks wait in memory, for this run to
            # compress once the dictionary is published.
            return make_writer(path, awaiting_writer, CompressionStrategy.DICTIONARY_COMPRESSION)
        # Parts taken from another run beyond its share: spilled, for whoever is free.
        number = len(shard_dirs) - 1
        spill = Path(job.spill_dir) / f"{job.run}-{number}"
        return _SpilledShard(spill, path, number, opts["block_size"])

    deferred: list = []  # closed shards awaiting the dictionary in this run's memory

    def close_shard(w):
        nonlocal known, spilled
        if isinstance(w, _SpilledShard):
            w.close()
            spilled += w.nbytes
            claims.spilled(w.number)
        elif isinstance(w, awaiting_writer):
            deferred.append(w)  # compressed once the dictionary is published
        elif job.first and not known:  # the first shard: it trains the dictionary
            # Its examples are the dictionary's sample: with them settled the others may
            # take any part of run 0's range, while it trains.
            claims.first_shard_settled()
            settle(w)
            known = True
        else:
            w.close()

    def settle(w):
        """Close a strategy-3 shard whose dictionary is the shared one (run 0's first shard
        publishes it as soon as it is trained: ``PublishingShardWriter``; the others await
        it: ``AwaitingDictShardWriter``): the dictionary leaves the shard, which becomes
        strategy 2."""
        nonlocal zdict
        w.close()
        data = None
        if w.metadata.compression_strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            own = w.path / _DICT_FILE
            data = own.read_bytes()
            own.unlink()
            w.metadata = w.metadata._replace(
                compression_strategy=int(CompressionStrategy.SHARED_DICTIONARY_COMPRESSION)
            )
            dump_meta(w.path / META_FILE, w.metadata._asdict())
        zdict = None if data is None else zstandard.ZstdCompressionDict(data)

    def compress_spilled() -> bool:
        """Compress a spilled shard, if there is one to take (the dictionary known)."""
        taken = claims.next_spilled()
        if taken is None:
            return False
        k, number = taken
        spill = Path(job.spill_dir) / f"{k}-{number}"
        _compress_spilled(spill, run_dir.parent / str(k) / str(number), make_writer)
        return True

    def first_shard_open():
        return not shard_dirs or (len(shard_dirs) == 1 and writer is not None)

    def read_rate():
        """Examples per input byte of the parts read so far (0.0: none read)."""
        read = sum(job.parts[i].nbytes for i, _ in counts)
        return sum(n for _, n in counts) / read if read else 0.0

    progress = _Emitter(emit)
    shard_size = opts["shard_size"]
    claims = _Claims(job)
    if job.first and known:
        claims.first_shard_settled()  # no dictionary to train: nothing to guard
    previous = None
    while True:
        if not known and not job.first:
            learn_dict(spilled >= SPILL_LIMIT)
        if known and deferred:
            for w in deferred:  # what only this run can compress, first
                settle(w)
            deferred.clear()
            continue
        if known and job.spill_dir is not None and compress_spilled():
            continue
        index = claims.next()
        if index is None:
            if writer is not None:
                close_shard(writer)
                writer = None
                continue  # a spilled shard to compress, maybe
            if not known and not job.first:
                learn_dict(True)  # nothing left to read: the spilled shards are left
                continue
            break
        if previous is None or index != previous + 1:
            if writer is not None:  # the group before ends with a short shard
                close_shard(writer)
                writer = None
            groups.append((index, []))
        previous = index
        part = job.parts[index]
        if job.first and not known and part.examples is not None and first_shard_open():
            # The source says how many examples this part holds: the others need not wait
            # for its end to know which of the next parts the first shard may yet need.
            done = 0 if writer is None else writer.stored_examples
            claims.keep_for_first_shard(read_rate(), shard_size - done - part.examples)
        count = 0
        for example in part.read():
            if writer is None:
                writer = open_shard()
            writer.add_example(example)
            count += 1
            progress.example()
            if writer.stored_examples == shard_size:
                close_shard(writer)
                writer = None
        counts.append((index, count))
        progress.flush(part.nbytes)
        if job.first and not known and writer is not None and len(shard_dirs) == 1:
            # Still in the first shard: tell the others which parts it may yet need.
            claims.keep_for_first_shard(read_rate(), shard_size - writer.stored_examples)
    if job.first and not known:  # no example at all in run 0
        _publish(dict_dir, None)
    if job.first:
        claims.first_shard_settled()  # nothing of its range is left to keep
    return groups, counts


def verify_run(job: VerifyJob, emit) -> int:
    """Read the dataset's examples from ``job.start`` on and compare each with the source
    re-read; returns the number compared. A difference raises ``VerifyError``."""
    from .. import atlas

    progress = _Emitter(emit)
    with atlas.AtlasDataset(job.dataset) as ds:
        total = len(ds)
        index = job.start
        for part in job.parts:
            for number, expected in enumerate(part.read()):
                where = f"{job.label}: example {index} (example {number} of part {part.label})"
                if index >= total:
                    raise VerifyError(f"{where}: missing, the dataset holds {total} examples")
                found = difference(expected, ds[index])
                if found is not None:
                    raise VerifyError(f"{where} differs from the source: {found}")
                index += 1
                progress.example()
            progress.flush(part.nbytes)
    return index - job.start


# -- Ray Data ----------------------------------------------------------------------------


def _part_rows(parts: list, row: dict) -> list:
    """The Ray Data rows of one part (a Ray task reads one part)."""
    from ..ray import example_to_row

    return [example_to_row(example) for example in parts[row["part"]].read()]


def write_with_ray(source: Source, root: Path, options: dict) -> tuple:
    """Write ``source`` at ``root`` through ``atlas_fast.ray.write_atlas``: a Ray Dataset of
    one block per part, each read by a task, in part order. Returns (examples, shards)."""
    from functools import partial

    from ..ray import write_atlas

    if options["checksums"]:
        raise ValueError("checksums are not written on Ray (atlas_fast.ray.write_atlas)")
    import ray.data

    parts = list(source.parts)
    if not parts:
        raise SourceError("the source has no parts to read")
    dataset = ray.data.from_items(
        [{"part": i} for i in range(len(parts))], override_num_blocks=len(parts)
    ).flat_map(partial(_part_rows, parts))
    # A part's SourceError reaches the caller wrapped in Ray's task error, its text kept.
    metadata = write_atlas(
        dataset,
        root,
        shard_size=options["shard_size"],
        block_size=options["block_size"],
        compression_strategy=options["compression_strategy"],
        compression_level=options["compression_level"],
        compression_dict_size=options["compression_dict_size"],
    )
    return sum(metadata.shard_sizes), len(metadata.shard_sizes)


# -- worker processes --------------------------------------------------------------------


def _portable(exc: BaseException, k: int) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError carrying its traceback."""
    if isinstance(exc, (SourceError, VerifyError)):
        return exc
    try:
        pickle.loads(pickle.dumps(exc))
        if isinstance(exc, (OSError, ValueError, AssertionError)):
            return exc
    except Exception:
        pass
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return RuntimeError(f"worker process {k} failed: {type(exc).__name__}: {exc}\n{text}")


def _child(k: int, inbox, results, claims) -> None:
    """A worker process: runs ``(function, job)`` tasks until it gets None."""
    global _SHARED_CLAIMS, _CLAIMS_WATCH
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt does
    _SHARED_CLAIMS = claims
    parent = os.getppid()
    _CLAIMS_WATCH = lambda: None if os.getppid() == parent else "the parent process died"  # noqa: E731

    def emit(examples, nbytes):
        results.put(("progress", k, (examples, nbytes)))

    while (task := inbox.get()) is not None:
        function, job = task
        try:
            results.put(("done", k, function(job, emit)))
        except BaseException as exc:
            results.put(("error", k, _portable(exc, k)))


def _start_method() -> str:
    """ "fork" where it is safe and available: Linux, and no other thread in this process (a
    forked child inherits no thread, so a lock another thread held would stay held); it
    starts a worker in milliseconds with every module already imported, where "spawn"
    starts a new interpreter that imports atlas_fast, zstandard and the format's readers
    (a few tenths of a second of a conversion that may last one second).
    ``ATLAS_FAST_CONVERT_START`` (fork, spawn or forkserver) overrides the choice."""
    import multiprocessing

    chosen = os.environ.get("ATLAS_FAST_CONVERT_START", "").strip()
    methods = multiprocessing.get_all_start_methods()
    if chosen:
        if chosen not in methods:
            raise ValueError(
                f"ATLAS_FAST_CONVERT_START={chosen!r}: not a start method here "
                f"({', '.join(methods)})"
            )
        return chosen
    if sys.platform == "linux" and "fork" in methods and threading.active_count() == 1:
        return "fork"
    return "spawn"


class _Workers:
    """``n - 1`` worker processes; the calling process is worker 0. ``cores``: the cores the
    conversion uses in total (``workers``), shared out among its runs (``_convert_source``)."""

    def __init__(self, n: int, cores: int):
        import multiprocessing

        self.cores = cores
        self._spill_root = None

        ctx = multiprocessing.get_context(_start_method())
        self.results = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(n - 1)]
        self.claims = ctx.Array("q", len(_Claims.layout([(0, 0)] * n)))  # see _Claims
        self.processes = [
            ctx.Process(
                target=_child,
                args=(k, inbox, self.results, self.claims),
                name=f"atlas-fast-convert-{k}",
                daemon=True,
            )
            for k, inbox in enumerate(self.inboxes, 1)
        ]
        # Workers only write and compare examples: they start without torch (see _compat).
        saved = os.environ.get("ATLAS_FAST_NO_TORCH")
        os.environ["ATLAS_FAST_NO_TORCH"] = "1"
        # A forked child shares this process's memory until it writes to it; its garbage
        # collector would touch every object the parent holds (copying their pages), so they
        # are moved out of its reach first (gc.freeze), and given back to ours after.
        import gc

        # An application's own freeze (before its DataLoader workers, say) is left alone.
        frozen = ctx.get_start_method() == "fork" and gc.get_freeze_count() == 0
        if frozen:
            gc.freeze()
        try:
            with warnings.catch_warnings():
                # Python 3.12+ warns on any fork of a process with native threads (numpy's
                # BLAS and pyarrow's pools are started on import or first use). Those pools
                # re-create themselves in a forked child, and the workers take no lock of
                # ours that another thread could hold: _start_method forks only when no
                # other Python thread runs.
                warnings.simplefilter("ignore", DeprecationWarning)
                for p in self.processes:
                    p.start()
        finally:
            if frozen:
                gc.unfreeze()
            if saved is None:
                del os.environ["ATLAS_FAST_NO_TORCH"]
            else:
                os.environ["ATLAS_FAST_NO_TORCH"] = saved

    def run(self, tasks: list, on_progress, claims=()) -> list:
        """Run ``tasks[k]`` (``(function, job)`` or None) on worker k; their results.
        ``claims``: the ``(start, stop)`` ranges of parts each run starts with."""
        global _SHARED_CLAIMS, _CLAIMS_WATCH
        table = _Claims.layout(claims)
        self.claims[: len(table)] = table
        results = [None] * len(tasks)
        pending = set()
        for k, task in enumerate(tasks[1:], 1):
            if task is not None:
                self.inboxes[k - 1].put(task)
                pending.add(k)

        def emit(examples, nbytes):
            on_progress(examples, nbytes)
            self._receive(results, pending, on_progress, timeout=None)

        if tasks[0] is not None:
            function, job = tasks[0]
            _SHARED_CLAIMS, _CLAIMS_WATCH = self.claims, self._dead_worker
            try:
                results[0] = function(job, emit)
            finally:
                _SHARED_CLAIMS = _CLAIMS_WATCH = None
        while pending:
            self._receive(results, pending, on_progress, timeout=0.2)
        return results

    def _dead_worker(self):
        """What to say of a worker process that has ended, or None while all run."""
        for k, p in enumerate(self.processes, 1):
            if not p.is_alive():
                return f"worker process {k} ended unexpectedly (exit code {p.exitcode})"
        return None

    def _receive(self, results, pending, on_progress, timeout) -> None:
        while pending:
            try:
                if timeout is None:
                    kind, k, payload = self.results.get_nowait()
                else:
                    kind, k, payload = self.results.get(timeout=timeout)
            except queue.Empty:
                for k in sorted(pending):
                    p = self.processes[k - 1]
                    if not p.is_alive():
                        raise RuntimeError(
                            f"worker process {k} ended unexpectedly (exit code {p.exitcode}; "
                            "a script that converts with workers > 1 needs its work under "
                            "`if __name__ == '__main__':`, as spawned processes import it)"
                        ) from None
                return
            if kind == "progress":
                on_progress(*payload)
            elif kind == "done":
                results[k] = payload
                pending.discard(k)
            else:
                raise payload

    def spill_dir(self, name: str) -> str:
        """A new directory for the blocks runs spill (``_SpilledShard``), removed with the
        pool (once its processes have ended): in the temporary directory (``TMPDIR``), local
        space rather than the destination's file system, which may be a network one; spilled
        blocks live about as long as the dictionary's training."""
        if self._spill_root is None:
            self._spill_root = tempfile.mkdtemp(prefix="atlas-fast-convert-spill-")
        path = os.path.join(self._spill_root, name)
        os.mkdir(path)
        return path

    def close(self, *, kill: bool) -> None:
        try:
            self._close(kill=kill)
        finally:
            if self._spill_root is not None:
                shutil.rmtree(self._spill_root, ignore_errors=True)

    def _close(self, *, kill: bool) -> None:
        for inbox, p in zip(self.inboxes, self.processes):
            if kill:
                p.terminate()
            elif p.is_alive():
                inbox.put(None)
        for p in self.processes:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        for q in (self.results, *self.inboxes):
            q.close()
            q.cancel_join_thread()


class _Serial:
    """The calling process alone, on ``cores`` cores: its shard writers' compression threads
    (a source of one part with ``workers`` > 1)."""

    processes = ()  # no other process

    def __init__(self, cores: int):
        self.cores = cores

    def run(self, tasks: list, on_progress, claims=()) -> list:
        function, job = tasks[0]
        return [function(job, on_progress)]

    def close(self, *, kill: bool) -> None:
        pass


# -- progress ---------------------------------------------------------------------------


class _Progress:
    """Progress of one phase: a tqdm bar (``progress=True``, when tqdm is installed), a
    callable ``progress(examples, nbytes)`` given increments, or nothing."""

    def __init__(self, progress, total_bytes: int, desc: str):
        self.callback = progress if callable(progress) and progress is not True else None
        self.bar = None
        self.examples = 0
        self.start = self.last = time.monotonic()
        if progress is True:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(
                total=total_bytes,
                desc=desc,
                unit="B",
                unit_scale=True,
                unit_divisor=1000,
                file=sys.stderr,
                dynamic_ncols=True,
                leave=False,
            )

    def __call__(self, examples: int, nbytes: int) -> None:
        self.examples += examples
        if self.callback is not None:
            self.callback(examples, nbytes)
        if self.bar is None:
            return
        if nbytes:
            self.bar.update(nbytes)
        now = time.monotonic()
        if now - self.last > 0.2:
            rate = self.examples / max(now - self.start, 1e-9)
            self.bar.set_postfix_str(f"{self.examples:,} examples, {rate:,.0f} ex/s", False)
            self.bar.refresh()
            self.last = now

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# -- the conversion ----------------------------------------------------------------------


def _check_destination(dst: Path) -> None:
    from .._errors import destination_exists

    if (dst.is_dir() and any(dst.iterdir())) or (
        not dst.is_dir() and (dst.exists() or dst.is_symlink())
    ):
        raise destination_exists(dst, "convert", empty_dir_ok=True)


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
) -> ConvertSummary:
    """Convert the sources ``list_sources()`` returns into DST (see ``convert``)."""
    from .._format import read_dataset_metadata

    started = time.monotonic()
    dst = Path(dst)
    _check_destination(dst)
    pool = _Serial(1 if ray else workers)
    staging = None
    ok = False
    try:
        sources = list_sources()
        _check_sources(sources)
        # The worker processes start now, with the format's modules imported (pyarrow: a
        # fifth of a second in each), and no more of them than the parts to share.
        processes = min(pool.cores, max(len(source.parts) for source in sources))
        if processes > 1:
            pool = _Workers(processes, pool.cores)
        dst.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.converting-", dir=dst.parent))
        out = staging / "out"
        summary = ConvertSummary(fmt, dst)
        for s, source in enumerate(sources):
            root = out if source.split is None else out / source.split
            label = dst if source.split is None else dst / source.split
            if ray:
                examples, shards = write_with_ray(source, root, options)
                if verify:
                    counts = [examples]  # checked against the count verify_run makes
                    _verify_source(
                        pool, source, [source.parts], counts, root, label, examples, progress
                    )
            else:
                examples, shards = _convert_source(
                    pool, source, staging / "work" / str(s), root, label, verify, progress, options
                )
            summary.datasets.append((source.split, examples, shards))
        _check_destination(dst)
        if dst.is_dir():
            dst.rmdir()
        os.rename(out, dst)
        ok = True
    finally:
        pool.close(kill=not ok)
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
            if staging.exists():
                warnings.warn(
                    f"{staging}: could not remove this staging directory of the conversion; "
                    "it is not a dataset, remove it by hand",
                    RuntimeWarning,
                    stacklevel=2,
                )
    summary.strategy = int(options["compression_strategy"])
    summary.strategies = [
        read_dataset_metadata(dst if split is None else dst / split).compression_strategy
        for split, _, _ in summary.datasets
    ]
    summary.examples = sum(e for _, e, _ in summary.datasets)
    summary.shards = sum(n for _, _, n in summary.datasets)
    summary.bytes_in = sum(p.nbytes for source in sources for p in source.parts)
    summary.bytes_out = _tree_bytes(dst)
    summary.verified = bool(verify)
    summary.seconds = time.monotonic() - started
    return summary


def _convert_source(pool, source, work, root, label, verify, progress, options):
    """Write ``source`` with the pool's workers (into ``work``), commit it at ``root`` and
    verify it if asked; returns (examples, shards)."""
    from .._format import CompressionStrategy
    from .._writing.commit import commit_staged_shards

    dict_dir = work / "dict"
    dict_dir.mkdir(parents=True)
    parts = list(source.parts)
    runs = split_runs(parts, _pool_size(pool))
    ranges, start = [], 0
    for run in runs:
        ranges.append((start, start + len(run)))
        start += len(run)
    ranges = tuple(ranges)
    # ``workers`` is cores in total: one process per run, whose shard writers compress on its
    # share of them (one thread each when every process has a run; all of them for a source
    # of one part). The output does not depend on it (the writers' files are byte-identical
    # whatever their threads), only the time does.
    threads = max(1, pool.cores // len(runs))
    strategy = CompressionStrategy(options["compression_strategy"])
    spill_dir = None
    if len(runs) > 1 and strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
        spill_dir = pool.spill_dir(work.name)
    tasks = [
        (
            write_run,
            WriteJob(
                parts, ranges, k, str(work / str(k)), str(dict_dir), options, threads, spill_dir
            ),
        )
        for k in range(len(runs))
    ]
    total_bytes = sum(p.nbytes for p in parts)
    bar = _Progress(progress, total_bytes, _phase_name("converting", source))
    try:
        results = pool.run(tasks, bar, ranges)
    finally:
        bar.close()
    # Groups of consecutive parts, from whichever run wrote them, in the order of the parts.
    groups = sorted(g for run_groups, _ in results for g in run_groups)
    staged = [d for _, dirs in groups for d in dirs]
    written = dict(c for _, part_counts in results for c in part_counts)
    if sorted(written) != list(range(len(parts))):  # every part exactly once
        raise RuntimeError(f"parts written: {sorted(written)}, expected {len(parts)} of them")
    counts = [written[i] for i in range(len(parts))]
    shared = None
    if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
        shared = _shared_dict(dict_dir)
        if shared is None or shared is ...:
            shared = None
            strategy = CompressionStrategy.STANDARD_COMPRESSION
    commit_staged_shards(root, staged, compression_strategy=strategy, shared_dict=shared)
    examples = sum(counts)
    if verify:
        _verify_source(pool, source, runs, counts, root, label, examples, progress)
    return examples, len(staged)


def _pool_size(pool) -> int:
    return len(pool.processes) + 1


def _phase_name(what: str, source: Source) -> str:
    return what if source.split is None else f"{what} {source.split}"


def _verify_source(pool, source, runs, counts, root, label, examples, progress) -> None:
    tasks, start, i = [], 0, 0
    for run in runs:
        tasks.append((verify_run, VerifyJob(str(root), str(label), start, run)))
        start += sum(counts[i : i + len(run)])
        i += len(run)
    bar = _Progress(progress, sum(p.nbytes for p in source.parts), _phase_name("verifying", source))
    try:
        compared = sum(pool.run(tasks, bar))
    finally:
        bar.close()
    from .. import atlas

    with atlas.AtlasDataset(root) as ds:
        stored = len(ds)
    if compared != examples or stored != examples:
        raise VerifyError(
            f"{label}: the converted dataset holds {stored} examples, the source {compared}"
        )
