# Directives are set once, in setup.py.
"""The writer's block compressor, in C (its twin: ``_compress_py``)."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.errno cimport EINTR, EIO, errno
from libc.stdlib cimport calloc, free, realloc
from posix.unistd cimport close as c_close
from posix.unistd cimport write as c_write

cimport cython

from zstd cimport (
    ZSTD_CCtx,
    ZSTD_c_checksumFlag,
    ZSTD_c_compressionLevel,
    ZSTD_c_contentSizeFlag,
    ZSTD_c_dictIDFlag,
    ZSTD_e_end,
    ZSTD_inBuffer,
    ZSTD_outBuffer,
    ZSTD_reset_session_and_parameters,
    ZSTD_reset_session_only,
)

import os
import sys

from .._fork import after_fork_in_child

__all__ = [
    "block_compressor",
    "BlockCompressor",
    "zstd_available",
    "zstd_compress_version",
    "zstd_library",
    "BACKEND",
]

BACKEND = "cython"

include "_libzstd.pxi"

# Bumped in a forked child, which has none of the parent's helper threads: a BlockCompressor
# created in an older generation neither waits for nor joins them.
cdef unsigned long _generation = 0


def _after_fork_in_child():
    global _generation
    _generation += 1


after_fork_in_child(_after_fork_in_child)


# The frames are those of python-zstandard's ZstdCompressor(level=L, dict_data=D,
# write_checksum=C).compress(b) byte for byte: the same parameters on the context (level, content
# size written, a content checksum when C, dictionary id written), the dictionary loaded into the
# context, and per block a session reset, the pledged size and one ZSTD_compressStream2(ZSTD_e_end)
# into a buffer of ZSTD_compressBound bytes. Only used when the libzstd bound here is the version
# python-zstandard compresses with (zstd_compress_version()).
#
# Threads: ``workers - 1`` helper threads are plain pthreads that never take the GIL; they
# and the calling thread share one ring of jobs under one mutex. The calling thread queues a
# pickled block (keeping a reference to it) and, when the ring is full, takes the oldest
# block's frame; while that one is not done it compresses queued blocks itself, so neither
# side idles while the other has work, and no job costs a GIL hand-off.
#
# Given a file descriptor (``out``), the frames are written to it in block order by whichever
# thread finds the next one to write done (one writes at a time, the ``writing`` flag), so
# the calling thread neither copies a frame into a bytes object nor writes it: it gets the
# frames' sizes. ``level=None`` stores the blocks as they are (strategy 0): with ``out`` and a
# helper, the helper writes them while the calling thread pickles the next ones.

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_t:
        pass
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    int pthread_create(pthread_t* thread, const void* attr,
                       void* (*start)(void*) noexcept nogil, void* arg)
    int pthread_join(pthread_t thread, void** retval)
    int pthread_mutex_init(pthread_mutex_t* mutex, const void* attr)
    int pthread_mutex_destroy(pthread_mutex_t* mutex)
    int pthread_mutex_lock(pthread_mutex_t* mutex)
    int pthread_mutex_unlock(pthread_mutex_t* mutex)
    int pthread_cond_init(pthread_cond_t* cond, const void* attr)
    int pthread_cond_destroy(pthread_cond_t* cond)
    int pthread_cond_wait(pthread_cond_t* cond, pthread_mutex_t* mutex)
    int pthread_cond_signal(pthread_cond_t* cond)
    int pthread_cond_broadcast(pthread_cond_t* cond)


cdef enum:
    _Z_QUEUED = 1
    _Z_DONE = 2  # compressed (the last state without ``out``)
    _Z_WRITTEN = 3  # written to ``out`` (or skipped after an earlier failure)
    _Z_MAX_HELPERS = 63
    _Z_SPARE = 16  # contexts and buffers kept for the next BlockCompressors


cdef struct _ZJob:
    const char* src
    size_t src_size
    char* dst
    size_t dst_cap
    size_t size  # the frame's length, when error == 0
    size_t error  # a zstd error code, or 1 for an unfinished frame, or 0
    int write_errno  # with ``out``: the errno of a failed write, or -1 if not written, or 0
    int state


cdef struct _ZShared:
    pthread_mutex_t mutex
    pthread_cond_t work  # a job was queued, or stop was set
    pthread_cond_t done  # a job is done
    _ZJob* jobs
    size_t depth
    unsigned long long take  # the next queued job to compress
    unsigned long long tail  # the next job to queue
    bint stop
    bint store  # level=None: blocks are written as they are, not compressed
    int out  # the file descriptor frames are written to, or -1
    unsigned long long wnext  # with ``out``: the next job to write
    bint writing  # a thread is writing job ``wnext``
    bint failed  # a job failed: no later one is written


cdef struct _ZHelper:
    _ZShared* shared
    ZSTD_CCtx* cctx
    pthread_t thread
    bint started


cdef size_t _cctx_setup(ZSTD_CCtx* cctx, int level, const char* zdict,
                        size_t zdict_size, int checksum) noexcept nogil:
    """python-zstandard's ZstdCompressor parameters on ``cctx``; 0 or a zstd error code."""
    cdef size_t r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level)
    if not ZSTD_isError(r):
        r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1)
    if not ZSTD_isError(r):
        r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, checksum)
    if not ZSTD_isError(r):
        r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_dictIDFlag, 1)
    if not ZSTD_isError(r) and zdict != NULL:
        r = ZSTD_CCtx_loadDictionary(cctx, zdict, zdict_size)
    return r if ZSTD_isError(r) else 0


