# Included by _reader.pyx (one extension module): data.bin memory-mapped, its descriptors bounded.
# Directives are set once, in setup.py.

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
