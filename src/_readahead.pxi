# Included by _reader.pyx (one extension module): read-ahead of compressed blocks.
# Directives are set once, in setup.py.

# ---------------------------------------------------------------------------------------------
# Read-ahead: the next blocks of a pass in order decompressed by a C thread
#
# A pass in order (iter(ds), or ds[i] for i in order) queues the next blocks here, as jobs;
# so does a reader's prefetch() (the blocks a sampler reads next), at the reader's next read.
# One process-wide worker, a pthread that never touches a Python object nor the GIL,
# decompresses them from the mapping into malloc'd buffers while the caller unpickles the
# block before; the caller then unpickles from that buffer. A caller whose block is still
# queued decodes it itself, and one whose block is being decoded decodes another queued job
# meanwhile (the machine's second core is the worker's: on two cores both keep busy). Only
# frames that declare their size, within the size limits, are queued: anything else, and any
# job that fails, is decoded again by the caller's ordinary path, which raises the same named
# error at the same block as without read-ahead.
#
# Invariants:
# - _ra.mu guards the slots' state, who, block, seq and the counters. A slot's buffer (buf,
#   cap) and its job's fields are used without the lock by the one thread that claimed the
#   slot (state _RA_BUSY) and by nobody else; in any other state only by GIL-holding callers
#   under _ra.mu. Nobody takes the GIL while holding _ra.mu.
# - _ra_owners[i] (a Python list, changed only with the GIL held) holds the mapping and
#   dictionary slot i reads from, from when the job is queued until the slot is _RA_EMPTY
#   again: a close() or a dealloc of the reader cannot unmap bytes a decoder is reading. It is
#   cleared only once the slot is out of every decoder's hands (_RA_DRAINED, or a queued or
#   ready job cancelled under _ra.mu), never while _RA_BUSY.
# - A job's output buffer, once taken (_ra_take), belongs to the _RABuffer returned, which
#   frees it (or gives it back to an empty slot: _ra_recycle). So nothing a caller reads is
#   ever freed or reused under it, whatever the worker or a close() does.
# - A job is matched by (who, block), ``who`` the reader's address: a reader cancels its jobs
#   when it is closed or freed (_ra_cancel), so an address reused by another reader never
#   matches an older job. A job cancelled while being decoded is orphaned (who = NULL) and its
#   slot reclaimed when done.
# - After fork the worker does not exist in the child: the child (register_at_fork, after
#   _zstd.pxi's hook has bumped _generation, or the generation check on every entry) abandons
#   the old lock state (it may be held forever), frees the buffers and starts a new worker on
#   first use.
# - Memory: at most _RA_SLOTS jobs, whose declared sizes together stay under _RA_MAX_BYTES;
#   a pass queues _RA_DEPTH blocks ahead.
#
# Back-off: the worker pays only on an idle core. When every core is busy (DataLoader workers,
# other jobs), the worker, woken for a job, is put on the reading thread's core and preempts it
# (an involuntary context switch of the reader per block: the work is serial again, with the
# hand-offs added: 0.88x inline, measured pinned to one core); or it waits for a core, and a
# reader that reaches the block it is decoding waits for it to be scheduled again
# (milliseconds, for a block decoded in tens of microseconds). Two signs, judged as blocks
# are taken from the read-ahead:
# - shared core: the worker decoded the block on the core the reader is on, and the reader
#   was switched out involuntarily since its last take, on _ra_shared of _RA_WINDOW takes
#   (Linux: sched_getcpu and the thread's own count; elsewhere the sign is absent). Either
#   alone is no sign: the worker may use the reader's core while the reader sleeps (a GPU
#   step), and the reader may be preempted by other work (on a core the worker is not on,
#   the read-ahead still pays: niced jobs, say);
# - a long wait: the reader waited for the worker longer than _ra_slow_ns plus 4 ns per
#   decoded byte (250 MB/s; a 36 KB block decodes in ~35 us), unless the worker's decoding
#   of that block faulted pages in from storage (a cold or network file: waiting for I/O,
#   not for a core).
# Either makes the process skip the next _ra_skip blocks that would be read ahead (entered by
# a pass in order, or named by a hint) and decode them inline; _RA_BACKOFF_MIN the first
# time, doubling on each sign after it, up to _RA_BACKOFF_MAX; the doubling is forgotten
# after _RA_TRUST_AFTER takes without a sign. The jobs queued before a back-off are still
# taken, and not judged. Process-wide, as the cores are; GIL held for all of its state.

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_t:
        pass
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    int pthread_create(pthread_t* thread, const void* attr, void* (*start)(void*) noexcept nogil,
                       void* arg)
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

