# Directives are set once, in setup.py.
"""The compiled backend: the hot path of reading blocks, in C (see atlas_fast._pyreader)."""

from cpython.buffer cimport (
    PyBUF_FORMAT,
    PyBUF_ND,
    PyBUF_WRITABLE,
    PyBuffer_Release,
    PyObject_GetBuffer,
)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject_GetItem
from cpython.ref cimport PyObject
from cpython.pythread cimport (
    NOWAIT_LOCK,
    WAIT_LOCK,
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_release_lock,
    PyThread_type_lock,
)
from libc.errno cimport errno
from libc.stdint cimport uint64_t
from libc.stdlib cimport free, getenv, realloc
from libc.string cimport memcpy
from posix.dlfcn cimport RTLD_LOCAL, RTLD_NOW, dlerror, dlopen, dlsym
from posix.fcntl cimport O_RDONLY
from posix.fcntl cimport open as c_open
from posix.mman cimport MAP_FAILED, MAP_SHARED, PROT_READ, mmap, munmap
from posix.stat cimport fstat, struct_stat
from posix.stat cimport stat as c_stat
from posix.unistd cimport close as c_close

cimport cython

from zstd cimport (
    ZSTD_CONTENTSIZE_ERROR,
    ZSTD_CONTENTSIZE_UNKNOWN,
    ZSTD_DCtx,
    ZSTD_DCtx_refDDict_fn,
    ZSTD_DCtx_reset_fn,
    ZSTD_DDict,
    ZSTD_createDCtx_fn,
    ZSTD_createDDict_fn,
    ZSTD_decompressStream_fn,
    ZSTD_freeDCtx_fn,
    ZSTD_freeDDict_fn,
    ZSTD_getDictID_fromDDict_fn,
    ZSTD_getDictID_fromFrame_fn,
    ZSTD_getErrorName_fn,
    ZSTD_getFrameContentSize_fn,
    ZSTD_inBuffer,
    ZSTD_isError_fn,
    ZSTD_outBuffer,
    ZSTD_reset_session_only,
    ZSTD_versionNumber_fn,
    ZSTD_versionString_fn,
)

import os
import pickle
import sys

from ._batch import check_shared_dict, gather, open_files, read_ahead, shard_reader
from ._contract import DEFAULT_CACHE_BYTES, CacheInfo, block_number, normalize_index
from ._errors import AtlasFormatError
from ._format import (
    DATA_FILE,
    INDEX_FILE,
    block_count,
    check_block_examples,
    check_zstd_content_size,
    expected_block_length,
    max_block_bytes,
    truncated_block_error,
    unpickle_error,
    zstd_frame_error,
)

cdef extern from "<dlfcn.h>" nogil:
    ctypedef struct Dl_info:
        const char* dli_fname
    int dladdr(const void* addr, Dl_info* info)

cdef extern from "<fcntl.h>":
    enum:
        O_CLOEXEC

cdef extern from *:
    """
    #define ATLAS_MAX_ZSTD_RATIO 32768ULL
    #define ATLAS_DEFAULT_MAX_BLOCK_BYTES (4ULL << 30)
    """
    const unsigned long long ATLAS_MAX_ZSTD_RATIO
    const unsigned long long ATLAS_DEFAULT_MAX_BLOCK_BYTES

__all__ = [
    "ZstdDict",
    "BlockCache",
    "ShardCore",
    "DatasetCore",
    "zstd_library",
    "zstd_available",
    "zstd_load_error",
    "BACKEND",
]

BACKEND = "cython"

# The C constants that mirror Python ones (tests check them equal): MAX_ZSTD_RATIO and
# _DEFAULT_MAX_BLOCK_BYTES of _format, and the input step _pyreader streams sizeless frames by.
C_CONSTANTS = {
    "MAX_ZSTD_RATIO": ATLAS_MAX_ZSTD_RATIO,
    "DEFAULT_MAX_BLOCK_BYTES": ATLAS_DEFAULT_MAX_BLOCK_BYTES,
    "STREAM_STEP": _STEP,
}

# ---------------------------------------------------------------------------------------------
# libzstd, bound at import with dlopen/dlsym (no header, no link-time dependency)

cdef ZSTD_versionNumber_fn ZSTD_versionNumber = NULL
cdef ZSTD_versionString_fn ZSTD_versionString = NULL
cdef ZSTD_isError_fn ZSTD_isError = NULL
cdef ZSTD_getErrorName_fn ZSTD_getErrorName = NULL
cdef ZSTD_getFrameContentSize_fn ZSTD_getFrameContentSize = NULL
cdef ZSTD_createDCtx_fn ZSTD_createDCtx = NULL
cdef ZSTD_freeDCtx_fn ZSTD_freeDCtx = NULL
cdef ZSTD_DCtx_reset_fn ZSTD_DCtx_reset = NULL
cdef ZSTD_DCtx_refDDict_fn ZSTD_DCtx_refDDict = NULL
cdef ZSTD_createDDict_fn ZSTD_createDDict = NULL
cdef ZSTD_freeDDict_fn ZSTD_freeDDict = NULL
cdef ZSTD_getDictID_fromDDict_fn ZSTD_getDictID_fromDDict = NULL
cdef ZSTD_getDictID_fromFrame_fn ZSTD_getDictID_fromFrame = NULL
cdef ZSTD_decompressStream_fn ZSTD_decompressStream = NULL

cdef bint _zstd_ok = False
_zstd_info = None  # dict reported by zstd_library() once bound
_zstd_error = "libzstd was not looked for"

_SYMBOLS = (
    "ZSTD_versionNumber", "ZSTD_versionString", "ZSTD_isError", "ZSTD_getErrorName",
    "ZSTD_getFrameContentSize", "ZSTD_createDCtx", "ZSTD_freeDCtx", "ZSTD_DCtx_reset",
    "ZSTD_DCtx_refDDict", "ZSTD_createDDict", "ZSTD_freeDDict", "ZSTD_getDictID_fromDDict",
    "ZSTD_decompressStream", "ZSTD_getDictID_fromFrame",
)
_MIN_VERSION = 10400  # ZSTD_DCtx_reset and ZSTD_DCtx_refDDict are stable from 1.4.0


cdef str _dl_error():
    cdef const char* msg = dlerror()
    return "unknown dlopen error" if msg == NULL else msg.decode("utf-8", "replace")


cdef void* _bind_one(void* handle, str name) except NULL:
    cdef bytes cname = name.encode()
    cdef void* sym = dlsym(handle, cname)
    if sym == NULL:
        raise OSError(f"symbol {name} not found")
    return sym


