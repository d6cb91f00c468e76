"""The decompression pool both cores share (batches, ``gather``; hints, ``decode_on_pool``),
and the Python backend's pass in order (``read_in_order``).

Part of the core side of the contract (``_contract``): called by the cores only, never by the
facade. It works on a core's shard readers through their core-internal methods ``_lookup(b)``
(the cached examples of block ``b``, or None, counted as a hit or a miss), ``_held(b)`` (the
same for ``iter``, which reads a block the cache holds only as its pickle, or remembers, whole
as a hit), ``_ahead(b)`` (the examples of block ``b`` if it was decoded ahead, now cached, or
None), ``_store(b, data)`` (unpickle decoded bytes, check and cache them), ``_pass_block(b,
data)`` (the same, cached as a pass in order keeps its blocks), ``_load(b)`` (a block stored
uncompressed, read and cached, not counted again) and ``_block_bytes``.

Decompression (which releases the GIL in both backends) runs on a small per-process thread
pool; unpickling stays on the calling thread. The pool is created on first use and dropped in
a forked child, whose copy has no threads, so DataLoader workers make their own.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from .._fork import after_fork_in_child
from .._format import DATA_FILE

__all__ = ["gather", "read_in_order", "decode_on_pool", "worth_the_pool", "pool_size", "READ_AHEAD"]

# Blocks ahead of the one being read at which ``read_in_order`` warms a remote shard.
READ_AHEAD = 8


def pool_size() -> int:
    """Threads of the decompression pool: ``min(4, os.cpu_count())``."""
    return max(1, min(4, os.cpu_count() or 1))


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _thread_pool() -> ThreadPoolExecutor:
    global _pool
    pool = _pool
    if pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(pool_size(), thread_name_prefix="atlas_fast")
            pool = _pool
    return pool


def _after_fork_in_child() -> None:
    # The parent's pool threads do not exist here, and a lock may have been held by one of
    # them at fork time: start from nothing (the executor module forgets its threads itself).
    global _pool, _pool_lock
    _pool = None
    _pool_lock = threading.Lock()


after_fork_in_child(_after_fork_in_child)


# -- the pool -------------------------------------------------------------------------------


class _Inline:
    """A finished "future" for work done on the calling thread."""

    __slots__ = ()

    def cancel(self) -> bool:
        return True

    def done(self) -> bool:
        return False


_INLINE = _Inline()


def _submit(fn, *args):
    """``fn(*args)`` on the pool, or a marker telling the caller to run it itself."""
    try:
        return _thread_pool().submit(fn, *args)
    except RuntimeError:  # the interpreter is shutting down: no new threads
        return _INLINE


# -- batches --------------------------------------------------------------------------------


def gather(reader_of, located: list) -> list:
    """The examples at ``located`` ((shard number, local index) pairs, already checked).

    ``reader_of(s)`` is shard ``s``'s reader. Each block needed is looked up once in the
    cache; uncompressed misses are read here, compressed ones decompressed in parallel and
    unpickled here, and every decoded block is cached.
    """
    out: list = [None] * len(located)
    readers: dict = {}  # shard number -> (reader, block size)
    wanted: dict = {}  # (shard number, block) -> [(position in out, index in block)]
    for pos, (s, j) in enumerate(located):
        known = readers.get(s)
        if known is None:
            reader = reader_of(s)
            known = readers[s] = (reader, reader._block_size)
        size = known[1]
        key = (s, j // size)
        places = wanted.get(key)
        if places is None:
            wanted[key] = [(pos, j % size)]
        else:
            places.append((pos, j % size))
    # Every distinct block is looked up before any is loaded: one hit or miss each, for what
    # the cache held when the batch began (a load cannot evict a block the batch looks up
    # later), and the remote misses are asked for together (``_prefetch``).
    missed = []
    for key, places in wanted.items():
        reader = readers[key[0]][0]
        examples = reader._lookup(key[1])
        if examples is None:
            missed.append((reader, key))
        else:
            _place(examples, places, out)
    _prefetch(missed)
    # The misses, in the order the batch first reads them: decoded ahead (``prefetch``),
    # read here (stored uncompressed: nothing to decompress; or too small for a pool
    # hand-off), or left for the pool, whose blocks are cached last.
    todo = []
    pooled: dict = {}  # shard number -> whether its blocks go to the pool
    for reader, key in missed:
        examples = reader._ahead(key[1])
        if examples is None:
            if not reader._compressed:
                examples = reader._load(key[1])
            else:
                on_pool = pooled.get(key[0])
                if on_pool is None:
                    on_pool = pooled[key[0]] = worth_the_pool(reader)
                if not on_pool:
                    examples = reader._store(key[1], reader._block_bytes(key[1]))
        if examples is None:
            todo.append((reader, key))
        else:
            _place(examples, wanted[key], out)
    if len(todo) == 1:
        reader, key = todo[0]
        _place(reader._store(key[1], reader._block_bytes(key[1])), wanted[key], out)
    elif todo:
        _decode_in_parallel(todo, wanted, out)
    return out


def _prefetch(missed: list) -> None:
    """Ask the remote shards among ``missed`` for their blocks at once: neighbours merged into
    large requests, made concurrently, while the blocks are decoded in order."""
    blocks: dict = {}
    for reader, key in missed:
        if reader._source is not None:
            blocks.setdefault(id(reader), (reader, []))[1].append(key[1])
    for reader, wanted in blocks.values():
        reader._source.prefetch(wanted)


def _place(examples: list, places: list, out: list) -> None:
    for pos, k in places:
        out[pos] = examples[k]


def _decode_in_parallel(todo: list, wanted: dict, out: list) -> None:
    """Decode the blocks ``todo`` and place their examples, a few blocks at a time.

    A chunk of ``2 * pool_size()`` blocks is decompressed (the pool takes blocks from the
    front while this thread decompresses from the back, so every thread spends this phase
    mostly without the GIL), then unpickled in order. Unpickling while the pool still
    decompresses would hold the GIL for long runs and starve the pool threads. Chunks bound
    the decompressed bytes alive at once: a batch of random indices touches a block per
    index, and holding them all would grow the heap by the whole batch's decoded size.
    """
    step = 2 * pool_size()
    for first in range(0, len(todo), step):
        chunk = todo[first : first + step]
        futures = [_submit(reader._block_bytes, key[1]) for reader, key in chunk]
        data: list = [None] * len(chunk)
        try:
            for k in range(len(chunk) - 1, -1, -1):
                if futures[k].cancel():  # not started: decode it here
                    reader, key = chunk[k]
                    data[k] = reader._block_bytes(key[1])
            for k, future in enumerate(futures):
                if data[k] is None:
                    data[k] = future.result()
        finally:
            for future in futures:
                future.cancel()
        for k, (reader, key) in enumerate(chunk):
            _place(reader._store(key[1], data[k]), wanted[key], out)
            data[k] = None


# -- read-ahead -----------------------------------------------------------------------------


# Below this many stored bytes per block (on average), a pool hand-off costs about as much as
# the decompression it moves: such blocks are decoded on the calling thread.
POOL_MIN_BLOCK_BYTES = 16 * 1024


def worth_the_pool(reader) -> bool:
    """Whether ``reader``'s blocks are worth decompressing on the pool: compressed, and
    large enough on average."""
    if not reader._compressed or reader._source is not None:
        # A remote shard's blocks arrive in order from its own read-ahead (storage): decoded
        # on the calling thread, in order, so that the read-ahead sees a pass in order.
        return False
    blocks = reader._n_blocks
    try:
        stored = os.stat(os.path.join(reader._root, DATA_FILE)).st_size
    except OSError:
        return True  # reading will report the problem
    return blocks > 0 and stored / blocks >= POOL_MIN_BLOCK_BYTES


def decode_on_pool(reader, b: int):
    """A future of ``reader._block_bytes(b)`` decoded on the pool, or None when the pool takes
    no more work (the Python core's ``prefetch``, for a reader ``worth_the_pool``)."""
    future = _submit(reader._block_bytes, b)
    return None if future is _INLINE else future


def read_in_order(blocks):
    """Every example of ``blocks`` ((reader, block number) pairs), in order (the Python
    backend's ``iter``; the compiled backend reads ahead on its own C thread, see
    src/_readahead.pxi).

    Each block is decoded on the calling thread when the pass reaches it. Not on the pool:
    a block decoded there while this thread unpickles the one before waits for the GIL that
    unpickling holds, so the two overlap little, and the hand-off costs more CPU time than
    the overlap saves. A remote shard is warmed (its files requested) ``READ_AHEAD`` blocks
    before the pass reaches it. Blocks found in the cache are used; blocks decoded here are
    added to it only as a pass in order adds them (see ``_contract``).
    """
    pending: deque = deque()
    blocks = iter(blocks)
    while True:
        while len(pending) <= READ_AHEAD:
            nxt = next(blocks, None)
            if nxt is None:
                break
            if nxt[0]._source is not None and nxt[1] == 0:
                nxt[0]._source.warm()  # a remote shard this pass reaches soon
            pending.append(nxt)
        if not pending:
            return
        reader, b = pending.popleft()
        examples = reader._held(b)
        if examples is None:
            # Cached only as a pass in order keeps its blocks (into a budget the user set,
            # while it has room): evicting blocks others keep, or holding blocks the pass
            # will not read again, would cost more than it saves.
            examples = reader._pass_block(b, reader._block_bytes(b))
        yield from examples