cdef extern from "<signal.h>" nogil:
    ctypedef struct sigset_t:
        pass
    int sigfillset(sigset_t* s)
    int pthread_sigmask(int how, const sigset_t* s, sigset_t* old)
    enum:
        SIG_SETMASK

cdef enum:
    _RA_SLOTS = 16  # jobs queued or done, all passes of the process together
    _RA_DEPTH = 6  # blocks queued ahead of the one a pass reads
    _RA_MAX_BYTES = 64 << 20  # declared sizes of the jobs held, together
    _RA_BACKOFF_MIN = 64  # blocks decoded inline after the first sign of busy cores
    _RA_BACKOFF_MAX = 1 << 16  # ... and at most, after many
    _RA_TRUST_AFTER = 1024  # takes without a sign that forget the doubling
    _RA_WINDOW = 16  # takes over which the reader's preemptions are counted
    _RA_SLOW_NS = 250000  # _ra_slow_ns by default
    _RA_SHARED = 4  # _ra_shared by default

cdef extern from *:
    """
    #include <sys/resource.h>
    /* The calling thread's involuntary context switches (faults == 0) or page faults that
       read storage (faults != 0) so far, or -1 where they are not counted per thread
       (RUSAGE_THREAD is Linux's; Python.h defines _GNU_SOURCE). */
    static long long atlas_thread_count(int faults) {
    #ifdef RUSAGE_THREAD
        struct rusage ru;
        if (getrusage(RUSAGE_THREAD, &ru) == 0)
            return (long long)(faults ? ru.ru_majflt : ru.ru_nivcsw);
    #endif
        return -1;
    }
    /* The core the calling thread runs on, or -1 where that is not known. */
    #if defined(__linux__)
    #include <sched.h>
    static int atlas_cpu(void) { return sched_getcpu(); }
    #else
    static int atlas_cpu(void) { return -1; }
    #endif
    """
    long long atlas_thread_count(int faults) nogil
    int atlas_cpu() nogil

# Slot states.
cdef enum:
    _RA_EMPTY = 0
    _RA_QUEUED = 1  # waiting for a decoder
    _RA_BUSY = 2  # a decoder (the worker or a caller) owns buf and the job's fields
    _RA_READY = 3  # decoded (ok) or failed (not ok): waiting to be taken
    _RA_DRAINED = 4  # taken; the taker clears its owner, then empties it


ctypedef struct _RASlot:
    int state
    bint ok  # _RA_READY: buf holds the whole frame, declared bytes
    void* who  # the reader (its address), NULL once cancelled
    Py_ssize_t block
    unsigned long long seq  # order queued: decoders take the oldest job first
    const char* src
    size_t src_size
    const ZSTD_DDict* ddict
    ZSTD_DCtx** warm  # the dictionary's warm context slot, for a caller decoding it
    size_t declared
    bint faulted  # _RA_READY: the worker's decoding read pages in from storage
    int cpu  # _RA_READY: the core the worker decoded it on, -1: a caller did (or unknown)
    char* buf
    size_t cap


ctypedef struct _RASync:
    pthread_mutex_t mu
    pthread_cond_t work  # the worker waits here for a queued job
    pthread_cond_t done  # callers wait here for a job being decoded
    pthread_t thread
    bint running  # the worker was started (and not joined)
    bint stop  # asks the worker to exit


