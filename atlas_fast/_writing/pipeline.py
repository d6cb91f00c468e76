"""The dataset writer's concurrency, below ``atlas_fast.writer.AtlasDatasetWriter``.

``ShardFinisher``: with ``workers > 1``, full shards are closed (their last blocks
compressed, index.npy and meta.json written; under strategy 3 their dictionary trained and
every block compressed) on a pool of ``workers`` threads while the calling thread fills the
next shard. Their errors are raised on the calling thread, in shard order, naming the shard.
The dataset writer hands it only shards it may close elsewhere (see its docstring).
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures

from .context import add_context, describe

__all__ = ["ShardFinisher", "abort_shard", "shard_error"]


def shard_error(shard, exc: BaseException) -> BaseException:
    """``exc``, raised closing ``shard`` on another thread: itself, noted as the shard's
    unless it names the shard already (``context.names``)."""
    return add_context(exc, f"{shard.path}: finishing the shard", shard.path)


def abort_shard(shard) -> list:
    """Abandon ``shard`` (when its writer has an ``abort()``); its error, as a message."""
    abort = getattr(shard, "abort", None)
    if abort is not None:
        try:
            abort()
        except Exception as exc:
            return [f"{shard.path}: abandoning the shard: {type(exc).__name__}: {exc}"]
    return []


class ShardFinisher:
    """Shards closed on a pool of ``workers`` threads (started with the first), in order.

    Only the calling thread uses it: ``take`` hands a shard's closing to a free thread,
    ``collect`` takes those done (raising the first error), ``abandon`` waits for those
    running.
    """

    def __init__(self, workers: int, on_closed=None) -> None:
        self.workers = workers
        self.on_closed = on_closed  # called with each shard closed without error, in order
        self._pool = None
        self._finishing: deque = deque()  # (shard writer, future of its closing)

    def take(self, shard, *, wait_for_thread: bool) -> bool:
        """Close ``shard`` (``shard.close()``) on the pool if one of its threads is free,
        waiting for one if ``wait_for_thread``: whether it did."""
        self.collect(wait=False)
        if wait_for_thread:
            while len(self._finishing) >= self.workers:
                wait_futures([f for _, f in self._finishing], return_when=FIRST_COMPLETED)
                self.collect(wait=False)
        if len(self._finishing) >= self.workers:
            return False
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="atlas-fast-shard")
        self._finishing.append((shard, self._pool.submit(shard.close)))
        return True

    def collect(self, wait: bool) -> None:
        """Take the shards closed (all of them, in order, if ``wait``); the first error is
        raised here, naming the shard, the shards after it left queued (for ``abandon``)."""
        still = deque()
        while self._finishing:
            shard, future = self._finishing.popleft()
            if not wait and not future.done():
                still.append((shard, future))
                continue
            exc = future.exception()
            if exc is not None:
                still.extend(self._finishing)
                self._finishing = still
                raise shard_error(shard, exc)
            if self.on_closed is not None:
                try:
                    self.on_closed(shard)
                except BaseException:
                    still.extend(self._finishing)
                    self._finishing = still
                    raise
        self._finishing = still

    def abandon(self) -> list:
        """Stop: the shards handed over that have not started are cancelled and abandoned,
        those running are waited for. The errors met, as messages, raising none."""
        handed = list(self._finishing)
        self._finishing.clear()
        for _, future in handed:
            future.cancel()  # only those not started
        self.stop()  # waits for those running
        problems = []
        for shard, future in handed:
            if future.cancelled():
                problems += abort_shard(shard)
            else:
                exc = future.exception()
                if exc is not None:
                    problems.append(describe(shard_error(shard, exc)))
        return problems

    def stop(self) -> None:
        """Stop the threads, once those running are done (those handed over were collected
        or cancelled)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._finishing.clear()
