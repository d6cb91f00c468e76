"""The pure-Python backend: the core of reading blocks, in plain Python.

This module and the compiled ``atlas_fast._core._reader`` implement the same contract
(``atlas_fast._contract``) with the same behaviour; the facade picks one at import
(``atlas_fast.BACKEND``). What both share above the hot path (opening a shard, batches,
read-ahead) lives in ``_pool`` and ``_shards``; metadata and error wording in ``_format``.

Errors as the compiled core words them: a short read of data.bin is ``truncated_block_error``; a
zstd frame whose header declares its size is decoded in one call and checked
(``check_zstd_content_size`` first); one without a recorded size is streamed, never past
``max_block_bytes()``; a truncated frame is "<where>: the zstd frame is truncated", bytes after the
frame "<where>: N bytes follow the zstd frame" (where = "<data.bin>: block <b>"), a frame of another
dictionary ``zstd_dictionary_mismatch``, any other zstd failure ``corrupt_frame_error``; an
exception from ``loads`` through ``unpickle_error``; a result that is not a list of
``expected_block_length`` examples through ``check_block_examples``.

Invariants: a core is safe to call from several threads (at method level) and in a forked
child whatever the parent did; it holds no file descriptor between calls except through the
process-wide, bounded ``_FilePool``.
"""

from __future__ import annotations

import os
import pickle
import threading
import weakref
from bisect import bisect_right
from collections import OrderedDict

import zstandard

from .._compat import freeze_in_worker
from .._contract import (
    DEFAULT_CACHE_BYTES,
    CacheInfo,
    block_number,
    hinted_readers,
    normalize_index,
    run_start,
)
from .._errors import AtlasFormatError
from .._fork import after_fork_in_child, started_result
from .._format import (
    MAX_ZSTD_RATIO,
    check_block_examples,
    check_zstd_content_size,
    corrupt_frame_error,
    expected_block_length,
    max_block_bytes,
    truncated_block_error,
    unpickle_error,
    widened_shard_dir,
    zstd_dictionary_mismatch,
)
from ._objsize import ChargeMeter
from ._pickle_scan_py import find_unbounded, unbounded_error
from ._pool import decode_on_pool, gather, read_in_order, worth_the_pool
from ._shards import ShardOpener, open_files, renamed_root, shard_layout
from ._tokens_py import block_token_stats, gather_tokens, token_pieces

# What CoreModule (atlas_fast._contract) declares
__all__ = ["BACKEND", "BlockCache", "DatasetCore", "ShardCore", "ZstdDict", "zstd_library"]
__all__ += ["block_token_stats", "gather_tokens", "token_pieces"]

BACKEND = "python"

# Input fed per step to a zstd frame without a recorded size (at most STREAM_STEP *
# MAX_ZSTD_RATIO bytes of output each); the compiled core's C_CONSTANTS mirror it.
STREAM_STEP = 4096


def zstd_library() -> dict:
    """Which libzstd this backend decompresses with."""
    return {
        "backend": BACKEND,
        "path": getattr(zstandard, "__file__", None),
        "version": zstandard.ZSTD_VERSION and ".".join(map(str, zstandard.ZSTD_VERSION)),
        "binding": f"python-zstandard {zstandard.__version__} ({zstandard.backend})",
    }


def read_at(fd: int, size: int, offset: int) -> bytes:
    """Up to ``size`` bytes of ``fd`` from ``offset`` (fewer only at the end of the file).

    ``os.pread`` where it exists (no shared file offset); elsewhere (Windows) a seek and a
    read, which the caller serialises. Loops, since one call returns at most ~2 GiB.
    """
    if _pread is None:
        os.lseek(fd, offset, os.SEEK_SET)
    parts = []
    while size > 0:
        part = os.read(fd, size) if _pread is None else _pread(fd, size, offset)
        if not part:
            break
        parts.append(part)
        size -= len(part)
        offset += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


_pread = getattr(os, "pread", None)
_frame_content_size = zstandard.frame_content_size


class _FilePool:
    """Open data.bin descriptors, at most ``limit`` at once, least recently used closed first.

    Reads are ``os.pread`` (no shared file offset, so forked children read correctly; where
    there is no pread, a seek and a read). ``_lock`` is held from looking a descriptor up until
    its read returns, so a descriptor is never closed (and its number reused for another file)
    under a reader, and no two reads move one file offset.
    """

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def pread(self, path: str, size: int, offset: int) -> bytes:
        with self._lock:
            fds = self._fds
            fd = fds.get(path)
            if fd is None:
                fd = self._open_lock_held(path)
            else:
                fds.move_to_end(path)
            if _pread is None:
                return read_at(fd, size, offset)
            data = _pread(fd, size, offset)  # all of it but at the end of the file, or past 2 GiB
            if len(data) == size or not data:
                return data
            return data + read_at(fd, size - len(data), offset + len(data))

    def _open_lock_held(self, path: str) -> int:
        while len(self._fds) >= self.limit:
            _, old = self._fds.popitem(last=False)
            os.close(old)
        flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            # Closed by this pool, then an append widened the shard names: the same file
            # (hard-linked) in the shard's renamed folder.
            moved = widened_shard_dir(os.path.dirname(path))
            if moved is None:
                raise
            fd = os.open(os.path.join(moved, os.path.basename(path)), flags)
        self._fds[path] = fd
        return fd

    def forget(self, path: str) -> None:
        with self._lock:
            fd = self._fds.pop(path, None)
            if fd is not None:
                os.close(fd)

    def open_count(self) -> int:
        return len(self._fds)

    def _after_fork_in_child(self) -> None:
        # The parent's lock may have been held by another thread at fork time.
        self._lock = threading.Lock()


