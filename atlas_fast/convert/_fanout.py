"""The plain design: train the strategy-2 dictionary, then fan out.

Run 0 writes the source's first shard in the calling process, as a serial run does, and
trains the dictionary from it (the rest of the part that shard ends in follows into the next
shard); then the parts left are cut into runs of about equal bytes, one per process, each
given the dictionary with its job. ``steal=True``: a run done with its own parts takes the
back half of another's (``Claims``); False: each writes its own and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ._claims import Claims
from ._progress import Emitter

__all__ = ["FanOutJob", "FanOutWriter", "fan_out_run"]


@dataclass(frozen=True)
class FanOutJob:
    parts: list  # every part of the source
    ranges: tuple  # (start, stop) of the parts each run writes (starts with, if stealing)
    run: int
    run_dir: str
    options: dict
    threads: int = 1
    zdict: bytes | None = None  # the shared dictionary (strategy 2), None: none
    steal: bool = False


def fan_out_run(job: FanOutJob, worker) -> tuple:
    """The task of a run > 0 (see ``FanOutWriter.run``)."""
    return FanOutWriter(job.run_dir, job.options, job.threads, job.zdict).run(job, worker)


class FanOutWriter:
    """Writes parts into shards ``run_dir/0, 1, ...``: first, for run 0, the source's first
    shard (``first_shard``), then the parts of its run (``run``)."""

    def __init__(self, run_dir, options: dict, threads: int, zdict: bytes | None):
        import zstandard

        from .._format import CompressionStrategy
        from ..writer import AtlasDatasetShardWriter

        self.options = options
        self.threads = threads
        self.run_dir = Path(run_dir)
        self.shard_writer = AtlasDatasetShardWriter
        self.strategy = CompressionStrategy(options["compression_strategy"])
        self.zdict = None if zdict is None else zstandard.ZstdCompressionDict(zdict)
        self.shard_dirs: list = []
        self.groups: list = []
        self.counts: list = []
        self.writer = None
        self.training = False  # the writer is the first shard, training the dictionary
        self.previous = None  # the last part written
        self.progress = None

    def first_shard(self, parts: list, emit, threads: int) -> int:
        """Run 0, strategy 2: write parts from the first on until the first shard is full,
        train the dictionary from it (on ``threads`` compression threads: nobody else works
        meanwhile), and write the rest of the part it ends in. Returns the next part's
        index. ``zdict_bytes()`` is then the dictionary, or None (strategy 1)."""
        from .._format import CompressionStrategy

        self.progress = Emitter(emit)
        shard_size = self.options["shard_size"]
        self.groups.append((0, []))
        self.writer = self._open_shard(CompressionStrategy.DICTIONARY_COMPRESSION, threads)
        self.training = True
        index = 0
        while index < len(parts) and self.training:
            self._write_part(parts, index, shard_size)
            index += 1
        if self.training:  # the whole source is shorter than a shard
            self._close_shard()
        return index

    def zdict_bytes(self):
        return None if self.zdict is None else self.zdict.as_bytes()

    def run(self, job: FanOutJob, worker) -> tuple:
        """Write the parts this run claims. Returns (groups, counts), as ``RunWriter.run``."""
        self.progress = Emitter(worker.emit)
        claims = Claims(job.parts, job.ranges, job.run, worker.table, worker.watch)
        claims.first_shard_settled()
        claims.steal = job.steal
        shard_size = self.options["shard_size"]
        while (index := claims.next()) is not None:
            if self.previous is None or index != self.previous + 1:
                if self.writer is not None:
                    self._close_shard()
                self.groups.append((index, []))
            self._write_part(job.parts, index, shard_size)
        if self.writer is not None:
            self._close_shard()
        return self.groups, self.counts

    def shared_fallback(self) -> bool:
        from .._format import CompressionStrategy

        return self.strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION and (
            self.zdict is None
        )

    def _write_part(self, parts, index: int, shard_size: int) -> None:
        part = parts[index]
        count = 0
        progress = self.progress
        for example in part.read():
            if self.writer is None:
                self.writer = self._open_shard()
            self.writer.add_example(example)
            count += 1
            progress.example()
            if self.writer.stored_examples == shard_size:
                self._close_shard()
        self.counts.append((index, count))
        self.previous = index
        progress.flush(part.nbytes)

    def _open_shard(self, strategy=None, threads=None):
        from .._format import CompressionStrategy

        path = self.run_dir / str(len(self.shard_dirs))
        self.shard_dirs.append(str(path))
        self.groups[-1][1].append(str(path))
        if strategy is None:
            strategy = self.strategy
            if self.shared_fallback():
                strategy = CompressionStrategy.STANDARD_COMPRESSION
        opts = self.options
        return self.shard_writer(
            path,
            opts["block_size"],
            compression_strategy=strategy,
            compression_level=opts["compression_level"],
            compression_dict=self.zdict,
            compression_dict_size=opts["compression_dict_size"],
            checksums=opts["checksums"],
            workers=threads or self.threads,
        )

    def _close_shard(self) -> None:
        w, self.writer = self.writer, None
        w.close()
        if not self.training:
            return
        # The first shard: its dictionary leaves it for the root, and it becomes strategy 2.
        import zstandard

        from .._format import DICT_FILE, META_FILE, CompressionStrategy, dump_meta

        self.training = False
        if w.metadata.compression_strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            own = w.path / DICT_FILE
            self.zdict = zstandard.ZstdCompressionDict(own.read_bytes())
            own.unlink()
            w.metadata = w.metadata._replace(
                compression_strategy=int(CompressionStrategy.SHARED_DICTIONARY_COMPRESSION)
            )
            dump_meta(w.path / META_FILE, w.metadata._asdict())