cdef _RASlot _ra_slots[_RA_SLOTS]
cdef _RASync* _ra = NULL  # NULL: read-ahead unavailable (out of memory)
# The fork generation (_zstd.pxi's _generation) _ra belongs to: -1 before the first use.
cdef long _ra_generation = -1
cdef unsigned long long _ra_seq = 0
cdef size_t _ra_held = 0  # declared bytes of the slots not empty
cdef unsigned long long _ra_by_worker = 0
cdef unsigned long long _ra_by_caller = 0
cdef unsigned long long _ra_taken = 0
cdef unsigned long long _ra_waits = 0  # times a caller waited for the worker
cdef unsigned long long _ra_idle = 0  # times the worker waited for a job
# Frames of fewer stored bytes are decoded by the reading thread: a hand-off to the worker
# (and the decoded bytes crossing to the reading thread's core) costs about what decoding them
# does. A 16-document block of text (~9 KB stored, ~36 KB decoded) takes ~35 us to decode,
# far more than a hand-off to this thread, which takes no GIL: ds[i] in order over such
# blocks ran 1.1-1.2x the reference by the wall clock inline, 1.5-1.7x read ahead.
cdef size_t _ra_min_bytes = 4096
C_CONSTANTS["READ_AHEAD_MIN_STORED"] = _ra_min_bytes
# prefetch() hints are taken for a shard whose blocks average this many stored bytes: the line
# the Python backend's pool draws (_pool.POOL_MIN_BLOCK_BYTES), where the hand-off is dearer.
cdef size_t _ra_hint_min_bytes = 16384
C_CONSTANTS["PREFETCH_MIN_STORED"] = _ra_hint_min_bytes
# The signs of busy cores (see Back-off). A wait for the worker is long past this many ns,
# plus 4 ns per decoded byte (-1: every take is one; -2: none is). A window of _RA_WINDOW
# takes is one when this many of them shared the reader's core (-1: none is; 0: every one).
cdef long long _ra_slow_ns = _RA_SLOW_NS
cdef int _ra_shared = _RA_SHARED
cdef int _ra_window = 0  # takes judged in the current window
cdef int _ra_window_shared = 0  # ... that shared the reader's core
cdef long long _ra_preempted = -1  # the reader's count at its last take; -1: not known
cdef unsigned long _ra_reader = 0  # that reader (a window is one thread's)
cdef Py_ssize_t _ra_backoff = 0  # blocks of the last back-off, 0: none in force
cdef Py_ssize_t _ra_skip = 0  # blocks left to decode inline
cdef Py_ssize_t _ra_trust = 0  # takes since the last sign
cdef unsigned long long _ra_backoffs = 0  # signs seen
cdef unsigned long long _ra_skipped = 0  # blocks not read ahead for them
# A C global, not a module attribute: the final collection at interpreter exit may free a
# reader (a dealloc cancels its jobs, under _ra.mu) after the module's dict was cleared.
cdef list _ra_owners = [None] * _RA_SLOTS


cdef _RASync* _ra_new_sync() noexcept:
    cdef _RASync* s = <_RASync*>malloc(sizeof(_RASync))
    if s == NULL:
        return NULL
    if pthread_mutex_init(&s.mu, NULL) != 0:
        free(s)
        return NULL
    if pthread_cond_init(&s.work, NULL) != 0 or pthread_cond_init(&s.done, NULL) != 0:
        free(s)  # a leaked condition on this failure path only
        return NULL
    s.running = False
    s.stop = False
    return s


cdef void _ra_decode(_RASlot* slot, ZSTD_DCtx* dctx) noexcept nogil:
    """Decode the job of ``slot``, which the caller claimed (_RA_BUSY); sets slot.ok."""
    cdef size_t zresult = 0
    cdef size_t produced = 0
    cdef size_t size = slot.declared
    slot.ok = False
    if slot.cap < size or slot.buf == NULL:
        # With an eighth to spare: blocks of about one size then reuse buffers, never
        # reallocating (a fresh allocation of this size costs page faults).
        free(slot.buf)
        slot.cap = size + (size >> 3) + 1
        slot.buf = <char*>malloc(slot.cap)
        if slot.buf == NULL:
            slot.cap = 0
            return
    if dctx == NULL:
        return
    if _decode_known_nogil(dctx, slot.ddict, slot.src, slot.src_size, slot.buf, size,
                           &zresult, &produced) == _DONE:
        slot.ok = produced == size