_files = _FilePool()

# Bumped in a forked child: a shard's lock from an older generation may have been held by a
# parent thread that does not exist in the child, so the shard replaces it on next use.
_generation = [0]
# Blocks a reader decodes ahead on the pool for prefetch() at most (as the compiled core's
# read-ahead holds at most 16 jobs).
_AHEAD_JOBS = 16
_caches: weakref.WeakSet = weakref.WeakSet()  # every BlockCache, to renew its lock after fork
# A reader's _hot when no block is (its hot path serves nothing).
_COLD = (0, 0, None)
# What a block remembered only (ShardCore._miss) is charged: about what its entry takes (the
# _Entry, its key, its place in the cache's dict), so that a budget in bytes bounds them too.
_REMEMBERED_BYTES = 256
# A block read at random and remembered only, or left by a pass in order, is kept as the
# cache's spare (BlockCache._keep_spare_lock_held) if it decodes to at least this many bytes.
# Freeing a smaller block at once is cheaper: its memory is reused warm by the next decode
# (blobs of 1.6 MB blocks: 0.89x with a spare; of 10 MB blocks, freed at once: 0.26x, the heap
# trimmed and faulted in again at each read).
SPARE_MIN_BYTES = 4 << 20
# True until this process decodes its first block, and again in a forked child: that decode
# calls _compat.freeze_in_worker first (see there).
_first_decode = [True]


def _after_fork_in_child() -> None:
    _files._after_fork_in_child()
    _generation[0] += 1
    _first_decode[0] = True
    for cache in list(_caches):
        cache._lock = threading.Lock()


after_fork_in_child(_after_fork_in_child)


class ZstdDict:
    """A zstd dictionary, digested once (python-zstandard keeps the digested form)."""

    __slots__ = ("path", "_dict", "__weakref__")

    def __init__(self, data: bytes, path: str) -> None:
        self.path = path
        self._dict = zstandard.ZstdCompressionDict(bytes(data))
        # Digest it now: a corrupt dictionary must fail here (the caller names the file),
        # not later inside some block read.
        zstandard.ZstdDecompressor(dict_data=self._dict)


class _ThreadState(threading.local):
    dctx = None
    zdict = None  # the ZstdDict that dctx was made for


class _Entry:
    """A cached block: ``examples`` the unpickled list (None once dropped, and for a block
    remembered only, see ``ShardCore._miss``), ``nbytes`` what the block counts against the
    budget, ``live`` whether the cache still holds it (a reader's last entry may outlive it),
    ``for_pass`` whether it is held only for the pass in order reading it, until the pass
    moves on (``BlockCache._forget``), ``decoded`` the size of its decoded pickle (0 where
    unknown)."""

    __slots__ = ("key", "block", "examples", "nbytes", "live", "for_pass", "decoded")

    def __init__(
        self, key, block: int, examples, nbytes: int, for_pass: bool = False, decoded: int = 0
    ) -> None:
        self.key = key
        self.block = block
        self.examples = examples
        self.nbytes = nbytes
        self.live = True
        self.for_pass = for_pass
        self.decoded = decoded


