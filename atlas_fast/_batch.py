"""High-throughput reading shared by both backends: batches, read-ahead, a bounded block cache.

Built only on the backend core's primitives (``_block_bytes``, ``_unpickle``, ``_locate``, and
the ``_load_block`` hook), so it serves the pure-Python and the compiled core alike.

The block cache has two levels. The core keeps the last block it decoded and checks it first
(the hot path, ``ds[i]`` in order, never leaves the core). On a miss the core calls
``self._load_block(b)``, which ``ShardLoading`` overrides to consult a ``BlockCache``: an LRU
bounded by a number of blocks and/or by decoded bytes, shared by every shard of a dataset.

Decompression (which releases the GIL in both backends) runs on a small per-process thread
pool; unpickling stays on the calling thread. The pool is created on first use and dropped in
a forked child, whose copy has no threads, so DataLoader workers make their own.
"""

from __future__ import annotations

import operator
import os
import threading
import weakref
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor

from ._format import DATA_FILE

__all__ = ["BlockCache", "ShardLoading", "DatasetLoading", "pool_size", "READ_AHEAD"]

# Blocks decompressed ahead of the one being unpickled by ``__iter__`` (so up to
# READ_AHEAD + 1 decoded blocks are held per iterator). Enough that the pool never runs dry
# while this thread unpickles: with 2 cores, 100-document compressed blocks read 1.44x the
# sequential ``ds[i]`` loop with 8 ahead, 1.32x with 4, 1.18x with 2.
READ_AHEAD = 8


def pool_size() -> int:
    """Threads of the decompression pool: ``min(4, os.cpu_count())``."""
    return max(1, min(4, os.cpu_count() or 1))


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_caches: weakref.WeakSet = weakref.WeakSet()  # every BlockCache, to renew its lock after fork


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
    for cache in list(_caches):
        cache._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


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


# -- the block cache ------------------------------------------------------------------------


def check_cache_limits(cache_blocks, cache_bytes) -> None:
    """Refuse cache limits that are not positive integers (None: no limit of that kind)."""
    for name, value, minimum in (
        ("cache_blocks", cache_blocks, 1),
        ("cache_bytes", cache_bytes, 0),
    ):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int or None, not {type(value).__name__}")
        if value < minimum:
            raise ValueError(f"{name} must be at least {minimum}, not {value}")
    if cache_blocks is None and cache_bytes is None:
        raise ValueError("cache_blocks=None (no limit on blocks) needs a cache_bytes limit")