cdef object _bind(str path):
    """Bind every symbol from ``path``; return the library's real path, or raise OSError."""
    global ZSTD_versionNumber, ZSTD_versionString, ZSTD_isError, ZSTD_getErrorName
    global ZSTD_getFrameContentSize, ZSTD_createDCtx, ZSTD_freeDCtx, ZSTD_DCtx_reset
    global ZSTD_DCtx_refDDict, ZSTD_createDDict, ZSTD_freeDDict, ZSTD_getDictID_fromDDict
    global ZSTD_decompressStream, ZSTD_getDictID_fromFrame
    cdef bytes cpath = os.fsencode(path)
    cdef void* handle = dlopen(cpath, RTLD_NOW | RTLD_LOCAL)
    cdef void* syms[14]
    cdef Dl_info info
    cdef unsigned version
    if handle == NULL:
        raise OSError(_dl_error())
    for k, name in enumerate(_SYMBOLS):
        syms[k] = _bind_one(handle, name)
    version = (<ZSTD_versionNumber_fn>syms[0])()
    if version < _MIN_VERSION:
        raise OSError(f"libzstd {version} is older than 1.4.0")
    # Handles stay open for the life of the process: the pointers below point into them.
    ZSTD_versionNumber = <ZSTD_versionNumber_fn>syms[0]
    ZSTD_versionString = <ZSTD_versionString_fn>syms[1]
    ZSTD_isError = <ZSTD_isError_fn>syms[2]
    ZSTD_getErrorName = <ZSTD_getErrorName_fn>syms[3]
    ZSTD_getFrameContentSize = <ZSTD_getFrameContentSize_fn>syms[4]
    ZSTD_createDCtx = <ZSTD_createDCtx_fn>syms[5]
    ZSTD_freeDCtx = <ZSTD_freeDCtx_fn>syms[6]
    ZSTD_DCtx_reset = <ZSTD_DCtx_reset_fn>syms[7]
    ZSTD_DCtx_refDDict = <ZSTD_DCtx_refDDict_fn>syms[8]
    ZSTD_createDDict = <ZSTD_createDDict_fn>syms[9]
    ZSTD_freeDDict = <ZSTD_freeDDict_fn>syms[10]
    ZSTD_getDictID_fromDDict = <ZSTD_getDictID_fromDDict_fn>syms[11]
    ZSTD_decompressStream = <ZSTD_decompressStream_fn>syms[12]
    ZSTD_getDictID_fromFrame = <ZSTD_getDictID_fromFrame_fn>syms[13]
    if dladdr(syms[5], &info) and info.dli_fname != NULL:
        return os.path.realpath(os.fsdecode(info.dli_fname))
    return os.path.realpath(path) if os.sep in path else path


def _candidates():
    """Where libzstd is looked for, in order: (path, how it was found)."""
    forced = os.environ.get("ATLAS_FAST_LIBZSTD")
    if forced:
        return [(forced, "ATLAS_FAST_LIBZSTD")]
    found = []
    try:
        import importlib.util

        spec = importlib.util.find_spec("zstandard")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            try:
                names = sorted(os.listdir(folder))
            except OSError:
                continue
            for name in names:
                if name.startswith("_cffi") and name.endswith((".so", ".dylib")):
                    found.append((os.path.join(folder, name), "python-zstandard's _cffi module"))
    if sys.platform == "darwin":
        found.append(("libzstd.1.dylib", "the system libzstd"))
    else:
        found.append(("libzstd.so.1", "the system libzstd"))
    return found


def _load_zstd():
    global _zstd_ok, _zstd_info, _zstd_error
    errors = []
    tried_system = False
    for path, how in _candidates():
        try:
            real = _bind(path)
        except OSError as exc:
            errors.append(f"{path}: {exc}")
            tried_system = tried_system or how == "the system libzstd"
            continue
        _zstd_ok = True
        _zstd_info = {
            "backend": BACKEND,
            "path": real,
            "version": ZSTD_versionString().decode("ascii", "replace"),
            "version_number": ZSTD_versionNumber(),
            "binding": f"dlopen of {how}",
        }
        return
    if tried_system and not os.environ.get("ATLAS_FAST_LIBZSTD"):
        import ctypes.util

        name = ctypes.util.find_library("zstd")
        if name:
            try:
                real = _bind(name)
            except OSError as exc:
                errors.append(f"{name}: {exc}")
            else:
                _zstd_ok = True
                _zstd_info = {
                    "backend": BACKEND,
                    "path": real,
                    "version": ZSTD_versionString().decode("ascii", "replace"),
                    "version_number": ZSTD_versionNumber(),
                    "binding": "dlopen of the system libzstd (ctypes.util.find_library)",
                }
                return
    _zstd_error = "no usable libzstd: " + "; ".join(errors)


_load_zstd()


def zstd_available():
    """Whether libzstd was bound (otherwise the facade uses the pure-Python backend)."""
    return _zstd_ok


def zstd_load_error():
    """Why libzstd could not be bound, or None."""
    return None if _zstd_ok else _zstd_error


def zstd_library():
    """Which libzstd this backend decompresses with."""
    if not _zstd_ok:
        return {"backend": BACKEND, "path": None, "version": None, "binding": None,
                "error": _zstd_error}
    return dict(_zstd_info)


# ---------------------------------------------------------------------------------------------
# Locks, and re-creating them in a forked child

# Bumped in a forked child: a lock allocated in an older generation may have been held by a
# thread that does not exist in the child, so it is abandoned (never freed) and replaced.
cdef unsigned long _generation = 0


cdef inline int _acquire(PyThread_type_lock lock) except -1:
    """Take ``lock``; the GIL is released while waiting for it."""
    if not PyThread_acquire_lock(lock, NOWAIT_LOCK):
        with nogil:
            PyThread_acquire_lock(lock, WAIT_LOCK)
    return 0


cdef PyThread_type_lock _new_lock() except NULL:
    cdef PyThread_type_lock lock = PyThread_allocate_lock()
    if lock == NULL:
        raise MemoryError("cannot allocate a lock")
    return lock


# A pool of decompression contexts. Each ZSTD_DCtx is owned by one decompression at a time
# (taken from the pool, used with the GIL released, given back), so there are only as many
# as threads decompressing at once, not one per shard. _pool_lock guards _pool/_pool_n.
cdef ZSTD_DCtx* _pool[16]
cdef int _pool_n = 0
cdef PyThread_type_lock _pool_lock = _new_lock()


cdef ZSTD_DCtx* _pool_pop_lock_held() noexcept nogil:
    global _pool_n
    if _pool_n == 0:
        return NULL
    _pool_n -= 1
    return _pool[_pool_n]


cdef bint _pool_push_lock_held(ZSTD_DCtx* dctx) noexcept nogil:
    global _pool_n
    if _pool_n == 16:
        return False
    _pool[_pool_n] = dctx
    _pool_n += 1
    return True


cdef ZSTD_DCtx* _dctx_take(ZSTD_DCtx** warm) noexcept nogil:
    """A context owned by the caller until _dctx_give; NULL when out of memory.

    ``warm`` (NULL, or a ZstdDict's slot) holds a context last used with that dictionary:
    libzstd re-warms a context that switches dictionaries (it prefetches the whole
    dictionary), which costs up to a fifth of a small block's decoding.
    """
    cdef ZSTD_DCtx* dctx = NULL
    PyThread_acquire_lock(_pool_lock, WAIT_LOCK)
    if warm != NULL and warm[0] != NULL:
        dctx = warm[0]
        warm[0] = NULL
    else:
        dctx = _pool_pop_lock_held()
    PyThread_release_lock(_pool_lock)
    if dctx == NULL:
        dctx = ZSTD_createDCtx()
    return dctx


