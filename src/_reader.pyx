# Directives are set once, in setup.py.
"""The compiled core: the hot path of reading blocks, in C (its twin: ``_reader_py``)."""

from cpython.buffer cimport (
    PyBUF_FORMAT,
    PyBUF_ND,
    PyBUF_SIMPLE,
    PyBUF_WRITABLE,
    PyBuffer_Release,
    PyObject_GetBuffer,
)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.tuple cimport PyTuple_GET_SIZE
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
    PyThread_get_thread_ident,
    PyThread_release_lock,
    PyThread_type_lock,
)
from libc.errno cimport EINTR, errno
from libc.stdint cimport uint32_t, uint64_t
from libc.stdlib cimport free, getenv, malloc, realloc
from libc.string cimport memcpy
from posix.fcntl cimport O_RDONLY
from posix.fcntl cimport open as c_open
from posix.mman cimport MAP_FAILED, MAP_SHARED, PROT_READ, mmap, munmap
from posix.stat cimport fstat, struct_stat
from posix.stat cimport stat as c_stat
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from posix.unistd cimport close as c_close

cimport cython

from atlas_fast._core._pickle_scan cimport (
    PS_DONE,
    PickleScan,
    ps_bound,
    ps_bound_t,
    ps_feed,
    ps_free,
    ps_nbytes,
    ps_new,
    ps_reset,
    ps_synthetic,
)
from zstd cimport (
    ZSTD_CONTENTSIZE_ERROR,
    ZSTD_CONTENTSIZE_UNKNOWN,
    ZSTD_DCtx,
    ZSTD_DDict,
    ZSTD_inBuffer,
    ZSTD_outBuffer,
    ZSTD_reset_session_only,
)

import os
import pickle
import sys
from collections import deque

from ._pool import gather, worth_the_pool
from ._shards import ShardOpener, open_dictionary, renamed_root, shard_layout
from .._compat import freeze_in_worker
from .._contract import (
    DEFAULT_CACHE_BYTES,
    CacheInfo,
    block_number,
    hinted_readers,
    normalize_index,
)
from .._errors import AtlasFormatError
from .._fork import after_fork_in_child
from .._format import (
    INDEX_FILE,
    check_block_examples,
    check_zstd_content_size,
    corrupt_frame_error,
    expected_block_length,
    load_offsets,
    max_block_bytes,
    truncated_block_error,
    unpickle_error,
    zstd_dictionary_mismatch,
)
from ._objsize import objects_bytes
from ._pickle_scan_py import unbounded_error

cdef extern from "<fcntl.h>":
    enum:
        O_CLOEXEC

cdef extern from "Python.h":
    # Through CPython's call protocol, which checks the result: a callee that returns NULL
    # with no exception set raises SystemError here. Cython's own calls jump straight to a
    # vectorcall slot and skip that check, and pickle.loads can return so: a damaged block
    # may build objects whose deallocation, while the load unwinds, clears the error (a
    # bytearray freed with its buffer still exported prints and clears one).
    object PyObject_CallOneArg(object callable, object arg)

cdef extern from *:
    """
    #define ATLAS_MAX_ZSTD_RATIO 32768ULL
    #define ATLAS_DEFAULT_MAX_BLOCK_BYTES (4ULL << 30)
    """
    const unsigned long long ATLAS_MAX_ZSTD_RATIO
    const unsigned long long ATLAS_DEFAULT_MAX_BLOCK_BYTES

# What CoreModule (atlas_fast._contract) declares, and how libzstd was bound
__all__ = ["BACKEND", "BlockCache", "DatasetCore", "ShardCore", "ZstdDict", "zstd_library"]
__all__ += ["zstd_available", "zstd_load_error", "block_token_stats", "gather_tokens"]

BACKEND = "cython"

# True until this process decodes its first block, and again in a forked child: that decode
# calls _compat.freeze_in_worker first (see there).
cdef bint _first_decode = True


cdef int _first_decode_in_process() except -1:
    global _first_decode
    _first_decode = False
    freeze_in_worker()
    return 0


def _decode_after_fork():
    global _first_decode
    _first_decode = True


after_fork_in_child(_decode_after_fork)

# The C constants that mirror Python ones (tests check them equal): MAX_ZSTD_RATIO and
# _DEFAULT_MAX_BLOCK_BYTES of _format, and the input step _reader_py streams sizeless frames by.
C_CONSTANTS = {
    "MAX_ZSTD_RATIO": ATLAS_MAX_ZSTD_RATIO,
    "DEFAULT_MAX_BLOCK_BYTES": ATLAS_DEFAULT_MAX_BLOCK_BYTES,
    "STREAM_STEP": _STEP,
}


# The units of this module, one concern each, textually included so that the whole reading
# core is one extension module: the cache's hit path and the index arithmetic inline into the
# C __getitem__ slot, which calls across extension modules (through function pointers) would
# not allow. The writer's compressor is an extension of its own (_compress.pyx).
include "_libzstd.pxi"
include "_zstd.pxi"
include "_mapping.pxi"
include "_cache.pxi"
include "_readahead.pxi"


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


