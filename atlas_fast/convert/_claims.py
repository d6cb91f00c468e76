"""Which part each run of a conversion writes next: a claim table the worker processes share.

The table is a flat list of integers (a ``multiprocessing.Array("q")`` when processes share it,
a plain list for one process), laid out by ``Claims.layout``. Every read and write of it holds
its lock (``Claims._locked``).
"""

from __future__ import annotations

import contextlib
import itertools

__all__ = ["Claims"]


class Claims:
    """Which part a run writes next: its own parts in order while it has some left; then it
    steals from the run with the most bytes left the back half of what that run has not
    claimed (at least its last part), which becomes its own range (work stealing), so a run
    that starts late or has more to do (run 0 trains the strategy-2 dictionary) is helped by
    the others, down to the last part. Each run takes its own parts from the front and
    thieves take from the back, so every run's range stays contiguous and what a run steals
    is consecutive parts (written into the same shards); the order of the dataset is the
    order of the parts whoever writes them (see ``_write.RunWriter``).

    And which spilled shard a run compresses next (strategy 2): the shards runs > 0 fill
    before the dictionary is published are written uncompressed to spill files, for
    whichever run is free once it is (``next_spilled``).

    ``table``: the table the runs share (None: this run alone, on a table of its own);
    ``watch``: what went wrong with the other processes, or None while they all run (asked
    while waiting for the table's lock)."""

    # The slot after the part ranges: the last part of run 0's range that run 0 may still
    # need for its first shard, from which it trains the strategy-2 dictionary; the others
    # do not take parts up to it. Starts at _KEEP_ALL; -1 once that shard is closed.
    _KEEP_ALL = 1 << 62

    @staticmethod
    def layout(ranges) -> list:
        """A new table: the ``[start, stop)`` of each run's unclaimed parts, the keep slot,
        then each run's ``[first, end)`` spilled shards not yet taken (shard numbers)."""
        return [x for r in ranges for x in r] + [Claims._KEEP_ALL] + [0, 0] * len(ranges)

    def __init__(self, parts: list, ranges: tuple, run: int, table=None, watch=None):
        self.run = run
        self.runs = len(ranges)
        self.sizes = [max(p.nbytes, 1) for p in parts]
        self.counts = [getattr(p, "examples", None) for p in parts]
        self._before = list(itertools.accumulate(self.sizes, initial=0))  # bytes before part i
        self.watch = watch
        if table is None or self.runs == 1:
            self.table, self.lock = Claims.layout(ranges), None
        else:
            self.table, self.lock = table, table.get_lock()

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
        the OOM killer, say) would leave the others waiting forever, so waiting asks the
        watch, every second, whether anybody died."""
        if self.lock is None:
            yield
            return
        while not self.lock.acquire(timeout=1.0):
            problem = self.watch() if self.watch is not None else None
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
