"""The dataset writer's concurrency, below ``atlas_fast.writer.AtlasDatasetWriter``.

``ShardFinisher``: with ``workers > 1``, full shards are closed (their last blocks
compressed, index.npy and meta.json written; under strategy 3 their dictionary trained and
every block compressed) on a pool of ``workers`` threads while the calling thread fills the
next shard. Their errors are raised on the calling thread, in shard order, naming the shard.

``ReadAhead``: strategy 2 with ``workers > 1``. The first shard trains the dictionary every
other shard compresses with, so no other shard writer can exist before it is closed; it is
closed on the pool meanwhile, and the next shards' examples are held here, their full
blocks pickled, up to ``READ_AHEAD_BYTES``; once the dictionary exists they are given to
their shard writers (``replay``).

Both handle only shard writers the dataset writer made itself from this package's class:
a test double patched in as ``atlas_fast.writer.AtlasDatasetShardWriter`` is closed on the
calling thread, in the reference's order (strategy 3 aside, see the dataset writer).
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field

from .blocks import pickle_examples
from .context import add_context, describe

__all__ = ["READ_AHEAD_BYTES", "ReadAhead", "ShardFinisher", "replay", "shard_error"]

# Strategy 2 with workers > 1: the most pickled blocks (in bytes; one block more may be held)
# the dataset writer reads ahead while the first shard trains the shared dictionary.
READ_AHEAD_BYTES = 64 << 20


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

    Only the calling thread uses it: ``submit`` queues a shard's closing, ``collect`` takes
    those done (raising the first error), ``abandon`` cancels those not started and waits for
    those running.
    """

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool = None
        self._finishing: deque = deque()  # (shard writer, future of its closing)

    def run(self, fn, *args):
        """``fn(*args)`` on the pool, not queued (its caller waits for the future)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="atlas-fast-shard")
        return self._pool.submit(fn, *args)

    def submit(self, shard, fn, *args) -> None:
        """Close ``shard`` on the pool by ``fn(*args)``; ``collect`` takes it."""
        self._finishing.append((shard, self.run(fn, *args)))

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
        self.submit(shard, shard.close)
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
        self._finishing = still

    def abandon(self, more=()) -> list:
        """Stop: the shards queued (and ``more``: (shard, future) pairs run outside the
        queue) that have not started are cancelled and abandoned, those running are waited
        for. The errors met, as messages, raising none."""
        handed = [*more, *self._finishing]
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
        """Stop the threads, once those running are done (those queued were collected or
        cancelled)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._finishing.clear()


class _Part:
    """A shard read ahead: its full blocks pickled, the examples after them as given."""

    __slots__ = ("blocks", "pending", "count")

    def __init__(self) -> None:
        self.blocks: list = []
        self.pending: list = []
        self.count = 0


@dataclass(eq=False)
class ReadAhead:
    """The shards after strategy 2's first, held while it closes (``first``: the shard
    writer, ``future``: its closing on the pool). ``root``: the dataset's directory; shard
    ``first_number`` is the first held."""

    first: object
    future: object
    root: object = field(kw_only=True)
    first_number: int = field(kw_only=True)
    shard_size: int = field(kw_only=True)
    block_size: int = field(kw_only=True)
    parts: list = field(default_factory=list, init=False)
    nbytes: int = field(default=0, init=False)  # pickled bytes held

    @property
    def count(self) -> int:
        """The examples held."""
        return sum(part.count for part in self.parts)

    def add(self, example) -> bool:
        """Hold ``example`` for the shard it belongs to, pickling each full block; whether
        the read-ahead should end now (the first shard is closed, or READ_AHEAD_BYTES are
        held)."""
        parts = self.parts
        if not parts or parts[-1].count >= self.shard_size:
            parts.append(_Part())
        part = parts[-1]
        part.pending.append(example)
        part.count += 1
        if len(part.pending) == self.block_size:
            number = self.first_number + len(parts) - 1
            block = pickle_examples(part.pending, self.root / str(number), len(part.blocks))
            part.pending = []
            part.blocks.append(block)
            self.nbytes += len(block)
            return self.nbytes >= READ_AHEAD_BYTES or self.future.done()
        return False

    def wait(self) -> None:
        """Wait for the first shard to be closed; its error is raised here."""
        exc = self.future.exception()
        if exc is not None:
            raise shard_error(self.first, exc)


def replay(shard, part: _Part, block_size: int, close: bool = True) -> None:
    """Give ``shard`` (a new writer of this package's class) what ``part`` holds, then
    close it if ``close``; abandon it if that fails."""
    try:
        blocks, part.blocks = part.blocks, []
        blocks.reverse()
        while blocks:  # each pickled block is let go once stored
            shard.add_pickled_block(blocks.pop(), block_size)
        for example in part.pending:
            shard.add_example(example)
        if close:
            shard.close()
    except BaseException:
        shard.abort()
        raise