cdef Py_ssize_t _run_start(object indices, Py_ssize_t n, Py_ssize_t resume) except -2:
    """_contract.run_start in C: the first index if ``indices`` is a batch of a pass in order
    (consecutive ints in [0, n) from 0 or ``resume``), else -1."""
    cdef Py_ssize_t count, k
    cdef long long first
    cdef int overflow = 0
    cdef object item
    if type(indices) is list:
        count = PyList_GET_SIZE(indices)
    elif type(indices) is tuple:
        count = PyTuple_GET_SIZE(indices)
    else:
        return -1
    if count < 2:
        return -1
    item = indices[0]
    if not PyLong_CheckExact(item):
        return -1
    first = PyLong_AsLongLongAndOverflow(item, &overflow)
    if overflow or first < 0 or (first != 0 and first != resume) or first + count > n:
        return -1
    for k in range(1, count):
        item = indices[k]
        if not PyLong_CheckExact(item):
            return -1
        if PyLong_AsLongLongAndOverflow(item, &overflow) != first + k or overflow:
            return -1
    return <Py_ssize_t>first


cdef inline Py_ssize_t _block_index(object b, Py_ssize_t n_blocks) except -1:
    """``b`` as a block number in [0, n_blocks); IndexError outside."""
    cdef int overflow = 0
    cdef long long k
    if PyLong_CheckExact(b):
        k = PyLong_AsLongLongAndOverflow(b, &overflow)
        if overflow == 0 and 0 <= k < n_blocks:
            return <Py_ssize_t>k
    return block_number(b, n_blocks)


cdef object _WHOLE = object()  # _partial's answer: unpickle the whole block

cdef enum:
    _SCAN_NOGIL_BYTES = 65536  # larger blocks are scanned with the GIL released
    _SCRATCH_KEPT_BYTES = 4 << 20  # a scratch scan grown past this is freed after its scan

# The scan of a random miss is used once (a block read again is unpickled whole): one scratch
# scan, taken and given back with the GIL held, serves every miss of the process, its arrays
# already grown and warm. A thread finding it taken scans with one of its own.
cdef PickleScan* _scratch = NULL


cdef PickleScan* _scratch_take() noexcept:
    global _scratch
    cdef PickleScan* scan = _scratch
    _scratch = NULL
    if scan == NULL:
        scan = ps_new()
        if scan == NULL:
            return NULL
    ps_reset(scan)
    return scan


cdef void _scratch_give(PickleScan* scan) noexcept:
    global _scratch
    if _scratch == NULL and ps_nbytes(scan) <= _SCRATCH_KEPT_BYTES:
        _scratch = scan
    else:
        ps_free(scan)


cdef int _check_bounded(object data, str data_path, Py_ssize_t b) except -1:
    """Refuse block ``b``'s pickle ``data`` before it is unpickled if an operand asks the
    unpickler to allocate by more than the block holds (ps_bound: _pickle_scan_py's rule)."""
    cdef Py_buffer buf
    cdef ps_bound_t found
    cdef int bad
    PyObject_GetBuffer(data, &buf, PyBUF_SIMPLE)
    try:
        if buf.len > _SCAN_NOGIL_BYTES:
            with nogil:
                bad = ps_bound(<const unsigned char*>buf.buf, <size_t>buf.len, &found)
        else:
            bad = ps_bound(<const unsigned char*>buf.buf, <size_t>buf.len, &found)
    finally:
        PyBuffer_Release(&buf)
    if bad:
        raise unbounded_error((found.op, found.pos, found.value, found.limit), data_path, b)
    return 0


cdef inline object _item(list examples, Py_ssize_t j):
    # A list handed out by read_block may have been emptied by its caller.
    if j < PyList_GET_SIZE(examples):
        return <object>PyList_GET_ITEM(examples, j)
    return PyObject_GetItem(examples, j)


cdef enum:
    _BATCH_BLOCKS = 32  # distinct blocks a batch read by _batch_c may touch