class BlockCache:
    """Decoded blocks, least recently used evicted first; thread-safe.

    Bounded by ``max_blocks`` blocks and/or ``max_bytes`` bytes of decoded pickle data (the
    size of a block's pickle stands for the memory its examples take); None: no bound of that
    kind. The most recent block is always kept, however large. Keys are
    ``(shard tag, block number)``. ``_lock`` guards ``_entries`` and ``_bytes``.
    """

    __slots__ = ("max_blocks", "max_bytes", "_entries", "_bytes", "_lock", "__weakref__")

    def __init__(self, max_blocks: int | None = 1, max_bytes: int | None = None) -> None:
        check_cache_limits(max_blocks, max_bytes)
        self.max_blocks = max_blocks
        self.max_bytes = max_bytes
        self._entries: OrderedDict = OrderedDict()  # key -> (examples, nbytes)
        self._bytes = 0
        self._lock = threading.Lock()
        _caches.add(self)

    def get(self, key):
        """The examples cached under ``key`` (now the most recent), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key, examples: list, nbytes: int) -> None:
        with self._lock:
            entries = self._entries
            old = entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            entries[key] = (examples, nbytes)
            self._bytes += nbytes
            max_blocks = self.max_blocks
            max_bytes = self.max_bytes
            while len(entries) > 1 and (
                (max_blocks is not None and len(entries) > max_blocks)
                or (max_bytes is not None and self._bytes > max_bytes)
            ):
                _, (_, size) = entries.popitem(last=False)
                self._bytes -= size

    def discard_tag(self, tag) -> None:
        """Drop every block of the shard tagged ``tag``."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == tag]:
                _, size = self._entries.pop(key)
                self._bytes -= size

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Decoded bytes of the blocks held."""
        return self._bytes

    def keys(self) -> list:
        with self._lock:
            return list(self._entries)


# -- batches and read-ahead -----------------------------------------------------------------


def _check_index(i, n: int) -> int:
    # Same rules and messages as the core's __getitem__.
    i = operator.index(i)
    if i < 0:
        i += n
        if i < 0:
            raise IndexError(f"index {i - n} out of range for {n} examples")
    elif i >= n:
        raise IndexError(f"index {i} out of range for {n} examples")
    return i


def _gather(shards: list, located: list) -> list:
    """The examples at ``located`` ((shard number, local index) pairs, already checked).

    Each block needed is decoded once: cached ones come from the cache, uncompressed ones are
    read here, compressed ones are decompressed in parallel and unpickled here. A decoded
    block gives its examples to the batch at once and is then let go (the cache keeps what
    it is sized for), so a batch of random indices holds only its own examples, not every
    block it touched.
    """
    out: list = [None] * len(located)
    sizes: dict = {}  # shard number -> block size, for the shards involved
    wanted: dict = {}  # (shard number, block) -> [(position in out, index in block)]
    for pos, (s, j) in enumerate(located):
        size = sizes.get(s)
        if size is None:
            size = sizes[s] = shards[s].metadata.block_size
        key = (s, j // size)
        places = wanted.get(key)
        if places is None:
            wanted[key] = [(pos, j % size)]
        else:
            places.append((pos, j % size))
    todo = []
    for key, places in wanted.items():
        shard = shards[key[0]]
        examples = shard._cached_block(key[1])
        if examples is None and not shard.metadata.compression_strategy:
            # Nothing to decompress: a thread would only add hand-offs (and the compiled
            # core unpickles straight from the mapping on this path).
            examples = shard._read_block(key[1])
        if examples is None:
            todo.append(key)
        else:
            for pos, k in places:
                out[pos] = examples[k]
    if len(todo) == 1:
        s, b = todo[0]
        _place(_decoded(shards[s], b, shards[s]._block_bytes(b)), wanted[todo[0]], out)
    elif todo:
        _decode_in_parallel(shards, todo, wanted, out)
    return out


def _place(examples: list, places: list, out: list) -> None:
    for pos, k in places:
        out[pos] = examples[k]


def _decoded(shard, b: int, data) -> list:
    examples = shard._unpickle(data, b)
    shard._remember_block(b, examples, len(data))
    return examples


def _decode_in_parallel(shards: list, todo: list, wanted: dict, out: list) -> None:
    """Decode the blocks ``todo`` and place their examples: decompress them all, then
    unpickle in order.

    The pool takes blocks from the front while this thread decompresses from the back, so
    every thread spends this phase mostly without the GIL. Unpickling while the pool still
    decompresses would hold the GIL for long runs and starve the pool threads, which need it
    briefly around each block and otherwise wait a whole switch interval for it.
    """
    futures = [_submit(shards[s]._block_bytes, b) for s, b in todo]
    data: list = [None] * len(todo)
    try:
        for k in range(len(todo) - 1, -1, -1):
            if futures[k].cancel():  # not started: decode it here
                s, b = todo[k]
                data[k] = shards[s]._block_bytes(b)
        for k, future in enumerate(futures):
            if data[k] is None:
                data[k] = future.result()
    finally:
        for future in futures:
            future.cancel()
    for k, (s, b) in enumerate(todo):
        _place(_decoded(shards[s], b, data[k]), wanted[(s, b)], out)
        data[k] = None


class _Ahead:
    """One block of the read-ahead: its future, or its bytes once decoded here."""

    __slots__ = ("shard", "b", "future", "data")

    def __init__(self, shard, b: int, on_pool: bool) -> None:
        self.shard = shard
        self.b = b
        self.data = None
        self.future = _submit(shard._block_bytes, b) if on_pool else _INLINE

    def steal(self) -> bool:
        """Decode here if the pool has not started; False if it has (or it is done)."""
        if self.data is None and self.future.cancel():
            self.data = self.shard._block_bytes(self.b)
            return True
        return False

    def result(self):
        if self.data is None and not self.steal():
            self.data = self.future.result()
        data, self.data = self.data, None
        return data


# Below this many stored bytes per block (on average), a pool hand-off costs about as much as
# the decompression it moves (measured: 8-document zstd blocks of ~4 KB read at 0.66x the
# ds[i] loop through the pool); such blocks are decoded on the calling thread.
POOL_MIN_BLOCK_BYTES = 16 * 1024


def _worth_the_pool(shard) -> bool:
    """Whether ``shard``'s blocks are worth decompressing on the pool: compressed, and large
    enough on average."""
    if not shard.metadata.compression_strategy:
        return False  # nothing to decompress
    blocks = _block_count(shard)
    try:
        stored = os.stat(shard.root / DATA_FILE).st_size
    except OSError:
        return True  # reading will report the problem
    return blocks > 0 and stored / blocks >= POOL_MIN_BLOCK_BYTES


def _read_ahead(blocks):
    """Every example of ``blocks`` ((shard, block number) pairs), in order.

    The next ``READ_AHEAD`` blocks are decompressed on the pool while one is unpickled and
    handed out. When the block needed has not started, this thread decodes it; when it is
    being decompressed, this thread waits (decompressing a later block here instead was
    measured slower: it leaves the pool short of work and the cores oversubscribed).
    Closing or dropping the generator cancels what has not started; nothing else outlives it.
    """
    pending: deque = deque()
    pooled: dict = {}  # id(shard) -> whether its blocks go to the pool
    blocks = iter(blocks)
    try:
        while True:
            while len(pending) <= READ_AHEAD:
                nxt = next(blocks, None)
                if nxt is None:
                    break
                shard = nxt[0]
                on_pool = pooled.get(id(shard))
                if on_pool is None:
                    on_pool = pooled[id(shard)] = _worth_the_pool(shard)
                pending.append(_Ahead(shard, nxt[1], on_pool))
            if not pending:
                return
            current = pending.popleft()
            examples = current.shard._unpickle(current.result(), current.b)
            yield from examples
    finally:
        for later in pending:
            later.future.cancel()


def _block_count(shard) -> int:
    return -(-len(shard) // shard.metadata.block_size)


# -- the mixins -----------------------------------------------------------------------------


def _decodes_directly(cls, cache: BlockCache) -> bool:
    """Whether the core may decode its misses itself, skipping the ``_load_block`` hook.

    Only when that changes nothing: a one-block cache keeps no block the core's own last
    block does not (so the default costs no Python call per block decoded), and the class
    overrides none of the hook, ``_block_bytes`` and ``_unpickle`` (checked when the reader
    is made: a class patched later is seen by readers made later).
    """
    if cache.max_blocks != 1 or cache.max_bytes is not None:
        return False
    core = next(c for c in cls.__mro__ if "_core_init" in vars(c))
    return (
        cls._load_block is ShardLoading._load_block
        and cls._block_bytes is core._block_bytes
        and cls._unpickle is core._unpickle
    )


class ShardLoading:
    """Batched reads, read-ahead iteration and the bounded block cache of a shard."""

    def _init_loading(self, cache_blocks, cache_bytes) -> None:
        self.cache_blocks = cache_blocks
        self.cache_bytes = cache_bytes
        self._block_cache = BlockCache(cache_blocks, cache_bytes)
        self._block_tag = 0
        self._direct_load = _decodes_directly(type(self), self._block_cache)

    def _share_block_cache(self, cache: BlockCache, tag) -> None:
        """Use ``cache`` (a dataset's, shared by its shards) under key prefix ``tag``."""
        self.cache_blocks = cache.max_blocks
        self.cache_bytes = cache.max_bytes
        self._block_cache = cache
        self._block_tag = tag
        self._direct_load = _decodes_directly(type(self), cache)

    def _load_block(self, b: int) -> list:
        # The core's miss path (its last block was not ``b``): the LRU, then decode.
        key = (self._block_tag, b)
        cache = self._block_cache
        examples = cache.get(key)
        if examples is None:
            data = self._block_bytes(b)
            examples = self._unpickle(data, b)
            cache.put(key, examples, len(data))
        return examples

    def _cached_block(self, b: int):
        return self._block_cache.get((self._block_tag, b))

    def _remember_block(self, b: int, examples: list, nbytes: int) -> None:
        self._block_cache.put((self._block_tag, b), examples, nbytes)

    def _forget_blocks(self) -> None:
        self._block_cache.discard_tag(self._block_tag)

    def __getitems__(self, indices) -> list:
        """The examples at ``indices``, in that order; each block needed is decoded once.

        What ``DataLoader`` calls with a whole batch. Indices follow ``shard[i]``'s rules and
        are all checked before anything is read. Blocks are decompressed in parallel.
        """
        n = len(self)
        located = [(0, _check_index(i, n)) for i in indices]
        return _gather([self], located)

    def __iter__(self):
        """Every example in order, the next blocks decompressing while one is handed out."""
        return _read_ahead((self, b) for b in range(_block_count(self)))


class DatasetLoading:
    """Batched reads, read-ahead iteration and the block cache of a dataset (all shards)."""

    def _init_loading(self, cache_blocks, cache_bytes) -> None:
        self.cache_blocks = cache_blocks
        self.cache_bytes = cache_bytes
        self._block_cache = BlockCache(cache_blocks, cache_bytes)
        for tag, shard in enumerate(self.shards):
            shard._share_block_cache(self._block_cache, tag)

    def __getitems__(self, indices) -> list:
        """The examples at ``indices``, in that order; each block needed is decoded once.

        What ``DataLoader`` calls with a whole batch. Indices follow ``ds[i]``'s rules and are
        all checked before anything is read. Blocks are decompressed in parallel.
        """
        locate = self._locate
        located = [locate(i) for i in indices]
        return _gather(self.shards, located)

    def __iter__(self):
        """Every example in order, the next blocks decompressing while one is handed out."""
        return _read_ahead((shard, b) for shard in self.shards for b in range(_block_count(shard)))