cdef int _ra_oldest_lock_held() noexcept nogil:
    """The queued slot queued first, or -1."""
    cdef int i
    cdef int best = -1
    for i in range(_RA_SLOTS):
        if _ra_slots[i].state == _RA_QUEUED and (best < 0
                                                 or _ra_slots[i].seq < _ra_slots[best].seq):
            best = i
    return best


cdef void* _ra_worker(void* arg) noexcept nogil:
    global _ra_by_worker, _ra_idle
    cdef _RASync* s = <_RASync*>arg
    cdef ZSTD_DCtx* dctx = ZSTD_createDCtx()  # this thread's own
    cdef int i
    cdef long long faults
    pthread_mutex_lock(&s.mu)
    while not s.stop:
        i = _ra_oldest_lock_held()
        if i < 0:
            _ra_idle += 1
            pthread_cond_wait(&s.work, &s.mu)
            continue
        _ra_slots[i].state = _RA_BUSY
        pthread_mutex_unlock(&s.mu)
        faults = atlas_thread_count(1)
        _ra_slots[i].cpu = atlas_cpu()
        _ra_decode(&_ra_slots[i], dctx)
        _ra_slots[i].faulted = atlas_thread_count(1) > faults
        pthread_mutex_lock(&s.mu)
        _ra_slots[i].state = _RA_READY
        _ra_by_worker += 1
        pthread_cond_broadcast(&s.done)
    pthread_mutex_unlock(&s.mu)
    if dctx != NULL:
        ZSTD_freeDCtx(dctx)
    return NULL


cdef int _ra_ready() except -1:
    """Whether read-ahead can be used in this process (after fork: reset first). GIL held."""
    if _ra_generation != <long>_generation:
        _ra_reset_in_child()
    return _ra != NULL and _zstd_ok


cdef bint _ra_start_lock_held() noexcept nogil:
    """Start the worker unless running; whether it runs."""
    cdef sigset_t all_signals
    cdef sigset_t old
    cdef int err
    if _ra.running:
        return True
    # The worker takes no signal: they go to the threads that run Python.
    sigfillset(&all_signals)
    pthread_sigmask(SIG_SETMASK, &all_signals, &old)
    err = pthread_create(&_ra.thread, NULL, _ra_worker, _ra)
    pthread_sigmask(SIG_SETMASK, &old, NULL)
    _ra.running = err == 0
    return _ra.running


cdef int _ra_free_slot_lock_held(int i, list dropped) except -1:
    """Empty slot ``i`` (out of every decoder's hands); its owner goes to ``dropped``."""
    global _ra_held
    cdef _RASlot* slot = &_ra_slots[i]
    if slot.state != _RA_EMPTY:
        _ra_held -= slot.declared
    slot.state = _RA_EMPTY
    slot.who = NULL
    slot.ok = False
    dropped.append(_ra_owners[i])
    _ra_owners[i] = None
    return 0


cdef inline bint _ra_fits_better(_RASlot* a, _RASlot* b, size_t size) noexcept nogil:
    """Whether ``a``'s buffer suits a job of ``size`` bytes better than ``b``'s."""
    if (a.cap >= size) != (b.cap >= size):
        return a.cap >= size
    return a.cap < b.cap if a.cap >= size else a.cap > b.cap


cdef bint _ra_queued(void* who, Py_ssize_t block) noexcept:
    """Whether block ``block`` of ``who`` is queued, being decoded or decoded. GIL held."""
    cdef int i
    cdef bint found = False
    if _ra == NULL or _ra_generation != <long>_generation:
        return False
    pthread_mutex_lock(&_ra.mu)
    for i in range(_RA_SLOTS):
        if (_ra_slots[i].who == who and _ra_slots[i].block == block
                and _ra_slots[i].state != _RA_EMPTY and _ra_slots[i].state != _RA_DRAINED):
            found = True
            break
    pthread_mutex_unlock(&_ra.mu)
    return found


