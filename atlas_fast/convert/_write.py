"""The work of one run of a conversion: the parts it claims, written into shards."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ._claims import Claims
from ._dictionary import DictionaryHandOver
from ._progress import Emitter
from ._spill import SPILL_LIMIT, SpilledShard, compress_spilled

__all__ = ["RunWriter", "WriteJob", "write_run"]


@dataclass(frozen=True)
class WriteJob:
    parts: list  # every part of the source
    ranges: tuple  # (start, stop) of the parts each run starts with (see Claims)
    run: int  # this run's number: 0 starts the source (with strategy 2 it trains the dictionary)
    run_dir: str
    dict_dir: str
    options: dict
    # The shard writers' compression threads (their ``workers=``): the conversion's cores
    # shared out among its runs, so that it uses ``workers`` cores in total (see
    # ``_run._convert_source``): 1 whenever there is more than one run.
    threads: int = 1
    # Strategy 2 with several runs: where runs > 0 write the pickled blocks of the shards
    # they fill before the dictionary is published (see SpilledShard); None: not needed.
    spill_dir: str | None = None
    # A conversion to a URL: the run tells the converting process of its groups and shards
    # (``Worker.event``) and waits at the staging gate after each shard (see ``_stream``).
    stream: bool = False
    # An append to a dataset that has its dictionary (``convert --append``): it is
    # published in ``dict_dir`` before the runs start, and no run trains one.
    dict_known: bool = False

    @property
    def first(self) -> bool:
        return self.run == 0


def write_run(job: WriteJob, worker) -> tuple:
    """The task of a run (see ``RunWriter.run``)."""
    return RunWriter(job, worker).run()


class RunWriter:
    """Writes the parts one run claims (``Claims``) into shards ``run_dir/0, 1, ...`` of
    ``shard_size`` examples. Consecutive parts share shards; a part that does not follow the
    one before (a stolen range) starts a new group of shards.

    Strategy 2: run 0 trains the dictionary from its first shard and publishes it
    (``DictionaryHandOver``); until it is published, the others read on: the blocks of their
    own parts (their share) wait in memory for them to compress, those of parts taken
    from other runs go to spill files (``SpilledShard``) that any run compresses once it
    knows the dictionary, before it claims another part. Every shard holds the examples it
    would hold had its run written it at once, and the same bytes.

    The run's state lives in its fields; ``run()`` writes it, once."""

    def __init__(self, job: WriteJob, worker):
        from .._format import CompressionStrategy
        from ..writer import AtlasDatasetShardWriter

        self.job = job
        self.options = job.options
        self.run_dir = Path(job.run_dir)
        self.hand_over = DictionaryHandOver(job.dict_dir)
        self.shard_writer = AtlasDatasetShardWriter
        self.strategy = CompressionStrategy(self.options["compression_strategy"])
        self.shared = self.strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
        self.zdict = None  # the shared dictionary, once known
        self.known = not self.shared  # whether zdict is settled (strategy 2)
        self.shard_dirs: list = []  # every shard this run opened, in order
        self.groups: list = []  # (first part index, shard dirs of the group)
        self.counts: list = []  # (part index, examples) of every part written
        self.writer = None  # the shard being filled
        self.kind = None  # the writer's: "trains", "awaits", "spills" or None (plain)
        self.deferred: list = []  # closed shards awaiting the dictionary in this memory
        self.spilled = 0  # bytes this run has spilled
        self.progress = Emitter(worker.emit)
        self.claims = Claims(job.parts, job.ranges, job.run, worker.table, worker.watch)
        self.worker = worker
        self.event = worker.event if job.stream else None
        if job.dict_known and not self.known:
            self._learn_dict(True)

    def run(self) -> tuple:
        """Write the run. Returns (groups, counts): groups ``(first part index, shard
        dirs)`` whose parts are consecutive from that index, and ``(part index, examples)``
        for every part written."""
        job = self.job
        shard_size = self.options["shard_size"]
        claims = self.claims
        if job.first and self.known:
            claims.first_shard_settled()  # no dictionary to train: nothing to guard
        previous = None
        while True:
            if not self.known and not job.first:
                self._learn_dict(self.spilled >= SPILL_LIMIT)
            if self.known and self.deferred:
                deferred, self.deferred = self.deferred, []
                for w in deferred:  # what only this run can compress, first
                    self._settle(w)
                    self._finished(job.run, w.path)
                continue
            if self.known and job.spill_dir is not None and self._compress_spilled():
                continue
            index = claims.next()
            if index is None:
                if self.writer is not None:
                    self._close_shard()
                    continue  # a spilled shard to compress, maybe
                if not self.known and not job.first:
                    self._learn_dict(True)  # nothing left to read: the spilled shards are left
                    continue
                if previous is not None:
                    self._tell(("end", self.groups[-1][0], previous))
                break
            if previous is None or index != previous + 1:
                if self.writer is not None:  # the group before ends with a short shard
                    self._close_shard()
                if previous is not None:
                    self._tell(("end", self.groups[-1][0], previous))
                self.groups.append((index, []))
                self._tell(("group", index))
            previous = index
            self._write_part(index, shard_size)
        if job.first and not self.known:  # no example at all in run 0
            self.hand_over.publish(None)
        if job.first:
            claims.first_shard_settled()  # nothing of its range is left to keep
        return self.groups, self.counts

    def _write_part(self, index: int, shard_size: int) -> None:
        job, claims = self.job, self.claims
        part = job.parts[index]
        training = job.first and not self.known
        if training and part.examples is not None and self._first_shard_open():
            # The source says how many examples this part holds: the others need not wait
            # for its end to know which of the next parts the first shard may yet need.
            done = 0 if self.writer is None else self.writer.stored_examples
            claims.keep_for_first_shard(self._read_rate(), shard_size - done - part.examples)
        count = 0
        progress = self.progress
        writer = self.writer  # self.writer too, while open (the loop reads it as a local)
        for example in part.read():
            if writer is None:
                writer = self.writer = self._open_shard()
            writer.add_example(example)
            count += 1
            progress.example()
            if writer.stored_examples == shard_size:
                self._close_shard()
                writer = None
        self.counts.append((index, count))
        progress.flush(part.nbytes)
        if job.first and not self.known and self.writer is not None and len(self.shard_dirs) == 1:
            # Still in the first shard: tell the others which parts it may yet need.
            claims.keep_for_first_shard(self._read_rate(), shard_size - self.writer.stored_examples)

    def _learn_dict(self, wait: bool) -> None:
        """A run > 0: the published dictionary, once it is (``wait``: waits for it)."""
        import zstandard

        data = self.hand_over.published()
        if data is ... and wait:
            data = self.hand_over.wait()
            data = None if data is None else data.as_bytes()
        if data is not ...:
            self.zdict = None if data is None else zstandard.ZstdCompressionDict(data)
            self.known = True

    def _make_writer(self, path, chosen=None, dictionary_source=None):
        from .._format import CompressionStrategy

        if chosen is None:
            chosen = self.strategy
            if self.shared and self.zdict is None:
                chosen = CompressionStrategy.STANDARD_COMPRESSION
        opts = self.options
        return self.shard_writer(
            path,
            opts["block_size"],
            compression_strategy=chosen,
            compression_level=opts["compression_level"],
            compression_dict=self.zdict,
            compression_dict_size=opts["compression_dict_size"],
            checksums=opts["checksums"],
            workers=self.job.threads,
            dictionary_source=dictionary_source,
        )

    def _open_shard(self):
        """The writer of the next shard; ``kind`` says what it is."""
        from functools import partial

        from .._format import CompressionStrategy

        job, opts = self.job, self.options
        path = self.run_dir / str(len(self.shard_dirs))
        self.shard_dirs.append(str(path))
        self.groups[-1][1].append(str(path))
        self._tell(("open", self.groups[-1][0], job.run, len(self.shard_dirs) - 1))
        if not self.known and not job.first:
            self._learn_dict(False)
        self.kind = None
        if self.known:
            return self._make_writer(path)
        own = job.ranges[job.run]
        if job.first:
            # Run 0's first shard: strategy 3, its dictionary published once trained.
            self.kind = "trains"
            source = partial(
                self.hand_over.trained,
                compression_dict_size=opts["compression_dict_size"],
                compression_level=opts["compression_level"],
                shard=path,
            )
        elif job.spill_dir is None or own[0] <= self.groups[-1][0] < own[1]:
            # Its own parts (its share): their blocks wait in memory, for this run to
            # compress once the dictionary is published.
            self.kind = "awaits"
            source = self.hand_over.awaited
        else:
            # Parts taken from another run beyond its share: spilled, for whoever is free.
            self.kind = "spills"
            number = len(self.shard_dirs) - 1
            spill = Path(job.spill_dir) / f"{job.run}-{number}"
            return SpilledShard(spill, path, number, opts["block_size"])
        return self._make_writer(path, CompressionStrategy.DICTIONARY_COMPRESSION, source)

    def _close_shard(self) -> None:
        w, kind = self.writer, self.kind
        self.writer = self.kind = None
        if kind == "spills":
            w.close()
            self.spilled += w.nbytes
            self.claims.spilled(w.number)
        elif kind == "awaits":
            self.deferred.append(w)  # compressed once the dictionary is published
        elif kind == "trains":
            # Its examples are the dictionary's sample: with them settled the others may
            # take any part of run 0's range, while it trains.
            self.claims.first_shard_settled()
            self._settle(w)
            self.known = True
            self._finished(self.job.run, w.path)
        else:
            w.close()
            self._finished(self.job.run, w.path)

    def _tell(self, event: tuple) -> None:
        """Tell the converting process ``event`` (a conversion to a URL: see ``_stream``)."""
        if self.event is not None:
            self.event(event)

    def _finished(self, run: int, path) -> None:
        """Shard ``path`` of ``run`` is finished (its files final): told, then this run
        waits while local staging is full (see ``_stream.Gate``)."""
        if self.event is None:
            return
        from ._stream import shard_bytes

        size = shard_bytes(path)
        gate = self.worker.gate
        gate.held(size)
        self.event(("done", run, int(Path(path).name), str(path), size))
        # Run 0 runs in the converting process: it handles the others' messages meanwhile.
        pump = (lambda: self.worker.emit(0, 0)) if self.worker.number == 0 else None
        gate.wait(self.job.run, pump, self.worker.watch)

    def _settle(self, w) -> None:
        """Close a strategy-3 shard whose dictionary is the shared one (run 0's first shard
        publishes it as soon as it is trained; the others await it: see ``_open_shard``):
        the dictionary leaves the shard, which becomes strategy 2."""
        import zstandard

        from .._format import DICT_FILE, META_FILE, CompressionStrategy, dump_meta

        w.close()
        data = None
        if w.metadata.compression_strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            own = w.path / DICT_FILE
            data = own.read_bytes()
            own.unlink()
            w.metadata = w.metadata._replace(
                compression_strategy=int(CompressionStrategy.SHARED_DICTIONARY_COMPRESSION)
            )
            dump_meta(w.path / META_FILE, w.metadata._asdict())
        self.zdict = None if data is None else zstandard.ZstdCompressionDict(data)

    def _compress_spilled(self) -> bool:
        """Compress a spilled shard, if there is one to take (the dictionary known)."""
        taken = self.claims.next_spilled()
        if taken is None:
            return False
        k, number = taken
        spill = Path(self.job.spill_dir) / f"{k}-{number}"
        shard = self.run_dir.parent / str(k) / str(number)
        compress_spilled(spill, shard, self._make_writer)
        self._finished(k, shard)
        return True

    def _first_shard_open(self) -> bool:
        return not self.shard_dirs or (len(self.shard_dirs) == 1 and self.writer is not None)

    def _read_rate(self) -> float:
        """Examples per input byte of the parts read so far (0.0: none read)."""
        read = sum(self.job.parts[i].nbytes for i, _ in self.counts)
        return sum(n for _, n in self.counts) / read if read else 0.0