cdef void _dctx_give(ZSTD_DCtx* dctx, ZSTD_DCtx** warm) noexcept nogil:
    cdef bint kept = True
    PyThread_acquire_lock(_pool_lock, WAIT_LOCK)
    if warm != NULL and warm[0] == NULL:
        warm[0] = dctx
    else:
        kept = _pool_push_lock_held(dctx)
    PyThread_release_lock(_pool_lock)
    if not kept:
        ZSTD_freeDCtx(dctx)


def _after_fork_in_child():
    global _generation, _pool_lock, _pool_n
    _generation += 1
    # Another parent thread may have held the pool lock at fork time; contexts it had taken
    # are simply lost in the child. The old lock is abandoned, not freed.
    _pool_lock = PyThread_allocate_lock()
    _pool_n = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ---------------------------------------------------------------------------------------------
# Dictionaries


@cython.auto_pickle(False)
cdef class ZstdDict:
    """A zstd dictionary, digested once (ZSTD_DDict) and shared read-only."""

    cdef ZSTD_DDict* ddict
    # A context last used with this dictionary, or NULL: guarded by _pool_lock.
    cdef ZSTD_DCtx* warm
    cdef readonly object path
    cdef object __weakref__

    def __cinit__(self, data, path):
        cdef Py_buffer buf
        if not _zstd_ok:
            raise RuntimeError(zstd_load_error())
        self.path = path
        PyObject_GetBuffer(data, &buf, 0)
        try:
            with nogil:
                self.ddict = ZSTD_createDDict(buf.buf, <size_t>buf.len)
        finally:
            PyBuffer_Release(&buf)
        if self.ddict == NULL:
            raise ValueError("libzstd cannot load it (ZSTD_createDDict failed)")

    def __dealloc__(self):
        # No reader holds self.warm: a reader holds a reference to self while it uses it.
        if self.warm != NULL:
            ZSTD_freeDCtx(self.warm)
        if self.ddict != NULL:
            ZSTD_freeDDict(self.ddict)

    @property
    def dict_id(self):
        """The dictionary's id (0 for a raw-content dictionary)."""
        return ZSTD_getDictID_fromDDict(self.ddict)


# ---------------------------------------------------------------------------------------------
# data.bin, memory-mapped
#
# A mapped file that shrinks under the mapping turns a read of the lost pages into SIGBUS. So
# before any block is read from the mapping, the file's size is checked again (one fstat(2)
# per block decoded, never per cached example): a block past the end is refused with
# truncated_block_error, as the Python backend's short pread is. The _KEEP_FDS most recently
# mapped files keep their descriptor for this (process-wide, so descriptors stay bounded
# whatever the number of shards; closed with the mapping); a mapping whose descriptor was
# given up is checked by path (stat(2)). What remains: a truncation racing with the read
# itself, after the check (a file truncated while it is being read is beyond what a reader
# can make safe without copying it first), and, for a mapping checked by path, a file
# truncated through another descriptor after data.bin was renamed away or replaced.
# The descriptors are handed out, used and closed with the GIL held and never released in
# between, so no other lock is needed.

cdef enum:
    _KEEP_FDS = 32

cdef PyObject* _fd_keepers[_KEEP_FDS]  # the mappings holding a descriptor (borrowed), a ring
cdef int _fd_next = 0


@cython.auto_pickle(False)
@cython.final
cdef class _Mapping:
    """A read-only mapping of a whole data.bin; unmapped when the last reference goes."""

    cdef const char* ptr
    cdef size_t size
    cdef bytes cpath  # the file's path, encoded: its size is checked before each read
    cdef int fd  # the mapped file, for that check, or -1 (checked by path)
    cdef int slot  # its place in _fd_keepers, or -1

    def __cinit__(self):
        self.fd = -1
        self.slot = -1

    def __dealloc__(self):
        if self.slot >= 0:
            _fd_keepers[self.slot] = NULL
        if self.fd >= 0:
            c_close(self.fd)
        if self.ptr != NULL:
            munmap(<void*>self.ptr, self.size)


@cython.auto_pickle(False)
@cython.final
cdef class _BlockView:
    """Bytes ``ptr[0:size]`` of a mapping, exported read-only through the buffer protocol.

    What an uncompressed block is unpickled from: no copy of the block. It holds the mapping,
    so a ``close()`` on another thread cannot unmap the bytes while they are being read.
    """

    cdef _Mapping owner
    cdef const char* ptr
    cdef Py_ssize_t size

    def __getbuffer__(self, Py_buffer* view, int flags):
        if flags & PyBUF_WRITABLE:
            raise BufferError("a block of data.bin is read-only")
        view.buf = <void*>self.ptr
        view.obj = self
        view.len = self.size
        view.readonly = 1
        view.itemsize = 1
        view.format = <char*>"B" if flags & PyBUF_FORMAT else NULL
        view.ndim = 1
        view.shape = &self.size if flags & PyBUF_ND else NULL
        view.strides = NULL
        view.suboffsets = NULL
        view.internal = NULL

    def __releasebuffer__(self, Py_buffer* view):
        pass


cdef void _keep_fd(_Mapping mapping, int fd) noexcept:
    """Give ``fd`` to ``mapping``, taking it from the mapping that has held one longest."""
    global _fd_next
    cdef int slot = _fd_next
    cdef _Mapping old
    _fd_next = (slot + 1) % _KEEP_FDS
    if _fd_keepers[slot] != NULL:
        old = <_Mapping>_fd_keepers[slot]
        c_close(old.fd)
        old.fd = -1
        old.slot = -1
    _fd_keepers[slot] = <PyObject*>mapping
    mapping.fd = fd
    mapping.slot = slot


cdef inline int _file_size(_Mapping mapping, struct_stat* st) noexcept:
    if mapping.fd >= 0:
        return fstat(mapping.fd, st)
    return c_stat(PyBytes_AS_STRING(mapping.cpath), st)


cdef _Mapping _map_file(str data_path, uint64_t expected, str index_path):
    """Map data.bin whole; its descriptor is kept for size checks, or closed (see above)."""
    cdef bytes cpath = os.fsencode(data_path)
    cdef const char* c_path = cpath
    cdef int fd
    cdef int err
    cdef struct_stat st
    cdef void* ptr
    cdef _Mapping mapping = _Mapping.__new__(_Mapping)
    mapping.cpath = cpath
    with nogil:
        fd = c_open(c_path, O_RDONLY | O_CLOEXEC)
    if fd < 0:
        err = errno
        exc = OSError(err, os.strerror(err), data_path)
        raise AtlasFormatError(f"{data_path}: cannot be read: {exc}") from exc
    try:
        if fstat(fd, &st) != 0:
            err = errno
            exc = OSError(err, os.strerror(err), data_path)
            raise AtlasFormatError(f"{data_path}: cannot be read: {exc}") from exc
        if <uint64_t>st.st_size != expected:
            raise AtlasFormatError(
                f"{index_path}: the last offset is {expected} but {data_path} has "
                f"{st.st_size} bytes"
            )
        if expected == 0:
            return mapping  # nothing to map (mmap refuses zero length)
        with nogil:
            ptr = mmap(NULL, <size_t>expected, PROT_READ, MAP_SHARED, fd, 0)
        if ptr == MAP_FAILED:
            err = errno
            exc = OSError(err, os.strerror(err), data_path)
            raise AtlasFormatError(f"{data_path}: cannot be mapped: {exc}") from exc
        mapping.ptr = <const char*>ptr
        mapping.size = <size_t>expected
        _keep_fd(mapping, fd)
        fd = -1
        return mapping
    finally:
        if fd >= 0:
            c_close(fd)