cdef void _z_run(_ZShared* s, ZSTD_CCtx* cctx, _ZJob* job) noexcept nogil:
    """Compress one job into its buffer (one frame, as ZstdCompressor.compress)."""
    cdef ZSTD_inBuffer inb
    cdef ZSTD_outBuffer outb
    cdef size_t r
    if s.store:
        job.size = job.src_size
        job.error = 0
        return
    ZSTD_CCtx_reset(cctx, ZSTD_reset_session_only)
    r = ZSTD_CCtx_setPledgedSrcSize(cctx, job.src_size)
    if not ZSTD_isError(r):
        inb.src = job.src
        inb.size = job.src_size
        inb.pos = 0
        outb.dst = job.dst
        outb.size = job.dst_cap
        outb.pos = 0
        r = ZSTD_compressStream2(cctx, &outb, &inb, ZSTD_e_end)
        if not ZSTD_isError(r):
            job.size = outb.pos
            job.error = 1 if r != 0 else 0  # r != 0: the frame did not fit (cannot happen)
            return
    job.error = r


cdef void _z_run_next_lock_held(_ZShared* s, ZSTD_CCtx* cctx) noexcept nogil:
    """Compress the oldest queued job (there is one: ``s.take != s.tail``), the mutex released
    meanwhile, then write what is ready."""
    cdef _ZJob* job = &s.jobs[s.take % s.depth]
    s.take += 1
    pthread_mutex_unlock(&s.mutex)
    _z_run(s, cctx, job)
    pthread_mutex_lock(&s.mutex)
    job.state = _Z_DONE
    pthread_cond_signal(&s.done)  # only the calling thread waits for jobs
    _z_write_ready(s)


cdef int _write_all(int fd, const char* data, size_t size) noexcept nogil:
    """Write ``size`` bytes at ``fd``'s position; 0, or the errno of the failure."""
    cdef ssize_t n
    while size:
        n = c_write(fd, data, size)
        if n < 0:
            if errno == EINTR:
                continue
            return errno
        if n == 0:
            return EIO
        data += n
        size -= <size_t>n
    return 0


cdef void _z_write_ready(_ZShared* s) noexcept nogil:
    """With ``out``, the mutex held: write the jobs done in order from ``wnext`` on, unless
    another thread is writing (it writes them). The mutex is released around each write."""
    cdef _ZJob* job
    cdef int err
    if s.out < 0:
        return
    while not s.writing and s.wnext != s.tail:
        job = &s.jobs[s.wnext % s.depth]
        if job.state != _Z_DONE:
            return
        if job.error or s.failed:
            s.failed = True
            job.write_errno = -1
        else:
            s.writing = True
            pthread_mutex_unlock(&s.mutex)
            err = _write_all(s.out, job.src if s.store else job.dst, job.size)
            pthread_mutex_lock(&s.mutex)
            s.writing = False
            job.write_errno = err
            if err:
                s.failed = True
        job.state = _Z_WRITTEN
        s.wnext += 1
        pthread_cond_signal(&s.done)  # only the calling thread waits for jobs