cdef int _ra_queue(void* who, Py_ssize_t block, object owner, const char* src, size_t src_size,
                   ZstdDict zdict, bint hint) except -1:
    """Queue block ``block`` of reader ``who`` (its frame ``src[0:src_size]``, kept alive by
    ``owner``) unless it is queued already or cannot be; whether it is queued. GIL held.

    A pass in order (``hint`` false) may take the slot of the oldest job decoded and not taken
    (a pass that stopped reading); a hint (a reader's ``prefetch``) only one of a job queued
    _RA_SLOTS queuings ago or more, so that hints never push out the jobs queued just before
    them, which are read first."""
    global _ra_seq, _ra_held
    cdef unsigned long long declared
    cdef int i
    cdef int st
    cdef _RASlot* slot
    cdef int free_slot = -1
    cdef int stale = -1
    cdef bint queued = False
    cdef list dropped = []
    if not _ra_ready():
        return False
    declared = ZSTD_getFrameContentSize(src, src_size)
    if (declared == ZSTD_CONTENTSIZE_ERROR or declared == ZSTD_CONTENTSIZE_UNKNOWN
            or declared == 0 or declared > _RA_MAX_BYTES or src_size < _ra_min_bytes
            or not _limits_allow(declared, src_size)):
        return False  # the caller's own path decodes it (and words any error)
    if hint and _ra_skip_one():
        return False
    pthread_mutex_lock(&_ra.mu)
    for i in range(_RA_SLOTS):
        st = _ra_slots[i].state
        if st != _RA_EMPTY and _ra_slots[i].who == who and _ra_slots[i].block == block:
            pthread_mutex_unlock(&_ra.mu)
            return st != _RA_DRAINED
        if st == _RA_EMPTY:
            # The empty slot whose buffer fits best: large enough, else the largest.
            if free_slot < 0 or _ra_fits_better(&_ra_slots[i], &_ra_slots[free_slot],
                                                <size_t>declared):
                free_slot = i
        elif st == _RA_READY and (not hint or _ra_slots[i].who == NULL
                                  or _ra_slots[i].seq + _RA_SLOTS <= _ra_seq) and (
                _ra_slots[i].who == NULL or stale < 0 or _ra_slots[i].seq < _ra_slots[stale].seq):
            stale = i  # orphaned, or the oldest decoded: a pass that stopped reading
    if free_slot < 0 and stale >= 0:
        _ra_free_slot_lock_held(stale, dropped)
        free_slot = stale
    if free_slot >= 0 and _ra_held + declared <= _RA_MAX_BYTES and _ra_start_lock_held():
        slot = &_ra_slots[free_slot]
        slot.state = _RA_QUEUED
        slot.ok = False
        slot.faulted = False
        slot.cpu = -1
        slot.who = who
        slot.block = block
        _ra_seq += 1
        slot.seq = _ra_seq
        slot.src = src
        slot.src_size = src_size
        slot.ddict = _ddict(zdict)
        slot.warm = NULL if zdict is None else &zdict.warm
        slot.declared = <size_t>declared
        _ra_held += slot.declared
        _ra_owners[free_slot] = owner
        pthread_cond_signal(&_ra.work)
        queued = True
    pthread_mutex_unlock(&_ra.mu)
    return queued  # ``dropped`` released here, the lock no longer held


cdef inline long long _ra_now_ns() noexcept nogil:
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return <long long>t.tv_sec * 1000000000 + t.tv_nsec