class BlockCache:
    """Decoded blocks, least recently used evicted first (see ``atlas_fast._contract``).

    ``_lock`` guards ``_entries`` (key -> _Entry, least recently used first) and the counts,
    with one exception, the readers' hot path (their ``__getitem__``): a hit on ``_newest``
    (the entry last used or put, None when unknown; only ever set under the lock) changes no
    order, so the reader reads ``entry.examples`` and counts the hit without the lock. The
    count is a statistic that nothing decides by; the lock costs more than the rest of a hit.
    Readers also test ``key in _entries`` without it (one call, a hint of what to read).
    """

    def __init__(self, max_bytes=None, max_blocks=None, passes_fill=True) -> None:
        self.max_bytes = max_bytes
        self.max_blocks = max_blocks
        self.passes_fill = passes_fill  # passes in order keep their blocks while there is room
        self._for_pass = 0  # live entries held for a pass (_Entry.for_pass)
        self._reserved = 1
        self._entries: OrderedDict = OrderedDict()
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._newest = None
        # (key, examples, decoded bytes) of the block a random read last decoded and did not hold
        # (ShardCore._miss), or of the compressed block a pass in order last dropped
        # (_forget), or None: see _keep_spare_lock_held.
        self._spare = None
        self._meter = ChargeMeter()  # what a block is charged (atlas_fast._core._objsize)
        self._lock = threading.Lock()
        _caches.add(self)

    def cache_info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(
                self._hits,
                self._misses,
                self.max_bytes,
                self._bytes,
                len(self._entries),
                self.max_blocks,
            )

    @property
    def reserved(self) -> int:
        return self._reserved

    def reserve(self, blocks: int) -> None:
        with self._lock:
            self._reserved = max(self._reserved, int(blocks))

    def keys(self) -> list:
        with self._lock:
            return list(self._entries)

    def _touch(self, entry: _Entry) -> None:
        """A hit on ``entry``, read by a reader's hot path while not ``_newest``: now the most
        recent, unless it was evicted since its examples were read (the hit stands)."""
        with self._lock:
            self._hits += 1
            if entry.live:
                self._entries.move_to_end(entry.key)
                self._newest = entry

    def _get(self, key) -> tuple:
        """``(entry, examples)`` for ``key`` (now the most recent), or (None, None); counted."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.examples is None:
                self._misses += 1
                return None, None
            self._hits += 1
            self._entries.move_to_end(key)
            self._newest = entry
            return entry, entry.examples

    def _find(self, key) -> tuple:
        """``(entry, examples)`` for ``key``: the block held whole, or remembered only
        (examples None), a hit (now the most recent); ``(None, None)``, a miss. Counted as
        the compiled core counts its blocks held as their pickle."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._misses += 1
                return None, None
            self._hits += 1
            self._entries.move_to_end(key)
            self._newest = entry
            return entry, entry.examples

    def _remember(self, key, block: int) -> _Entry:
        """A miss on block ``key``, counted, that is remembered, not held (``ShardCore._miss``):
        an entry without examples, charged ``_REMEMBERED_BYTES``; an entry already there
        wins."""
        dropped = []
        with self._lock:
            self._misses += 1
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(key, block, None, _REMEMBERED_BYTES)
                self._newest = entry
                self._bytes += _REMEMBERED_BYTES
                self._evict_lock_held(dropped, entry)
        return entry

    def _set_spare(self, key, examples: list, decoded: int) -> None:
        """Keep ``examples``, block ``key`` remembered only (``ShardCore._miss``), as the
        spare (``_keep_spare_lock_held``). A read of it again decodes nothing
        (``_hold_spare``)."""
        dropped = []
        with self._lock:
            self._keep_spare_lock_held(key, examples, decoded, dropped)

    def _keep_spare_lock_held(self, key, examples: list, decoded: int, dropped: list) -> None:
        """Keep ``examples`` of block ``key``, which the cache does not hold, alive until this
        cache's next block is decoded (``ShardCore._unpickle``), ``clear`` or ``_discard``,
        if the block decodes to ``SPARE_MIN_BYTES`` or more: one block at most, beyond the
        budget, as the reference keeps the block it read last. Freeing a large block the
        moment it is done with hands its memory back to the system (the heap's top is
        trimmed), and the next block's read faults it all in again; freed after the next
        block is decoded, it is reused. The spare it replaces goes to ``dropped``, freed by
        the caller once the lock is let go. Under the lock, so that a ``clear()`` on another
        thread comes wholly before or after it."""
        if decoded >= SPARE_MIN_BYTES:
            dropped.append(self._spare)
            self._spare = (key, examples, decoded)

    def _release_spare(self) -> None:
        """A block was decoded: the spare's memory can go (see ``_keep_spare_lock_held``)."""
        self._spare = None

    def _hold_spare(self, key, b: int):
        """If block ``key`` is the spare, put it in the cache as ``_put`` does, without
        decoding it again: ``(entry, examples)``; else None."""
        spare = self._spare
        if spare is None or spare[0] != key:
            return None
        return self._put(key, b, spare[1], spare[2])

    def partial_keys(self) -> list:
        """``(tag, block)`` of the blocks remembered only (the compiled core's: held as their
        pickle only), least recently used first."""
        with self._lock:
            return [key for key, entry in self._entries.items() if entry.examples is None]

    def _put(self, key, block: int, examples: list, nbytes: int, for_pass: bool = False) -> tuple:
        """Cache ``examples`` (a pickle of ``nbytes``), charged what the meter says: ``(entry,
        examples)``; an entry already there (another thread's) wins. ``for_pass``: the block a
        pass in order reads, held for it until it moves on (``_forget``); it evicts only
        blocks held for passes (``_evict_lock_held``)."""
        decoded = nbytes
        nbytes = self._meter.charge(examples, nbytes)
        dropped = []
        with self._lock:
            entries = self._entries
            entry = entries.get(key)
            if entry is not None and entry.examples is not None:
                entries.move_to_end(key)
                self._newest = entry
                return entry, entry.examples
            if entry is not None:
                self._drop_lock_held(entry, dropped)
            entry = _Entry(key, block, examples, nbytes, for_pass, decoded)
            entries[key] = entry
            self._newest = entry
            self._bytes += nbytes
            self._for_pass += for_pass
            self._evict_lock_held(dropped, entry)
        return entry, examples

    def _keep_passed(self, key, block: int, examples: list, nbytes: int) -> None:
        """A block that ``iter`` read (a pass in order): cached only if passes fill this cache
        and it has room for the block (nothing is evicted for it)."""
        if not self.passes_fill:
            return
        nbytes = self._meter.charge(examples, nbytes)
        with self._lock:
            if key not in self._entries and self._has_room_lock_held(nbytes):
                entry = self._entries[key] = _Entry(key, block, examples, nbytes)
                self._newest = entry
                self._bytes += nbytes

    def _has_room_lock_held(self, nbytes: int) -> bool:
        """Whether one more block charged ``nbytes`` fits the budget without evicting."""
        max_bytes, max_blocks = self.max_bytes, self.max_blocks
        return (max_bytes is None or self._bytes + nbytes <= max_bytes) and (
            max_blocks is None or len(self._entries) < max_blocks
        )

    def _forget(self, entry: _Entry, spare: bool = False) -> None:
        """``entry`` is the block a pass in order (``ds[i]``) is done with. Held for the pass
        only (not a block others put here): kept if passes fill this cache and it has room
        for the pass's next block (of about ``entry``'s size), as ``_keep_passed`` keeps a
        block of ``iter``, else dropped. ``spare`` (a compressed shard's block): dropped as the
        spare (``_keep_spare_lock_held``: if it decoded to ``SPARE_MIN_BYTES`` or more), so
        that its memory is freed once the pass's next block is decoded and reused by the one
        after (blobs of 10 MB zstd blocks, a pass in order: 0.7x the reference freed now,
        0.85-1.0x as the spare). Read again, such a block is decoded again. An uncompressed block is
        dropped now: there, keeping it measured no faster."""
        dropped = []
        with self._lock:
            if not (entry.live and entry.for_pass):
                return
            if self.passes_fill and self._has_room_lock_held(entry.nbytes):
                entry.for_pass = False  # kept: a block of the cache like any other from now on
                self._for_pass -= 1
                return
            self._drop_lock_held(entry, dropped)
            if spare:
                self._keep_spare_lock_held(entry.key, dropped[0], entry.decoded, dropped)

    def _evict_lock_held(self, dropped: list, newest: _Entry | None = None) -> None:
        """Evict down to the budget, least recently used first; after ``newest``, a block held
        for a pass (``for_pass``), only other such blocks (a pass evicts nothing else: the
        cache may hold that one block over budget)."""
        entries = self._entries
        max_bytes = self.max_bytes
        max_blocks = self.max_blocks
        while len(entries) > self._reserved and (
            (max_bytes is not None and self._bytes > max_bytes)
            or (max_blocks is not None and len(entries) > max_blocks)
        ):
            if newest is None or not newest.for_pass:
                victim = next(iter(entries.values()))
            elif self._for_pass > 1:
                victim = next(e for e in entries.values() if e.for_pass and e is not newest)
            else:
                break
            self._drop_lock_held(victim, dropped)

    def _drop_lock_held(self, entry: _Entry, dropped: list) -> None:
        # Dropped entries are freed by the caller once the lock is released: freeing
        # examples may run arbitrary code.
        del self._entries[entry.key]
        if self._newest is entry:
            self._newest = None
        self._bytes -= entry.nbytes
        self._for_pass -= entry.for_pass
        entry.live = False
        dropped.append(entry.examples)
        entry.examples = None

    def _discard(self, tag) -> None:
        """Drop every block of the reader tagged ``tag``."""
        dropped = []
        with self._lock:
            spare = self._spare
            if spare is not None and spare[0][0] == tag:
                self._spare = None
            for entry in [e for e in self._entries.values() if e.key[0] == tag]:
                self._drop_lock_held(entry, dropped)

    def clear(self) -> None:
        dropped = []
        with self._lock:
            dropped.append(self._spare)
            self._spare = None
            for entry in list(self._entries.values()):
                self._drop_lock_held(entry, dropped)