cdef void* _z_helper_main(void* arg) noexcept nogil:
    cdef _ZHelper* helper = <_ZHelper*>arg
    cdef _ZShared* s = helper.shared
    pthread_mutex_lock(&s.mutex)
    while True:
        while not s.stop and s.take == s.tail:
            pthread_cond_wait(&s.work, &s.mutex)
        if s.stop:
            break
        _z_run_next_lock_held(s, helper.cctx)
    pthread_mutex_unlock(&s.mutex)
    return NULL


# Contexts and frame buffers of closed BlockCompressors, for the next ones: a new context
# page-faults its workspace in at its first frame (a ZSTD_CCtx_reset of the parameters keeps
# the workspace, and the frames do not depend on what a context compressed before). Only
# touched with the GIL held, which serialises them.
cdef ZSTD_CCtx* _spare_cctx[_Z_SPARE]
cdef int _spare_cctx_n = 0
cdef char* _spare_buf[_Z_SPARE]
cdef size_t _spare_buf_cap[_Z_SPARE]
cdef int _spare_buf_n = 0


cdef ZSTD_CCtx* _cctx_take() noexcept:
    global _spare_cctx_n
    if _spare_cctx_n:
        _spare_cctx_n -= 1
        return _spare_cctx[_spare_cctx_n]
    return ZSTD_createCCtx()


cdef void _cctx_give(ZSTD_CCtx* cctx) noexcept:
    global _spare_cctx_n
    if cctx == NULL:
        return
    if _spare_cctx_n < _Z_SPARE and not ZSTD_isError(
        ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters)
    ):
        _spare_cctx[_spare_cctx_n] = cctx
        _spare_cctx_n += 1
    else:
        ZSTD_freeCCtx(cctx)


cdef void _buf_take(_ZJob* job) noexcept:
    global _spare_buf_n
    if _spare_buf_n:
        _spare_buf_n -= 1
        job.dst = _spare_buf[_spare_buf_n]
        job.dst_cap = _spare_buf_cap[_spare_buf_n]


cdef void _buf_give(_ZJob* job) noexcept:
    global _spare_buf_n
    if job.dst == NULL:
        return
    if _spare_buf_n < _Z_SPARE:
        _spare_buf[_spare_buf_n] = job.dst
        _spare_buf_cap[_spare_buf_n] = job.dst_cap
        _spare_buf_n += 1
    else:
        free(job.dst)
    job.dst = NULL
    job.dst_cap = 0


def zstd_compress_version():
    """The libzstd version number BlockCompressor compresses with, or None without one."""
    return ZSTD_versionNumber() if _zcompress_ok else None


def block_compressor(level, zdict, int workers, bint checksum=False, out=None):
    """The writer's compressor of pickled blocks (see _contract.BlockCompressorProtocol):
    this module's BlockCompressor when the bound libzstd is the version python-zstandard
    compresses with (same version, same frames), or nothing needs compressing
    (``level=None``), python-zstandard's otherwise."""
    from ._compress_py import PoolCompressor, zstandard_version_number

    if level is None or (
        _zcompress_ok and ZSTD_versionNumber() == zstandard_version_number()
    ):
        return BlockCompressor(level, zdict, workers, checksum, out)
    return PoolCompressor(level, zdict, workers, checksum, out)


