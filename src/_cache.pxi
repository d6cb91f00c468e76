# Included by _reader.pyx (one extension module): the block cache.
# Directives are set once, in setup.py.

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
    """A cached block: its examples, or only its pickle (after partial decoding).

    ``examples`` the unpickled list (or None), ``data`` its decoded pickle bytes (or None);
    ``tokens`` where its documents' tokens are in ``data`` (a ``_TokenBlock``, or None: see
    _tokens.pxi); ``nbytes`` what it counts against the budget.
    ``live``: the cache holds it (it is then in the dict and the list); a reader's last entry
    may outlive it, emptied. ``for_pass``: held only for the pass in order reading it, until
    the pass moves on (``BlockCache._forget``).
    """

    cdef object key
    cdef Py_ssize_t block
    cdef list examples
    cdef object data
    cdef object tokens
    cdef Py_ssize_t nbytes
    cdef bint live
    cdef bint for_pass
    cdef PyObject* newer  # borrowed: the cache's dict owns every live entry
    cdef PyObject* older


cdef enum:
    _MEASURE_FIRST = 2  # _objsize's MEASURE_FIRST, MEASURE_EVERY and WINDOW (a test checks)
    _MEASURE_EVERY = 256
    _WINDOW = 4

C_CONSTANTS["MEASURE_FIRST"] = _MEASURE_FIRST
C_CONSTANTS["MEASURE_EVERY"] = _MEASURE_EVERY
C_CONSTANTS["WINDOW"] = _WINDOW