cdef inline int _check_extent(_Mapping mapping, str data_path, Py_ssize_t b, uint64_t start,
                              uint64_t end) except -1:
    """Refuse block ``b`` (bytes start..end) unless the mapping and the file still hold it."""
    cdef struct_stat st
    if start == end:
        return 0  # nothing is read
    if end <= mapping.size and _file_size(mapping, &st) == 0:
        if <uint64_t>st.st_size >= end:
            return 0
    return _extent_error(mapping, data_path, b, start, end)


cdef int _extent_error(_Mapping mapping, str data_path, Py_ssize_t b, uint64_t start,
                       uint64_t end) except -1:
    cdef struct_stat st
    cdef int err
    cdef uint64_t size = mapping.size
    if _file_size(mapping, &st) != 0:
        err = errno
        exc = OSError(err, os.strerror(err), data_path)
        raise AtlasFormatError(f"{data_path}: cannot be read: {exc}") from exc
    if <uint64_t>st.st_size < size:
        size = <uint64_t>st.st_size
    raise truncated_block_error(data_path, b, start, end, size - start if size > start else 0)


# ---------------------------------------------------------------------------------------------
# Decompression, worded as _pyreader words it
#
# The hot path (a frame declaring its size, decoded in one ZSTD_decompressStream call as
# python-zstandard's decompress() does) runs in C without the GIL. Every failure is then
# diagnosed in Python, the way _pyreader's _diagnose does it, so both backends build the same
# message with the same _format helpers.

# Results of the nogil decoding loops.
cdef enum:
    _DONE = 0
    _ZSTD_FAILED = 1
    _INCOMPLETE = 2
    _TOO_LARGE = 3
    _NO_MEMORY = 4
    _TRAILING = 5

cdef enum:
    _STEP = 4096  # input fed per step to a frame without its size, as _pyreader feeds it
    _SCRATCH = 65536  # output discarded per call when only the outcome matters


cdef int _decode_known_nogil(ZSTD_DCtx* dctx, const ZSTD_DDict* ddict, const char* src,
                             size_t src_size, char* dst, size_t dst_size,
                             size_t* zresult, size_t* produced) noexcept nogil:
    """One call, as python-zstandard's decompress(): output sized from the frame header."""
    cdef ZSTD_inBuffer inb
    cdef ZSTD_outBuffer outb
    ZSTD_DCtx_reset(dctx, ZSTD_reset_session_only)
    zresult[0] = ZSTD_DCtx_refDDict(dctx, ddict)
    if ZSTD_isError(zresult[0]):
        return _ZSTD_FAILED
    inb.src = src
    inb.size = src_size
    inb.pos = 0
    outb.dst = dst
    outb.size = dst_size
    outb.pos = 0
    zresult[0] = ZSTD_decompressStream(dctx, &outb, &inb)
    produced[0] = outb.pos
    if ZSTD_isError(zresult[0]):
        return _ZSTD_FAILED
    if zresult[0] != 0:
        return _INCOMPLETE
    if inb.pos != src_size:
        zresult[0] = src_size - inb.pos
        return _TRAILING
    return _DONE


cdef int _decode_stream_nogil(ZSTD_DCtx* dctx, const ZSTD_DDict* ddict, const char* src,
                              size_t src_size, size_t limit, char** out, size_t* out_size,
                              size_t* consumed, size_t* zresult) noexcept nogil:
    """Stream a frame that does not record its size into a growing malloc'd buffer.

    ``*out`` is owned by the caller afterwards (even on failure). Input is fed in steps of
    _STEP bytes and the limit checked after each, as _pyreader does, so a frame that is both
    too large and corrupt fails the same way: past ``limit`` bytes, the rest of the step is
    decoded into a scratch buffer only to see whether zstd fails within it.
    """
    cdef ZSTD_inBuffer inb
    cdef ZSTD_outBuffer outb
    cdef size_t cap = src_size * 4
    cdef char* grown
    cdef char* scratch = NULL
    cdef bint too_large = False
    cdef bint eof = False
    if cap < 65536:
        cap = 65536
    if cap > limit + 1:
        cap = limit + 1
    out[0] = <char*>realloc(NULL, cap)
    out_size[0] = 0
    consumed[0] = 0
    if out[0] == NULL:
        return _NO_MEMORY
    ZSTD_DCtx_reset(dctx, ZSTD_reset_session_only)
    zresult[0] = ZSTD_DCtx_refDDict(dctx, ddict)
    if ZSTD_isError(zresult[0]):
        return _ZSTD_FAILED
    inb.src = src
    inb.size = 0
    inb.pos = 0
    outb.dst = out[0]
    outb.size = cap
    outb.pos = 0
    try:
        while inb.size < src_size and not eof:
            inb.size = inb.size + _STEP if src_size - inb.size > _STEP else src_size
            while True:
                zresult[0] = ZSTD_decompressStream(dctx, &outb, &inb)
                consumed[0] = inb.pos
                if not too_large:
                    out_size[0] = outb.pos
                if ZSTD_isError(zresult[0]):
                    return _ZSTD_FAILED
                if zresult[0] == 0:
                    eof = True
                    break
                if outb.pos < outb.size:
                    if inb.pos == inb.size:
                        break  # the step is consumed: zstd waits for more input
                    continue
                # The output is full and the frame goes on.
                if too_large:
                    outb.pos = 0
                elif outb.size > limit:
                    too_large = True  # over the limit: finish the step, keeping nothing
                    scratch = <char*>realloc(NULL, _SCRATCH)
                    if scratch == NULL:
                        return _NO_MEMORY
                    outb.dst = scratch
                    outb.size = _SCRATCH
                    outb.pos = 0
                else:
                    cap = outb.size * 2
                    if cap > limit + 1 or cap < outb.size:
                        cap = limit + 1
                    grown = <char*>realloc(out[0], cap)
                    if grown == NULL:
                        return _NO_MEMORY
                    out[0] = grown
                    outb.dst = grown
                    outb.size = cap
            if too_large:
                return _TOO_LARGE
        if not eof:
            return _INCOMPLETE
        return _DONE
    finally:
        free(scratch)


cdef int _restream_nogil(ZSTD_DCtx* dctx, const ZSTD_DDict* ddict, const char* src,
                         size_t src_size, char* scratch, size_t* consumed,
                         size_t* zresult) noexcept nogil:
    """Decode a whole frame keeping nothing: does it fail, end early, or want more input?"""
    cdef ZSTD_inBuffer inb
    cdef ZSTD_outBuffer outb
    ZSTD_DCtx_reset(dctx, ZSTD_reset_session_only)
    zresult[0] = ZSTD_DCtx_refDDict(dctx, ddict)
    if ZSTD_isError(zresult[0]):
        return _ZSTD_FAILED
    inb.src = src
    inb.size = src_size
    inb.pos = 0
    while True:
        outb.dst = scratch
        outb.size = _SCRATCH
        outb.pos = 0
        zresult[0] = ZSTD_decompressStream(dctx, &outb, &inb)
        consumed[0] = inb.pos
        if ZSTD_isError(zresult[0]):
            return _ZSTD_FAILED
        if zresult[0] == 0:
            return _DONE
        if inb.pos == inb.size and outb.pos < outb.size:
            return _INCOMPLETE


