"""The pure-Python backend: the hot path of reading blocks, in plain Python.

This module and the compiled ``atlas_fast._reader`` expose the same names with the same
behaviour; the facade picks one at import (``atlas_fast.BACKEND``). The public classes in
``atlas_fast.atlas`` subclass ``ShardCore`` and ``DatasetCore`` and add everything that is not
hot: metadata, file discovery, pickling, validation (``_format``).

The contract a backend implements:

``ZstdDict(data, path)``
    A decompression dictionary, digested once and shared read-only by every shard using it.
``ShardCore``
    ``_core_init(path, data_path, n_examples, block_size, compressed, loads)`` sets it up.
    Nothing is opened then: on first use the core calls ``self._open_files()`` (defined by the
    public class) which returns ``(offsets, zdict)``: validated uint64 offsets and a
    ``ZstdDict`` or None. ``__len__``, ``__getitem__`` (an int, negative from the end,
    IndexError outside), ``_read_block(b)`` the cached list of block ``b``,
    ``_block_bytes(b)`` its decoded pickle bytes, ``_unpickle(data, b)`` the checked list,
    ``_close()`` releasing files and caches. The core caches only the last block it decoded;
    on a miss, ``__getitem__`` and ``_read_block`` call ``self._load_block(b)`` through normal
    attribute lookup (the core's own version is ``_unpickle(_block_bytes(b), b)``), so the
    public classes can put a larger cache behind the one-block fast path.
``DatasetCore``
    ``_core_init(shards, sizes)``; ``__len__``; ``__getitem__`` mapping a global index to its
    shard; ``_locate(i)`` the (shard number, local index) pair.
``zstd_library()``
    Which libzstd decompresses, as a dict.

Invariants: a core is safe to call from several threads (at method level) and in a forked
child whatever the parent did; it holds no file descriptor between calls except through the
process-wide, bounded ``_FilePool``.
"""

from __future__ import annotations

import operator
import os
import threading
from bisect import bisect_right
from collections import OrderedDict

import zstandard

from ._errors import AtlasFormatError, UnsafePickleError
from ._format import check_zstd_content_size

__all__ = ["ZstdDict", "ShardCore", "DatasetCore", "zstd_library", "BACKEND"]

BACKEND = "python"


def zstd_library() -> dict:
    """Which libzstd this backend decompresses with."""
    return {
        "backend": BACKEND,
        "path": getattr(zstandard, "__file__", None),
        "version": zstandard.ZSTD_VERSION and ".".join(map(str, zstandard.ZSTD_VERSION)),
        "binding": f"python-zstandard {zstandard.__version__} ({zstandard.backend})",
    }


class _FilePool:
    """Open data.bin descriptors, at most ``limit`` at once, least recently used closed first.

    Reads are ``os.pread`` (no shared file offset, so forked children read correctly).
    ``_lock`` is held from looking a descriptor up until its pread returns, so a descriptor is
    never closed (and its number reused for another file) under a reader.
    """

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def pread(self, path: str, size: int, offset: int) -> bytes:
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                fd = self._open_lock_held(path)
            else:
                self._fds.move_to_end(path)
            return os.pread(fd, size, offset)

    def _open_lock_held(self, path: str) -> int:
        while len(self._fds) >= self.limit:
            _, old = self._fds.popitem(last=False)
            os.close(old)
        flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags)
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
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_files._after_fork_in_child)


class ZstdDict:
    """A zstd dictionary, digested once (python-zstandard keeps the digested form)."""

    __slots__ = ("path", "_dict", "__weakref__")

    def __init__(self, data: bytes, path: str) -> None:
        self.path = path
        self._dict = zstandard.ZstdCompressionDict(bytes(data))


class _ThreadState(threading.local):
    dctx = None


