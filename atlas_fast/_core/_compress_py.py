"""The writer's block compressor with python-zstandard: the pure-Python twin of ``_compress``,
and what the compiled one hands over to when its libzstd is not the version python-zstandard
compresses with (so the frames never depend on the backend).

``PoolCompressor`` keeps the ``BlockCompressor`` contract (``atlas_fast._contract``):
``submit(block)`` queues a pickled block and returns the frames finished since, in block
order; ``finish()`` the rest; ``close()`` stops the threads. With ``workers > 1`` a thread pool
compresses (python-zstandard releases the GIL), at most ``2 * workers`` blocks in flight, one
``ZstdCompressor`` per task at a time; with ``workers == 1`` each block is compressed on the
calling thread as it is submitted. ``level=None`` keeps the blocks as they are. With ``out`` (a
file descriptor), the frames are written to it in order on the calling thread and their
sizes returned instead.
"""

from __future__ import annotations

import errno
import io
import os
import queue
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import zstandard

from .._fork import after_fork_in_child

__all__ = ["PoolCompressor", "block_compressor", "zstandard_version_number"]

# Pickled blocks handed to the pool and not yet returned, per worker thread.
IN_FLIGHT_PER_WORKER = 2

# Bumped in a forked child, whose copy of a PoolCompressor has no pool threads.
_generation = 0


def _forked() -> None:
    global _generation
    _generation += 1


after_fork_in_child(_forked)


def zstandard_version_number() -> int:
    """The libzstd python-zstandard compresses with, as ZSTD_versionNumber() counts it."""
    major, minor, patch = zstandard.ZSTD_VERSION[:3]
    return major * 10000 + minor * 100 + patch


def block_compressor(
    level: int | None, zdict, workers: int, checksum: bool = False, out: int | None = None
) -> PoolCompressor:
    """The writer's compressor of pickled blocks (see _contract.BlockCompressorProtocol)."""
    return PoolCompressor(level, zdict, workers, checksum, out)


class PoolCompressor:
    def __init__(
        self, level: int | None, zdict, workers: int, checksum: bool = False, out=None
    ) -> None:
        if out is not None and (not isinstance(out, int) or out < 0):
            raise ValueError(f"out must be a file descriptor, not {out!r}")
        # A duplicate of its own (closed by close(), or when collected), as the compiled one.
        self._out = None if out is None else io.FileIO(os.dup(out), "wb")
        self._generation = _generation
        self._failed = False  # with out: a write failed, no later frame is written
        self._workers = workers
        self._pool = None
        self._in_flight: deque = deque()
        if level is None:
            self._compressor = None  # blocks are kept as they are: nothing to run on threads
            return

        def new():
            if zdict is None:
                return zstandard.ZstdCompressor(level=level, write_checksum=checksum)
            return zstandard.ZstdCompressor(
                level=level,
                dict_data=zstandard.ZstdCompressionDict(bytes(zdict)),
                write_checksum=checksum,
            )

        self._compressor = new()
        if workers > 1:
            self._idle = queue.SimpleQueue()
            self._idle.put(self._compressor)
            for _ in range(workers - 1):
                self._idle.put(new())
            self._pool = ThreadPoolExecutor(workers, thread_name_prefix="atlas-fast-zstd")

    def _task(self, block: bytes) -> bytes:
        # The pool runs at most `workers` tasks and the queue holds `workers` compressors,
        # so `get` never waits and no compressor is shared.
        compressor = self._idle.get()
        try:
            return compressor.compress(block)
        finally:
            self._idle.put(compressor)

    def _check_process(self) -> None:
        if self._generation != _generation:
            raise RuntimeError(
                "this PoolCompressor was made by another process (inherited through fork): "
                "its threads are not here"
            )

    def submit(self, block: bytes) -> list:
        self._check_process()
        if self._pool is None:
            frame = block
            if self._compressor is not None:
                try:
                    frame = self._compressor.compress(block)
                except BaseException:
                    self._failed = True
                    raise
            return [self._written(frame)]
        self._in_flight.append(self._pool.submit(self._task, block))
        return self._drain(IN_FLIGHT_PER_WORKER * self._workers)

    def finish(self) -> list:
        self._check_process()
        return self._drain(0)

    def _drain(self, keep: int) -> list:
        out = []
        while len(self._in_flight) > keep:
            future = self._in_flight.popleft()  # a block whose error is raised is gone too
            try:
                frame = future.result()
            except BaseException:
                self._failed = True
                raise
            out.append(self._written(frame))
        return out

    def _written(self, frame: bytes):
        """``frame``, or with ``out`` its size once written there (an ``OSError`` if not)."""
        if self._out is None:
            return frame
        if self._failed:
            raise OSError(errno.EIO, "not written: an earlier block failed")
        view = memoryview(frame)
        try:
            while view:
                written = self._out.write(view)
                if not written:
                    raise OSError(errno.EIO, "the file took no bytes")
                view = view[written:]
        except OSError:
            self._failed = True
            raise
        return len(frame)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._in_flight.clear()
        if self._out is not None:
            self._out.close()