cdef str _zstd_error_name(size_t code):
    return ZSTD_getErrorName(code).decode("utf-8", "replace")


cdef inline bint _limits_allow(unsigned long long declared, size_t src_size) noexcept:
    """The common case of _format.check_zstd_content_size, decided in C.

    False means: let check_zstd_content_size decide (and word the error).
    """
    cdef const char* env = getenv("ATLAS_FAST_MAX_BLOCK_BYTES")
    if env != NULL and env[0] != 0:
        return False
    if declared > ATLAS_DEFAULT_MAX_BLOCK_BYTES:
        return False
    return declared <= <unsigned long long>src_size * ATLAS_MAX_ZSTD_RATIO + 1024


cdef ZSTD_DCtx* _take(ZstdDict zdict, bint fresh) except NULL:
    """A context for one decoding: from the pool, or (``fresh``) a new one, see _give."""
    cdef ZSTD_DCtx* dctx
    cdef ZSTD_DCtx** warm = NULL if zdict is None else &zdict.warm
    with nogil:
        dctx = ZSTD_createDCtx() if fresh else _dctx_take(warm)
    if dctx == NULL:
        raise MemoryError("cannot create a zstd decompression context")
    return dctx


cdef inline void _give(ZSTD_DCtx* dctx, ZstdDict zdict, bint fresh) noexcept nogil:
    if fresh:
        ZSTD_freeDCtx(dctx)
    else:
        _dctx_give(dctx, NULL if zdict is None else &zdict.warm)


cdef inline const ZSTD_DDict* _ddict(ZstdDict zdict) noexcept:
    return NULL if zdict is None else zdict.ddict


# How libzstd fails on a damaged frame can depend on what its context decoded before (a reused
# context keeps buffers sized for earlier frames). A failure is therefore decided by a fresh
# context, decoding once more on the error path: the same file fails the same way whatever
# was read before, as it does on the Python backend's fresh decompressor.


cdef bytes _decompress(const char* src, size_t src_size, ZstdDict zdict, str data_path,
                       Py_ssize_t b, bint fresh=False):
    """Decode one frame (``zdict``, held by the caller, keeps its dictionary alive)."""
    cdef unsigned long long declared = ZSTD_getFrameContentSize(src, src_size)
    cdef const ZSTD_DDict* ddict = _ddict(zdict)
    cdef ZSTD_DCtx* dctx
    cdef bytes out
    cdef char* dst
    cdef size_t zresult = 0
    cdef size_t produced = 0
    cdef int status
    if declared == ZSTD_CONTENTSIZE_ERROR:
        raise _diagnose(src, src_size, zdict, data_path, b,
                        "error when determining content size")
    if declared == ZSTD_CONTENTSIZE_UNKNOWN or declared == 0:
        # No size recorded; or 0, which python-zstandard's decompress() returns unchecked.
        return _decompress_stream(src, src_size, zdict, data_path, b, fresh)
    if not _limits_allow(declared, src_size):
        check_zstd_content_size(declared, src_size, f"{data_path}: block {b}")
    out = PyBytes_FromStringAndSize(NULL, <Py_ssize_t>declared)
    dst = PyBytes_AS_STRING(out)
    dctx = _take(zdict, fresh)
    # ``out`` is not shared until returned.
    with nogil:
        status = _decode_known_nogil(dctx, ddict, src, src_size, dst, <size_t>declared,
                                     &zresult, &produced)
        _give(dctx, zdict, fresh)
    if status == _ZSTD_FAILED and not fresh:
        return _decompress(src, src_size, zdict, data_path, b, True)
    if status == _DONE:
        if produced != declared:
            raise AtlasFormatError(
                f"{data_path}: block {b}: decoded {produced} bytes, the frame says {declared}"
            )
        return out
    out = None
    if status == _ZSTD_FAILED:
        detail = f"decompression error: {_zstd_error_name(zresult)}"
    elif status == _INCOMPLETE:
        detail = "decompression error: did not decompress full frame"
    else:
        detail = (f"compressed input contains {zresult} bytes of unused data, "
                  "which is disallowed")
    raise _diagnose(src, src_size, zdict, data_path, b, detail)


cdef bytes _decompress_stream(const char* src, size_t src_size, ZstdDict zdict,
                              str data_path, Py_ssize_t b, bint fresh):
    """A frame without its size, streamed never past max_block_bytes()."""
    limit = max_block_bytes()
    cdef size_t c_limit = min(limit, <Py_ssize_t>(<size_t>-1 >> 2))
    cdef const ZSTD_DDict* ddict = _ddict(zdict)
    cdef char* buf = NULL
    cdef size_t size = 0
    cdef size_t consumed = 0
    cdef size_t zresult = 0
    cdef int status
    cdef ZSTD_DCtx* dctx = _take(zdict, fresh)
    try:
        with nogil:
            status = _decode_stream_nogil(dctx, ddict, src, src_size, c_limit, &buf, &size,
                                          &consumed, &zresult)
            _give(dctx, zdict, fresh)
        if status == _ZSTD_FAILED and not fresh:
            free(buf)
            buf = NULL
            return _decompress_stream(src, src_size, zdict, data_path, b, True)
        where = f"{data_path}: block {b}"
        if status == _NO_MEMORY:
            raise MemoryError(f"{where}: out of memory decoding a zstd frame")
        if status == _ZSTD_FAILED:
            raise _diagnose(src, src_size, zdict, data_path, b,
                            f"zstd decompressor error: {_zstd_error_name(zresult)}")
        if status == _TOO_LARGE:
            raise AtlasFormatError(
                f"{where}: the zstd frame decodes to more than {limit} bytes, the "
                "limit (ATLAS_FAST_MAX_BLOCK_BYTES)"
            )
        if status == _INCOMPLETE:
            raise AtlasFormatError(f"{where}: the zstd frame is truncated")
        if consumed != src_size:
            raise AtlasFormatError(f"{where}: {src_size - consumed} bytes follow the zstd frame")
        return PyBytes_FromStringAndSize(buf, <Py_ssize_t>size)
    finally:
        free(buf)


cdef object _diagnose(const char* src, size_t src_size, ZstdDict zdict, str data_path,
                      Py_ssize_t b, str detail):
    """The error for a frame that did not decode (error path only, as _pyreader's)."""
    where = f"{data_path}: block {b}"
    frame_dict_id = ZSTD_getDictID_fromFrame(src, src_size)
    dict_id = None if zdict is None else ZSTD_getDictID_fromDDict(zdict.ddict)
    error = zstd_frame_error(
        where, detail, frame_dict_id, dict_id, None if zdict is None else zdict.path
    )
    if "corrupt zstd frame" not in str(error):
        return error
    # Truncated or followed by other bytes? Streaming the whole input tells these apart.
    cdef const ZSTD_DDict* ddict = _ddict(zdict)
    cdef size_t consumed = 0
    cdef size_t zresult = 0
    cdef int status
    cdef char* scratch = <char*>PyMem_Malloc(_SCRATCH)
    if scratch == NULL:
        raise MemoryError()
    cdef ZSTD_DCtx* dctx
    try:
        dctx = _take(zdict, True)
        with nogil:
            status = _restream_nogil(dctx, ddict, src, src_size, scratch, &consumed, &zresult)
            _give(dctx, zdict, True)
    finally:
        PyMem_Free(scratch)
    if status == _ZSTD_FAILED:
        return error
    if status == _INCOMPLETE:
        return AtlasFormatError(f"{where}: the zstd frame is truncated")
    if consumed != src_size:
        return AtlasFormatError(f"{where}: {src_size - consumed} bytes follow the zstd frame")
    return error