@cython.auto_pickle(False)
@cython.no_gc_clear  # the helpers read the blocks in _sources until __dealloc__ stops them
cdef class BlockCompressor:
    """Compresses pickled blocks into zstd frames, in order, on ``workers`` threads (the
    calling one included), as ``zstandard.ZstdCompressor(level, dict_data,
    write_checksum=checksum).compress`` does; ``level=None`` keeps the blocks as they are.

    ``submit(block)`` queues a block and returns the frames finished since, oldest first (at
    most ``2 * workers`` blocks are in flight); ``finish()`` returns the rest; ``close()``
    stops the threads and drops what is still queued. Calls come from one thread at a time.
    A compression error is raised by the call that would return that block's frame.

    ``out`` (a file descriptor open for writing; the compressor writes through a duplicate
    of it, closed once its threads are stopped, so a descriptor the caller closes or drops
    early is never written to): the frames are written to it in order, by whichever thread
    has the next one, and ``submit``/``finish`` return their sizes instead; a failed write is
    raised as an ``OSError`` (its errno, no file name) by the call that would return that
    frame's size, and no later frame is written.
    """

    cdef _ZShared* _s
    cdef _ZHelper* _helpers
    cdef int _n_helpers
    cdef ZSTD_CCtx* _cctx  # the calling thread's
    cdef unsigned long long _head  # the oldest job not returned
    cdef list _sources  # the queued blocks, kept alive while the helpers read them
    cdef bint _sync_ok  # the mutex and conditions were initialised
    cdef unsigned long _generation  # _generation at creation: bumped in a forked child
    cdef int _final  # the state of a job whose result is ready: _Z_DONE or _Z_WRITTEN

    def __cinit__(self, level, zdict, int workers, bint checksum=False, out=None):
        cdef const char* zd = NULL
        cdef size_t zd_size = 0
        cdef int k
        cdef Py_ssize_t depth
        cdef int c_level = 0
        cdef bint store = level is None
        cdef int fd = -1
        if not store:
            c_level = level
            if not _zcompress_ok:
                raise RuntimeError("the bound libzstd has no compression functions")
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        if out is not None:
            fd = out
            if fd < 0:
                raise ValueError(f"out must be a file descriptor, not {out!r}")
        self._generation = _generation
        self._n_helpers = min(workers - 1, _Z_MAX_HELPERS)
        depth = 1 if self._n_helpers == 0 else 2 * (self._n_helpers + 1)
        if zdict is not None:
            zdict = bytes(zdict)
            zd = PyBytes_AS_STRING(zdict)
            zd_size = PyBytes_GET_SIZE(zdict)
        self._sources = [None] * depth
        self._s = <_ZShared*>calloc(1, sizeof(_ZShared))
        if self._s == NULL:
            raise MemoryError()
        self._s.jobs = <_ZJob*>calloc(depth, sizeof(_ZJob))
        if self._s.jobs == NULL:
            raise MemoryError()
        self._s.depth = depth
        self._s.store = store
        self._s.out = -1
        if fd >= 0:
            # A duplicate of its own, closed by _release after the threads writing to it.
            self._s.out = os.dup(fd)
        self._final = _Z_DONE if self._s.out < 0 else _Z_WRITTEN
        pthread_mutex_init(&self._s.mutex, NULL)
        pthread_cond_init(&self._s.work, NULL)
        pthread_cond_init(&self._s.done, NULL)
        self._sync_ok = True
        if not store:
            self._cctx = self._new_cctx(c_level, zd, zd_size, checksum)
        if self._n_helpers:
            self._helpers = <_ZHelper*>calloc(self._n_helpers, sizeof(_ZHelper))
            if self._helpers == NULL:
                raise MemoryError()
            for k in range(self._n_helpers):
                self._helpers[k].shared = self._s
                if not store:
                    self._helpers[k].cctx = self._new_cctx(c_level, zd, zd_size, checksum)
            for k in range(self._n_helpers):
                if pthread_create(&self._helpers[k].thread, NULL, _z_helper_main,
                                  &self._helpers[k]) != 0:
                    raise OSError("cannot start a compression thread")
                self._helpers[k].started = True

    cdef ZSTD_CCtx* _new_cctx(self, int level, const char* zd, size_t zd_size,
                              bint checksum) except NULL:
        cdef ZSTD_CCtx* cctx = _cctx_take()
        cdef size_t r
        if cctx == NULL:
            raise MemoryError("cannot allocate a zstd compression context")
        r = _cctx_setup(cctx, level, zd, zd_size, checksum)
        if r:
            _cctx_give(cctx)
            raise ValueError(f"zstd: {ZSTD_getErrorName(r).decode('ascii', 'replace')}")
        return cctx

    def submit(self, bytes block not None):
        """Queue ``block``; the frames finished meanwhile, in block order."""
        cdef _ZShared* s = self._s
        cdef _ZJob* job
        cdef size_t bound
        cdef size_t slot
        cdef char* dst
        cdef list out = []
        if s == NULL:
            raise ValueError("the BlockCompressor is closed")
        self._check_process()
        if s.tail - self._head == s.depth:
            out.append(self._pop())
        slot = s.tail % s.depth
        job = &s.jobs[slot]
        if not s.store:
            bound = ZSTD_compressBound(<size_t>PyBytes_GET_SIZE(block))
            if job.dst == NULL:
                _buf_take(job)
            if job.dst_cap < bound:
                dst = <char*>realloc(job.dst, bound)
                if dst == NULL:
                    raise MemoryError()
                job.dst = dst
                job.dst_cap = bound
        job.src = PyBytes_AS_STRING(block)
        job.src_size = PyBytes_GET_SIZE(block)
        job.error = 0
        job.write_errno = 0
        job.size = 0
        self._sources[slot] = block
        pthread_mutex_lock(&s.mutex)
        job.state = _Z_QUEUED
        s.tail += 1
        if self._n_helpers:
            pthread_cond_signal(&s.work)
        pthread_mutex_unlock(&s.mutex)
        if self._n_helpers == 0:
            out.append(self._pop())
            return out
        while self._head != s.tail and self._oldest_done():
            out.append(self._pop())
        return out

    def finish(self):
        """The frames of every block still in flight, in block order."""
        cdef list out = []
        if self._s == NULL:
            raise ValueError("the BlockCompressor is closed")
        self._check_process()
        while self._head != self._s.tail:
            out.append(self._pop())
        return out

    cdef int _check_process(self) except -1:
        if self._generation != _generation:
            raise RuntimeError(
                "this BlockCompressor was made by another process (inherited through fork): "
                "its threads are not here"
            )
        return 0

    cdef bint _oldest_done(self) noexcept:
        cdef bint done
        pthread_mutex_lock(&self._s.mutex)
        done = self._s.jobs[self._head % self._s.depth].state == self._final
        pthread_mutex_unlock(&self._s.mutex)
        return done

    cdef object _pop(self):
        """The oldest job's frame (with ``out``: its size, once written); until then this
        thread compresses queued jobs and writes those done in order."""
        cdef _ZShared* s = self._s
        cdef size_t slot = self._head % s.depth
        cdef _ZJob* job = &s.jobs[slot]
        cdef int final = self._final
        cdef object frame
        with nogil:
            pthread_mutex_lock(&s.mutex)
            while job.state != final:
                if s.take != s.tail:
                    _z_run_next_lock_held(s, self._cctx)
                elif s.out >= 0 and not s.writing and s.wnext != s.tail and (
                    s.jobs[s.wnext % s.depth].state == _Z_DONE
                ):
                    _z_write_ready(s)
                else:
                    pthread_cond_wait(&s.done, &s.mutex)
            job.state = 0
            pthread_mutex_unlock(&s.mutex)
        self._head += 1
        if job.error == 1:
            self._sources[slot] = None
            raise RuntimeError("zstd: the frame did not fit in ZSTD_compressBound bytes")
        if job.error:
            self._sources[slot] = None
            raise RuntimeError(f"zstd: {ZSTD_getErrorName(job.error).decode('ascii', 'replace')}")
        if s.out >= 0:
            self._sources[slot] = None
            if job.write_errno > 0:
                raise OSError(job.write_errno, os.strerror(job.write_errno))
            if job.write_errno < 0:
                raise OSError(EIO, "not written: an earlier block failed")
            return job.size
        if s.store:
            frame = self._sources[slot]
        else:
            frame = PyBytes_FromStringAndSize(job.dst, job.size)
        self._sources[slot] = None
        return frame

    def close(self):
        """Stop the threads (a block being compressed is finished first) and free memory;
        blocks still queued are dropped. Idempotent."""
        self._release()

    cdef void _release(self) noexcept:
        cdef _ZShared* s = self._s
        cdef int k
        cdef bint joinable = self._generation == _generation  # a forked child has no helpers
        if s == NULL:
            return
        if self._helpers != NULL:
            if self._sync_ok and joinable:
                pthread_mutex_lock(&s.mutex)
                s.stop = True
                pthread_cond_broadcast(&s.work)
                pthread_mutex_unlock(&s.mutex)
            for k in range(self._n_helpers):
                if self._helpers[k].started and joinable:
                    with nogil:
                        pthread_join(self._helpers[k].thread, NULL)
                if joinable or not self._helpers[k].started:
                    _cctx_give(self._helpers[k].cctx)
            if joinable:
                free(self._helpers)
            self._helpers = NULL
        _cctx_give(self._cctx)
        self._cctx = NULL
        if s.out >= 0:  # no thread of this process writes to it any more
            c_close(s.out)
            s.out = -1
        if joinable:
            if s.jobs != NULL:
                for k in range(<int>s.depth):
                    _buf_give(&s.jobs[k])
                free(s.jobs)
            if self._sync_ok:
                pthread_cond_destroy(&s.work)
                pthread_cond_destroy(&s.done)
                pthread_mutex_destroy(&s.mutex)
            free(s)
        self._s = NULL
        self._sources = None

    def __dealloc__(self):
        self._release()
