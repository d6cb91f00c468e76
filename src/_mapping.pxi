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
#
# A data.bin of at most _COPY_MAX bytes is read into memory instead (a "copy" mapping): on a
# dataset of many small shards, mapping and unmapping cost more than reading, a mapping
# rounds each file up to a page of resident memory, and a copy cannot
# fault when the file shrinks. Both kinds are checked against the file's size alike, so a
# shard truncated after it was opened is reported the same way whichever kind reads it.

from libc.errno cimport EINTR, ENOENT
from posix.fcntl cimport O_NONBLOCK
from posix.stat cimport S_ISREG
from posix.types cimport off_t
from posix.unistd cimport pread

cdef enum:
    _KEEP_FDS = 32
    _COPY_MAX = 16384

cdef PyObject* _fd_keepers[_KEEP_FDS]  # the mappings holding a descriptor (borrowed), a ring
cdef int _fd_next = 0


@cython.auto_pickle(False)
@cython.final
cdef class _Mapping:
    """A read-only mapping of a whole data.bin; unmapped when the last reference goes."""

    cdef const char* ptr
    cdef size_t size
    cdef bytes copy  # the file's bytes when read instead of mapped (ptr points into it)
    cdef bint is_copy  # ptr is copy's, not a mapping: never munmap it
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
        if self.ptr != NULL and not self.is_copy:
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
        _export_read_only(view, self, self.ptr, self.size, flags,
                          "a block of data.bin is read-only")

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
        # Non-blocking: a FIFO in data.bin's place must not hang the open (refused below).
        fd = c_open(c_path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
    if fd < 0:
        err = errno
        if err == ENOENT:
            raise AtlasFormatError(f"{data_path}: missing")
        exc = OSError(err, os.strerror(err), data_path)
        raise AtlasFormatError(f"{data_path}: cannot be read: {exc}") from exc
    try:
        if fstat(fd, &st) != 0:
            err = errno
            exc = OSError(err, os.strerror(err), data_path)
            raise AtlasFormatError(f"{data_path}: cannot be read: {exc}") from exc
        if not S_ISREG(st.st_mode):
            raise AtlasFormatError(f"{data_path}: not a regular file")
        if <uint64_t>st.st_size != expected:
            raise AtlasFormatError(
                f"{index_path}: the last offset is {expected} but {data_path} has "
                f"{st.st_size} bytes"
            )
        if expected == 0:
            return mapping  # nothing to map (mmap refuses zero length)
        if expected <= _COPY_MAX:
            _read_copy(mapping, fd, <size_t>expected, data_path)
        else:
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


cdef int _read_copy(_Mapping mapping, int fd, size_t size, str data_path) except -1:
    """Fill ``mapping`` with the ``size`` bytes of ``fd`` (a copy mapping)."""
    cdef bytes copy = PyBytes_FromStringAndSize(NULL, <Py_ssize_t>size)
    cdef char* dst = PyBytes_AS_STRING(copy)
    cdef size_t done = 0
    cdef Py_ssize_t got = 1
    cdef int err = 0
    with nogil:
        while done < size:
            got = pread(fd, dst + done, size - done, <off_t>done)
            if got < 0 and errno == EINTR:
                continue
            if got <= 0:
                err = errno if got < 0 else 0
                break
            done += <size_t>got
    if got < 0:
        exc = OSError(err, os.strerror(err), data_path)
        raise AtlasFormatError(f"{data_path}: cannot be read: {exc}") from exc
    if done < size:
        raise AtlasFormatError(
            f"{data_path}: shrank to {done} bytes while being read ({size} expected)"
        )
    mapping.copy = copy
    mapping.is_copy = True
    mapping.ptr = dst
    mapping.size = size
    return 0


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
