"""Blocks of one object by exact byte ranges: merged requests, bounded read-ahead.

A ``BlockFetcher`` serves the stored bytes of block ``b`` of an object whose block
boundaries are ``offsets`` (a shard's data.bin and its index.npy):

- a block read alone (uniform random access) is one request for exactly its bytes;
- ``prefetch(blocks)`` (a batch) fetches the blocks not held yet, neighbours merged into
  requests of up to ``request_bytes``, concurrently; each is kept until read; batches that
  follow each other in order (a DataLoader's pass, each worker taking every other batch)
  start the read-ahead below;
- with ``extent_blocks`` set (by a sampler reading the object in extents: runs of that many
  blocks, the first starting at block 0), a block missed fetches the blocks of its extent not
  held yet, in one request; those not asked for are kept until read, counted in the bytes
  held ahead (``_BUDGET``), or not fetched when that is full;
- a pass in order (two blocks read one after the other) starts a read-ahead: the blocks after
  it, merged into requests of ``request_bytes``, with at most ``requests_in_flight`` requests
  of this fetcher in flight and at most ``read_ahead_bytes`` fetched ahead and not yet read in
  the whole process (``_BUDGET``). A read elsewhere ends it: what was fetched ahead and not
  read is dropped.

Every block is fetched at most once per use; bytes read are handed over and forgotten (the
reader's block cache keeps decoded examples, not this).

Invariants: ``_lock`` guards ``_ready``, ``_inflight``, ``_ahead``, ``_explicit``, ``_extent``
and the pass state; a block of ``_ahead`` or ``_extent`` (and, while in flight, of its run's
``charged``) has its bytes counted in ``_BUDGET`` until it is read or dropped; requests run on
the fetch pool without it and deposit their blocks under it before their future completes, so a
reader woken by a future finds its block in ``_ready``. A forked child never waits on the
parent's requests: it drops that state on first use (``_pid``), taking a new lock.
"""

from __future__ import annotations

import bisect
import os
import threading
import weakref
from concurrent.futures import Future

from .._fork import after_fork_in_child
from ._object import fetch_pool, merge_ranges

__all__ = ["BlockFetcher", "read_ahead_held", "take_read_ahead", "give_read_ahead"]


class _Budget:
    """Bytes fetched ahead and not yet read, process-wide.

    ``holders`` are the fetchers holding such bytes, least recently active first. When a pass
    needs room, what the least recently active other fetchers hold ready is dropped first (a
    pass that stopped, or a dataset no longer read, must not starve the passes that go on).
    """

    def __init__(self) -> None:
        self.held = 0
        self.lock = threading.Lock()
        self.holders: dict = {}  # id(fetcher) -> weakref, least recently active first

    def take(self, n: int, limit: int, fetcher) -> bool:
        with self.lock:
            self.holders.pop(id(fetcher), None)
            self.holders[id(fetcher)] = weakref.ref(fetcher)
            if not self.held or self.held + n <= limit:
                self.held += n
                return True
            others = [ref for key, ref in self.holders.items() if key != id(fetcher)]
        for ref in others:  # without self.lock: dropping gives bytes back through give()
            other = ref()
            if other is not None:
                other._drop_ready_ahead()
            with self.lock:
                if self.held + n <= limit:
                    self.held += n
                    return True
        return False

    def forget(self, fetcher) -> None:
        with self.lock:
            self.holders.pop(id(fetcher), None)

    def give(self, n: int) -> None:
        with self.lock:
            self.held -= n


_BUDGET = _Budget()


def take_read_ahead(n: int, limit: int, holder) -> bool:
    """Charge ``n`` bytes about to be fetched ahead to the process's budget, if there is room
    (``holder``: whose they are, see ``_Budget``); ``give_read_ahead`` gives them back."""
    return _BUDGET.take(n, limit, holder)


def give_read_ahead(n: int) -> None:
    _BUDGET.give(n)


