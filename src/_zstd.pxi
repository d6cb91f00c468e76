# Included by _reader.pyx: decompression contexts, dictionaries, decoding (libzstd is bound
# by _libzstd.pxi).
# Directives are set once, in setup.py.

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


after_fork_in_child(_after_fork_in_child)


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
# Decompression, worded as _reader_py words it
#
# The hot path (a frame declaring its size, decoded in one ZSTD_decompressStream call as
# python-zstandard's decompress() does) runs in C without the GIL. Every failure is then
# diagnosed in Python, the way _reader_py's _diagnose does it, so both backends build the same
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
    _STEP = 4096  # input fed per step to a frame without its size, as _reader_py feeds it
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
    _STEP bytes and the limit checked after each, as _reader_py does, so a frame that is both
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
    """The error for a frame that did not decode (error path only, as _reader_py's)."""
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