@cython.final
@cython.auto_pickle(False)
cdef class ChargeMeter:
    """_objsize.ChargeMeter in C: the same charges, its schedule and ratio kept in C so that
    a block put in the cache costs no Python call unless it is measured (objects_bytes, the
    first _MEASURE_FIRST puts and one in _MEASURE_EVERY after)."""

    cdef unsigned long long _puts
    cdef double _ratio
    cdef list _window  # (objects, pickle) bytes measured, the last _WINDOW, as Python ints

    def __cinit__(self):
        self._ratio = 1.0
        self._window = []

    def charge(self, list examples, Py_ssize_t nbytes):
        return self._charge(examples, nbytes)

    cdef Py_ssize_t _charge(self, list examples, Py_ssize_t nbytes) except -1:
        cdef unsigned long long n = self._puts
        cdef double scaled
        self._puts = n + 1
        if n < _MEASURE_FIRST or n % _MEASURE_EVERY == 0:
            self._measure(examples, nbytes)
        scaled = <double>nbytes * self._ratio
        if scaled <= <double>nbytes:
            return nbytes
        if scaled >= 9.0e18:
            return <Py_ssize_t>(<size_t>-1 >> 1)
        return <Py_ssize_t>scaled

    cdef int _measure(self, list examples, Py_ssize_t nbytes) except -1:
        try:
            measured = objects_bytes(examples)
        except Exception:  # an object that cannot be measured: keep the ratio
            return 0
        if nbytes <= 0:
            return 0
        if len(self._window) == _WINDOW:
            del self._window[0]
        self._window.append((measured, nbytes))
        self._ratio = sum([m for m, _ in self._window]) / sum([p for _, p in self._window])
        return 0


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
    cdef ChargeMeter _meter  # what a block is charged (as atlas_fast._core._objsize's)
    cdef bint _passes_fill  # passes in order keep their blocks while there is room
    cdef Py_ssize_t _n_for_pass  # live entries held for a pass (_Entry.for_pass)

    def __cinit__(self, max_bytes=None, max_blocks=None, passes_fill=True):
        self._entries = {}
        self._meter = ChargeMeter()
        self._max_bytes = -1 if max_bytes is None else max_bytes
        self._max_blocks = -1 if max_blocks is None else max_blocks
        self._reserved = 1
        self._passes_fill = passes_fill

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

    def partial_keys(self):
        """``(tag, block)`` of the blocks held as their pickle only (partial decoding),
        least recently used first."""
        return [key for key in self.keys() if (<_Entry>self._entries[key]).examples is None]

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

    cdef _Entry _find(self, object key):
        """The live entry of ``key``, with examples or only its pickle, or None;
        counts nothing."""
        cdef PyObject* found = PyDict_GetItem(self._entries, key)
        return None if found == NULL else <_Entry>found

    cdef _Entry _put(self, object key, Py_ssize_t block, list examples, Py_ssize_t nbytes,
                     bint for_pass=False):
        """Cache ``examples`` (a pickle of ``nbytes``) as block ``key``, charged what the meter
        says; an entry already there (another thread's) wins. ``for_pass``: the block a pass
        in order reads, held for it until it moves on (``_forget``); it evicts only blocks
        held for passes (``_add``)."""
        # Before the look-up: measuring runs Python code.
        cdef Py_ssize_t charge = self._meter._charge(examples, nbytes)
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
            self._drop(e, dropped)  # its pickle: now decoded whole
        e = _Entry.__new__(_Entry)
        e.key = key
        e.block = block
        e.examples = examples
        e.nbytes = charge
        e.for_pass = for_pass
        return self._add(e, dropped)

    cdef int _keep_passed(self, object key, Py_ssize_t block, list examples,
                          Py_ssize_t nbytes) except -1:
        """A block that ``iter`` read (a pass in order): cached only if passes fill this cache
        and it has room for the block (nothing is evicted for it)."""
        cdef Py_ssize_t charge
        cdef _Entry e
        if not self._passes_fill:
            return 0
        charge = self._meter._charge(examples, nbytes)  # before the look-up: may run Python
        if PyDict_GetItem(self._entries, key) != NULL or not self._has_room(charge):
            return 0
        e = _Entry.__new__(_Entry)
        e.key = key
        e.block = block
        e.examples = examples
        e.nbytes = charge
        self._add(e, [])
        return 0

    cdef inline bint _has_room(self, Py_ssize_t nbytes) noexcept:
        """Whether one more block charged ``nbytes`` fits the budget without evicting."""
        return (self._max_bytes < 0 or self._bytes + nbytes <= self._max_bytes) and (
            self._max_blocks < 0 or self._count < self._max_blocks
        )

    cdef _Entry _put_partial(self, object key, Py_ssize_t block, object data, Py_ssize_t nbytes):
        """Cache block ``key`` as its pickle bytes (partial decoding returned one example; a
        second read unpickles them whole); an entry already there wins."""
        cdef PyObject* found = PyDict_GetItem(self._entries, key)
        cdef _Entry e
        if found != NULL:
            return <_Entry>found
        e = _Entry.__new__(_Entry)
        e.key = key
        e.block = block
        e.data = data
        e.nbytes = nbytes
        return self._add(e, [])

    cdef _Entry _add(self, _Entry e, list dropped):
        """Insert new entry ``e`` as the most recent, then evict down to the budget: least
        recently used first; for a block held for a pass (``for_pass``), only other such
        blocks (a pass evicts nothing else: the cache may hold that one block over budget)."""
        cdef PyObject* p
        self._entries[e.key] = e
        e.live = True
        self._push(e)
        self._count += 1
        self._bytes += e.nbytes
        if e.for_pass:
            self._n_for_pass += 1
        while self._count > self._reserved and (
            (self._max_bytes >= 0 and self._bytes > self._max_bytes)
            or (self._max_blocks >= 0 and self._count > self._max_blocks)
        ):
            if not e.for_pass:
                self._drop(<_Entry>self._oldest, dropped)
                continue
            p = self._oldest if self._n_for_pass > 1 else NULL
            while p != NULL and (p == <PyObject*>e or not (<_Entry>p).for_pass):
                p = (<_Entry>p).newer
            if p == NULL:
                break
            self._drop(<_Entry>p, dropped)
        return e

    cdef int _forget(self, _Entry e) except -1:
        """``e`` is the block a pass in order (``ds[i]``) is done with. Held for the pass
        only (not a block others put here): kept if passes fill this cache and it has room
        for the pass's next block (of about ``e``'s size), as ``_keep_passed`` keeps a block
        of ``iter``, else dropped now."""
        cdef list dropped = []
        if not (e.live and e.for_pass):
            return 0
        if self._passes_fill and self._has_room(e.nbytes):
            e.for_pass = False  # kept: a block of the cache like any other from now on
            self._n_for_pass -= 1
        else:
            self._drop(e, dropped)
        return 0

    cdef int _drop(self, _Entry e, list dropped) except -1:
        """Unlink ``e``; what it held goes to ``dropped``, released by the caller's return."""
        dropped.append((e, e.examples, e.data, e.tokens))
        self._unlink(e)
        del self._entries[e.key]
        self._count -= 1
        self._bytes -= e.nbytes
        if e.for_pass:
            self._n_for_pass -= 1
        e.live = False
        e.examples = None
        e.data = None
        e.tokens = None
        return 0


cdef inline Py_ssize_t _data_size(object data) noexcept:
    if type(data) is bytes:
        return PyBytes_GET_SIZE(data)
    if type(data) is _RABuffer:  # a block decoded ahead, kept as it is (the token gather)
        return (<_RABuffer>data).size
    return (<_BlockView>data).size