# ---------------------------------------------------------------------------------------------
# Indices: the rules (and their messages) are _contract.normalize_index and block_number; the
# common case is decided here in C, anything else is handed to them.

cdef inline Py_ssize_t _normalize(object i, Py_ssize_t n) except -1:
    """``i`` as an index in [0, n): negative counts from the end; IndexError outside."""
    cdef int overflow = 0
    cdef long long k
    if PyLong_CheckExact(i):
        k = PyLong_AsLongLongAndOverflow(i, &overflow)
        if overflow == 0:
            if k < 0:
                k += n
                if k >= 0:
                    return <Py_ssize_t>k
            elif k < n:
                return <Py_ssize_t>k
    return normalize_index(i, n)


cdef inline Py_ssize_t _block_index(object b, Py_ssize_t n_blocks) except -1:
    """``b`` as a block number in [0, n_blocks); IndexError outside."""
    cdef int overflow = 0
    cdef long long k
    if PyLong_CheckExact(b):
        k = PyLong_AsLongLongAndOverflow(b, &overflow)
        if overflow == 0 and 0 <= k < n_blocks:
            return <Py_ssize_t>k
    return block_number(b, n_blocks)


# ---------------------------------------------------------------------------------------------
# The block cache (see atlas_fast._contract for its semantics)
#
# Every method runs with the GIL held and calls no Python code while the list and the dict
# disagree, so the GIL alone guards them: no lock to take, none to renew after fork. Entries
# dropped are released only once the structure is consistent again (freeing examples may run
# arbitrary code, which may come back here).


@cython.final
@cython.auto_pickle(False)
cdef class _Entry:
    """A cached block: its examples, and room for what partial decoding will keep.

    ``examples`` the unpickled list (or None), ``data`` its decoded pickle bytes (or None),
    ``offsets`` per-example positions in ``data`` and ``partial`` a resumable decompression
    state (None until a core fills them); ``nbytes`` what it counts against the budget.
    ``live``: the cache holds it (it is then in the dict and the list); a reader's last entry
    may outlive it, emptied.
    """

    cdef object key
    cdef Py_ssize_t block
    cdef list examples
    cdef object data
    cdef object offsets
    cdef object partial
    cdef Py_ssize_t nbytes
    cdef bint live
    cdef PyObject* newer  # borrowed: the cache's dict owns every live entry
    cdef PyObject* older


@cython.final
@cython.auto_pickle(False)
cdef class BlockCache:
    """Decoded blocks, least recently used evicted first, bounded in bytes and/or blocks."""

    cdef dict _entries  # key -> _Entry: owns them
    cdef PyObject* _newest
    cdef PyObject* _oldest
    cdef Py_ssize_t _count
    cdef Py_ssize_t _bytes
    cdef Py_ssize_t _max_bytes  # -1: no bound
    cdef Py_ssize_t _max_blocks  # -1: no bound
    cdef Py_ssize_t _reserved
    cdef unsigned long long _hits
    cdef unsigned long long _misses

    def __cinit__(self, max_bytes=None, max_blocks=None):
        self._entries = {}
        self._max_bytes = -1 if max_bytes is None else max_bytes
        self._max_blocks = -1 if max_blocks is None else max_blocks
        self._reserved = 1

    def cache_info(self):
        return CacheInfo(
            self._hits,
            self._misses,
            None if self._max_bytes < 0 else self._max_bytes,
            self._bytes,
            self._count,
            None if self._max_blocks < 0 else self._max_blocks,
        )

    @property
    def reserved(self):
        return self._reserved

    def reserve(self, Py_ssize_t blocks):
        if blocks > self._reserved:
            self._reserved = blocks

    def keys(self):
        """``(tag, block)`` of the blocks held, least recently used first."""
        cdef list out = []
        cdef PyObject* p = self._oldest
        while p != NULL:
            out.append((<_Entry>p).key)
            p = (<_Entry>p).newer
        return out

    def clear(self):
        cdef list dropped = []
        while self._oldest != NULL:
            self._drop(<_Entry>self._oldest, dropped)

    def _discard(self, tag):
        """Drop every block of the reader tagged ``tag``."""
        cdef list dropped = []
        for e in [e for e in self._entries.values() if (<_Entry>e).key[0] == tag]:
            self._drop(<_Entry>e, dropped)

    cdef inline void _unlink(self, _Entry e) noexcept:
        if e.newer != NULL:
            (<_Entry>e.newer).older = e.older
        else:
            self._newest = e.older
        if e.older != NULL:
            (<_Entry>e.older).newer = e.newer
        else:
            self._oldest = e.newer
        e.newer = NULL
        e.older = NULL

    cdef inline void _push(self, _Entry e) noexcept:
        e.newer = NULL
        e.older = self._newest
        if self._newest != NULL:
            (<_Entry>self._newest).newer = <PyObject*>e
        self._newest = <PyObject*>e
        if self._oldest == NULL:
            self._oldest = <PyObject*>e

    cdef inline void _hit(self, _Entry e) noexcept:
        """A hit on live entry ``e``: now the most recent."""
        self._hits += 1
        if self._newest != <PyObject*>e:
            self._unlink(e)
            self._push(e)

    cdef _Entry _get(self, object key):
        """The live entry holding examples for ``key`` (a hit), or None (a miss)."""
        cdef PyObject* found = PyDict_GetItem(self._entries, key)
        if found == NULL or (<_Entry>found).examples is None:
            self._misses += 1
            return None
        self._hit(<_Entry>found)
        return <_Entry>found

    cdef _Entry _put(self, object key, Py_ssize_t block, list examples, Py_ssize_t nbytes):
        """Cache ``examples`` as block ``key``; an entry already there (another thread's) wins."""
        cdef PyObject* found = PyDict_GetItem(self._entries, key)
        cdef list dropped = []
        cdef _Entry e
        if found != NULL:
            e = <_Entry>found
            if e.examples is not None:
                if self._newest != found:
                    self._unlink(e)
                    self._push(e)
                return e
            self._drop(e, dropped)
        e = _Entry.__new__(_Entry)
        e.key = key
        e.block = block
        e.examples = examples
        e.nbytes = nbytes
        self._entries[key] = e
        e.live = True
        self._push(e)
        self._count += 1
        self._bytes += nbytes
        while self._count > self._reserved and (
            (self._max_bytes >= 0 and self._bytes > self._max_bytes)
            or (self._max_blocks >= 0 and self._count > self._max_blocks)
        ):
            self._drop(<_Entry>self._oldest, dropped)
        return e

    cdef int _drop(self, _Entry e, list dropped) except -1:
        """Unlink ``e``; what it held goes to ``dropped``, released by the caller's return."""
        dropped.append((e, e.examples, e.data, e.offsets, e.partial))
        self._unlink(e)
        del self._entries[e.key]
        self._count -= 1
        self._bytes -= e.nbytes
        e.live = False
        e.examples = None
        e.data = None
        e.offsets = None
        e.partial = None
        return 0