cdef object _batch_c(DatasetCore ds, ShardCore shard, list indices):
    """The examples at ``indices`` (``ds``'s, or ``shard``'s when ``ds`` is None), read as
    _pool.gather reads them, in C: a sampler's batches touch few blocks, most of them
    cached by the batch before. None (nothing read, nothing counted) when the batch touches
    more than _BATCH_BLOCKS blocks, a shard not opened yet, a block to decode that is worth
    gather's thread pool (and not decoded ahead), or a missing block of a remote shard
    (gather asks its source for them together): gather reads those.

    As gather: every distinct block looked up once, in the order the batch first reads it,
    before any is loaded (one hit or miss each); then the misses loaded in that order; the
    same errors for bad indices.
    """
    cdef Py_ssize_t count = PyList_GET_SIZE(indices)
    cdef Py_ssize_t k, t, b, local, s
    cdef Py_ssize_t n_seen = 0
    cdef Py_ssize_t misses = 0
    cdef void* seen_reader[_BATCH_BLOCKS]
    cdef Py_ssize_t seen_block[_BATCH_BLOCKS]
    cdef ShardCore reader
    cdef _Entry e
    cdef BlockCache cache = shard._cache if ds is None else ds._cache
    cdef list readers = []  # of the distinct blocks, first read first
    cdef list entries = []  # their cached entries (None: not cached whole)
    cdef list out
    cdef Py_ssize_t* slots = <Py_ssize_t*>PyMem_Malloc(2 * max(count, 1) * sizeof(Py_ssize_t))
    cdef Py_ssize_t* within
    if slots == NULL:
        raise MemoryError()
    within = slots + count
    try:
        for k in range(count):
            if ds is None:
                reader = shard
                local = _normalize(<object>PyList_GET_ITEM(indices, k), shard._n)
            else:
                local = _normalize(<object>PyList_GET_ITEM(indices, k), ds._total)
                s = ds._shard_of(local)
                if s:
                    local -= ds._c_ends[s - 1]
                if <object>PyList_GET_ITEM(ds._readers, s) is None:
                    return None  # a shard not read yet
                reader = <ShardCore>PyList_GET_ITEM(ds._readers, s)
            b = local // reader._block_size
            within[k] = local - b * reader._block_size
            t = n_seen - 1  # the block of the index before, most often
            if t < 0 or seen_reader[t] != <void*>reader or seen_block[t] != b:
                t = 0
                while t < n_seen and (seen_reader[t] != <void*>reader or seen_block[t] != b):
                    t += 1
                if t == n_seen:
                    if n_seen == _BATCH_BLOCKS:
                        return None
                    e = reader._last
                    if e is None or not e.live or e.block != b or e.examples is None:
                        e = cache._find((reader._tag, b))
                        if e is not None and e.examples is None:
                            e = None
                    misses += e is None
                    readers.append(reader)
                    entries.append(e)
                    seen_reader[t] = <void*>reader
                    seen_block[t] = b
                    n_seen += 1
            slots[k] = t
        if misses:
            return _batch_misses(cache, readers, seen_block, entries, slots, within, count)
        out = [None] * count
        # Allocating may have run a collection, whose finalizers may have read and evicted:
        # check again. No Python code runs from here on, so the entries stay as checked.
        for t in range(n_seen):
            e = <_Entry>PyList_GET_ITEM(entries, t)
            if not e.live or e.examples is None:
                return None
        for t in range(n_seen):
            cache._hit(<_Entry>PyList_GET_ITEM(entries, t))
        for k in range(count):
            e = <_Entry>PyList_GET_ITEM(entries, slots[k])
            out[k] = _item(e.examples, within[k])
        return out
    finally:
        PyMem_Free(slots)