cdef int _ra_wait_nogil(void* who, Py_ssize_t block, long long* waited) noexcept nogil:
    """Block ``block`` of ``who`` decoded: the index of its slot, now _RA_DRAINED, or -1 when
    it is not queued. Decodes it here if no decoder has started it, and other queued jobs
    while the worker decodes it; adds the ns spent waiting for the worker to ``waited``."""
    global _ra_by_caller, _ra_waits
    cdef int i
    cdef int mine
    cdef int other
    cdef ZSTD_DCtx* dctx
    cdef long long t0
    pthread_mutex_lock(&_ra.mu)
    while True:
        mine = -1
        for i in range(_RA_SLOTS):
            if (_ra_slots[i].who == who and _ra_slots[i].block == block
                    and _ra_slots[i].state != _RA_EMPTY and _ra_slots[i].state != _RA_DRAINED):
                mine = i
                break
        if mine < 0:
            pthread_mutex_unlock(&_ra.mu)
            return -1
        if _ra_slots[mine].state == _RA_READY:
            _ra_slots[mine].state = _RA_DRAINED
            pthread_mutex_unlock(&_ra.mu)
            return mine
        if _ra_slots[mine].state == _RA_QUEUED:
            other = mine
        else:
            # Help: the next job in order, which this thread is likely to unpickle next (its
            # bytes still in this core's cache).
            other = _ra_oldest_lock_held()
            if other < 0:
                _ra_waits += 1
                t0 = _ra_now_ns()
                pthread_cond_wait(&_ra.done, &_ra.mu)
                waited[0] += _ra_now_ns() - t0
                continue
        _ra_slots[other].state = _RA_BUSY
        _ra_slots[other].faulted = False  # the caller did not wait for this one
        _ra_slots[other].cpu = -1
        pthread_mutex_unlock(&_ra.mu)
        dctx = _dctx_take(_ra_slots[other].warm)
        _ra_decode(&_ra_slots[other], dctx)
        if dctx != NULL:
            _dctx_give(dctx, _ra_slots[other].warm)
        pthread_mutex_lock(&_ra.mu)
        _ra_slots[other].state = _RA_READY
        _ra_by_caller += 1
        pthread_cond_broadcast(&_ra.done)


@cython.final
@cython.auto_pickle(False)
cdef class _RABuffer:
    """A block decoded ahead: owns its malloc'd bytes, exported read-only (for pickle.loads)."""

    cdef char* buf
    cdef size_t cap
    cdef Py_ssize_t size
    cdef Py_ssize_t exports

    def __getbuffer__(self, Py_buffer* view, int flags):
        _export_read_only(view, self, self.buf, self.size, flags, "a decoded block is read-only")
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* view):
        self.exports -= 1

    def __dealloc__(self):
        free(self.buf)


cdef _RABuffer _ra_take(void* who, Py_ssize_t block):
    """Block ``block`` of reader ``who`` decoded ahead, or None: not queued, or it failed (the
    caller decodes it again, for the error). Waits (GIL released) while it is decoded."""
    global _ra_taken
    cdef int i
    cdef _RASlot* slot
    cdef _RABuffer out = None
    cdef list dropped = []
    cdef long long waited = 0
    if not _ra_ready():
        return None
    with nogil:
        i = _ra_wait_nogil(who, block, &waited)
    if i < 0:
        return None
    slot = &_ra_slots[i]
    _ra_judge(0 if slot.faulted else waited, slot.declared, slot.cpu)
    # _RA_DRAINED: no decoder touches the slot, and no caller queues into it until emptied.
    if slot.ok:
        out = _RABuffer.__new__(_RABuffer)
        out.buf = slot.buf
        out.cap = slot.cap
        out.size = <Py_ssize_t>slot.declared
        slot.buf = NULL
        slot.cap = 0
    pthread_mutex_lock(&_ra.mu)
    _ra_free_slot_lock_held(i, dropped)
    if out is not None:
        _ra_taken += 1
    pthread_mutex_unlock(&_ra.mu)
    return out


cdef inline void _ra_judge(long long waited, size_t declared, int cpu) noexcept:
    """Back off on a sign of busy cores (see Back-off): a take that waited ``waited`` ns for
    the worker, of a block of ``declared`` bytes the worker decoded on core ``cpu`` (-1: a
    caller did). GIL held."""
    global _ra_backoff, _ra_skip, _ra_trust, _ra_backoffs
    global _ra_window, _ra_window_shared, _ra_preempted, _ra_reader
    cdef long long count
    cdef unsigned long me
    cdef bint busy
    if _ra_skip > 0:
        return  # backing off: a job queued before it, judged already
    busy = _ra_slow_ns == -1 or (_ra_slow_ns >= 0
                                 and waited - 4 * <long long>declared > _ra_slow_ns)
    if not busy and _ra_shared >= 0:
        count = atlas_thread_count(0)
        me = PyThread_get_thread_ident()
        if (cpu >= 0 and cpu == atlas_cpu() and _ra_preempted >= 0 and me == _ra_reader
                and count > _ra_preempted):
            _ra_window_shared += 1
        _ra_preempted = count
        _ra_reader = me
        _ra_window += 1
        if _ra_window >= _RA_WINDOW:
            busy = _ra_window_shared >= _ra_shared
            _ra_window = _ra_window_shared = 0
    if not busy:
        _ra_trust += 1
        if _ra_trust >= _RA_TRUST_AFTER:
            _ra_backoff = 0
        return
    _ra_backoffs += 1
    _ra_trust = 0
    _ra_window = _ra_window_shared = 0  # a new window when reading ahead resumes
    _ra_preempted = -1
    _ra_backoff = min(max(2 * _ra_backoff, <Py_ssize_t>_RA_BACKOFF_MIN),
                      <Py_ssize_t>_RA_BACKOFF_MAX)
    _ra_skip = _ra_backoff