class _CacheReader:
    """What both cores' classes share: the ``BlockCache`` they read through (``_cache``)."""

    def cache_info(self) -> CacheInfo:
        return self._cache.cache_info()

    def cache_reserve(self, blocks: int) -> None:
        self._cache.reserve(blocks)


class ShardCore(_CacheReader):
    """Reads the blocks of one shard (the pure-Python core)."""

    def __init__(
        self, root, metadata, dict_bytes=None, loads=pickle.loads, cache=None, tag=0, source=None
    ):
        (
            self._root,
            self._data_path,
            self._n,
            self._block_size,
            self._n_blocks,
            self._compressed,
        ) = shard_layout(root, metadata, dict_bytes)
        self._metadata = metadata
        self._dict_bytes = dict_bytes
        self._loads = loads
        self._cache = BlockCache(DEFAULT_CACHE_BYTES, None, False) if cache is None else cache
        self._tag = tag
        # A remote shard's storage._dataset.ShardSource (None: the local files under _root).
        self._source = source
        self._last = None  # the _Entry of the block last read
        # (first example, end, _Entry) of the block last read, for __getitem__'s hits: one
        # tuple, replaced whole; _COLD (nothing) after prefetch() and close().
        self._hot = _COLD
        self._next = -1  # the example after the one __getitem__ read last
        self._run_next = 0  # where the last batch of a pass in order (run_start) ended
        # (offsets, zdict, positions): set by _opened_files under the lock, replaced whole, so
        # a reader never pairs one opening's offsets with another's dictionary; positions are
        # the offsets as a memoryview, whose items are ints (a numpy item costs 5 times more).
        self._opened = None
        self._open_lock = threading.Lock()
        self._lock_generation = _generation[0]
        self._tls = _ThreadState()
        # prefetch(): the blocks named and not queued yet (None: none), and the blocks being
        # decoded ahead on the pool (block -> future), both of fork generation _ahead_generation.
        self._hints = None
        self._jobs: dict = {}
        self._ahead_generation = _generation[0]
        self._pooled = None  # whether this shard's blocks are worth the pool (found on first use)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        # The hot path: an example of the block last read (see BlockCache on the count).
        lo, end, entry = self._hot
        if type(i) is int and lo <= i < end:
            examples = entry.examples
            if examples is not None:
                cache = self._cache
                if cache._newest is entry:
                    cache._hits += 1
                else:
                    cache._touch(entry)
                self._next = i + 1
                return examples[i - lo]
        return self._read(normalize_index(i, self._n))

    def _read(self, k: int):
        """Example ``k`` (``0 <= k < len``), when ``__getitem__``'s hot path has not served it."""
        if self._hints is not None:
            self._queue_hints()
        size = self._block_size
        b = k // size
        entry = self._last
        examples = None
        if entry is not None and entry.block == b:
            examples = entry.examples
            if examples is not None:
                self._cache._touch(entry)
                self._hot = (b * size, min(b * size + size, self._n), entry)
        if examples is None:
            in_order = (
                k == self._next and k == b * size and entry is not None and entry.block == b - 1
            )
            if in_order:
                # A pass in order is done with block b - 1 (_forget: kept only if passes
                # fill the cache and it has room).
                self._cache._forget(entry, self._compressed)
            elif k and (entry is None or entry.block != b - 1):
                self._next = k + 1
                return self._miss(b, k - b * size)
            # The shard's first example is read as the start of a pass in order.
            examples = self._examples(b, in_order or k == 0)
        self._next = k + 1
        return examples[k - b * size]

    def _miss(self, b: int, j: int):
        """Example ``j`` of block ``b``, read at random (``_read``: not the shard's first
        example, nor in the block after the one read last).

        Pure Python has no partial decoding: the block is decoded and unpickled whole for
        example ``j``. When the cache neither holds nor remembers it, and prefetch() did not
        name it, it is remembered, not held, so that reads of blocks that are not read again
        (a dataset larger than the cache) fill no memory: its examples are kept only until
        the next block is decoded, if it is large (``BlockCache._set_spare``), as the
        reference keeps the block it read last. Read again, it is held whole (``_examples``).
        Which blocks are remembered, held and evicted, and the counts, are the compiled
        core's, whose partial decoding holds such a block as its pickle.
        """
        key = (self._tag, b)
        if self._jobs or key in self._cache._entries:  # held, remembered, or decoded ahead
            return self._examples(b)[j]
        data = self._decoded(b)
        examples = self._unpickle(data, b)
        self._cache._set_spare(key, examples, len(data))
        self._last = self._cache._remember(key, b)
        return examples[j]

    def _enter_pass(self):
        """Example 0, read by a pass in order coming from the shard before (DatasetCore)."""
        self._next = 1
        return self._examples(0, True)[0]

    def _leave_pass(self) -> None:
        """A pass in order moves on from this shard to the next: done with its last block."""
        entry = self._last
        if entry is not None and entry.block == self._n_blocks - 1:
            self._cache._forget(entry, self._compressed)

    def _examples(self, b: int, in_order: bool = False) -> list:
        """The examples of block ``b``, from the cache or decoded (then cached; ``in_order``:
        held for the pass in order reading it, see ``BlockCache._forget``). A block the
        cache remembers only (``_miss``) is a hit, decoded and held whole, not for a pass."""
        key = (self._tag, b)
        entry, examples = self._cache._find(key)
        if examples is None and entry is not None:
            held = self._cache._hold_spare(key, b)  # remembered only: the spare, if it is
            if held is not None:
                entry, examples = held
        if examples is None:
            data = self._take_ahead(b) if self._jobs else None
            if data is None:
                data = self._decoded(b)
            examples = self._unpickle(data, b)
            in_order = in_order and entry is None
            entry, examples = self._cache._put(key, b, examples, len(data), in_order)
        self._last = entry
        lo = b * self._block_size
        self._hot = (lo, min(lo + self._block_size, self._n), entry)
        return examples

    # -- the contract -----------------------------------------------------------------------

    def read_block(self, b) -> list:
        """The examples of block ``b``, through the cache."""
        return self._examples(block_number(b, self._n_blocks))

    def _block_bytes(self, b) -> bytes:
        """The decoded pickle bytes of block ``b``."""
        return self._decoded(block_number(b, self._n_blocks))

    def _raw_block(self, b) -> bytes:
        """The stored (possibly compressed) bytes of block ``b``."""
        return self._raw(block_number(b, self._n_blocks))

    def _block_offsets(self):
        """The validated block offsets, opening the shard's files on first use."""
        return self._opened_files()[0]

    def __getitems__(self, indices) -> list:
        """The examples at ``indices``, in that order; each block needed is decoded once (a
        batch of a pass in order, ``run_start``, is read as ``self[i]`` reads one)."""
        n = self._n
        first = run_start(indices, n, self._run_next)
        if self._hints is not None:
            self._queue_hints()
        if first >= 0:
            self._run_next = first + len(indices)
            return [self[k] for k in range(first, first + len(indices))]
        located = [(0, normalize_index(i, n)) for i in indices]
        return gather(self._self_reader, located)

    def _self_reader(self, s):
        return self

    def __iter__(self):
        """Every example in order, each block decoded when the pass reaches it."""
        return read_in_order((self, b) for b in range(self._n_blocks))

    def prefetch(self, indices) -> bool:
        """A hint: the blocks of ``indices`` are read next (see _contract); decoded ahead on
        the pool (a remote shard's fetched) from this reader's next read in this process on."""
        n = self._n
        blocks = [normalize_index(i, n) // self._block_size for i in indices]
        if self._pooled is False and self._source is None:
            return False
        self._renew_ahead()
        if self._hints is not None:
            blocks = self._hints + blocks
        self._hints = blocks[-_AHEAD_JOBS:] if blocks else None
        self._hot = _COLD  # the next read queues them (_read)
        return True

    def _renew_ahead(self) -> None:
        """Forget hints and jobs of an older fork generation (the parent's pool's)."""
        if self._ahead_generation != _generation[0]:
            self._hints = None
            self._jobs = {}
            self._ahead_generation = _generation[0]

    def _queue_hints(self) -> None:
        self._renew_ahead()
        hints, self._hints = self._hints, None
        self._queue_hinted(hints or [])

    def _queue_hinted(self, blocks: list) -> bool:
        """Read ``blocks`` ahead, named by prefetch(): a local shard's decoded on the pool; a
        remote shard's fetched now by its source, neighbours merged (the fetching is what
        takes time; each is decoded when read). Whether hints are of use to this shard."""
        if self._source is None:
            for b in blocks:
                self._queue_ahead(b)
            return self._pooled is not False
        try:
            self._opened_files()
        except Exception:
            return True  # raised again, by the read of a block of this shard
        entries = self._cache._entries
        wanted = [b for b in blocks if entries.get((self._tag, b)) is None]
        if wanted:
            self._source.prefetch(wanted, True)
        return True

    def _queue_ahead(self, b: int) -> None:
        """Decode block ``b`` on the pool unless it is cached or being decoded already; at
        most _AHEAD_JOBS blocks at once (the oldest job is dropped for a new one)."""
        jobs = self._jobs
        if b in jobs or self._cache._entries.get((self._tag, b)) is not None:
            return
        if self._pooled is None:
            self._pooled = worth_the_pool(self)
        if not self._pooled:
            return
        while len(jobs) >= _AHEAD_JOBS:
            jobs.pop(next(iter(jobs))).cancel()
        future = decode_on_pool(self, b)
        if future is not None:
            jobs[b] = future

    def _take_ahead(self, b: int):
        """Block ``b``'s bytes if it is being decoded ahead (waiting for them), else None (also
        when that failed: the caller's own decoding says why)."""
        self._renew_ahead()
        return started_result(self._jobs.pop(b, None))

    def close(self) -> None:
        """Release the shard's files and its cached blocks (it reopens on next use)."""
        self._hints = None
        for future in self._jobs.values():
            future.cancel()
        self._jobs = {}
        with self._lock():
            self._last = None
            self._hot = _COLD
            self._opened = None
            self._tls = _ThreadState()
            _files.forget(self._data_path)
        self._cache._discard(self._tag)
        if self._source is not None:
            self._source.close()

    # -- for _pool ---------------------------------------------------------------------------

    def _lookup(self, b: int):
        return self._cache._get((self._tag, b))[1]

    def _held(self, b: int):
        """For ``iter``: block ``b``'s examples if the cache holds the block (a hit;
        remembered only, it is decoded and held whole, as ``_miss`` reads it again), else
        None (a miss)."""
        key = (self._tag, b)
        entry, examples = self._cache._find(key)
        if entry is None or examples is not None:
            return examples
        held = self._cache._hold_spare(key, b)
        if held is not None:
            return held[1]
        data = self._decoded(b)
        return self._cache._put(key, b, self._unpickle(data, b), len(data))[1]

    def _ahead(self, b: int):
        data = self._take_ahead(b) if self._jobs else None
        return None if data is None else self._store(b, data)

    def _load(self, b: int) -> list:
        return self._store(b, self._decoded(b))

    def _pass_block(self, b: int, data) -> list:
        examples = self._unpickle(data, b)
        self._cache._keep_passed((self._tag, b), b, examples, len(data))
        return examples

    def _store(self, b: int, data) -> list:
        return self._cache._put((self._tag, b), b, self._unpickle(data, b), len(data))[1]

    def _prefetch(self, blocks) -> None:
        """A remote shard: fetch ``blocks`` now, neighbours merged (no-op for local files)."""
        if self._source is not None:
            self._source.prefetch(blocks)

    # -- blocks -----------------------------------------------------------------------------

    def _lock(self) -> threading.Lock:
        if self._lock_generation != _generation[0]:
            self._open_lock = threading.Lock()
            self._lock_generation = _generation[0]
        return self._open_lock

    def _opened_files(self) -> tuple:
        """``(offsets, zdict, positions)``, loaded on first use (again after ``close``)."""
        opened = self._opened
        if opened is None:
            with self._lock():
                opened = self._opened
                if opened is None:
                    # A descriptor pooled by an earlier opening may be of a file since
                    # replaced at this path: read the file that is validated now.
                    _files.forget(self._data_path)
                    if self._source is None:
                        moved = renamed_root(self._root)
                        if moved is not None:
                            self._root, self._data_path = moved
                    offsets, zdict = open_files(
                        self._root, self._metadata, self._dict_bytes, ZstdDict, self._source
                    )
                    opened = self._opened = (offsets, zdict, memoryview(offsets))
        return opened

    def _raw(self, b: int, positions=None) -> bytes:
        if positions is None:
            positions = self._opened_files()[2]
        start = positions[b]
        end = positions[b + 1]
        if self._source is not None:
            raw = self._source.block(b)
            if len(raw) != end - start:
                raise truncated_block_error(self._data_path, b, start, end, len(raw))
            return raw
        try:
            raw = _files.pread(self._data_path, end - start, start)
        except OSError as exc:
            raise AtlasFormatError(f"{self._data_path}: cannot be read: {exc}") from exc
        if len(raw) != end - start:
            raise truncated_block_error(self._data_path, b, start, end, len(raw))
        return raw

    def _decoded(self, b: int) -> bytes:
        opened = self._opened
        if opened is None:
            opened = self._opened_files()
        raw = self._raw(b, opened[2])
        if not self._compressed:
            return raw
        return self._decompress(raw, b, opened[1])

    def _decompressor(self, zdict):
        state = self._tls  # one decompressor per thread, for the dictionary it was made with
        dctx = state.dctx
        if dctx is None or state.zdict is not zdict:
            if zdict is None:
                dctx = zstandard.ZstdDecompressor()
            else:
                dctx = zstandard.ZstdDecompressor(dict_data=zdict._dict)
            state.dctx = dctx
            state.zdict = zdict
        return dctx

    def _where(self, b: int) -> str:
        return f"{self._data_path}: block {b}"

    def _decompress(self, raw: bytes, b: int, zdict) -> bytes:
        dctx = self._decompressor(zdict)
        try:
            declared = _frame_content_size(raw)
            # 0 is streamed too: python-zstandard's decompress() returns b"" for a frame
            # declaring 0 bytes without decoding it (trailing or damaged bytes unchecked).
            if declared > 0:
                # The common case decided here, as the compiled core's _limits_allow does;
                # check_zstd_content_size decides (and words) the rest.
                if declared > len(raw) * MAX_ZSTD_RATIO + 1024 or declared > max_block_bytes():
                    check_zstd_content_size(declared, len(raw), self._where(b))
                out = dctx.decompress(raw, allow_extra_data=False)
                if len(out) != declared:
                    raise AtlasFormatError(
                        f"{self._where(b)}: decoded {len(out)} bytes, the frame says {declared}"
                    )
                return out
            return self._decompress_unsized(dctx, raw, self._where(b))
        except zstandard.ZstdError as exc:
            raise self._diagnose(dctx, raw, self._where(b), exc, zdict) from exc

    @staticmethod
    def _decompress_unsized(dctx, raw: bytes, where: str) -> bytes:
        """Stream a frame that does not record its size, never past ``max_block_bytes()``."""
        limit = max_block_bytes()
        stream = dctx.decompressobj()
        parts = []
        total = 0
        pos = 0
        step = STREAM_STEP
        for pos in range(0, len(raw), step):
            part = stream.decompress(raw[pos : pos + step])
            total += len(part)
            if total > limit:
                raise AtlasFormatError(
                    f"{where}: the zstd frame decodes to more than {limit} bytes, the "
                    "limit (ATLAS_FAST_MAX_BLOCK_BYTES)"
                )
            parts.append(part)
            if stream.eof:
                break
        if not stream.eof:
            raise AtlasFormatError(f"{where}: the zstd frame is truncated")
        extra = len(stream.unused_data) + max(0, len(raw) - (pos + step))
        if extra:
            raise AtlasFormatError(f"{where}: {extra} bytes follow the zstd frame")
        return b"".join(parts)

    @staticmethod
    def _diagnose(dctx, raw: bytes, where: str, exc, zdict) -> AtlasFormatError:
        """Word a decompression failure as both backends do (error path only)."""
        try:
            frame_dict_id = zstandard.get_frame_parameters(raw).dict_id
        except zstandard.ZstdError:
            frame_dict_id = 0
        dict_id = None if zdict is None else zdict._dict.dict_id()
        dict_path = None if zdict is None else zdict.path
        error = zstd_dictionary_mismatch(where, frame_dict_id, dict_id, dict_path)
        if error is not None:
            return error
        # Truncated or followed by other bytes? Streaming tells these apart.
        try:
            stream = dctx.decompressobj()
            stream.decompress(raw)
        except zstandard.ZstdError:
            return corrupt_frame_error(where, str(exc), dict_path)
        if not stream.eof:
            return AtlasFormatError(f"{where}: the zstd frame is truncated")
        if stream.unused_data:
            return AtlasFormatError(
                f"{where}: {len(stream.unused_data)} bytes follow the zstd frame"
            )
        return corrupt_frame_error(where, str(exc), dict_path)

    def _unpickle(self, data, b: int) -> list:
        if _first_decode[0]:
            _first_decode[0] = False
            freeze_in_worker()
        # The bound check (_pickle_scan_py): before unpickling for an untrusted reader; for a
        # trusted one, whose blocks a Python walk would slow down, only once unpickling
        # failed, to say what the compiled core says.
        trusted = self._loads is pickle.loads
        found = None if trusted else find_unbounded(data)
        if found is not None:
            raise unbounded_error(found, self._data_path, b)
        try:
            examples = self._loads(data)
            self._cache._release_spare()
        except Exception as exc:
            found = find_unbounded(data) if trusted else None
            if found is not None:
                raise unbounded_error(found, self._data_path, b) from exc
            raise unpickle_error(exc, self._data_path, b) from exc
        expected = expected_block_length(self._n, self._block_size, b)
        if type(examples) is not list or len(examples) != expected:
            check_block_examples(examples, expected, self._data_path, b)
        return examples


class DatasetCore(_CacheReader):
    """Maps global indices onto the shards of a dataset; shard readers made on first use."""

    def __init__(
        self, root, shard_dirs, sizes, metadatas, dict_bytes, loads, cache, sources=None
    ) -> None:
        self._opener = ShardOpener(
            root, shard_dirs, sizes, metadatas, dict_bytes, loads, cache, sources
        )
        self._sizes = self._opener.sizes
        self._cache = cache
        self._readers = [None] * len(self._sizes)
        ends = []
        total = 0
        for size in self._sizes:
            total += size
            ends.append(total)
        self._ends = ends
        self._total = total
        self._run_next = 0  # where the last batch of a pass in order (run_start) ended
        self._next = -1  # the example after the one __getitem__ read last
        # (first example, end, _Entry) of the block last read, in dataset indices: as
        # ShardCore's _hot. Its hits are not told to the shard reader _read read it with
        # (_owner: (reader, its first example), or None), which _read tells (its _next) then.
        self._hot = _COLD
        self._owner = None
        # (shard, index in it) of the examples named by prefetch() and not queued yet (None:
        # none), in fork generation _hints_generation.
        self._hints = None
        self._hints_generation = _generation[0]
        self._hints_worth = True  # whether one of the shards hinted last is worth its hints

    def __len__(self) -> int:
        return self._total

    def _reader(self, s: int) -> ShardCore:
        reader = self._readers[s]
        if reader is None:
            made = self._opener.make(ShardCore, s)
            reader = self._readers[s]
            if reader is None:  # another thread may have made it meanwhile: keep one
                reader = self._readers[s] = made
        return reader

    def _locate(self, i) -> tuple:
        k = normalize_index(i, self._total)
        s = bisect_right(self._ends, k)
        return s, k - (self._ends[s - 1] if s else 0)

    def __getitem__(self, i):
        # The hot path, as ShardCore's.
        lo, end, entry = self._hot
        if type(i) is int and lo <= i < end:
            examples = entry.examples
            if examples is not None:
                cache = self._cache
                if cache._newest is entry:
                    cache._hits += 1
                else:
                    cache._touch(entry)
                self._next = i + 1
                return examples[i - lo]
        return self._read(normalize_index(i, self._total))

    def _read(self, k: int):
        """Example ``k`` (``0 <= k < len``), when ``__getitem__``'s hot path has not served it."""
        if self._hints is not None:
            self._queue_hints()
        owner = self._owner
        if owner is not None:  # the hot path's reads since were of this reader, the last k - 1
            owner[0]._next = self._next - owner[1]
        s = bisect_right(self._ends, k)
        start = self._ends[s - 1] if s else 0
        if k == start and k == self._next:
            # A pass in order moves on from the shard before to shard s (as ShardCore reads
            # one from a block to the next).
            self._next = k + 1
            self._reader(bisect_right(self._ends, k - 1))._leave_pass()
            reader = self._reader(s)
            example = reader._enter_pass()
        else:
            self._next = k + 1
            reader = self._reader(s)
            example = reader[k - start]
        lo, end, entry = reader._hot
        self._hot = (lo + start, end + start, entry)
        self._owner = (reader, start)
        return example

    def __getitems__(self, indices) -> list:
        """The examples at ``indices``, in that order; each block needed is decoded once (a
        batch of a pass in order: as ShardCore's)."""
        first = run_start(indices, self._total, self._run_next)
        if self._hints is not None:
            self._queue_hints()
        if first >= 0:
            self._run_next = first + len(indices)
            return [self[k] for k in range(first, first + len(indices))]
        locate = self._locate
        return gather(self._reader, [locate(i) for i in indices])

    def __iter__(self):
        """Every example in order, each block decoded when the pass reaches it."""
        return read_in_order(
            (self._reader(s), b)
            for s in range(len(self._readers))
            if self._sizes[s]
            for b in range(self._reader(s)._n_blocks)
        )

    def prefetch(self, indices) -> bool:
        """A hint: the blocks of ``indices`` are read next (see _contract); decoded ahead on
        the pool (a remote shard's fetched) from this dataset's next read in this process on."""
        located = [self._locate(i) for i in indices]
        if not self._hints_worth:
            return False
        if self._hints is not None and self._hints_generation == _generation[0]:
            located = self._hints + located
        self._hints = located[-_AHEAD_JOBS:] if located else None
        self._hints_generation = _generation[0]
        self._hot = _COLD  # the next read queues them (_read)
        return True

    def _queue_hints(self) -> None:
        hints, self._hints = self._hints, None
        if self._hints_generation != _generation[0]:
            return
        worth = False
        for reader, named in hinted_readers(hints, self._reader):
            size = reader._block_size
            worth = reader._queue_hinted([j // size for j in named]) or worth
        self._hints_worth = worth

    def close(self) -> None:
        """Release every shard's files and the cached blocks (they reopen on next use)."""
        self._hints = None
        self._hot = _COLD
        self._owner = None
        self._cache.clear()  # first: each reader's close then has no blocks of its own to find
        for reader in self._readers:
            if reader is not None:
                reader.close()