class ShardCore:
    """Reads the blocks of one shard (the pure-Python hot path)."""

    def _core_init(self, path, data_path, n_examples, block_size, compressed, loads) -> None:
        self._path = str(path)
        self._data_path = str(data_path)
        self._n = n_examples
        self._block_size = block_size
        self._compressed = compressed
        self._loads = loads
        self._n_blocks = -(-n_examples // block_size)
        self._offsets = None  # set once by _ensure_open, under _open_lock
        self._zdict = None
        self._cache = (-1, None)  # (block number, list): replaced whole, never mutated
        self._open_lock = threading.Lock()
        self._tls = _ThreadState()

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        n = self._n
        i = operator.index(i)
        if i < 0:
            i += n
            if i < 0:
                raise IndexError(f"index {i - n} out of range for {n} examples")
        elif i >= n:
            raise IndexError(f"index {i} out of range for {n} examples")
        b, j = divmod(i, self._block_size)
        cached_block, examples = self._cache
        if cached_block != b:
            examples = self._read_block(b)
        return examples[j]

    # -- blocks -----------------------------------------------------------------------------

    def _ensure_open(self):
        offsets = self._offsets
        if offsets is None:
            with self._open_lock:
                if self._offsets is None:
                    offsets, zdict = self._open_files()
                    self._zdict = zdict
                    self._offsets = offsets
                offsets = self._offsets
        return offsets

    def _raw_block(self, b: int) -> bytes:
        """The stored (possibly compressed) bytes of block ``b``."""
        offsets = self._ensure_open()
        start = int(offsets[b])
        end = int(offsets[b + 1])
        try:
            raw = _files.pread(self._data_path, end - start, start)
        except OSError as exc:
            raise AtlasFormatError(f"{self._data_path}: cannot be read: {exc}") from exc
        if len(raw) != end - start:
            raise AtlasFormatError(
                f"{self._data_path}: block {b} is truncated "
                f"(expected bytes {start}..{end}, the file ends at {start + len(raw)})"
            )
        return raw

    def _block_bytes(self, b: int) -> bytes:
        """The decoded pickle bytes of block ``b``."""
        if not 0 <= b < self._n_blocks:
            raise IndexError(f"block {b} out of range for {self._n_blocks} blocks")
        raw = self._raw_block(b)
        if not self._compressed:
            return raw
        return self._decompress(raw, b)

    def _decompress(self, raw: bytes, b: int) -> bytes:
        where = f"{self._data_path}: block {b}"
        state = self._tls
        dctx = state.dctx
        if dctx is None:
            zdict = self._zdict
            if zdict is None:
                dctx = zstandard.ZstdDecompressor()
            else:
                dctx = zstandard.ZstdDecompressor(dict_data=zdict._dict)
            state.dctx = dctx
        try:
            declared = zstandard.frame_content_size(raw)
            if declared >= 0:
                check_zstd_content_size(declared, len(raw), where)
                out = dctx.decompress(raw)
                if len(out) != declared:
                    raise AtlasFormatError(
                        f"{where}: decoded {len(out)} bytes, the frame says {declared}"
                    )
                return out
            # The frame does not record its size: stream it, within the same limits.
            stream = dctx.decompressobj()
            out = stream.decompress(raw)
            if not stream.eof:
                raise AtlasFormatError(f"{where}: the zstd frame is truncated")
            if stream.unused_data:
                extra = len(stream.unused_data)
                raise AtlasFormatError(f"{where}: {extra} bytes follow the zstd frame")
            return out
        except zstandard.ZstdError as exc:
            raise AtlasFormatError(f"{where}: corrupt zstd frame: {exc}") from exc

    def _read_block(self, b: int) -> list:
        """The examples of block ``b`` (decoded once, then served from the cache)."""
        cached_block, examples = self._cache
        if cached_block == b:
            return examples
        examples = self._load_block(b)
        self._cache = (b, examples)
        return examples

    def _load_block(self, b: int) -> list:
        """The miss path of ``_read_block``: decode block ``b``.

        The public classes override it (``_batch.ShardLoading``) to consult their larger
        block cache first; the core only ever checks its own last block before calling it.
        """
        return self._unpickle(self._block_bytes(b), b)

    def _unpickle(self, data, b: int) -> list:
        try:
            examples = self._loads(data)
        except UnsafePickleError as exc:
            raise UnsafePickleError(f"{exc} (in {self._data_path}, block {b})") from None
        except Exception as exc:
            raise AtlasFormatError(
                f"{self._data_path}: block {b} does not unpickle: {type(exc).__name__}: {exc}"
            ) from exc
        expected = min(self._block_size, self._n - b * self._block_size)
        if type(examples) is not list:
            raise AtlasFormatError(
                f"{self._data_path}: block {b} holds a {type(examples).__name__}, not a list"
            )
        if len(examples) != expected:
            raise AtlasFormatError(
                f"{self._data_path}: block {b} holds {len(examples)} examples, expected {expected}"
            )
        return examples

    def _close(self) -> None:
        with self._open_lock:
            self._cache = (-1, None)
            self._offsets = None
            self._zdict = None
            self._tls = _ThreadState()
            _files.forget(self._data_path)


class DatasetCore:
    """Maps global indices onto the shards of a dataset (pure Python)."""

    def _core_init(self, shards, sizes) -> None:
        self._shard_cores = list(shards)
        ends = []
        total = 0
        for size in sizes:
            total += size
            ends.append(total)
        self._ends = ends
        self._total = total

    def __len__(self) -> int:
        return self._total

    def _locate(self, i):
        n = self._total
        i = operator.index(i)
        if i < 0:
            i += n
            if i < 0:
                raise IndexError(f"index {i - n} out of range for {n} examples")
        elif i >= n:
            raise IndexError(f"index {i} out of range for {n} examples")
        s = bisect_right(self._ends, i)
        return s, i - (self._ends[s - 1] if s else 0)

    def __getitem__(self, i):
        s, j = self._locate(i)
        return self._shard_cores[s][j]