cdef inline bint _ra_skip_one() noexcept:
    """Whether the block a pass enters (or a hint names), which would be read ahead, is to be
    decoded inline instead, the cores being busy (see Back-off): one fewer to skip. GIL
    held."""
    global _ra_skip, _ra_skipped
    if _ra_skip <= 0:
        return False
    _ra_skip -= 1
    _ra_skipped += 1
    return True


cdef void _ra_recycle(_RABuffer data) noexcept:
    """Give ``data``'s bytes back to an empty slot once nothing exports them. GIL held."""
    cdef int i
    cdef char* spare = NULL
    if data.exports != 0 or data.buf == NULL or not _ra_ready():
        return  # still read by someone: freed with ``data``
    pthread_mutex_lock(&_ra.mu)
    for i in range(_RA_SLOTS):
        if _ra_slots[i].state == _RA_EMPTY and _ra_slots[i].cap < data.cap:
            spare = _ra_slots[i].buf
            _ra_slots[i].buf = data.buf
            _ra_slots[i].cap = data.cap
            data.buf = spare
            data.cap = 0
            data.size = 0
            break
    pthread_mutex_unlock(&_ra.mu)


cdef int _ra_cancel(void* who, Py_ssize_t block) except -1:
    """Cancel the jobs of reader ``who`` (``block`` < 0: all of them); free idle buffers when
    no job is left. GIL held."""
    cdef int i
    cdef int left = 0
    cdef list dropped = []
    cdef char* idle[_RA_SLOTS]
    cdef int n_idle = 0
    cdef int st
    if _ra == NULL or _ra_generation != <long>_generation:
        return 0
    pthread_mutex_lock(&_ra.mu)
    for i in range(_RA_SLOTS):
        st = _ra_slots[i].state
        if st != _RA_EMPTY and _ra_slots[i].who == who and (block < 0
                                                            or _ra_slots[i].block == block):
            if st == _RA_BUSY:
                _ra_slots[i].who = NULL  # orphaned: reclaimed once decoded
            elif st != _RA_DRAINED:
                _ra_free_slot_lock_held(i, dropped)
        if _ra_slots[i].state != _RA_EMPTY:
            left += 1
    if left == 0:
        for i in range(_RA_SLOTS):
            if _ra_slots[i].buf != NULL:
                idle[n_idle] = _ra_slots[i].buf
                n_idle += 1
                _ra_slots[i].buf = NULL
                _ra_slots[i].cap = 0
    pthread_mutex_unlock(&_ra.mu)
    for i in range(n_idle):
        free(idle[i])
    return 0


cdef int _ra_reset_in_child() except -1:
    """In a forked child: no worker exists. Abandon the lock state (the parent's worker may
    have held it), free the buffers, forget every job. GIL held."""
    global _ra, _ra_generation, _ra_held
    cdef int i
    for i in range(_RA_SLOTS):
        free(_ra_slots[i].buf)
        _ra_slots[i].buf = NULL
        _ra_slots[i].cap = 0
        _ra_slots[i].state = _RA_EMPTY
        _ra_slots[i].who = NULL
    _ra_held = 0
    _ra_reset_backoff()  # the parent's cores were judged, the child's are not yet
    _ra = _ra_new_sync()  # the old one is abandoned, never freed
    _ra_generation = <long>_generation
    _ra_owners[:] = [None] * _RA_SLOTS
    return 0


def _readahead_after_fork():
    if _ra_generation != <long>_generation:
        _ra_reset_in_child()


