# Included by _reader.pyx (one extension module): libzstd bound at import, decompression
# contexts, dictionaries, decoding.
# Directives are set once, in setup.py.

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

# Compression, bound when the library has it (the reader does not need it).
cdef ZSTD_createCCtx_fn ZSTD_createCCtx = NULL
cdef ZSTD_freeCCtx_fn ZSTD_freeCCtx = NULL
cdef ZSTD_CCtx_setParameter_fn ZSTD_CCtx_setParameter = NULL
cdef ZSTD_CCtx_reset_fn ZSTD_CCtx_reset = NULL
cdef ZSTD_CCtx_setPledgedSrcSize_fn ZSTD_CCtx_setPledgedSrcSize = NULL
cdef ZSTD_CCtx_loadDictionary_fn ZSTD_CCtx_loadDictionary = NULL
cdef ZSTD_compressStream2_fn ZSTD_compressStream2 = NULL
cdef ZSTD_compressBound_fn ZSTD_compressBound = NULL

cdef bint _zstd_ok = False
cdef bint _zcompress_ok = False
_zstd_info = None  # dict reported by zstd_library() once bound
_zstd_error = "libzstd was not looked for"

_SYMBOLS = (
    "ZSTD_versionNumber", "ZSTD_versionString", "ZSTD_isError", "ZSTD_getErrorName",
    "ZSTD_getFrameContentSize", "ZSTD_createDCtx", "ZSTD_freeDCtx", "ZSTD_DCtx_reset",
    "ZSTD_DCtx_refDDict", "ZSTD_createDDict", "ZSTD_freeDDict", "ZSTD_getDictID_fromDDict",
    "ZSTD_decompressStream", "ZSTD_getDictID_fromFrame",
)
_COMPRESS_SYMBOLS = (
    "ZSTD_createCCtx", "ZSTD_freeCCtx", "ZSTD_CCtx_setParameter", "ZSTD_CCtx_reset",
    "ZSTD_CCtx_setPledgedSrcSize", "ZSTD_CCtx_loadDictionary", "ZSTD_compressStream2",
    "ZSTD_compressBound",
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


cdef object _bind(str path, object versions=None):
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
    if versions is not None and version != versions:
        raise OSError(f"libzstd {version} is not python-zstandard's release ({versions})")
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
    _bind_compression(handle)
    if dladdr(syms[5], &info) and info.dli_fname != NULL:
        return os.path.realpath(os.fsdecode(info.dli_fname))
    return os.path.realpath(path) if os.sep in path else path


cdef void _bind_compression(void* handle) noexcept:
    """Bind the compression functions if ``handle`` has them all (else leave them unbound)."""
    global ZSTD_createCCtx, ZSTD_freeCCtx, ZSTD_CCtx_setParameter, ZSTD_CCtx_reset
    global ZSTD_CCtx_setPledgedSrcSize, ZSTD_CCtx_loadDictionary, ZSTD_compressStream2
    global ZSTD_compressBound, _zcompress_ok
    cdef void* syms[8]
    cdef bytes cname
    for k, name in enumerate(_COMPRESS_SYMBOLS):
        cname = name.encode()
        syms[k] = dlsym(handle, cname)
        if syms[k] == NULL:
            _zcompress_ok = False
            return
    ZSTD_createCCtx = <ZSTD_createCCtx_fn>syms[0]
    ZSTD_freeCCtx = <ZSTD_freeCCtx_fn>syms[1]
    ZSTD_CCtx_setParameter = <ZSTD_CCtx_setParameter_fn>syms[2]
    ZSTD_CCtx_reset = <ZSTD_CCtx_reset_fn>syms[3]
    ZSTD_CCtx_setPledgedSrcSize = <ZSTD_CCtx_setPledgedSrcSize_fn>syms[4]
    ZSTD_CCtx_loadDictionary = <ZSTD_CCtx_loadDictionary_fn>syms[5]
    ZSTD_compressStream2 = <ZSTD_compressStream2_fn>syms[6]
    ZSTD_compressBound = <ZSTD_compressBound_fn>syms[7]
    _zcompress_ok = True


def _candidates():
    """Where libzstd is looked for, in order: (path, how it was found, the release it must
    be, or None).

    First the system libzstd, if it is the very release python-zstandard carries: on the
    same machine python-zstandard's _cffi module (the libzstd it exports) decodes 8-9% slower
    per zstd block than the system's, and decoding is most of a compressed miss. Only the
    same release: another one may judge a damaged frame otherwise than the Python backend
    (which decodes with python-zstandard), and both backends must fail alike.
    """
    forced = os.environ.get("ATLAS_FAST_LIBZSTD")
    if forced:
        return [(forced, "ATLAS_FAST_LIBZSTD", None)]
    system = "libzstd.1.dylib" if sys.platform == "darwin" else "libzstd.so.1"
    found = []
    try:
        import zstandard

        same = zstandard.ZSTD_VERSION
        found.append((system, "the system libzstd", same[0] * 10000 + same[1] * 100 + same[2]))
    except (ImportError, AttributeError, TypeError, IndexError):
        pass
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
                    path = os.path.join(folder, name)
                    found.append((path, "python-zstandard's _cffi module", None))
    found.append((system, "the system libzstd", None))
    return found


def _load_zstd():
    global _zstd_ok, _zstd_info, _zstd_error
    errors = []
    tried_system = False
    for path, how, versions in _candidates():
        try:
            real = _bind(path, versions)
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


cdef inline const ZSTD_DDict* _ddict(ZstdDict zdict) noexcept nogil:
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
    dict_path = None if zdict is None else zdict.path
    error = zstd_dictionary_mismatch(where, frame_dict_id, dict_id, dict_path)
    if error is not None:
        return error
    error = corrupt_frame_error(where, detail, dict_path)
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


cdef int _export_read_only(Py_buffer* view, object owner, const void* buf, Py_ssize_t size,
                           int flags, str refusal) except -1:
    """Fill ``view`` with ``buf[0:size]``, one-dimensional bytes, read-only, held by ``owner``."""
    if flags & PyBUF_WRITABLE:
        raise BufferError(refusal)
    view.buf = <void*>buf
    view.obj = owner
    view.len = size
    view.readonly = 1
    view.itemsize = 1
    view.format = <char*>"B" if flags & PyBUF_FORMAT else NULL
    view.ndim = 1
    view.shape = &view.len if flags & PyBUF_ND else NULL
    view.strides = NULL
    view.suboffsets = NULL
    view.internal = NULL
    return 0


# ---------------------------------------------------------------------------------------------
# Partial decompression: a zstd frame decoded only as far as asked, resumably. The core does not
# use it (a prefix of a block's pickle does not determine its examples, see
# atlas_fast._pickle_scan); it is the building block for pickles whose structure allows it.

cdef enum:
    _PZ_OK = 0
    _PZ_ZSTD_ERROR = 1  # libzstd refused the frame (error code in .zresult)
    _PZ_TRUNCATED = 2  # the input ended before the frame did
    _PZ_TOO_LARGE = 3  # more output than the declared size or the limit
    _PZ_NO_MEMORY = 4
    _PZ_SIZE_MISMATCH = 5  # the frame ended short of its declared size


@cython.auto_pickle(False)
@cython.final
cdef class PartialZstd:
    """One zstd frame, decompressed into a buffer only as far as asked (``advance``).

    A later ``advance`` further into the frame resumes where the last one stopped, never
    starting over. The frame must declare its size (one that does not is refused: decode it
    whole): the buffer is allocated once, output never moves, and the object exports the
    bytes out so far (``available``) read-only through the buffer protocol.
    Thread-safe: one lock per object, the GIL released while libzstd decodes.
    """

    # self.lock guards everything below it; taken with the GIL released when contended.
    cdef PyThread_type_lock lock
    cdef ZSTD_DCtx* dctx  # NULL before the first advance and once the frame is over
    cdef ZstdDict zdict  # its dictionary, or None
    cdef Py_buffer src
    cdef bint have_src
    cdef size_t in_pos
    cdef unsigned char* out  # allocated once, content-size bytes: never moves
    cdef size_t out_len
    cdef size_t out_cap
    cdef unsigned char probe  # where a byte past the declared size would land
    cdef bint finished
    cdef int status
    cdef size_t zresult
    cdef Py_ssize_t exports

    def __cinit__(self, frame, dictionary=None, size_t max_size=1 << 32):
        cdef unsigned long long declared
        if not _zstd_ok:
            raise RuntimeError(zstd_load_error())
        self.lock = PyThread_allocate_lock()
        if self.lock == NULL:
            raise MemoryError("cannot allocate a lock")
        PyObject_GetBuffer(frame, &self.src, PyBUF_SIMPLE)
        self.have_src = True
        declared = ZSTD_getFrameContentSize(self.src.buf, <size_t>self.src.len)
        if declared == ZSTD_CONTENTSIZE_ERROR:
            raise ValueError("not a zstd frame (cannot read its header)")
        if declared == ZSTD_CONTENTSIZE_UNKNOWN:
            # Decoded whole, the usual way, by the caller.
            raise ValueError("the frame does not declare its size")
        if declared > max_size:
            raise ValueError(f"the frame declares {declared} bytes, over {max_size}")
        self.out_cap = <size_t>declared
        self.out = <unsigned char*>malloc(self.out_cap if self.out_cap else 1)
        if self.out == NULL:
            raise MemoryError()
        if dictionary is not None:
            self.zdict = dictionary if isinstance(dictionary, ZstdDict) else ZstdDict(
                dictionary, "<dictionary>"
            )

    def __dealloc__(self):
        cdef ZSTD_DCtx** warm
        if self.dctx != NULL:  # stopped mid-frame: its session is ended before it goes back
            ZSTD_DCtx_reset(self.dctx, ZSTD_reset_session_only)
            warm = self.warm_slot()
            if warm == NULL:
                # zdict may be gone already (a cycle's clear runs first): the context must not
                # go to the general pool still referring to a dictionary that may be freed.
                ZSTD_DCtx_refDDict(self.dctx, NULL)
            _dctx_give(self.dctx, warm)
        free(self.out)
        if self.have_src:
            PyBuffer_Release(&self.src)
        if self.lock != NULL:
            PyThread_free_lock(self.lock)

    cdef int advance_lock_held(self, size_t offset) noexcept nogil:
        """Decode until ``offset`` bytes are out or the frame ends; a _PZ_ status."""
        cdef ZSTD_inBuffer inb
        cdef ZSTD_outBuffer outb
        cdef size_t ret
        if self.status != _PZ_OK or self.finished or self.out_len >= offset:
            return self.status
        if self.dctx == NULL:
            # A pooled context (one made per frame costs as much as decoding a small one),
            # given back once the frame is over or this object goes.
            self.dctx = _dctx_take(self.warm_slot())
            if self.dctx == NULL:
                self.status = _PZ_NO_MEMORY
                return self.status
            ZSTD_DCtx_reset(self.dctx, ZSTD_reset_session_only)
            ret = ZSTD_DCtx_refDDict(self.dctx, _ddict(self.zdict))
            if ZSTD_isError(ret):
                self.zresult = ret
                self.status = _PZ_ZSTD_ERROR
                return self.status
        inb.src = self.src.buf
        inb.size = <size_t>self.src.len
        while self.out_len < offset and not self.finished:
            inb.pos = self.in_pos
            outb.pos = self.out_len
            if self.out_len < self.out_cap:
                outb.dst = self.out
                outb.size = offset if offset < self.out_cap else self.out_cap
            else:
                # The declared size is out: only the frame's end may follow, no more bytes.
                outb.dst = &self.probe
                outb.size = 1
                outb.pos = 0
            ret = ZSTD_decompressStream(self.dctx, &outb, &inb)
            if ZSTD_isError(ret):
                self.zresult = ret
                self.status = _PZ_ZSTD_ERROR
            elif self.out_len == self.out_cap and outb.pos:
                self.status = _PZ_TOO_LARGE
            elif ret == 0:
                self.finished = True
            elif inb.pos == self.in_pos and (self.out_len == self.out_cap
                                             or outb.pos == self.out_len):
                self.status = _PZ_TRUNCATED  # no progress: the input is exhausted
            if self.out_len < self.out_cap:
                self.out_len = outb.pos
            self.in_pos = inb.pos
            if self.status != _PZ_OK:
                return self.status
        if self.finished:
            if self.out_len != self.out_cap:
                self.status = _PZ_SIZE_MISMATCH
            _dctx_give(self.dctx, self.warm_slot())
            self.dctx = NULL
        return self.status

    cdef inline ZSTD_DCtx** warm_slot(self) noexcept nogil:
        return NULL if self.zdict is None else &self.zdict.warm

    cpdef size_t advance(self, size_t offset) except? 0:
        """Decode until ``offset`` bytes are out (or the frame ends); how many bytes are out.

        Raises ValueError when the frame is damaged or truncated, MemoryError when memory
        runs out; the object stays in that state.
        """
        cdef int status
        cdef size_t out_len
        if not PyThread_acquire_lock(self.lock, NOWAIT_LOCK):
            with nogil:
                PyThread_acquire_lock(self.lock, WAIT_LOCK)
        try:
            with nogil:
                status = self.advance_lock_held(offset)
            out_len = self.out_len
        finally:
            PyThread_release_lock(self.lock)
        if status == _PZ_NO_MEMORY:
            raise MemoryError("out of memory decompressing a zstd frame")
        if status == _PZ_ZSTD_ERROR:
            raise ValueError(f"zstd: {ZSTD_getErrorName(self.zresult).decode()}")
        if status == _PZ_TRUNCATED:
            raise ValueError("zstd: the frame is truncated")
        if status == _PZ_TOO_LARGE:
            raise ValueError(f"zstd: the frame decodes to more than {self.out_cap} bytes")
        if status == _PZ_SIZE_MISMATCH:
            raise ValueError(
                f"zstd: the frame decodes to {self.out_len} bytes, its header says "
                f"{self.out_cap}"
            )
        return out_len

    @property
    def available(self):
        """Bytes decoded so far."""
        return self.out_len

    @property
    def finished(self):
        """Whether the whole frame is decoded."""
        return self.finished

    @property
    def content_size(self):
        """The size the frame declares."""
        return self.out_cap

    def finish(self):
        """Decode the rest of the frame; its size."""
        return self.advance(self.out_cap + 1)

    def __getbuffer__(self, Py_buffer* view, int flags):
        # A view covers the bytes out at this moment: written once, never changed after.
        _export_read_only(view, self, self.out, <Py_ssize_t>self.out_len, flags,
                          "decoded bytes are read-only")
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* view):
        self.exports -= 1