cdef inline Py_ssize_t _data_size(object data) noexcept:
    if type(data) is bytes:
        return PyBytes_GET_SIZE(data)
    return (<_BlockView>data).size


# ---------------------------------------------------------------------------------------------
# Shards


@cython.auto_pickle(False)
cdef class ShardCore:
    """Reads the blocks of one shard: mmap'd data.bin, C index math, libzstd, the cache."""

    cdef readonly str _root
    cdef readonly str _data_path
    cdef readonly Py_ssize_t _n
    cdef readonly Py_ssize_t _block_size
    cdef readonly Py_ssize_t _n_blocks
    cdef Py_ssize_t _last_length  # examples in the last block
    cdef readonly bint _compressed
    cdef object _loads
    cdef object _metadata
    cdef object _dict_bytes
    cdef BlockCache _cache
    cdef object _tag
    # The entry of the block last read: a hit on it skips the dict. Read and replaced under
    # the GIL; only trusted while live.
    cdef _Entry _last
    # Set together by _open under _lock (and cleared by close under it); read under the GIL,
    # and held in locals by a reader across its nogil decompression.
    cdef object _offsets  # the validated numpy array (None: not open)
    cdef const uint64_t* _offs  # its data
    cdef _Mapping _mapping
    cdef ZstdDict _zdict
    cdef PyThread_type_lock _lock
    cdef unsigned long _lock_generation

    def __cinit__(self, *args, **kwargs):
        self._lock = _new_lock()
        self._lock_generation = _generation

    def __init__(self, root, metadata, dict_bytes=None, loads=None, cache=None, tag=0):
        check_shared_dict(root, metadata, dict_bytes)
        self._root = str(root)
        self._data_path = os.path.join(self._root, DATA_FILE)
        self._metadata = metadata
        self._dict_bytes = dict_bytes
        self._n = metadata.stored_examples
        self._block_size = metadata.block_size
        self._n_blocks = block_count(self._n, self._block_size)
        self._last_length = (
            expected_block_length(self._n, self._block_size, self._n_blocks - 1)
            if self._n_blocks else 0
        )
        self._compressed = metadata.compression_strategy != 0
        self._loads = pickle.loads if loads is None else loads
        self._cache = BlockCache(DEFAULT_CACHE_BYTES, None) if cache is None else cache
        self._tag = tag

    def __len__(self):
        return self._n

    def __getitem__(self, i):
        return self._get(_normalize(i, self._n))

    cdef inline object _get(self, Py_ssize_t k):
        """Example ``k``, 0 <= k < _n."""
        cdef Py_ssize_t b = k // self._block_size
        cdef Py_ssize_t j = k - b * self._block_size
        cdef _Entry e = self._last
        cdef list examples
        if e is not None and e.block == b and e.examples is not None:
            self._cache._hit(e)  # runs no Python code: e.examples stays
            examples = e.examples
        else:
            examples = self._examples(b)
        # A list handed out by read_block may have been emptied by its caller.
        if j < PyList_GET_SIZE(examples):
            return <object>PyList_GET_ITEM(examples, j)
        return PyObject_GetItem(examples, j)

    cdef list _examples(self, Py_ssize_t b):
        """The examples of block ``b`` (0 <= b < blocks), from the cache or decoded (then
        cached)."""
        key = (self._tag, b)
        cdef _Entry e = self._cache._get(key)
        cdef list examples
        if e is not None:
            examples = e.examples  # read before any Python code can run
        else:
            data = self._decoded(b, True, True)
            examples = self._unpickle_c(data, b)
            e = self._cache._put(key, b, examples, _data_size(data))
            # Another thread's copy may have won; releasing what _put evicted may have run
            # code that evicted it already: ``examples`` stays valid either way.
            if e.examples is not None:
                examples = e.examples
        self._last = e
        return examples

    # -- the contract (atlas_fast._contract.ShardCoreProtocol) ------------------------------

    def read_block(self, b):
        """The examples of block ``b``, through the cache."""
        return self._examples(_block_index(b, self._n_blocks))

    def block_bytes(self, b):
        """The decoded pickle bytes of block ``b`` (not cached)."""
        return self._decoded(_block_index(b, self._n_blocks), True)

    def raw_block(self, b):
        """The stored (possibly compressed) bytes of block ``b``."""
        return self._decoded(_block_index(b, self._n_blocks), False)

    def offsets(self):
        """The validated block offsets (opening the shard's files on first use)."""
        while self._offsets is None:
            self._open()
        return self._offsets

    def __getitems__(self, indices):
        """The examples at ``indices``, in that order; each block needed is decoded once."""
        cdef Py_ssize_t n = self._n
        return gather(lambda s: self, [(0, _normalize(i, n)) for i in indices])

    def __iter__(self):
        """Every example in order, the next blocks decompressing while one is handed out."""
        return read_ahead((self, b) for b in range(self._n_blocks))

    def cache_info(self):
        return self._cache.cache_info()

    def cache_reserve(self, blocks):
        self._cache.reserve(blocks)

    def close(self):
        """Release the mapping, the dictionary and the cached blocks (reopened on next use)."""
        cdef PyThread_type_lock lock = self._lock_get()
        if lock == NULL:
            raise MemoryError("cannot allocate a lock")
        _acquire(lock)
        # Dropped after the lock is released: freeing them may run arbitrary code.
        dropped = (self._last, self._mapping, self._zdict, self._offsets)
        self._last = None
        self._offsets = None
        self._offs = NULL
        self._mapping = None
        self._zdict = None
        PyThread_release_lock(lock)
        del dropped
        self._cache._discard(self._tag)

    # -- for _batch -------------------------------------------------------------------------

    def _lookup(self, Py_ssize_t b):
        cdef _Entry e = self._cache._get((self._tag, b))
        return None if e is None else e.examples

    def _load(self, Py_ssize_t b):
        return self._examples(b)

    def _store(self, Py_ssize_t b, data):
        cdef list examples = self._unpickle_c(data, b)
        cdef _Entry e = self._cache._put((self._tag, b), b, examples, _data_size(data))
        return examples if e.examples is None else e.examples

    # -- opening ----------------------------------------------------------------------------

    cdef inline PyThread_type_lock _lock_get(self) noexcept:
        if self._lock_generation != _generation:
            # Forked: the parent's lock may be held forever; abandon it.
            self._lock = PyThread_allocate_lock()
            self._lock_generation = _generation
        return self._lock

    cdef int _open_lock_held(self) except -1:
        offsets, zdict = open_files(self._root, self._metadata, self._dict_bytes, ZstdDict)
        cdef const uint64_t[::1] view = offsets
        if view.shape[0] != self._n_blocks + 1:
            raise AtlasFormatError(
                f"{self._root}: {view.shape[0]} offsets for {self._n_blocks} blocks"
            )
        cdef uint64_t end = view[self._n_blocks]
        cdef str index_path = os.path.join(self._root, INDEX_FILE)
        mapping = None
        if self._n_blocks:
            mapping = _map_file(self._data_path, end, index_path)
        # Published together, with no Python code in between.
        self._mapping = mapping
        self._zdict = zdict
        self._offs = &view[0]
        self._offsets = offsets
        return 0

    cdef int _open(self) except -1:
        cdef PyThread_type_lock lock = self._lock_get()
        if lock == NULL:
            raise MemoryError("cannot allocate a lock")
        _acquire(lock)
        try:
            if self._offsets is None:
                self._open_lock_held()
        finally:
            PyThread_release_lock(lock)
        return 0

    # -- blocks -----------------------------------------------------------------------------

    cdef object _decoded(self, Py_ssize_t b, bint decode, bint view=False):
        """Block ``b``'s pickle bytes (``decode`` false: its stored bytes); 0 <= b < blocks.

        ``view`` true: an uncompressed block comes as a _BlockView of the mapping (no copy);
        otherwise always bytes.
        """
        cdef object offsets = self._offsets
        while offsets is None:
            self._open()
            offsets = self._offsets
        # Locals keep the offsets, mapping and dictionary alive whatever another thread does.
        cdef _Mapping mapping = self._mapping
        cdef ZstdDict zdict = self._zdict
        cdef uint64_t start = self._offs[b]
        cdef uint64_t end = self._offs[b + 1]
        cdef bytes out
        cdef char* dst
        cdef _BlockView block_view
        cdef size_t size = <size_t>(end - start)
        _check_extent(mapping, self._data_path, b, start, end)
        if decode and self._compressed:
            return _decompress(mapping.ptr + start, size, zdict, self._data_path, b)
        if view:
            block_view = _BlockView.__new__(_BlockView)
            block_view.owner = mapping
            block_view.ptr = mapping.ptr + start if end > start else mapping.ptr
            block_view.size = <Py_ssize_t>size
            return block_view
        if size < (1 << 20):
            return PyBytes_FromStringAndSize(mapping.ptr + start, <Py_ssize_t>size)
        out = PyBytes_FromStringAndSize(NULL, <Py_ssize_t>size)
        dst = PyBytes_AS_STRING(out)
        with nogil:
            memcpy(dst, mapping.ptr + start, size)
        return out

    cdef list _unpickle_c(self, data, Py_ssize_t b):
        """Block ``b``'s examples from its pickle bytes, checked to be a list of its length."""
        cdef Py_ssize_t expected
        try:
            examples = self._loads(data)
        except Exception as exc:
            raise unpickle_error(exc, self._data_path, b) from exc
        expected = self._block_size if b < self._n_blocks - 1 else self._last_length
        if type(examples) is not list or PyList_GET_SIZE(examples) != expected:
            check_block_examples(examples, expected, self._data_path, b)
        return examples

    def __dealloc__(self):
        # self._lock is not freed: a lock from before a fork may be held by a lost thread,
        # and a current one is a few bytes. Free only one of the current generation.
        if self._lock != NULL and self._lock_generation == _generation:
            PyThread_free_lock(self._lock)


