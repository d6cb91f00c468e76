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
    public classes can put a larger cache behind the one-block fast path. ``_direct_load``
    (an attribute, False at ``_core_init``) set true skips the hook: a miss then decodes
    with the core's own ``_block_bytes`` and ``_unpickle``, whatever the class overrides.
``DatasetCore``
    ``_core_init(shards, sizes)``; ``__len__``; ``__getitem__`` mapping a global index to its
    shard; ``_locate(i)`` the (shard number, local index) pair.
``zstd_library()``
    Which libzstd decompresses, as a dict.

Errors (both backends word them identically, by building them with the ``_format`` helpers):
a short read of data.bin is ``truncated_block_error``; a frame declaring its size is checked
with ``check_zstd_content_size`` before anything is allocated; a frame without one is
streamed, never past ``max_block_bytes()`` (read when a shard opens or per block, not at
import); a truncated frame is "<where>: the zstd frame is truncated", bytes after the frame
"<where>: N bytes follow the zstd frame" (where = "<data.bin>: block <b>"), any other zstd
failure ``zstd_frame_error`` (which names a wrong or missing dictionary from the frame's
dictionary ID); an exception from ``loads`` through ``unpickle_error``; a result that is not
a list of ``expected_block_length`` examples through ``check_block_examples``. ``ZstdDict``
raises when zstd rejects the dictionary (the caller names the file). ``loads`` is
``pickle.loads`` or the restricted unpickler of ``_safe_pickle`` (``trusted=False``): the core
calls whichever it got.

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

from ._errors import AtlasFormatError
from ._format import (
    check_block_examples,
    check_zstd_content_size,
    expected_block_length,
    max_block_bytes,
    truncated_block_error,
    unpickle_error,
    zstd_frame_error,
)

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
            fd = self._fds.get(path)
            if fd is None:
                fd = self._open_lock_held(path)
            else:
                self._fds.move_to_end(path)
            return read_at(fd, size, offset)

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

# Bumped in a forked child: a shard's lock from an older generation may have been held by a
# parent thread that does not exist in the child, so the shard replaces it on next use.
_generation = [0]


def _after_fork_in_child() -> None:
    _files._after_fork_in_child()
    _generation[0] += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


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
        # (offsets, zdict): set by _opened_files under the lock, replaced whole, so a reader
        # never pairs one opening's offsets with another's dictionary.
        self._opened = None
        self._cache = (-1, None)  # (block number, list): replaced whole, never mutated
        # True: a miss decodes here without calling the _load_block hook. Set by the public
        # class when its block cache adds nothing to this one (see _batch.ShardLoading).
        self._direct_load = False
        self._open_lock = threading.Lock()
        self._lock_generation = _generation[0]
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

    def _lock(self) -> threading.Lock:
        if self._lock_generation != _generation[0]:
            self._open_lock = threading.Lock()
            self._lock_generation = _generation[0]
        return self._open_lock

    def _opened_files(self) -> tuple:
        """``(offsets, zdict)``, loading them on first use (again after ``_close``)."""
        opened = self._opened
        if opened is None:
            with self._lock():
                opened = self._opened
                if opened is None:
                    # A descriptor pooled by an earlier opening may be of a file since
                    # replaced at this path: read the file that is validated now.
                    _files.forget(self._data_path)
                    opened = self._opened = tuple(self._open_files())
        return opened

    def _ensure_open(self):
        return self._opened_files()[0]

    def _raw_block(self, b: int, offsets=None) -> bytes:
        """The stored (possibly compressed) bytes of block ``b``."""
        if offsets is None:
            offsets = self._ensure_open()
        start = int(offsets[b])
        end = int(offsets[b + 1])
        try:
            raw = _files.pread(self._data_path, end - start, start)
        except OSError as exc:
            raise AtlasFormatError(f"{self._data_path}: cannot be read: {exc}") from exc
        if len(raw) != end - start:
            raise truncated_block_error(self._data_path, b, start, end, len(raw))
        return raw

    def _block_bytes(self, b: int) -> bytes:
        """The decoded pickle bytes of block ``b``."""
        if not 0 <= b < self._n_blocks:
            raise IndexError(f"block {b} out of range for {self._n_blocks} blocks")
        offsets, zdict = self._opened_files()
        raw = self._raw_block(b, offsets)
        if not self._compressed:
            return raw
        return self._decompress(raw, b, zdict)

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

    def _decompress(self, raw: bytes, b: int, zdict) -> bytes:
        where = f"{self._data_path}: block {b}"
        dctx = self._decompressor(zdict)
        try:
            declared = zstandard.frame_content_size(raw)
            # 0 is streamed too: python-zstandard's decompress() returns b"" for a frame
            # declaring 0 bytes without decoding it (trailing or damaged bytes unchecked).
            if declared > 0:
                check_zstd_content_size(declared, len(raw), where)
                out = dctx.decompress(raw, allow_extra_data=False)
                if len(out) != declared:
                    raise AtlasFormatError(
                        f"{where}: decoded {len(out)} bytes, the frame says {declared}"
                    )
                return out
            return self._decompress_unsized(dctx, raw, where)
        except zstandard.ZstdError as exc:
            raise self._diagnose(dctx, raw, where, exc, zdict) from exc

    @staticmethod
    def _decompress_unsized(dctx, raw: bytes, where: str) -> bytes:
        """Stream a frame that does not record its size, never past ``max_block_bytes()``."""
        limit = max_block_bytes()
        stream = dctx.decompressobj()
        parts = []
        total = 0
        pos = 0
        step = 4096  # input per step: at most 4096 * MAX_ZSTD_RATIO bytes of output each
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
        error = zstd_frame_error(
            where, str(exc), frame_dict_id, dict_id, None if zdict is None else zdict.path
        )
        if "corrupt zstd frame" not in str(error):
            return error
        # Truncated or followed by other bytes? Streaming tells these apart.
        try:
            stream = dctx.decompressobj()
            stream.decompress(raw)
        except zstandard.ZstdError:
            return error
        if not stream.eof:
            return AtlasFormatError(f"{where}: the zstd frame is truncated")
        if stream.unused_data:
            return AtlasFormatError(
                f"{where}: {len(stream.unused_data)} bytes follow the zstd frame"
            )
        return error

    def _read_block(self, b: int) -> list:
        """The examples of block ``b`` (decoded once, then served from the cache)."""
        cached_block, examples = self._cache
        if cached_block == b:
            return examples
        if self._direct_load:
            examples = self._unpickle(self._block_bytes(b), b)
        else:
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
        except Exception as exc:
            raise unpickle_error(exc, self._data_path, b) from exc
        expected = expected_block_length(self._n, self._block_size, b)
        if type(examples) is not list or len(examples) != expected:
            check_block_examples(examples, expected, self._data_path, b)
        return examples

    def _close(self) -> None:
        with self._lock():
            self._cache = (-1, None)
            self._opened = None
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