cdef object _batch_misses(BlockCache cache, list readers, Py_ssize_t* blocks, list entries,
                          Py_ssize_t* slots, Py_ssize_t* within, Py_ssize_t count):
    """_batch_c for a batch some of whose blocks are not cached (``entries[t]`` None)."""
    cdef Py_ssize_t t, k, b
    cdef Py_ssize_t n_seen = len(readers)
    cdef ShardCore reader
    cdef _Entry e
    cdef _RABuffer ahead
    cdef list got = [None] * n_seen  # each distinct block's examples (held: evictions aside)
    for t in range(n_seen):
        reader = <ShardCore>readers[t]
        if entries[t] is None and (reader._source is not None or (
                reader._compressed and not _ra_queued(<void*>reader, blocks[t])
                and worth_the_pool(reader))):
            return None  # gather fetches or decodes it, beside the others
    for t in range(n_seen):  # all looked up before any is loaded
        reader = <ShardCore>readers[t]
        e = cache._get((reader._tag, blocks[t]))
        if e is not None:
            got[t] = e.examples
    for t in range(n_seen):
        if got[t] is not None:
            continue
        reader = <ShardCore>readers[t]
        b = blocks[t]
        ahead = reader._take_ahead(b)
        if ahead is not None:
            examples = reader._store_ahead((reader._tag, b), b, ahead)
        else:
            data = reader._decoded(b, True, not reader._compressed)
            examples = reader._unpickle_c(data, b)
            e = cache._put((reader._tag, b), b, examples, _data_size(data))
            if e.examples is not None:  # another thread's copy may have won
                examples = e.examples
        got[t] = examples
    return [_item(<list>got[slots[k]], within[k]) for k in range(count)]


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
    # A remote shard's storage._dataset.ShardSource (None: the local files under _root). Its
    # blocks come from it as bytes, decoded by the same _decompress as the mapped ones.
    cdef readonly object _source
    # The entry of the block last read: a hit on it skips the dict. Read and replaced under
    # the GIL; only trusted while live.
    cdef _Entry _last
    # The example after the one _get read last: a miss on the first example of the block
    # after _last's, at this index, is a pass in order (see _get).
    cdef Py_ssize_t _next
    cdef Py_ssize_t _run_next  # where the last batch of a pass in order (run_start) ended
    # Set together by _open under _lock (and cleared by close under it); read under the GIL,
    # and held in locals by a reader across its nogil decompression.
    cdef object _offsets  # the validated numpy array (None: not open)
    cdef const uint64_t* _offs  # its data
    cdef _Mapping _mapping
    cdef ZstdDict _zdict
    cdef PyThread_type_lock _lock
    cdef unsigned long _lock_generation
    # Blocks named by prefetch() and not queued yet (None: none), in this fork generation.
    cdef list _hints
    cdef unsigned long _hints_generation
    # Whether prefetch() hints are worth queuing: the blocks are compressed and large enough
    # on average to be read ahead (-1: not known before the shard is open).
    cdef int _hints_worth

    def __cinit__(self, *args, **kwargs):
        self._hints_worth = -1
        self._next = -1
        self._run_next = 0
        self._lock = _new_lock()
        self._lock_generation = _generation

    def __init__(self, root, metadata, dict_bytes=None, loads=None, cache=None, tag=0,
                 source=None):
        (self._root, self._data_path, self._n, self._block_size, self._n_blocks,
         self._compressed) = shard_layout(root, metadata, dict_bytes)
        self._metadata = metadata
        self._dict_bytes = dict_bytes
        self._last_length = (
            expected_block_length(self._n, self._block_size, self._n_blocks - 1)
            if self._n_blocks else 0
        )
        self._loads = pickle.loads if loads is None else loads
        self._cache = BlockCache(DEFAULT_CACHE_BYTES, None, False) if cache is None else cache
        self._tag = tag
        self._source = source

    def __len__(self):
        return self._n

    def __getitem__(self, i):
        if self._hints is not None:
            self._queue_hints()
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
            if k == self._next and j == 0 and e is not None and e.block == b - 1:
                # A pass in order is done with block b - 1 (_forget: kept only if passes
                # fill the cache and it has room).
                self._cache._forget(e)
                self._next = k + 1
                return self._in_order(b, j)
            self._next = k + 1
            if k == 0:
                # The shard's first example: read as the start of a pass in order (whole,
                # held for the pass), but nothing read ahead until the pass goes on: a lone
                # ds[0] (a peek, or a random read) starts no decoding or fetching it will
                # not use.
                return self._in_order(0, 0, False)
            return self._miss(b, j)
        self._next = k + 1
        return _item(examples, j)

    cdef object _miss(self, Py_ssize_t b, Py_ssize_t j):
        """Example ``j`` of block ``b`` when it is not the last block read.

        From the cache if it holds the block's examples. Otherwise, partial decoding: the
        block is decoded (decompressed) and scanned, and example ``j`` alone unpickled from
        its synthetic pickle (atlas_fast._core._pickle_scan); the block's pickle stays in the
        cache. The whole block is unpickled instead when it is read in order (the last
        block read is the one before), when it is read a second time (its pickle is in the
        cache), and when the scanner falls back.
        """
        key = (self._tag, b)
        cdef _Entry e = self._cache._find(key)
        cdef list examples
        if e is not None:
            self._cache._hit(e)
            if e.examples is not None:
                examples = e.examples  # read before any Python code can run
                self._last = e
                return _item(examples, j)
            data = e.data  # read a second time: worth unpickling whole
        else:
            self._cache._misses += 1
            ahead = self._take_ahead(b)
            if ahead is not None:  # named by prefetch(): read whole, soon
                return _item(self._store_ahead(key, b, ahead), j)
            data = self._decoded(b, True, True)
            if self._last is None or self._last.block != b - 1:
                out = self._partial(key, b, j, data)
                if out is not _WHOLE:
                    return out
        examples = self._unpickle_c(data, b, e is not None)
        e = self._cache._put(key, b, examples, _data_size(data))
        if e.examples is not None:  # another thread's copy may have won
            examples = e.examples
        self._last = e
        return _item(examples, j)

    cdef object _partial(self, object key, Py_ssize_t b, Py_ssize_t j, object data):
        """Example ``j`` of block ``b`` unpickled alone from the block's pickle ``data``, or
        _WHOLE: unpickle the whole block (which also decides any error)."""
        cdef PickleScan* scan = _scratch_take()
        cdef Py_buffer buf
        cdef int status
        cdef Py_ssize_t expected = self._block_size if b < self._n_blocks - 1 else self._last_length
        synthetic = None
        if scan == NULL:
            return _WHOLE
        try:
            # ``scan`` is this call's own until given back; ``data`` is held by the caller.
            PyObject_GetBuffer(data, &buf, PyBUF_SIMPLE)
            try:
                if buf.len > _SCAN_NOGIL_BYTES:
                    with nogil:
                        status = ps_feed(scan, <const unsigned char*>buf.buf, <size_t>buf.len, True)
                else:
                    status = ps_feed(scan, <const unsigned char*>buf.buf, <size_t>buf.len, True)
                if status == PS_DONE and scan.n_elems == expected:
                    synthetic = ps_synthetic(scan, <const unsigned char*>buf.buf, <uint32_t>j)
            finally:
                PyBuffer_Release(&buf)
        finally:
            _scratch_give(scan)  # before any Python code runs: loads may read here again
        if type(synthetic) is not bytes:
            return _WHOLE
        if _first_decode:
            _first_decode_in_process()
        try:
            example = PyObject_CallOneArg(self._loads, synthetic)
        except Exception:
            return _WHOLE
        # The pickle stays (a second read of the block unpickles it whole), not its scan.
        self._last = self._cache._put_partial(key, b, data, _data_size(data))
        return example

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

    def _block_bytes(self, b):
        """The decoded pickle bytes of block ``b`` (not cached)."""
        return self._decoded(_block_index(b, self._n_blocks), True)

    def _raw_block(self, b):
        """The stored (possibly compressed) bytes of block ``b``."""
        return self._decoded(_block_index(b, self._n_blocks), False)

    def _block_offsets(self):
        """The validated block offsets (opening the shard's files on first use)."""
        while self._offsets is None:
            self._open()
        return self._offsets

    def __getitems__(self, indices):
        """The examples at ``indices``, in that order; each block needed is decoded once. A
        batch of a pass in order (consecutive indices from 0 or from where the last such batch
        ended: _contract.run_start) is read as ``ds[i]`` reads a pass in order, with the next
        blocks decompressed ahead."""
        cdef Py_ssize_t n = self._n
        cdef Py_ssize_t first = _run_start(indices, n, self._run_next)
        cdef Py_ssize_t k
        if self._hints is not None:
            self._queue_hints()
        if first >= 0:
            self._run_next = first + len(indices)
            return [self._get(k) for k in range(first, first + len(indices))]
        if type(indices) is list:
            out = _batch_c(None, self, indices)
            if out is not None:
                return out
        return gather(lambda s: self, [(0, _normalize(i, n)) for i in indices])

    def __iter__(self):
        """Every example in order, the next blocks decompressing while one is handed out."""
        return _read_in_order((self, b) for b in range(self._n_blocks))

    def cache_info(self):
        return self._cache.cache_info()

    def cache_reserve(self, blocks):
        self._cache.reserve(blocks)

    def prefetch(self, indices):
        """A hint: the blocks of ``indices`` are read next (see _contract); queued for
        read-ahead at this reader's next read in this process."""
        cdef Py_ssize_t n = self._n
        cdef list blocks = [_normalize(i, n) // self._block_size for i in indices]
        if self._hints_worth == 0:
            return False
        if self._hints is not None and self._hints_generation == _generation:
            blocks = self._hints + blocks
        self._hints = blocks[-_RA_SLOTS:] if blocks else None
        self._hints_generation = _generation
        return True

    cdef int _queue_hints(self) except -1:
        """Queue the blocks prefetch() named (unless named before a fork)."""
        cdef list hints = self._hints
        self._hints = None
        if self._hints_generation == _generation:
            self._queue_hinted(hints)
        return 0

    cdef int _queue_hinted(self, list blocks) except -1:
        """Read ``blocks`` ahead, named by prefetch(): a local shard's decoded on the
        read-ahead thread; a remote shard's fetched now by its source, neighbours merged
        (the fetching is what takes time; each is decoded when read)."""
        if self._source is None:
            for b in blocks:
                self._queue_ahead(b, True)
            return 0
        self._hints_worth = 1
        if self._offsets is None:
            try:
                self._open()
            except Exception:
                return 0  # raised again, by the read of a block of this shard
        wanted = [b for b in blocks if self._cache._find((self._tag, b)) is None]
        if wanted:
            self._source.prefetch(wanted, True)
        return 0

    def close(self):
        """Release the mapping, the dictionary and the cached blocks (reopened on next use)."""
        cdef PyThread_type_lock lock = self._lock_get()
        if lock == NULL:
            raise MemoryError("cannot allocate a lock")
        self._hints = None
        _ra_cancel(<void*>self, -1)
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
        if self._source is not None:
            self._source.close()

    # -- for _pool ---------------------------------------------------------------------------

    def _lookup(self, Py_ssize_t b):
        cdef _Entry e = self._cache._get((self._tag, b))
        return None if e is None else e.examples

    def _held(self, Py_ssize_t b):
        return self._held_c(b)

    def _ahead(self, Py_ssize_t b):
        cdef _RABuffer data = self._take_ahead(b)
        return None if data is None else self._store_ahead((self._tag, b), b, data)

    def _load(self, Py_ssize_t b):
        return self._store(b, self._decoded(b, True, True))

    def _pass_block(self, Py_ssize_t b, data):
        return self._passed(data, b, _data_size(data))

    def _store(self, Py_ssize_t b, data):
        cdef list examples = self._unpickle_c(data, b)
        cdef _Entry e = self._cache._put((self._tag, b), b, examples, _data_size(data))
        return examples if e.examples is None else e.examples

    def _prefetch(self, blocks):
        """A remote shard: fetch ``blocks`` now, neighbours merged (no-op for local files)."""
        if self._source is not None:
            self._source.prefetch(blocks)

    # -- opening ----------------------------------------------------------------------------

    cdef inline PyThread_type_lock _lock_get(self) noexcept:
        if self._lock_generation != _generation:
            # Forked: the parent's lock may be held forever; abandon it.
            self._lock = PyThread_allocate_lock()
            self._lock_generation = _generation
        return self._lock

    cdef int _open_lock_held(self) except -1:
        # In the order the Python backend checks them (index.npy, data.bin, the dictionary),
        # data.bin's size checked by _map_file on the descriptor it maps (a remote shard's by
        # its source, against the size of the object its first block came from).
        if self._source is not None:
            return self._open_remote_lock_held()
        moved = renamed_root(self._root)
        if moved is not None:  # an append widened the shard names since this was made
            self._root, self._data_path = moved
        offsets = load_offsets(self._root, self._metadata, self._n_blocks == 0)
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
        zdict = open_dictionary(self._root, self._metadata, self._dict_bytes, ZstdDict)
        # Published together, with no Python code in between.
        self._mapping = mapping
        self._zdict = zdict
        self._offs = &view[0]
        self._offsets = offsets
        return 0

    cdef int _open_remote_lock_held(self) except -1:
        offsets = self._source.offsets(self._metadata)
        cdef const uint64_t[::1] view = offsets
        zdict = open_dictionary(self._root, self._metadata, self._dict_bytes, ZstdDict,
                                self._source)
        self._mapping = None
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
        if self._source is not None:
            return self._decoded_remote(b, decode, zdict, start, end)
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

    cdef object _decoded_remote(self, Py_ssize_t b, bint decode, ZstdDict zdict, uint64_t start,
                                uint64_t end):
        """_decoded for a remote shard: the stored bytes from the source, decoded as a mapped
        block's are (``raw`` holds them while _decompress reads them)."""
        raw = self._source.block(b)
        if type(raw) is not bytes:
            raw = bytes(raw)
        cdef Py_ssize_t got = PyBytes_GET_SIZE(raw)
        if <uint64_t>got != end - start:
            raise truncated_block_error(self._data_path, b, start, end, got)
        if decode and self._compressed:
            return _decompress(PyBytes_AS_STRING(raw), <size_t>got, zdict, self._data_path, b)
        return raw

    cdef list _unpickle_c(self, data, Py_ssize_t b, bint scanned=False):
        """Block ``b``'s examples from its pickle bytes, checked to be a list of its length;
        ``scanned``: the bytes a partial read scanned whole (which checked their bounds)."""
        cdef Py_ssize_t expected
        if _first_decode:
            _first_decode_in_process()
        if not scanned:
            _check_bounded(data, self._data_path, b)
        try:
            examples = PyObject_CallOneArg(self._loads, data)
        except Exception as exc:
            raise unpickle_error(exc, self._data_path, b) from exc
        expected = self._block_size if b < self._n_blocks - 1 else self._last_length
        if type(examples) is not list or PyList_GET_SIZE(examples) != expected:
            check_block_examples(examples, expected, self._data_path, b)
        return examples

    # -- read-ahead of a pass in order (see _readahead.pxi) -----------------------------------

    cdef object _in_order(self, Py_ssize_t b, Py_ssize_t j, bint queue=True):
        """Example ``j`` of block ``b``, read by a pass in order: decoded ahead if queued (see
        _readahead.pxi), the next blocks queued before it is unpickled (``queue``); unpickled
        whole and cached for the pass (``_forget`` decides, when the pass moves on, whether
        the cache keeps it). A block the cache holds is read as _miss reads it."""
        cdef _RABuffer ahead = None
        cdef list examples
        cdef _Entry e
        cdef Py_ssize_t size
        key = (self._tag, b)
        if self._cache._find(key) is not None:
            return self._miss(b, j)
        if self._compressed:
            ahead = _ra_take(<void*>self, b)
            if queue and not (self._source is None and _ra_skip_one()):
                self._queue_next(b)
        self._cache._misses += 1
        if ahead is not None:
            return _item(self._store_ahead(key, b, ahead, True), j)
        data = self._decoded(b, True, True)
        size = _data_size(data)
        examples = self._unpickle_c(data, b)
        del data
        e = self._cache._put(key, b, examples, size, True)
        if e.examples is not None:  # another thread's copy may have won
            examples = e.examples
        self._last = e
        return _item(examples, j)

    cdef list _store_ahead(self, object key, Py_ssize_t b, _RABuffer data, bint in_order=False):
        """Block ``b``'s examples from its bytes ``data`` decoded ahead (given back to the
        read-ahead after), cached under ``key`` (as a pass in order keeps its blocks when
        ``in_order``); the block is now the last read."""
        cdef Py_ssize_t size = data.size
        cdef list examples
        cdef _Entry e
        try:
            examples = self._unpickle_c(data, b)
        finally:
            _ra_recycle(data)
        e = self._cache._put(key, b, examples, size, in_order)
        if e.examples is not None:  # another thread's copy may have won
            examples = e.examples
        self._last = e
        return examples

    cdef _RABuffer _take_ahead(self, Py_ssize_t b):
        """Block ``b``'s bytes if it is queued for read-ahead (waiting for them), else None
        (also when decoding it failed there: the caller's own path says why)."""
        if not self._compressed or not _ra_queued(<void*>self, b):
            return None
        return _ra_take(<void*>self, b)

    cdef list _held_c(self, Py_ssize_t b):
        """For ``iter``: block ``b``'s examples if the cache holds the block (a hit; held as
        its pickle, it is unpickled whole, as _miss does), else None (a miss)."""
        key = (self._tag, b)
        cdef _Entry e = self._cache._find(key)
        cdef list examples
        if e is None:
            self._cache._misses += 1
            return None
        self._cache._hit(e)
        if e.examples is not None:
            return e.examples
        data = e.data  # a partial read's (_put_partial): scanned
        examples = self._unpickle_c(data, b, True)
        e = self._cache._put(key, b, examples, _data_size(data))
        return examples if e.examples is None else e.examples

    cdef list _passed(self, data, Py_ssize_t b, Py_ssize_t size):
        """Block ``b``'s examples unpickled from ``data`` for ``iter``: kept in the cache as
        a pass in order keeps its blocks (``BlockCache._keep_passed``)."""
        cdef list examples = self._unpickle_c(data, b)
        self._cache._keep_passed((self._tag, b), b, examples, size)
        return examples

    cdef int _queue_next(self, Py_ssize_t b) except -1:
        """Queue the _RA_DEPTH blocks after ``b`` for read-ahead."""
        cdef Py_ssize_t nb
        for nb in range(b + 1, min(b + 1 + _RA_DEPTH, self._n_blocks)):
            self._queue_ahead(nb, False)
        return 0

    cdef int _queue_ahead(self, Py_ssize_t b, bint hint) except -1:
        """Queue block ``b`` (0 <= b < blocks) for read-ahead, unless it is cached, stored
        uncompressed, or its shard cannot be opened (reading the block will say why);
        ``hint``: named by prefetch() (see _ra_queue)."""
        cdef struct_stat st
        if not self._compressed:
            self._hints_worth = 0
            return 0
        if (not hint and self._offsets is not None and self._source is None
                and self._offs[b + 1] - self._offs[b] < _ra_min_bytes):
            # A frame _ra_queue refuses: a pass in order tries each block _RA_DEPTH times,
            # spared the look-ups and the file's fstat for it.
            return 0
        if self._cache._find((self._tag, b)) is not None:
            return 0
        if self._source is not None:
            # Its blocks are fetched ahead by the source and decoded on this thread; a pass
            # reaching this shard soon starts its fetching now.
            if b <= 1:
                self._source.warm()
            return 0
        if _ra_queued(<void*>self, b):
            return 0
        if self._offsets is None:
            try:
                self._open()
            except Exception:
                return 0  # raised again, by the read of a block of this shard
            if self._offsets is None:
                return 0
        # Read together, with no Python code in between (close() clears them together).
        cdef _Mapping mapping = self._mapping
        cdef ZstdDict zdict = self._zdict
        cdef uint64_t start = self._offs[b]
        cdef uint64_t end = self._offs[b + 1]
        # The extent check of _decoded, before the worker reads the mapping; a block that
        # fails it is left to _decoded, which raises the error when the block is read.
        if end <= start or end > mapping.size or _file_size(mapping, &st) != 0:
            return 0
        if <uint64_t>st.st_size < end:
            return 0
        if hint and self._hints_worth < 0:
            # Stored bytes per block on average, against the line hints are worth it from.
            self._hints_worth = (self._offs[self._n_blocks]
                                 >= <uint64_t>self._n_blocks * _ra_hint_min_bytes)
        if hint and not self._hints_worth:
            return 0
        return _ra_queue(<void*>self, b, (mapping, zdict), mapping.ptr + start,
                         <size_t>(end - start), zdict, hint)

    def __dealloc__(self):
        # self._lock is not freed: a lock from before a fork may be held by a lost thread,
        # and a current one is a few bytes. Free only one of the current generation.
        _ra_cancel(<void*>self, -1)  # an address reused by another reader matches no job
        if self._lock != NULL and self._lock_generation == _generation:
            PyThread_free_lock(self._lock)


def _read_in_order(pairs):
    """Every example of ``pairs`` ((ShardCore, block) pairs), in order: the next _RA_DEPTH
    blocks are decoded ahead (see _readahead.pxi) while one is unpickled. Cached blocks are
    used; blocks decoded here are cached as a pass in order keeps its blocks (only into a
    budget the user set, while it has room: ShardCore._passed). Closing or dropping the
    generator cancels what was queued."""
    cdef ShardCore reader
    cdef ShardCore later
    cdef Py_ssize_t b
    cdef _RABuffer data
    cdef bint more = True
    ahead = deque()
    pairs = iter(pairs)
    try:
        while True:
            while more and len(ahead) <= _RA_DEPTH:
                pair = next(pairs, None)
                if pair is None:
                    more = False
                else:
                    ahead.append(pair)
            if not ahead:
                return
            reader, b = ahead.popleft()
            examples = reader._held_c(b)
            if examples is None:
                data = _ra_take(<void*>reader, b) if reader._compressed else None
                if not (reader._compressed and reader._source is None and _ra_skip_one()):
                    for later, nb in ahead:
                        later._queue_ahead(nb, False)
                if data is None:
                    block = reader._decoded(b, True, True)
                    examples = reader._passed(block, b, _data_size(block))
                    block = None
                else:
                    try:
                        examples = reader._passed(data, b, data.size)
                    finally:
                        _ra_recycle(data)
                    data = None
            yield from examples
    finally:
        for later, nb in ahead:
            _ra_cancel(<void*>later, nb)


# ---------------------------------------------------------------------------------------------
# Datasets


@cython.auto_pickle(False)
cdef class DatasetCore:
    """Maps global indices onto the shards of a dataset (binary search in C); a shard's
    reader is made on its first use."""

    cdef list _readers  # ShardCore or None (not used yet)
    cdef object _opener  # a _shards.ShardOpener
    cdef list _sizes
    cdef BlockCache _cache
    cdef Py_ssize_t _total
    cdef Py_ssize_t _run_next  # where the last batch of a pass in order (run_start) ended
    cdef Py_ssize_t _next  # the example after the one _get read last
    cdef Py_ssize_t* _c_ends
    cdef Py_ssize_t _n_shards
    # (shard, index in it) of the examples named by prefetch() and not queued yet (None:
    # none), in this fork generation.
    cdef list _hints
    cdef unsigned long _hints_generation
    cdef bint _hints_worth  # whether one of the shards hinted last is worth its hints

    def __cinit__(self, *args, **kwargs):
        self._hints_worth = True
        self._c_ends = NULL
        self._readers = []
        self._next = -1

    def __init__(self, root, shard_dirs, sizes, metadatas, dict_bytes, loads, cache,
                 sources=None):
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
        self._opener = ShardOpener(root, shard_dirs, sizes, metadatas, dict_bytes, loads, cache,
                                   sources)
        self._sizes = self._opener.sizes
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
        made = self._opener.make(ShardCore, s)
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
        if self._hints is not None:
            self._queue_hints()
        return self._get(_normalize(i, self._total))

    cdef inline object _get(self, Py_ssize_t k):
        """Example ``k``, 0 <= k < _total."""
        cdef Py_ssize_t s = self._shard_of(k)
        cdef Py_ssize_t start = self._c_ends[s - 1] if s else 0
        if k == start and k == self._next:
            return self._enter_shard(s, k)
        self._next = k + 1
        return self._reader_c(s)._get(k - start)

    cdef object _enter_shard(self, Py_ssize_t s, Py_ssize_t k):
        """Example ``k``, the first of shard ``s``, read by a pass in order coming from the
        shard before: that shard's last block is done with (ShardCore._forget), and this
        block is read as the pass's next one (ShardCore._in_order)."""
        cdef ShardCore before = self._reader_c(self._shard_of(k - 1))
        cdef ShardCore reader = self._reader_c(s)
        cdef _Entry e = before._last
        self._next = k + 1
        if e is not None and e.block == before._n_blocks - 1:
            before._cache._forget(e)
        reader._next = 1
        return reader._in_order(0, 0)

    def __getitems__(self, indices):
        """The examples at ``indices``, in that order; each block needed is decoded once (a
        batch of a pass in order: as ShardCore's)."""
        cdef Py_ssize_t first = _run_start(indices, self._total, self._run_next)
        cdef Py_ssize_t k
        if self._hints is not None:
            self._queue_hints()
        if first >= 0:
            self._run_next = first + len(indices)
            return [self._get(k) for k in range(first, first + len(indices))]
        if type(indices) is list:
            out = _batch_c(self, None, indices)
            if out is not None:
                return out
        return gather(self._reader, [self._locate(i) for i in indices])

    def __iter__(self):
        """Every example in order, the next blocks decompressing while one is handed out."""
        return _read_in_order(
            (self._reader_c(s), b)
            for s in range(self._n_shards)
            if self._sizes[s]
            for b in range(self._reader_c(s)._n_blocks)
        )

    def cache_info(self):
        return self._cache.cache_info()

    def cache_reserve(self, blocks):
        self._cache.reserve(blocks)

    def prefetch(self, indices):
        """A hint: the blocks of ``indices`` are read next (see _contract); queued for
        read-ahead at this dataset's next read in this process."""
        cdef list located = [self._locate(i) for i in indices]
        if not self._hints_worth:
            return False
        if self._hints is not None and self._hints_generation == _generation:
            located = self._hints + located
        self._hints = located[-_RA_SLOTS:] if located else None
        self._hints_generation = _generation
        return True

    cdef int _queue_hints(self) except -1:
        """Queue the blocks prefetch() named (unless named before a fork)."""
        cdef list hints = self._hints
        cdef ShardCore reader
        self._hints = None
        if self._hints_generation != _generation:
            return 0
        worth = False
        for reader, named in hinted_readers(hints, self._reader):
            reader._queue_hinted([j // reader._block_size for j in named])
            worth = worth or reader._hints_worth != 0
        self._hints_worth = worth
        return 0

    def close(self):
        """Release every shard's files and the cached blocks (they reopen on next use)."""
        self._hints = None
        self._cache.clear()  # first: each reader's close then has no blocks of its own to find
        for reader in self._readers:
            if reader is not None:
                reader.close()


include "_tokens.pxi"