# ---------------------------------------------------------------------------------------------
# Datasets


@cython.auto_pickle(False)
cdef class DatasetCore:
    """Maps global indices onto the shards of a dataset (binary search in C); a shard's
    reader is made on its first use."""

    cdef list _readers  # ShardCore or None (not used yet)
    cdef list _shard_dirs
    cdef list _sizes
    cdef list _metadatas
    cdef object _root
    cdef object _dict_bytes
    cdef object _loads
    cdef BlockCache _cache
    cdef Py_ssize_t _total
    cdef Py_ssize_t* _c_ends
    cdef Py_ssize_t _n_shards

    def __cinit__(self, *args, **kwargs):
        self._c_ends = NULL
        self._readers = []

    def __init__(self, root, shard_dirs, sizes, metadatas, dict_bytes, loads, cache):
        cdef Py_ssize_t n = len(sizes)
        cdef Py_ssize_t total = 0
        cdef Py_ssize_t* c_ends = <Py_ssize_t*>PyMem_Malloc(max(n, 1) * sizeof(Py_ssize_t))
        if c_ends == NULL:
            raise MemoryError()
        for k in range(n):
            total += sizes[k]
            c_ends[k] = total
        PyMem_Free(self._c_ends)
        self._c_ends = c_ends
        self._n_shards = n
        self._total = total
        self._root = str(root)
        self._shard_dirs = list(shard_dirs)
        self._sizes = list(sizes)
        self._metadatas = list(metadatas)
        self._dict_bytes = dict_bytes
        self._loads = loads
        self._cache = cache
        self._readers = [None] * n

    def __dealloc__(self):
        PyMem_Free(self._c_ends)

    def __len__(self):
        return self._total

    cdef inline ShardCore _reader_c(self, Py_ssize_t s):
        cdef object reader = <object>PyList_GET_ITEM(self._readers, s)
        if reader is not None:
            return <ShardCore>reader
        return self._make_reader(s)

    cdef ShardCore _make_reader(self, Py_ssize_t s):
        made = shard_reader(
            ShardCore, self._root, self._shard_dirs[s], self._metadatas[s], self._sizes[s],
            self._dict_bytes, self._loads, self._cache, s,
        )
        reader = self._readers[s]
        if reader is None:  # another thread may have made it meanwhile: keep one
            reader = self._readers[s] = made
        return <ShardCore>reader

    def _reader(self, Py_ssize_t s):
        return self._reader_c(s)

    cdef inline Py_ssize_t _shard_of(self, Py_ssize_t k) noexcept:
        """The first shard whose end is past ``k`` (bisect_right over the ends)."""
        cdef Py_ssize_t lo = 0
        cdef Py_ssize_t hi = self._n_shards
        cdef Py_ssize_t mid
        cdef const Py_ssize_t* ends = self._c_ends
        while lo < hi:
            mid = (lo + hi) >> 1
            if ends[mid] <= k:
                lo = mid + 1
            else:
                hi = mid
        return lo

    cdef tuple _locate(self, i):
        cdef Py_ssize_t k = _normalize(i, self._total)
        cdef Py_ssize_t s = self._shard_of(k)
        return s, k - (self._c_ends[s - 1] if s else 0)

    def __getitem__(self, i):
        cdef Py_ssize_t k = _normalize(i, self._total)
        cdef Py_ssize_t s = self._shard_of(k)
        return self._reader_c(s)._get(k - (self._c_ends[s - 1] if s else 0))

    def __getitems__(self, indices):
        """The examples at ``indices``, in that order; each block needed is decoded once."""
        return gather(self._reader, [self._locate(i) for i in indices])

    def __iter__(self):
        """Every example in order, the next blocks decompressing while one is handed out."""
        return read_ahead(
            (self._reader_c(s), b)
            for s in range(self._n_shards)
            if self._sizes[s]
            for b in range(self._reader_c(s)._n_blocks)
        )

    def cache_info(self):
        return self._cache.cache_info()

    def cache_reserve(self, blocks):
        self._cache.reserve(blocks)

    def close(self):
        """Release every shard's files and the cached blocks (they reopen on next use)."""
        for reader in self._readers:
            if reader is not None:
                reader.close()
        self._cache.clear()