def _readahead_shutdown():
    """Stop and join the worker (at exit: before the mappings its jobs read go away)."""
    cdef list dropped = []
    cdef int i
    cdef int st
    if _ra == NULL or _ra_generation != <long>_generation:
        return
    pthread_mutex_lock(&_ra.mu)
    running = _ra.running
    _ra.stop = True
    pthread_cond_broadcast(&_ra.work)
    pthread_mutex_unlock(&_ra.mu)
    if running:
        with nogil:
            pthread_join(_ra.thread, NULL)
    # The worker is gone: jobs being decoded by callers still end as _RA_READY.
    pthread_mutex_lock(&_ra.mu)
    _ra.running = False
    _ra.stop = False
    for i in range(_RA_SLOTS):
        st = _ra_slots[i].state
        if st == _RA_QUEUED or (st == _RA_READY and _ra_slots[i].who == NULL):
            _ra_free_slot_lock_held(i, dropped)
    pthread_mutex_unlock(&_ra.mu)


def _readahead_min_bytes(n):
    """Set the smallest stored block size read ahead by a pass in order and the average one
    hints are taken for (tests: 0 sets both); ``n`` an int for both, or the pair this
    returns: the old values."""
    global _ra_min_bytes, _ra_hint_min_bytes
    old = (_ra_min_bytes, _ra_hint_min_bytes)
    if isinstance(n, tuple):
        _ra_min_bytes, _ra_hint_min_bytes = n
    else:
        _ra_min_bytes = _ra_hint_min_bytes = n
    return old


cdef void _ra_reset_backoff() noexcept:
    global _ra_backoff, _ra_skip, _ra_trust, _ra_window, _ra_window_shared, _ra_preempted
    _ra_backoff = _ra_skip = _ra_trust = _ra_window = _ra_window_shared = 0
    _ra_preempted = -1


def _readahead_backoff(slow_ns=_RA_SLOW_NS, shared=_RA_SHARED, bint forget=True):
    """Set the signs that back off (see Back-off), for tests: ``slow_ns`` the ns past which
    a wait is long (-1: every take; None: none), ``shared`` the takes of a window that
    shared the reader's core that are a sign (0: every window; None: none); forgets a
    back-off in force unless ``forget`` is false. Returns the old pair."""
    global _ra_slow_ns, _ra_shared
    old = (None if _ra_slow_ns == -2 else _ra_slow_ns,
           None if _ra_shared == -1 else _ra_shared)
    _ra_slow_ns = -2 if slow_ns is None else slow_ns
    _ra_shared = -1 if shared is None else shared
    if forget:
        _ra_reset_backoff()
    return old


def _readahead_info():
    """The read-ahead's state, for tests: worker running, jobs held, buffers, counters."""
    cdef int i
    cdef int jobs = 0
    cdef int buffers = 0
    cdef size_t held
    cdef bint running
    cdef unsigned long long counts[5]
    cdef Py_ssize_t skip
    if not _ra_ready():
        return None
    skip = _ra_skip
    # Copied under the lock, reported after: building objects may run a collection, whose
    # finalizers may come back here.
    pthread_mutex_lock(&_ra.mu)
    for i in range(_RA_SLOTS):
        jobs += _ra_slots[i].state != _RA_EMPTY
        buffers += _ra_slots[i].buf != NULL
    held = _ra_held
    running = _ra.running
    counts[0] = _ra_by_worker
    counts[1] = _ra_by_caller
    counts[2] = _ra_taken
    counts[3] = _ra_waits
    counts[4] = _ra_idle
    pthread_mutex_unlock(&_ra.mu)
    return {
        "running": running,
        "jobs": jobs,
        "buffers": buffers,
        "held_bytes": held,
        "decoded_by_worker": counts[0],
        "decoded_by_caller": counts[1],
        "taken": counts[2],
        "caller_waits": counts[3],
        "worker_waits": counts[4],
        "owners": sum(1 for o in _ra_owners if o is not None),
        "backoffs": _ra_backoffs,
        "skipped": _ra_skipped,
        "skip": skip,
    }


_ra_reset_in_child()  # the first "child": this process

after_fork_in_child(_readahead_after_fork)

import atexit  # noqa: E402

atexit.register(_readahead_shutdown)