def read_ahead_held() -> int:
    """Bytes this process has fetched ahead and not read yet (all fetchers together)."""
    return _BUDGET.held


def _after_fork_in_child() -> None:
    global _BUDGET
    _BUDGET = _Budget()


after_fork_in_child(_after_fork_in_child)


class BlockFetcher:
    """The stored bytes of the blocks of ``obj`` (a ``StoredObject``), block ``b`` being bytes
    ``offsets[b]..offsets[b + 1]``. ``shard`` names the shard in errors; ``cache``, a
    ``_diskcache.DiskCache`` (or None), is where blocks are looked for before a request and
    kept after one."""

    def __init__(
        self, obj, offsets, shard=None, cache=None, following=None, extent_blocks=0
    ) -> None:
        self.obj = obj
        self.shard = shard
        self.cache = cache
        self.extent_blocks = extent_blocks  # > 1: a block missed fetches its extent
        # Called (once a pass) when the read-ahead has asked for the last block: the object
        # read next (a dataset's next shard) starts its own.
        self._following = following
        self._offsets = [int(x) for x in offsets]
        self._n = len(self._offsets) - 1
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._ready: dict = {}  # block -> bytes, fetched and not read yet
        self._inflight: dict = {}  # block -> the _Run fetching it
        self._ahead: set = set()  # blocks of _ready/_inflight charged to _BUDGET (read-ahead)
        self._explicit: set = set()  # blocks of _ready/_inflight asked for by prefetch()
        self._extent: set = set()  # blocks of _ready/_inflight fetched with their extent
        self._runs = 0  # read-ahead requests in flight
        self._last = -2  # the block read last
        self._next_ahead = 0  # the first block the read-ahead has not asked for
        self._batch_end = None  # the block after the last block of the last batch
        self._followed = False  # _following called for the pass going on
        self._streak = 0  # blocks the pass going on has read in order

    def _here(self) -> None:
        if self._pid != os.getpid():
            # Forked: the parent's requests will never finish here, and its lock may be held.
            self._reset()

    # -- reading ---------------------------------------------------------------------------

    def get(self, b: int) -> bytes:
        """Block ``b``'s stored bytes: from what was fetched ahead or for a batch, else one
        request for exactly its bytes."""
        self._here()
        settings = self.obj.location.settings
        with self._lock:
            explicit = b in self._explicit or b in self._extent
            if explicit:
                self._explicit.discard(b)
            else:
                in_order = b == self._last + 1
                self._last = b
                self._streak = self._streak + 1 if in_order else 0
                if not in_order:
                    self._end_pass_lock_held(b)
            data = self._take_lock_held(b)
            run = None if data is not None else self._inflight.get(b)
            if not explicit and in_order:
                self._ahead_lock_held(b + 1, settings)
            if data is None and run is None and self.extent_blocks > 1:
                self._fetch_extents_lock_held([b], settings)
                self._explicit.discard(b)
                run = self._inflight.get(b)
        if data is not None:
            return data
        if run is not None:
            run.future.result()  # raises the request's error
            with self._lock:
                data = self._take_lock_held(b)
            if data is not None:
                return data
        return self._read([b], self._offsets[b], self._offsets[b + 1])

    def prefetch(self, blocks, hint: bool = False) -> None:
        """Fetch ``blocks`` (those not held or asked for yet), neighbours merged, concurrently;
        each is kept until ``get`` reads it. ``hint``: blocks a sampler reads next, in an
        order of its own: never taken for a batch of a pass in order. Read in extents, each
        block wanted is fetched with its extent (see ``_fetch_extents_lock_held``): a
        sampler's hint of its next window of extents fetches those extents."""
        self._here()
        settings = self.obj.location.settings
        with self._lock:
            asked = sorted(set(blocks))
            wanted = [b for b in asked if b not in self._ready and b not in self._inflight]
            self._explicit.update(asked)
            if wanted and self.extent_blocks > 1:
                self._fetch_extents_lock_held(wanted, settings)
            elif wanted:
                ranges = [(self._offsets[b], self._offsets[b + 1]) for b in wanted]
                for start, end, members in merge_ranges(
                    ranges, settings.request_bytes, settings.merge_gap
                ):
                    run = [wanted[k] for k in members]
                    self._submit_lock_held(run, start, end, settings, False)
            # Batches of a pass in order (each a run of blocks starting where the last one
            # ended, give or take a block: DataLoader workers take every other batch) read
            # ahead as a pass does; not a sampler's hints, nor batches read in extents (a
            # sampler's, fetched by extent, may look like that by chance).
            if asked and not hint and self.extent_blocks <= 1:
                end = self._batch_end
                contiguous = asked[-1] - asked[0] + 1 == len(asked)
                if contiguous and end is not None and end - 1 <= asked[0] <= end + 2:
                    self._streak += len(asked)
                    self._ahead_lock_held(asked[-1] + 1, settings)
                else:
                    self._streak = 0
                self._batch_end = asked[-1] + 1

    def start_pass(self, first: int = 0) -> None:
        """A pass in order is about to read from block ``first``: start its read-ahead now
        (unless this fetcher is being read already)."""
        self._here()
        settings = self.obj.location.settings
        with self._lock:
            done = self._last == -2 or self._last == self._n - 1  # no pass, or one finished
            if done and not self._inflight and not self._ready:
                self._last = first - 1
                self._ahead_lock_held(first, settings)

    def start_pass_with_head(self, head, end: int, reserved: int) -> None:
        """A pass in order starts at block 0, and the object's first bytes up to ``end`` were
        requested before its offsets were known (``head``: a future of them, clipped to the
        object's size; ``reserved``: the bytes of ``_BUDGET`` taken for it). The blocks it
        holds whole are taken from it when it arrives (a failed one is left for the reads,
        each block then read alone), and the read-ahead asks for the rest from the block it
        cuts (the part of that block it holds is fetched twice: less than a block a pass)."""
        self._here()
        settings = self.obj.location.settings
        offsets = self._offsets
        covered = bisect.bisect_right(offsets, end) - 1  # blocks 0..covered-1 end by ``end``
        blocks = list(range(min(max(covered, 0), self._n)))
        run = _Run()
        run.future = Future()
        pid = self._pid
        with self._lock:
            _BUDGET.give(reserved - (offsets[len(blocks)] - offsets[0]))
            run.charged = set(blocks)
            for k in blocks:
                self._inflight[k] = run
                self._ahead.add(k)
            if blocks:
                self._runs += 1
            self._last = -1
            self._ahead_lock_held(0, settings)
        if blocks:
            head.add_done_callback(lambda done: self._head_arrived(run, blocks, done, pid))

    def _head_arrived(self, run, blocks: list, head, pid: int) -> None:
        """``start_pass_with_head``'s request has answered: its blocks into ``_ready``."""
        data = None
        if not head.cancelled():
            try:
                data = head.result()
            except Exception:
                data = None  # each block is read alone, raising its error there
        view = None if data is None else memoryview(data)
        offsets = self._offsets
        with self._lock:
            if pid != self._pid:
                return
            self._runs -= 1
            for k in blocks:
                size = offsets[k + 1] - offsets[k]
                if self._inflight.get(k) is not run:
                    if k in run.charged:
                        _BUDGET.give(size)
                    continue
                del self._inflight[k]
                if view is not None and len(view) >= offsets[k + 1]:
                    self._ready[k] = bytes(view[offsets[k] : offsets[k + 1]])
                elif k in self._ahead or k in self._extent:
                    self._ahead.discard(k)
                    self._extent.discard(k)
                    _BUDGET.give(size)
        run.future.set_result(None)

    def close(self) -> None:
        """Drop what was fetched and not read (requests in flight are left to finish and
        their bytes dropped)."""
        self._here()
        with self._lock:
            self._end_pass_lock_held(-1)
            for b in list(self._ready):
                self._take_lock_held(b)
            for k, run in list(self._inflight.items()):
                self._drop_inflight_lock_held(k, run)
            self._explicit.clear()
            self._extent.clear()
            self._last = -2

    def _drop_ready_ahead(self) -> None:
        """Give back what was fetched ahead and is ready (another pass needs the room); skipped
        when another thread holds this fetcher's lock (its pass is active)."""
        if self._pid != os.getpid() or not self._lock.acquire(blocking=False):
            return
        try:
            for k in [k for k in self._ahead if k in self._ready]:
                self._take_lock_held(k)
            self._next_ahead = 0  # a pass going on asks again from where it reads
            self._followed = False
        finally:
            self._lock.release()

    def __del__(self) -> None:
        try:
            if self._pid == os.getpid():
                for k in [k for k in self._ahead | self._extent if k in self._ready]:
                    _BUDGET.give(len(self._ready[k]))
                _BUDGET.forget(self)
        except Exception:
            pass

    def held(self) -> tuple:
        """``(blocks ready, blocks in flight)``: for tests."""
        with self._lock:
            return len(self._ready), len(self._inflight)

    # -- internals (``_lock`` held) ----------------------------------------------------------

    def _drop_inflight_lock_held(self, k: int, run) -> None:
        """Forget block ``k`` of ``run`` (in flight): what it was charged is given back now,
        not when the request lands (a request may retry for its whole deadline)."""
        del self._inflight[k]
        if k in run.charged:
            run.charged.discard(k)
            _BUDGET.give(self._offsets[k + 1] - self._offsets[k])

    def _take_lock_held(self, b: int):
        data = self._ready.pop(b, None)
        if data is not None and (b in self._ahead or b in self._extent):
            self._ahead.discard(b)
            self._extent.discard(b)
            _BUDGET.give(len(data))
        return data

    def _fetch_extents_lock_held(self, wanted: list, settings) -> None:
        """Fetch the blocks ``wanted`` (none held or in flight) with the rest of their extents
        (those not held, in flight, or beyond the room left in ``_BUDGET``): one request per
        run of neighbours."""
        k = self.extent_blocks
        offsets = self._offsets
        wanted_set = set(wanted)
        extra: set = set()
        for e in sorted({b // k for b in wanted}):
            others = [
                x
                for x in range(e * k, min((e + 1) * k, self._n))
                if x not in wanted_set and x not in self._ready and x not in self._inflight
            ]
            size = sum(offsets[x + 1] - offsets[x] for x in others)
            if others and _BUDGET.take(size, settings.read_ahead_bytes, self):
                extra.update(others)
        blocks = sorted(wanted_set | extra)
        ranges = [(offsets[b], offsets[b + 1]) for b in blocks]
        limit = max(settings.request_bytes, offsets[min(k, self._n)] - offsets[0])
        for start, end, members in merge_ranges(ranges, limit, settings.merge_gap):
            run = [blocks[m] for m in members]
            charged = extra.intersection(run)
            self._extent.update(charged)
            self._submit_lock_held(run, start, end, settings, False, charged)

    def _end_pass_lock_held(self, b: int) -> None:
        """A read elsewhere than the next block: drop the read-ahead (not the batch blocks)."""
        self._followed = False
        if not self._ahead:
            self._next_ahead = 0
            return
        for k in list(self._ahead):
            if k == b:
                continue
            data = self._ready.pop(k, None)
            if data is not None:
                self._ahead.discard(k)
                _BUDGET.give(len(data))
            elif k in self._inflight:
                self._drop_inflight_lock_held(k, self._inflight[k])
                self._ahead.discard(k)
        self._next_ahead = 0

    def _ahead_lock_held(self, first: int, settings) -> None:
        """Ask for the blocks from ``first`` on, in requests of ``request_bytes``, within the
        limits of requests in flight and bytes held ahead."""
        b = max(first, self._next_ahead)
        offsets = self._offsets
        while b < self._n and self._runs < settings.requests_in_flight:
            if b in self._ready or b in self._inflight:
                b += 1
                continue
            limit = settings.request_bytes
            end = b + 1
            while (
                end < self._n
                and end not in self._ready
                and end not in self._inflight
                and offsets[end + 1] - offsets[b] <= limit
            ):
                end += 1
            size = offsets[end] - offsets[b]
            if not _BUDGET.take(size, settings.read_ahead_bytes, self):
                break
            self._submit_lock_held(list(range(b, end)), offsets[b], offsets[end], settings, True)
            b = end
        self._next_ahead = b
        # A pass that has read a few blocks in order (not one started by start_pass alone,
        # nor two blocks of random access that happened to be neighbours) starts the next.
        if b >= self._n and not self._followed and self._following is not None:
            if self._streak >= min(8, max(2, self._n // 2)):
                self._followed = True
                self._following()

    def _submit_lock_held(
        self, blocks: list, start: int, end: int, settings, ahead: bool, charged=()
    ):
        """Request ``blocks`` (bytes ``start..end``); ``ahead``: the read-ahead's, all charged
        to ``_BUDGET``; else ``charged``: those of them charged (fetched with their extent)."""
        run = _Run()
        run.charged = set(blocks) if ahead else set(charged)
        for k in blocks:
            self._inflight[k] = run
            if ahead:
                self._ahead.add(k)
        if ahead:
            self._runs += 1
        pool = fetch_pool(settings.requests_in_flight)
        run.future = pool.submit(self._fetch, run, blocks, start, end, ahead)

    def _fetch(self, run, blocks: list, start: int, end: int, ahead: bool) -> None:
        """One request (on the pool): blocks ``blocks``, bytes ``start..end``. Blocks dropped
        while it was in flight (``_inflight`` no longer names this run) are not kept."""
        pid = self._pid
        data = error = None
        try:
            data = self._read(blocks, start, end)
        except BaseException as exc:
            error = exc
        view = None if data is None else memoryview(data)
        with self._lock:
            if pid != self._pid:
                return
            if ahead:
                self._runs -= 1
            for k in blocks:
                size = self._offsets[k + 1] - self._offsets[k]
                if self._inflight.get(k) is not run:
                    if k in run.charged:  # dropped while in flight: charged, not kept
                        _BUDGET.give(size)
                    continue
                del self._inflight[k]
                if view is not None:
                    pos = self._offsets[k] - start
                    self._ready[k] = bytes(view[pos : pos + size])
                elif k in self._ahead or k in self._extent:
                    self._ahead.discard(k)
                    self._extent.discard(k)
                    _BUDGET.give(size)
        if error is not None:
            raise error

    def _read(self, blocks: list, start: int, end: int):
        """The bytes ``start..end`` holding ``blocks`` (ascending; with ``merge_gap``, not
        always consecutive): one request, or through the disk cache when there is one. Runs
        without ``_lock``."""
        if self.cache is None:
            return self.obj.read_range(start, end, shard=self.shard, block=blocks[0])
        data = self.cache.read(self.obj, self._offsets, blocks, self.shard)
        if len(data) == end - start:
            return data
        # The cache hands the blocks' bytes end to end: put each where the range has it (the
        # gaps between them, not asked for, are left as zeros and never read).
        offsets = self._offsets
        out = bytearray(end - start)
        pos = 0
        for b in blocks:
            size = offsets[b + 1] - offsets[b]
            out[offsets[b] - start : offsets[b + 1] - start] = data[pos : pos + size]
            pos += size
        return out


class _Run:
    """One request in flight: ``future`` completes once its blocks are in ``_ready``."""

    __slots__ = ("future", "charged")

    def __init__(self) -> None:
        self.future = None
        self.charged: set = set()  # its blocks whose bytes are counted in _BUDGET
