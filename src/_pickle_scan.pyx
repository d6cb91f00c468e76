# Directives are set once, in setup.py.
"""Partial decoding of a block: a scanner of pickle opcodes, one element unpickled alone.

A block is ``pickle.dumps(list_of_examples)``. The scanner walks the block's opcodes
(protocols 0-5) simulating the unpickler's stack without building any object. For each
top-level element it records the byte span of its construction; for each memo entry, the span
of the object stored there (from where its stack slot was created to where that slot was last
on top of the stack: a memoized list or dict filled by later APPENDS or SETITEMS is included
whole); for each GET, the entry it reads. Element ``i`` is then unpickled from a synthetic
pickle: PROTO, the spans of every memo entry it reads that was built before it (recursively,
in block order, each followed by POP), its own span, STOP; MEMOIZE opcodes are rewritten as
explicit puts at their original index and FRAME headers are dropped. The caller's ``loads``
(``pickle.loads`` or the restricted unpickler) loads it: whatever the block refers to reaches
that ``loads`` unchanged.

Anything the scanner does not fully understand makes the whole scan a fallback (the caller
unpickles the whole block): unknown opcodes, persistent ids, the extension registry,
out-of-band buffers, DUP, a top level that is not a list built by the pickle itself, an object
changed after it was built through a GET (APPEND/SETITEM/BUILD on a fetched object), a memo
index stored twice or out of range, a GET of an unset index, a stack underflow, truncation.
A single element falls back when it needs an object whose construction was not over when the
element read it (a recursive structure reaching outside the element).

Elements are final only once the pickle's STOP has been scanned: a prefix of a pickle does not
determine its top-level elements (``MARK K1 K2`` starts both ``[1, 2]`` and ``[(1, 2)]``), so
the scan of a prefix reports PS_MORE and no element.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int32_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, qsort, realloc
from libc.string cimport memchr, memcpy, memset

cimport cython


import pickle

__all__ = ["PickleScanner", "scan", "bound_check", "MAX_PROTOCOL", "MEMO_SLACK"]

cdef enum:
    PS_MAX_PROTOCOL = 5  # pickle.HIGHEST_PROTOCOL of every CPython this builds for
    _DENSE_BYTES = 16384  # see _reserve

MAX_PROTOCOL = PS_MAX_PROTOCOL

cdef extern from *:
    """
    #define PS_OPEN 0xFFFFFFFFu
    #define PS_FRAME_EDIT 0xFFFFFFFFu
    #define PS_LIMIT 0xFFFFFFF0u
    #define PS_MEMO_SLACK 256u
    #define PS_BOUND_SLACK 65536u
    """
    # ps_def.end while the object is being built; ps_edit.memo of a FRAME header
    const uint32_t PS_OPEN
    const uint32_t PS_FRAME_EDIT
    # Blocks this long or longer are not scanned (offsets are 32-bit).
    const uint32_t PS_LIMIT
    # An explicit memo index may exceed its opcode's offset by this much.
    const uint32_t PS_MEMO_SLACK
    # ps_bound: a memo index may exceed the pickle's length by this much (the memo table it
    # asks for is then at most 16 bytes per byte of the pickle, plus 1 MiB).
    const uint32_t PS_BOUND_SLACK

MEMO_SLACK = PS_BOUND_SLACK

# Slot flags.
cdef enum:
    F_LIST = 1  # built by EMPTY_LIST or LIST
    F_GET = 2  # pushed by a GET: an object built elsewhere

# Fallback reasons; their text is in _REASONS, in the same order.
cdef enum:
    R_NONE = 0
    R_UNKNOWN_OPCODE
    R_UNSUPPORTED_OPCODE
    R_TRUNCATED
    R_TOO_LARGE
    R_PROTO
    R_UNDERFLOW
    R_MEMO_RANGE
    R_MEMO_TWICE
    R_MEMO_UNSET
    R_MUTATION
    R_NOT_LIST
    R_STOP
    R_BAD_ARGUMENT
    R_NO_MEMORY
    R_RECURSIVE
    R_NO_ELEMENT
    R_NOT_DONE

cdef const char* _REASONS[18]
_REASONS[R_NONE] = b"none"
_REASONS[R_UNKNOWN_OPCODE] = b"unknown opcode"
_REASONS[R_UNSUPPORTED_OPCODE] = (
    b"unsupported opcode (DUP, persistent id, extension registry or out-of-band buffer)")
_REASONS[R_TRUNCATED] = b"truncated pickle"
_REASONS[R_TOO_LARGE] = b"block too large to scan"
_REASONS[R_PROTO] = b"unsupported or misplaced PROTO"
_REASONS[R_UNDERFLOW] = b"stack underflow or misplaced mark"
_REASONS[R_MEMO_RANGE] = b"memo index out of range"
_REASONS[R_MEMO_TWICE] = b"memo index stored twice"
_REASONS[R_MEMO_UNSET] = b"GET of a memo index never stored"
_REASONS[R_MUTATION] = b"an object is changed after it was built"
_REASONS[R_NOT_LIST] = b"the top level is not a list"
_REASONS[R_STOP] = b"STOP with a stack other than one list, or a frame past STOP"
_REASONS[R_BAD_ARGUMENT] = b"malformed opcode argument"
_REASONS[R_NO_MEMORY] = b"out of memory"
_REASONS[R_RECURSIVE] = b"refers to an object whose construction is not over (recursive)"
_REASONS[R_NO_ELEMENT] = b"no such element"
_REASONS[R_NOT_DONE] = b"the scan is not complete"

# Opcodes (pickletools' names).
cdef enum:
    OP_MARK = 0x28  # (
    OP_STOP = 0x2E  # .
    OP_POP = 0x30  # 0
    OP_POP_MARK = 0x31  # 1
    OP_DUP = 0x32  # 2
    OP_FLOAT = 0x46  # F
    OP_INT = 0x49  # I
    OP_BININT = 0x4A  # J
    OP_BININT1 = 0x4B  # K
    OP_LONG = 0x4C  # L
    OP_BININT2 = 0x4D  # M
    OP_NONE = 0x4E  # N
    OP_PERSID = 0x50  # P
    OP_BINPERSID = 0x51  # Q
    OP_REDUCE = 0x52  # R
    OP_STRING = 0x53  # S
    OP_BINSTRING = 0x54  # T
    OP_SHORT_BINSTRING = 0x55  # U
    OP_UNICODE = 0x56  # V
    OP_BINUNICODE = 0x58  # X
    OP_APPEND = 0x61  # a
    OP_BUILD = 0x62  # b
    OP_GLOBAL = 0x63  # c
    OP_DICT = 0x64  # d
    OP_EMPTY_DICT = 0x7D  # }
    OP_APPENDS = 0x65  # e
    OP_GET = 0x67  # g
    OP_BINGET = 0x68  # h
    OP_INST = 0x69  # i
    OP_LONG_BINGET = 0x6A  # j
    OP_LIST = 0x6C  # l
    OP_EMPTY_LIST = 0x5D  # ]
    OP_OBJ = 0x6F  # o
    OP_PUT = 0x70  # p
    OP_BINPUT = 0x71  # q
    OP_LONG_BINPUT = 0x72  # r
    OP_SETITEM = 0x73  # s
    OP_TUPLE = 0x74  # t
    OP_EMPTY_TUPLE = 0x29  # )
    OP_SETITEMS = 0x75  # u
    OP_BINFLOAT = 0x47  # G
    OP_BINBYTES = 0x42  # B
    OP_SHORT_BINBYTES = 0x43  # C
    OP_PROTO = 0x80
    OP_NEWOBJ = 0x81
    OP_EXT1 = 0x82
    OP_EXT2 = 0x83
    OP_EXT4 = 0x84
    OP_TUPLE1 = 0x85
    OP_TUPLE2 = 0x86
    OP_TUPLE3 = 0x87
    OP_NEWTRUE = 0x88
    OP_NEWFALSE = 0x89
    OP_LONG1 = 0x8A
    OP_LONG4 = 0x8B
    OP_SHORT_BINUNICODE = 0x8C
    OP_BINUNICODE8 = 0x8D
    OP_BINBYTES8 = 0x8E
    OP_EMPTY_SET = 0x8F
    OP_ADDITEMS = 0x90
    OP_FROZENSET = 0x91
    OP_NEWOBJ_EX = 0x92
    OP_STACK_GLOBAL = 0x93
    OP_MEMOIZE = 0x94
    OP_FRAME = 0x95
    OP_BYTEARRAY8 = 0x96
    OP_NEXT_BUFFER = 0x97
    OP_READONLY_BUFFER = 0x98

# What ps_feed does with each opcode: one class per way of reading its argument and applying
# it. The classes are dense, so ps_feed dispatches through one jump table (the opcodes
# themselves span 0x28-0x98 sparsely, which compilers test one range after another).
cdef enum:
    C_UNKNOWN = 0  # every byte not listed below
    C_UNSUPPORTED  # DUP, persistent ids, the extension registry, out-of-band buffers
    C_MEMOIZE
    C_GETPUT1  # BINGET, BINPUT
    C_GETPUT4  # LONG_BINGET, LONG_BINPUT
    C_COUNT1  # a 1-byte length, then that many bytes
    C_FIXED  # a fixed-size argument (_ARG_SIZE)
    C_PUSH  # no argument: one new object
    C_EMPTY_LIST
    C_MARK
    C_FROM_MARK
    C_TUPLE_N  # TUPLE1-3
    C_MERGE2  # REDUCE, NEWOBJ, STACK_GLOBAL
    C_NEWOBJ_EX
    C_APPEND
    C_SETITEM
    C_BUILD
    C_POP
    C_COUNT4  # a 4-byte length, then that many bytes
    C_COUNT8  # an 8-byte length (FRAME: the frame's)
    C_TEXT  # newline-terminated text argument(s)
    C_PROTO
    C_STOP

cdef unsigned char _OP_CLASS[256]
cdef unsigned char _ARG_SIZE[256]


cdef void _classify(const unsigned char* ops, int n, unsigned char c) noexcept:
    cdef int k
    for k in range(n):
        _OP_CLASS[ops[k]] = c


memset(_OP_CLASS, C_UNKNOWN, sizeof(_OP_CLASS))
memset(_ARG_SIZE, 0, sizeof(_ARG_SIZE))
_classify(b"2PQ\x82\x83\x84\x97\x98", 8, C_UNSUPPORTED)
_classify(b"\x94", 1, C_MEMOIZE)
_classify(b"hq", 2, C_GETPUT1)
_classify(b"jr", 2, C_GETPUT4)
_classify(b"\x8cCU\x8a", 4, C_COUNT1)
_classify(b"KMJG", 4, C_FIXED)
_ARG_SIZE[OP_BININT1] = 1
_ARG_SIZE[OP_BININT2] = 2
_ARG_SIZE[OP_BININT] = 4
_ARG_SIZE[OP_BINFLOAT] = 8
_classify(b"N\x88\x89)}\x8f", 6, C_PUSH)
_classify(b"]", 1, C_EMPTY_LIST)
_classify(b"(", 1, C_MARK)
_classify(b"eut\x90d\x91ol1", 9, C_FROM_MARK)
_classify(b"\x85\x86\x87", 3, C_TUPLE_N)
_classify(b"R\x81\x93", 3, C_MERGE2)
_classify(b"\x92", 1, C_NEWOBJ_EX)
_classify(b"a", 1, C_APPEND)
_classify(b"s", 1, C_SETITEM)
_classify(b"b", 1, C_BUILD)
_classify(b"0", 1, C_POP)
_classify(b"XBT\x8b", 4, C_COUNT4)
_classify(b"\x8d\x8e\x96\x95", 4, C_COUNT8)
_classify(b"ILFSVpgci", 9, C_TEXT)
_classify(b"\x80", 1, C_PROTO)
_classify(b".", 1, C_STOP)

# ps_bound's lanes: four walks in step, their positions in registers. One walk is a chain of
# dependent loads (an opcode, its step, the next opcode); four independent chains overlap in
# the CPU. Each step is branch-free (a fixed size, plus a 1-byte count's 2 + count); the loop
# stops when a lane reaches its end or meets an opcode of another kind (the caller steps it).
cdef extern from *:
    """
    static void atlas_bound_lanes(const unsigned char* d, const unsigned char* fixed,
                                  const unsigned char* count1, size_t* p, const size_t* end) {
        size_t p0 = p[0], p1 = p[1], p2 = p[2], p3 = p[3];
        const size_t e0 = end[0], e1 = end[1], e2 = end[2], e3 = end[3];
        while (p0 < e0 && p1 < e1 && p2 < e2 && p3 < e3) {
            const unsigned char o0 = d[p0], o1 = d[p1], o2 = d[p2], o3 = d[p3];
            if (!((fixed[o0] | count1[o0]) && (fixed[o1] | count1[o1])
                  && (fixed[o2] | count1[o2]) && (fixed[o3] | count1[o3])))
                break;
            p0 += fixed[o0] + count1[o0] * (size_t)(2 + d[p0 + 1]);
            p1 += fixed[o1] + count1[o1] * (size_t)(2 + d[p1 + 1]);
            p2 += fixed[o2] + count1[o2] * (size_t)(2 + d[p2 + 1]);
            p3 += fixed[o3] + count1[o3] * (size_t)(2 + d[p3 + 1]);
        }
        p[0] = p0; p[1] = p1; p[2] = p2; p[3] = p3;
    }
    """
    void atlas_bound_lanes(const unsigned char* d, const unsigned char* fixed,
                           const unsigned char* count1, size_t* p, const size_t* end) nogil


# ps_bound's step over each opcode that has a fixed size and no operand it must check: 1 + its
# argument's size; _STEP_COUNT1 for a 1-byte count; 0 for the others (4- and 8-byte counts,
# text, LONG_BINPUT, STOP, unknown).
cdef enum:
    _STEP_COUNT1 = 0x80
cdef unsigned char _BOUND_STEP[256]
memset(_BOUND_STEP, 0, sizeof(_BOUND_STEP))
for _k in range(256):
    if _OP_CLASS[_k] in (C_PUSH, C_EMPTY_LIST, C_MARK, C_FROM_MARK, C_TUPLE_N, C_MERGE2,
                         C_NEWOBJ_EX, C_APPEND, C_SETITEM, C_BUILD, C_POP, C_MEMOIZE):
        _BOUND_STEP[_k] = 1
    elif _OP_CLASS[_k] == C_FIXED:
        _BOUND_STEP[_k] = 1 + _ARG_SIZE[_k]
_BOUND_STEP[OP_BINGET] = _BOUND_STEP[OP_BINPUT] = _BOUND_STEP[OP_PROTO] = 2  # BINPUT: <= 255
_BOUND_STEP[OP_LONG_BINGET] = 5
for _k in (OP_DUP, OP_BINPERSID, OP_NEXT_BUFFER, OP_READONLY_BUFFER):
    _BOUND_STEP[_k] = 1
_BOUND_STEP[OP_EXT1] = 2
_BOUND_STEP[OP_EXT2] = 3
_BOUND_STEP[OP_EXT4] = 5
for _k in range(256):
    if _OP_CLASS[_k] == C_COUNT1:
        _BOUND_STEP[_k] = _STEP_COUNT1
# The same, split for atlas_bound_lanes: a fixed size (0: not one), a 1-byte count (1: one).
cdef unsigned char _BOUND_FIXED[256]
cdef unsigned char _BOUND_COUNT1[256]
for _k in range(256):
    _BOUND_FIXED[_k] = _BOUND_STEP[_k] if _BOUND_STEP[_k] < _STEP_COUNT1 else 0
    _BOUND_COUNT1[_k] = _BOUND_STEP[_k] == _STEP_COUNT1

# ---------------------------------------------------------------------------------------------
# Growing arrays (malloc'd; every failure is reported, never fatal)

cdef inline int _grow(void** arr, uint32_t* cap, uint32_t need, size_t item) noexcept nogil:
    """Make ``*arr`` hold at least ``need`` items; 0, or -1 when out of memory."""
    if need <= cap[0]:
        return 0
    return _regrow(arr, cap, need, item)


cdef int _regrow(void** arr, uint32_t* cap, uint32_t need, size_t item) noexcept nogil:
    cdef uint64_t new_cap
    cdef void* grown
    new_cap = cap[0] * 2 if cap[0] >= 16 else 16
    if new_cap < need:
        new_cap = need
    if new_cap > PS_LIMIT:
        new_cap = PS_LIMIT
        if new_cap < need:
            return -1
    grown = realloc(arr[0], <size_t>new_cap * item)
    if grown == NULL:
        return -1
    arr[0] = grown
    cap[0] = <uint32_t>new_cap
    return 0


cdef void _shrink(void** arr, uint32_t* cap, uint32_t n, size_t item) noexcept nogil:
    """Give back what ``*arr`` holds beyond ``n`` items (kept as it is if realloc fails)."""
    cdef void* shrunk
    if n == 0 or cap[0] <= n + 16:
        return
    shrunk = realloc(arr[0], <size_t>n * item)
    if shrunk != NULL:
        arr[0] = shrunk
        cap[0] = n


cdef inline uint32_t _le32(const unsigned char* p) noexcept nogil:
    return p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline uint64_t _le64(const unsigned char* p) noexcept nogil:
    return _le32(p) | (<uint64_t>_le32(p + 4) << 32)


# ---------------------------------------------------------------------------------------------
# The scan

cdef PickleScan* ps_new() noexcept nogil:
    """A fresh scan (all zero), or NULL when out of memory."""
    cdef PickleScan* s = <PickleScan*>calloc(1, sizeof(PickleScan))
    if s != NULL:
        s.proto = -1
        s.status = PS_MORE
    return s


cdef void _free_scanning_state(PickleScan* s) noexcept nogil:
    free(s.stack)
    free(s.marks)
    free(s.open_defs)
    free(s.memo)
    s.stack = NULL
    s.marks = NULL
    s.open_defs = NULL
    s.memo = NULL
    s.cap_stack = s.cap_marks = s.cap_open = s.cap_memo = 0
    s.height = s.n_marks = s.n_open = s.fence = 0


cdef void ps_free(PickleScan* s) noexcept nogil:
    if s == NULL:
        return
    _free_scanning_state(s)
    free(s.elems)
    free(s.defs)
    free(s.uses)
    free(s.edits)
    free(s)


cdef void ps_reset(PickleScan* s) noexcept nogil:
    cdef uint32_t k
    if s.memo != NULL:
        for k in range(s.n_defs):  # the entries set, and only those
            if s.defs[k].memo < s.cap_memo:
                s.memo[s.defs[k].memo] = -1
    s.status = PS_MORE
    s.reason = 0
    s.proto = -1
    s.pos = s.need = s.frame_end = 0
    s.root_list = 0
    s.keep = 1
    s.n_elems = s.n_defs = s.n_uses = s.n_edits = 0
    s.height = s.n_marks = s.n_open = s.fence = 0


cdef size_t ps_nbytes(const PickleScan* s) noexcept nogil:
    """Bytes the scan holds (for a cache's accounting)."""
    return (sizeof(PickleScan) + s.cap_elems * sizeof(ps_span) + s.cap_defs * sizeof(ps_def)
            + s.cap_uses * sizeof(ps_use) + s.cap_edits * sizeof(ps_edit)
            + s.cap_stack * sizeof(ps_slot) + s.cap_marks * sizeof(ps_mark)
            + s.cap_open * sizeof(int32_t) + s.cap_memo * sizeof(int32_t))


cdef const char* ps_reason(int reason) noexcept nogil:
    if reason < 0 or reason > R_NOT_DONE:
        return b"?"
    return _REASONS[reason]


cdef int _fail(PickleScan* s, int reason) noexcept nogil:
    s.status = PS_FALLBACK
    s.reason = reason
    _free_scanning_state(s)
    return PS_FALLBACK


cdef int _fail_at(PickleScan* s, uint32_t p, int reason) noexcept nogil:
    """A fallback at the opcode at ``p``."""
    s.pos = p
    return _fail(s, reason)


cdef int _more(PickleScan* s, uint32_t p, uint64_t need, bint final) noexcept nogil:
    """Stop before the opcode at ``p``, which ends at ``need``: past the data given."""
    s.pos = p
    if final:
        return _fail(s, R_TRUNCATED)
    if need >= PS_LIMIT:
        return _fail(s, R_TOO_LARGE)
    s.need = <uint32_t>need
    return PS_MORE


cdef inline uint32_t _fence(const PickleScan* s) noexcept nogil:
    """The stack height below which the current mark hides the stack."""
    return s.fence


cdef inline void _pop_mark(PickleScan* s) noexcept nogil:
    s.n_marks -= 1
    s.fence = s.marks[s.n_marks - 1].height if s.n_marks else 0


cdef inline int _push(PickleScan* s, uint32_t start, uint32_t flags) noexcept nogil:
    """A new object on top of the stack; 0, or R_NO_MEMORY."""
    cdef ps_slot* slot
    if s.height == s.cap_stack and _grow(
            <void**>&s.stack, &s.cap_stack, s.height + 1, sizeof(ps_slot)) < 0:
        return R_NO_MEMORY
    slot = &s.stack[s.height]
    slot.start = start
    slot.last_end = start
    slot.flags = flags
    if s.height == 0:
        s.root_list = (flags & F_LIST) != 0
    s.height += 1
    return 0


cdef inline void _consume(PickleScan* s, uint32_t height) noexcept nogil:
    """Drop the stack slots from ``height`` up: the objects there are built."""
    cdef ps_def* d
    while s.n_open and s.defs[s.open_defs[s.n_open - 1]].slot >= <int32_t>height:
        d = &s.defs[s.open_defs[s.n_open - 1]]
        d.end = s.stack[d.slot].last_end
        s.n_open -= 1
    if height == 0:
        s.n_elems = 0
        s.root_list = 0
    s.height = height


cdef int _add_elements(PickleScan* s, uint32_t first, uint32_t last) noexcept nogil:
    """The slots first..last-1 go into the top-level list: they are its next elements."""
    cdef uint32_t k
    if _grow(<void**>&s.elems, &s.cap_elems, s.n_elems + last - first, sizeof(ps_span)) < 0:
        return -1
    for k in range(first, last):
        s.elems[s.n_elems].start = s.stack[k].start
        s.elems[s.n_elems].end = s.stack[k].last_end
        s.n_elems += 1
    return 0


cdef inline int _add_edit(PickleScan* s, uint32_t pos, uint32_t memo) noexcept nogil:
    if _grow(<void**>&s.edits, &s.cap_edits, s.n_edits + 1, sizeof(ps_edit)) < 0:
        return -1
    s.edits[s.n_edits].pos = pos
    s.edits[s.n_edits].memo = memo
    s.n_edits += 1
    return 0


cdef inline int _put(PickleScan* s, uint64_t idx, uint32_t pos) noexcept nogil:
    """The top object is stored at memo index ``idx``; returns a reason, or 0."""
    cdef uint32_t k
    cdef uint32_t old_cap
    cdef ps_def* d
    if s.height <= _fence(s):
        return R_UNDERFLOW
    if idx > <uint64_t>pos + PS_MEMO_SLACK:
        return R_MEMO_RANGE
    if idx < s.cap_memo and s.memo[idx] >= 0:
        return R_MEMO_TWICE
    if idx >= s.cap_memo:
        old_cap = s.cap_memo
        if _grow(<void**>&s.memo, &s.cap_memo, <uint32_t>idx + 1, sizeof(int32_t)) < 0:
            return R_NO_MEMORY
        for k in range(old_cap, s.cap_memo):
            s.memo[k] = -1
    if (_grow(<void**>&s.defs, &s.cap_defs, s.n_defs + 1, sizeof(ps_def)) < 0
            or _grow(<void**>&s.open_defs, &s.cap_open, s.n_open + 1, sizeof(int32_t)) < 0):
        return R_NO_MEMORY
    d = &s.defs[s.n_defs]
    d.start = s.stack[s.height - 1].start
    d.end = PS_OPEN
    d.memo = <uint32_t>idx
    d.slot = <int32_t>(s.height - 1)
    s.memo[idx] = <int32_t>s.n_defs
    s.open_defs[s.n_open] = <int32_t>s.n_defs
    s.n_open += 1
    s.n_defs += 1
    return 0


cdef inline int _get(PickleScan* s, uint64_t idx, uint32_t pos) noexcept nogil:
    """A GET of memo index ``idx`` at ``pos``; returns a reason, or 0."""
    if idx >= s.cap_memo or s.memo[idx] < 0:
        return R_MEMO_UNSET
    if _grow(<void**>&s.uses, &s.cap_uses, s.n_uses + 1, sizeof(ps_use)) < 0:
        return R_NO_MEMORY
    s.uses[s.n_uses].pos = pos
    s.uses[s.n_uses].def_ = <uint32_t>s.memo[idx]
    s.n_uses += 1
    return _push(s, pos, F_GET)


cdef int _decimal(const unsigned char* p, const unsigned char* end, uint64_t* out) noexcept nogil:
    """A text opcode's memo index: 1-10 ASCII digits, nothing else; 0 or -1."""
    cdef uint64_t v = 0
    if end <= p or end - p > 10:
        return -1
    while p < end:
        if p[0] < 48 or p[0] > 57:
            return -1
        v = v * 10 + (p[0] - 48)
        p += 1
    out[0] = v
    return 0


cdef int _from_mark(PickleScan* s, unsigned char op) noexcept nogil:
    """TUPLE, LIST, DICT, FROZENSET, INST, OBJ, POP_MARK, APPENDS, SETITEMS, ADDITEMS: the
    items above the mark become one object, go into the object below the mark, or go."""
    cdef uint32_t fence, k, start
    if s.n_marks == 0:
        return R_UNDERFLOW
    fence = s.marks[s.n_marks - 1].height
    start = s.marks[s.n_marks - 1].pos
    k = s.height - fence  # the items above the mark
    _pop_mark(s)
    if op == OP_APPENDS or op == OP_SETITEMS or op == OP_ADDITEMS:
        # The object the items go into is just below the mark, above the next one.
        if fence <= _fence(s):
            return R_UNDERFLOW
        if k and s.stack[fence - 1].flags & F_GET:
            return R_MUTATION
        if op == OP_SETITEMS and k % 2:
            return R_UNDERFLOW
        if op == OP_APPENDS and fence == 1 and s.root_list and _add_elements(s, 1, s.height) < 0:
            return R_NO_MEMORY
        _consume(s, fence)
        return 0
    if op == OP_POP_MARK:
        _consume(s, fence)
        return 0
    if (op == OP_DICT and k % 2) or (op == OP_OBJ and k == 0):
        return R_UNDERFLOW
    _consume(s, fence)
    if op == OP_LIST and fence == 0 and _add_elements(s, 0, k) < 0:
        return R_NO_MEMORY
    return _push(s, start, F_LIST if op == OP_LIST else 0)


cdef int _merge(PickleScan* s, uint32_t arity) noexcept nogil:
    """TUPLE1-3, REDUCE, NEWOBJ, NEWOBJ_EX, STACK_GLOBAL: the top ``arity`` -> one object."""
    cdef uint32_t start
    if s.height - _fence(s) < arity:
        return R_UNDERFLOW
    start = s.stack[s.height - arity].start
    _consume(s, s.height - arity)
    return _push(s, start, 0)


cdef int _into(PickleScan* s, uint32_t arity, bint append) noexcept nogil:
    """APPEND, SETITEM, BUILD: the top ``arity`` go into the object below them."""
    cdef uint32_t target
    if s.height - _fence(s) < arity + 1:
        return R_UNDERFLOW
    target = s.height - arity - 1
    if s.stack[target].flags & F_GET:
        return R_MUTATION
    if append and target == 0 and s.root_list and _add_elements(s, 1, 2) < 0:
        return R_NO_MEMORY
    _consume(s, target + 1)
    return 0


cdef int _stop(PickleScan* s, uint64_t q) noexcept nogil:
    if s.n_marks or s.height != 1 or s.frame_end > q:
        return R_STOP
    if not s.root_list:
        return R_NOT_LIST
    _consume(s, 1)
    while s.n_open:  # the list's own memo entry
        s.defs[s.open_defs[s.n_open - 1]].end = s.stack[0].last_end
        s.n_open -= 1
    s.pos = <uint32_t>q
    s.status = PS_DONE
    if s.keep:
        return 0
    _free_scanning_state(s)
    # What a cache entry keeps: no more than it holds.
    _shrink(<void**>&s.defs, &s.cap_defs, s.n_defs, sizeof(ps_def))
    _shrink(<void**>&s.uses, &s.cap_uses, s.n_uses, sizeof(ps_use))
    _shrink(<void**>&s.edits, &s.cap_edits, s.n_edits, sizeof(ps_edit))
    _shrink(<void**>&s.elems, &s.cap_elems, s.n_elems, sizeof(ps_span))
    return 0


cdef int _reserve(PickleScan* s, size_t avail) noexcept nogil:
    """First arrays sized from the block's length, to spare most regrowth. Text documents hold
    about one memo entry, one GET and one MEMOIZE per 30-60 bytes; small blocks of table rows
    one per 11 bytes, and a 4 KB block regrew its arrays about 15 times: blocks of up to
    _DENSE_BYTES get room for one per 8 bytes, the memo table and the element list too."""
    cdef uint32_t guess = <uint32_t>(avail // 48) + 16
    cdef uint32_t k
    if guess > 4096:
        guess = 4096
    if avail <= _DENSE_BYTES:
        guess = <uint32_t>(avail // 8) + 16
        if (_grow(<void**>&s.memo, &s.cap_memo, guess, sizeof(int32_t)) < 0
                or _grow(<void**>&s.elems, &s.cap_elems, 64, sizeof(ps_span)) < 0):
            return -1
        for k in range(s.cap_memo):
            s.memo[k] = -1
    if (_grow(<void**>&s.defs, &s.cap_defs, guess, sizeof(ps_def)) < 0
            or _grow(<void**>&s.uses, &s.cap_uses, guess, sizeof(ps_use)) < 0
            or _grow(<void**>&s.edits, &s.cap_edits, guess, sizeof(ps_edit)) < 0
            or _grow(<void**>&s.open_defs, &s.cap_open, 64, sizeof(int32_t)) < 0
            or _grow(<void**>&s.stack, &s.cap_stack, 64, sizeof(ps_slot)) < 0
            or _grow(<void**>&s.marks, &s.cap_marks, 16, sizeof(ps_mark)) < 0):
        return -1
    return 0


cdef int ps_feed(PickleScan* s, const unsigned char* d, size_t avail, bint final) noexcept nogil:
    """Scan on from where the last call stopped, over ``d[0:avail]`` (a prefix of the block
    when not ``final``; the same bytes as before, extended). Returns the scan's status."""
    cdef uint32_t p
    cdef uint64_t q, n, idx
    cdef unsigned char op, c
    cdef int reason
    cdef bint built  # the opcode leaves an object on top, built as far as q
    cdef const unsigned char* nl
    if s.status != PS_MORE:
        return s.status
    if avail >= PS_LIMIT:
        return _fail(s, R_TOO_LARGE)
    if s.cap_defs == 0 and _reserve(s, avail) < 0:
        return _fail(s, R_NO_MEMORY)
    p = s.pos  # kept here, not in s, while scanning: stored back wherever the scan stops
    while True:
        if p >= avail:
            return _more(s, p, <uint64_t>p + 1, final)
        op = d[p]
        q = <uint64_t>p + 1
        reason = 0
        built = True
        # One dispatch per opcode: read its argument (q: where it ends), then apply it.
        c = _OP_CLASS[op]
        if c == C_MEMOIZE:
            reason = _put(s, s.n_defs, p)
            if reason == 0 and _add_edit(s, p, s.defs[s.n_defs - 1].memo) < 0:
                reason = R_NO_MEMORY
        elif c == C_GETPUT1:
            q += 1
            if q > avail:
                return _more(s, p, q, final)
            reason = _get(s, d[p + 1], p) if op == OP_BINGET else _put(s, d[p + 1], p)
        elif c == C_GETPUT4:
            q += 4
            if q > avail:
                return _more(s, p, q, final)
            idx = _le32(d + p + 1)
            reason = _get(s, idx, p) if op == OP_LONG_BINGET else _put(s, idx, p)
        elif c == C_COUNT1:
            if q + 1 > avail:
                return _more(s, p, q + 1, final)
            q += 1 + d[p + 1]
            if q > avail:
                return _more(s, p, q, final)
            reason = _push(s, p, 0)
        elif c == C_FIXED:
            q += _ARG_SIZE[op]
            if q > avail:
                return _more(s, p, q, final)
            reason = _push(s, p, 0)
        elif c == C_PUSH:
            reason = _push(s, p, 0)
        elif c == C_EMPTY_LIST:
            reason = _push(s, p, F_LIST)
        elif c == C_MARK:
            if _grow(<void**>&s.marks, &s.cap_marks, s.n_marks + 1, sizeof(ps_mark)) < 0:
                reason = R_NO_MEMORY
            else:
                s.marks[s.n_marks].height = s.height
                s.marks[s.n_marks].pos = p
                s.n_marks += 1
                s.fence = s.height
                built = False
        elif c == C_FROM_MARK:
            reason = _from_mark(s, op)
        elif c == C_TUPLE_N:
            reason = _merge(s, op - OP_TUPLE1 + 1)
        elif c == C_MERGE2:
            reason = _merge(s, 2)
        elif c == C_NEWOBJ_EX:
            reason = _merge(s, 3)
        elif c == C_APPEND:
            reason = _into(s, 1, True)
        elif c == C_SETITEM:
            reason = _into(s, 2, False)
        elif c == C_BUILD:
            reason = _into(s, 1, False)
        elif c == C_POP:
            if s.n_marks and s.height == _fence(s):
                _pop_mark(s)
            elif s.height > _fence(s):
                _consume(s, s.height - 1)
            else:
                reason = R_UNDERFLOW
        elif c == C_COUNT4:
            if q + 4 > avail:
                return _more(s, p, q + 4, final)
            n = _le32(d + p + 1)
            if (op == OP_BINSTRING or op == OP_LONG4) and n > 0x7FFFFFFF:
                reason = R_BAD_ARGUMENT  # a negative count: the unpickler refuses it
            else:
                q += 4 + n
                if q > avail:
                    return _more(s, p, q, final)
                reason = _push(s, p, 0)
        elif c == C_COUNT8:
            if q + 8 > avail:
                return _more(s, p, q + 8, final)
            n = _le64(d + p + 1)
            if n >= PS_LIMIT:
                return _more(s, p, PS_LIMIT, final)  # past any block scanned
            q += 8
            if op == OP_FRAME:
                built = False
                if q + n >= PS_LIMIT:
                    reason = R_TOO_LARGE
                elif _add_edit(s, p, PS_FRAME_EDIT) < 0:
                    reason = R_NO_MEMORY
                elif q + n > s.frame_end:
                    s.frame_end = <uint32_t>(q + n)
            else:
                q += n
                if q > avail:
                    return _more(s, p, q, final)
                reason = _push(s, p, 0)
        elif c == C_TEXT:
            nl = <const unsigned char*>memchr(d + q, 10, avail - q)
            if nl == NULL:
                return _more(s, p, <uint64_t>avail + 1, final)
            if (op == OP_PUT or op == OP_GET) and _decimal(d + q, nl, &idx) < 0:
                return _fail_at(s, p, R_BAD_ARGUMENT)
            q = <uint64_t>(nl - d) + 1
            if op == OP_GLOBAL or op == OP_INST:
                nl = <const unsigned char*>memchr(d + q, 10, avail - q) if q < avail else NULL
                if nl == NULL:
                    return _more(s, p, <uint64_t>avail + 1, final)
                q = <uint64_t>(nl - d) + 1
            if op == OP_PUT:
                reason = _put(s, idx, p)
            elif op == OP_GET:
                reason = _get(s, idx, p)
            elif op == OP_INST:
                reason = _from_mark(s, op)
            else:
                reason = _push(s, p, 0)
        elif c == C_PROTO:
            q += 1
            if q > avail:
                return _more(s, p, q, final)
            if p != 0 or d[1] > PS_MAX_PROTOCOL:
                reason = R_PROTO
            s.proto = d[1]
            built = False
        elif c == C_STOP:
            reason = _stop(s, q)
            if reason == 0:
                return PS_DONE
        elif c == C_UNSUPPORTED:
            reason = R_UNSUPPORTED_OPCODE
        else:
            reason = R_UNKNOWN_OPCODE
        if reason:
            return _fail_at(s, p, reason)
        if q >= PS_LIMIT:
            return _fail_at(s, p, R_TOO_LARGE)
        if built and s.height > s.fence:
            s.stack[s.height - 1].last_end = <uint32_t>q
        p = <uint32_t>q


# ---------------------------------------------------------------------------------------------
# The bound check: operands the unpickler sizes an allocation by, before reading anything

cdef enum:
    _BOUND_MORE = 0  # _bound_step: on to the next opcode
    _BOUND_BAD = 1  # an operand asks for more than the data holds (``out`` filled)
    _BOUND_END = 2  # the walk ends here: STOP, the end, or the load fails here anyway


cdef size_t _bound_slow(const unsigned char* d, size_t n, uint64_t limit, size_t p,
                        ps_bound_t* out, int* verdict) noexcept nogil:
    """The opcode at ``p``: the next one's position, or ``*verdict`` set (why the walk ends)."""
    cdef uint64_t q, v
    cdef unsigned char op = d[p]
    cdef unsigned char c
    cdef unsigned char step = _BOUND_STEP[op]
    cdef const unsigned char* nl
    cdef const unsigned char* t
    if step:
        if step < _STEP_COUNT1:  # a fixed size, with no operand that sizes anything
            return p + step
        if p + 1 >= n:  # a 1-byte count: SHORT_BINUNICODE, SHORT_BINBYTES, ...
            verdict[0] = _BOUND_END
            return p
        q = <uint64_t>p + 2 + d[p + 1]
        if q > n:
            verdict[0] = _bound_at(out, op, p, d[p + 1], n - p - 2)
            return p
        return <size_t>q
    c = _OP_CLASS[op]
    q = <uint64_t>p + 1  # where the argument starts
    if op == OP_LONG_BINPUT:
        q += 4
        if q > n:
            verdict[0] = _BOUND_END
            return p
        v = _le32(d + p + 1)
        if v >= limit:
            verdict[0] = _bound_at(out, op, p, v, limit)
            return p
    elif c == C_COUNT4 or c == C_COUNT8:
        q += 4 if c == C_COUNT4 else 8
        if q > n:
            verdict[0] = _BOUND_END
            return p
        v = _le32(d + p + 1) if c == C_COUNT4 else _le64(d + p + 1)
        if (op == OP_BINSTRING or op == OP_LONG4) and v > 0x7FFFFFFF:
            verdict[0] = _BOUND_END  # negative: refused by the unpickler as it is read
            return p
        if v > n - q:
            verdict[0] = _bound_at(out, op, p, v, n - q)
            return p
        if op != OP_FRAME:
            q += v
    elif c == C_TEXT or op == OP_PERSID:
        nl = <const unsigned char*>memchr(d + q, 10, n - q) if q < n else NULL
        if nl == NULL:
            verdict[0] = _BOUND_END
            return p
        if op == OP_PUT:
            v = 0  # the digits' value (saturated), whatever else the line holds
            t = d + q
            while t < nl:
                if t[0] >= 48 and t[0] <= 57:
                    if v > (0xFFFFFFFFFFFFFFFFULL - 9) // 10:
                        v = 0xFFFFFFFFFFFFFFFFULL
                    else:
                        v = v * 10 + (t[0] - 48)
                t += 1
            if v >= limit:
                verdict[0] = _bound_at(out, op, p, v, limit)
                return p
        q = <uint64_t>(nl - d) + 1
        if op == OP_GLOBAL or op == OP_INST:
            nl = <const unsigned char*>memchr(d + q, 10, n - q) if q < n else NULL
            if nl == NULL:
                verdict[0] = _BOUND_END
                return p
            q = <uint64_t>(nl - d) + 1
    else:  # STOP, or an opcode the unpickler does not know
        verdict[0] = _BOUND_END
        return p
    return <size_t>q


cdef int _bound_walk(const unsigned char* d, size_t n, uint64_t limit, size_t* pp,
                     size_t end, ps_bound_t* out) noexcept nogil:
    """Walk from ``*pp`` until the walk ends (its verdict) or reaches ``end`` (_BOUND_MORE, and
    ``*pp`` the first opcode at or past ``end``)."""
    cdef size_t p = pp[0]
    cdef size_t q
    cdef unsigned char step
    cdef int verdict = _BOUND_MORE
    while p < end:
        step = _BOUND_STEP[d[p]]
        if step and step < _STEP_COUNT1:  # a fixed size, with no operand that sizes anything
            p += step
            continue
        if step and p + 1 < n:  # a 1-byte count, ending within the data
            q = p + 2 + d[p + 1]
            if q <= n:
                p = q
                continue
        p = _bound_slow(d, n, limit, p, out, &verdict)
        if verdict != _BOUND_MORE:
            return verdict
    pp[0] = p
    return _BOUND_MORE


cdef enum:
    _LANES = 4  # as atlas_bound_lanes
    _LANE_BYTES = 512  # pickles shorter than _LANES * this are walked in one lane
    _LANE_TRAIL = 32  # positions a lane records, for the walk before it to join it
    _DENSITY_OPCODES = 128  # lanes when the first of these opcodes average at most
    _DENSE_OPCODE_BYTES = 8  # this many bytes


cdef int ps_bound(const unsigned char* d, size_t n, ps_bound_t* out) noexcept nogil:
    """Walk the opcodes of the pickle ``d[0:n]`` as CPython's unpickler reads them, checking
    every operand it allocates by before it looks at the stream: a memo index (PUT, BINPUT,
    LONG_BINPUT: the memo table grows to twice the index, zero-filled) must be below
    ``n + PS_BOUND_SLACK``; a counted argument (BINBYTES, BINBYTES8, BYTEARRAY8 allocate their
    count first; the others' counts) must end within the data. 1 and ``out`` filled at the
    first operand that does not; 0 otherwise. The walk ends at STOP, at the end of the data,
    and where the unpickler fails anyway without allocating (an unknown opcode, a text argument
    without its newline, a negative count): the load says why. A scan that reached PS_DONE
    implies this check passes (its memo and count rules are stricter).

    A pickle of some kilobytes is walked in _LANES lanes: lane 0 from its start, lane k from
    byte k * n / _LANES (maybe inside an argument: a guess), each to the start of the next
    lane's share. Opcode streams fall into step: once the walk known to be true reaches a
    position lane k recorded among its first ones, lane k's walk from there is the true one,
    and its verdict stands; a lane the true walk does not join is walked again."""
    cdef uint64_t limit = <uint64_t>n + PS_BOUND_SLACK
    cdef size_t pos[_LANES]
    cdef size_t ends[_LANES]
    cdef size_t fast_ends[_LANES]
    cdef size_t trail[_LANES][_LANE_TRAIL]
    cdef uint32_t n_trail[_LANES]
    cdef int verdicts[_LANES]
    cdef ps_bound_t found[_LANES]
    cdef size_t p = 0
    cdef uint32_t j
    cdef int k, r, _t
    cdef unsigned char op
    if n >= _LANES * _LANE_BYTES:
        # Lanes pay where opcodes are dense (table rows: a few bytes each); where long
        # arguments dominate (documents, arrays) one walk is short anyway, and lanes started
        # inside arguments spend it falling into step.
        for _t in range(_DENSITY_OPCODES):
            if p >= n:
                break
            r = _BOUND_MORE
            p = _bound_slow(d, n, limit, p, out, &r)
            if r != _BOUND_MORE:
                return r == _BOUND_BAD
    if n < _LANES * _LANE_BYTES or p > _DENSITY_OPCODES * _DENSE_OPCODE_BYTES:
        return _bound_walk(d, n, limit, &p, n, out) == _BOUND_BAD
    for k in range(_LANES):
        pos[k] = p if k == 0 else n * k // _LANES
        ends[k] = n * (k + 1) // _LANES
        fast_ends[k] = ends[k] if ends[k] < n - 1 else n - 1  # d[p + 1] is readable below
        verdicts[k] = _BOUND_MORE
        n_trail[k] = 0
    # Each lane's first opcodes, recorded (lane 0's too: simpler, and it is true anyway). A
    # lane after the first whose guess ends (an unknown opcode, a count past the end: what
    # starting inside an argument meets) starts again after it, forgetting what it recorded.
    for _t in range(_LANE_TRAIL):
        for k in range(_LANES):
            if verdicts[k] == _BOUND_MORE and pos[k] < ends[k]:
                trail[k][n_trail[k]] = pos[k]
                n_trail[k] += 1
                pos[k] = _bound_slow(d, n, limit, pos[k], &found[k], &verdicts[k])
                if k and verdicts[k] != _BOUND_MORE:
                    pos[k] = trail[k][n_trail[k] - 1] + 1
                    verdicts[k] = _BOUND_MORE
                    n_trail[k] = 0
    # The lanes in step while all four take the fast steps; each then finishes alone.
    while True:
        for k in range(_LANES):
            if verdicts[k] != _BOUND_MORE or pos[k] >= fast_ends[k]:
                break
        else:
            atlas_bound_lanes(d, _BOUND_FIXED, _BOUND_COUNT1, pos, fast_ends)
            for k in range(_LANES):  # the lanes that stopped on another kind of opcode
                if pos[k] >= fast_ends[k]:
                    continue
                op = d[pos[k]]
                if not (_BOUND_FIXED[op] | _BOUND_COUNT1[op]):
                    pos[k] = _bound_slow(d, n, limit, pos[k], &found[k], &verdicts[k])
            continue
        break
    for k in range(_LANES):
        if verdicts[k] == _BOUND_MORE:
            if pos[k] > n:  # a 1-byte count ran past the data: walk the lane again, with checks
                pos[k] = trail[k][n_trail[k] - 1]
            verdicts[k] = _bound_walk(d, n, limit, &pos[k], ends[k], &found[k])
    # The true walk: lane 0's, then each lane it joins.
    if verdicts[0] != _BOUND_MORE:
        out[0] = found[0]
        return verdicts[0] == _BOUND_BAD
    p = pos[0]
    for k in range(1, _LANES):
        j = 0
        while True:
            while j < n_trail[k] and trail[k][j] < p:
                j += 1
            if j == n_trail[k]:  # past all lane k recorded: walk its share again
                r = _bound_walk(d, n, limit, &p, ends[k], out)
                if r != _BOUND_MORE:
                    return r == _BOUND_BAD
                break
            if trail[k][j] == p:  # joined: lane k's walk is the true one from here
                if verdicts[k] != _BOUND_MORE:
                    out[0] = found[k]
                    return verdicts[k] == _BOUND_BAD
                p = pos[k]
                break
            r = _BOUND_MORE
            p = _bound_slow(d, n, limit, p, out, &r)
            if r != _BOUND_MORE:
                return r == _BOUND_BAD
    return 0


cdef int _bound_at(ps_bound_t* out, unsigned char op, size_t pos, uint64_t value,
                   uint64_t limit) noexcept nogil:
    out.op = op
    out.pos = pos
    out.value = value
    out.limit = limit
    return _BOUND_BAD


def bound_check(data):
    """The first operand of the pickle ``data`` that asks the unpickler for more than the data
    can hold, as ``(opcode, position, value, limit)``, or None (see ps_bound)."""
    cdef Py_buffer buf
    cdef ps_bound_t found
    cdef int bad
    PyObject_GetBuffer(data, &buf, PyBUF_SIMPLE)
    try:
        with nogil:
            bad = ps_bound(<const unsigned char*>buf.buf, <size_t>buf.len, &found)
    finally:
        PyBuffer_Release(&buf)
    if not bad:
        return None
    return (found.op, found.pos, found.value, found.limit)


# ---------------------------------------------------------------------------------------------
# One element's synthetic pickle

cdef uint32_t _first_at(const void* items, uint32_t n, size_t size, uint32_t pos) noexcept nogil:
    """The first of ``n`` items (``size`` bytes each, in position order, their first field
    their position: ps_use, ps_edit) at or after ``pos``."""
    cdef uint32_t lo = 0
    cdef uint32_t hi = n
    cdef uint32_t mid
    while lo < hi:
        mid = lo + (hi - lo) // 2
        if (<const uint32_t*>(<const char*>items + <size_t>mid * size))[0] < pos:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef inline uint32_t _first_use(const PickleScan* s, uint32_t pos) noexcept nogil:
    return _first_at(s.uses, s.n_uses, sizeof(ps_use), pos)


cdef inline uint32_t _first_edit(const PickleScan* s, uint32_t pos) noexcept nogil:
    return _first_at(s.edits, s.n_edits, sizeof(ps_edit), pos)


cdef int _plan_add(ps_plan_t* plan, uint32_t start, uint32_t end) noexcept nogil:
    """One more span in ``plan`` (its small inline array first, then the heap); 0 or -1."""
    cdef ps_span* grown
    cdef uint32_t cap
    if plan.n == plan.cap:
        cap = plan.cap * 2
        if plan.spans == plan.small:
            grown = <ps_span*>malloc(cap * sizeof(ps_span))
            if grown != NULL:
                memcpy(grown, plan.small, plan.n * sizeof(ps_span))
        else:
            grown = <ps_span*>realloc(plan.spans, cap * sizeof(ps_span))
        if grown == NULL:
            return -1
        plan.spans = grown
        plan.cap = cap
    plan.spans[plan.n].start = start
    plan.spans[plan.n].end = end
    plan.n += 1
    return 0


cdef int _walk(const PickleScan* s, ps_plan_t* plan, unsigned char* seen, uint32_t start,
               uint32_t end) noexcept nogil:
    """Add the memo entries that ``start:end`` reads from before ``start``; a reason or 0."""
    cdef uint32_t j = _first_use(s, start)
    cdef const ps_def* d
    cdef uint32_t di
    while j < s.n_uses and s.uses[j].pos < end:
        di = s.uses[j].def_
        d = &s.defs[di]
        if d.start < start:  # built outside the span: before it
            if d.end > s.uses[j].pos:
                return R_RECURSIVE
            if not (seen[di >> 3] & (1 << (di & 7))):
                seen[di >> 3] |= 1 << (di & 7)
                if _plan_add(plan, d.start, d.end) < 0:
                    return R_NO_MEMORY
        j += 1
    return 0


cdef int _by_start(const void* a, const void* b) noexcept nogil:
    """Spans in block order; of two starting together, the longer (the enclosing) first."""
    cdef const ps_span* x = <const ps_span*>a
    cdef const ps_span* y = <const ps_span*>b
    if x.start != y.start:
        return -1 if x.start < y.start else 1
    return (x.end < y.end) - (x.end > y.end)


cdef Py_ssize_t _span_size(const PickleScan* s, uint32_t start, uint32_t end) noexcept nogil:
    """Bytes ``start:end`` takes once its MEMOIZEs are rewritten and its FRAMEs dropped."""
    cdef Py_ssize_t size = end - start
    cdef uint32_t j = _first_edit(s, start)
    while j < s.n_edits and s.edits[j].pos < end:
        if s.edits[j].memo == PS_FRAME_EDIT:
            size -= 9
        else:
            size += 1 if s.edits[j].memo < 256 else 4
        j += 1
    return size


cdef int ps_plan(const PickleScan* s, uint32_t i, ps_plan_t* plan) noexcept nogil:
    """What element ``i``'s synthetic pickle holds; 0, or a reason to unpickle the block.
    A plan made (reason 0 or not) is released with ps_plan_release."""
    cdef unsigned char small_seen[512]
    cdef unsigned char* seen = small_seen  # one bit per memo entry: already in the plan
    cdef size_t seen_size = (s.n_defs >> 3) + 1
    cdef uint32_t k, kept, n_defs
    cdef int reason = 0
    cdef ps_span elem
    plan.spans = plan.small
    plan.cap = sizeof(plan.small) // sizeof(ps_span)
    plan.n = 0
    plan.size = 0
    if s.status != PS_DONE:
        return R_NOT_DONE
    if i >= s.n_elems:
        return R_NO_ELEMENT
    elem = s.elems[i]
    if seen_size > sizeof(small_seen):
        seen = <unsigned char*>calloc(seen_size, 1)
        if seen == NULL:
            return R_NO_MEMORY
    else:
        memset(seen, 0, seen_size)
    reason = _walk(s, plan, seen, elem.start, elem.end)
    k = 0
    while reason == 0 and k < plan.n:  # the plan grows as it is walked: the closure
        reason = _walk(s, plan, seen, plan.spans[k].start, plan.spans[k].end)
        k += 1
    if seen != small_seen:
        free(seen)
    if reason == 0 and _plan_add(plan, elem.start, elem.end) < 0:
        reason = R_NO_MEMORY
    if reason:
        return reason
    # In block order; an entry built inside another one is re-created with it.
    n_defs = plan.n - 1
    if n_defs > 1:
        qsort(plan.spans, n_defs, sizeof(ps_span), _by_start)
    kept = 0
    for k in range(n_defs):
        if kept and plan.spans[k].start < plan.spans[kept - 1].end:
            continue
        plan.spans[kept] = plan.spans[k]
        kept += 1
    plan.spans[kept] = elem
    plan.n = kept + 1
    plan.size = (2 if s.proto >= 2 else 0) + kept + 1  # PROTO, a POP after each entry, STOP
    for k in range(plan.n):
        plan.size += _span_size(s, plan.spans[k].start, plan.spans[k].end)
    return 0


cdef void ps_plan_release(ps_plan_t* plan) noexcept nogil:
    if plan.spans != plan.small:
        free(plan.spans)
    plan.spans = plan.small
    plan.n = 0


cdef unsigned char* _copy_span(const PickleScan* s, const unsigned char* data, uint32_t start,
                               uint32_t end, unsigned char* out) noexcept nogil:
    cdef uint32_t j = _first_edit(s, start)
    cdef uint32_t at = start
    cdef uint32_t memo
    while j < s.n_edits and s.edits[j].pos < end:
        memcpy(out, data + at, s.edits[j].pos - at)
        out += s.edits[j].pos - at
        memo = s.edits[j].memo
        if memo == PS_FRAME_EDIT:
            at = s.edits[j].pos + 9
        else:
            at = s.edits[j].pos + 1
            if memo < 256:
                out[0] = OP_BINPUT
                out[1] = <unsigned char>memo
                out += 2
            else:
                out[0] = OP_LONG_BINPUT
                out[1] = memo & 0xFF
                out[2] = (memo >> 8) & 0xFF
                out[3] = (memo >> 16) & 0xFF
                out[4] = (memo >> 24) & 0xFF
                out += 5
        j += 1
    memcpy(out, data + at, end - at)
    return out + (end - at)


cdef void ps_plan_write(const PickleScan* s, const unsigned char* data, const ps_plan_t* plan,
                        unsigned char* out) noexcept nogil:
    """Write the synthetic pickle (``plan.size`` bytes) into ``out``."""
    cdef uint32_t k
    if s.proto >= 2:
        out[0] = OP_PROTO
        out[1] = <unsigned char>s.proto
        out += 2
    for k in range(plan.n):
        out = _copy_span(s, data, plan.spans[k].start, plan.spans[k].end, out)
        out[0] = OP_POP if k + 1 < plan.n else OP_STOP
        out += 1


cdef object ps_synthetic(const PickleScan* s, const unsigned char* data, uint32_t i):
    """Element ``i``'s synthetic pickle as bytes, or its fallback reason as an int."""
    cdef ps_plan_t plan
    cdef int reason
    cdef bytes out
    cdef unsigned char* dst
    with nogil:
        reason = ps_plan(s, i, &plan)
    if reason:
        ps_plan_release(&plan)
        return reason
    try:
        out = PyBytes_FromStringAndSize(NULL, plan.size)
        dst = <unsigned char*>PyBytes_AS_STRING(out)
        with nogil:
            ps_plan_write(s, data, &plan, dst)
    finally:
        ps_plan_release(&plan)
    return out


# ---------------------------------------------------------------------------------------------
# Python-visible wrapper (tests, the pure-Python twin's parity checks, tools)

_STATUS = {PS_MORE: "more", PS_DONE: "done", PS_FALLBACK: "fallback"}


@cython.auto_pickle(False)
@cython.final
cdef class PickleScanner:
    """The scan of one block, fed its bytes (``feed``), then asked for single elements.

    ``feed(data, final)`` scans ``data`` (the whole block, or with ``final=False`` a prefix of
    it, each call's data extending the last one's) and returns ``"done"``, ``"more"`` or
    ``"fallback"``. ``synthetic(i)`` is element ``i``'s synthetic pickle, or None when the
    element must come from the whole block (``element_reason(i)`` says why). ``reset()``
    readies the scanner for another block, keeping its arrays (as the reader's scratch scan).
    """

    def __cinit__(self):
        self.s = ps_new()
        if self.s == NULL:
            raise MemoryError()

    def __dealloc__(self):
        ps_free(self.s)

    def feed(self, data, bint final=True):
        """Scan ``data`` on from where the last call stopped; the status."""
        cdef Py_buffer buf
        cdef int status
        PyObject_GetBuffer(data, &buf, PyBUF_SIMPLE)
        try:
            if <size_t>buf.len < self.s.pos:
                raise ValueError("feed() needs the block's bytes from its start")
            # With the GIL held: another thread's feed() or synthetic() on this object must
            # not see the scan while it changes (once done, it changes only by reset()).
            self._check_not_reading()
            status = ps_feed(self.s, <const unsigned char*>buf.buf, <size_t>buf.len, final)
        finally:
            PyBuffer_Release(&buf)
        self.data = data
        return _STATUS[status]

    def reset(self):
        """Forget the scan: ready for another block's bytes."""
        self._check_not_reading()
        ps_reset(self.s)
        self.data = None

    cdef int _check_not_reading(self) except -1:
        if self._reading:
            raise RuntimeError("the scan is being read by another thread: it cannot change now")
        return 0

    @property
    def status(self):
        return _STATUS[self.s.status]

    @property
    def reason(self):
        """Why the scan fell back, or None."""
        if self.s.status != PS_FALLBACK:
            return None
        return ps_reason(self.s.reason).decode()

    @property
    def need(self):
        """With status "more": how many bytes of the block the scan needs to go on."""
        return self.s.need if self.s.status == PS_MORE else None

    @property
    def protocol(self):
        return None if self.s.proto < 0 else self.s.proto

    @property
    def nbytes(self):
        return ps_nbytes(self.s)

    def __len__(self):
        return self.s.n_elems if self.s.status == PS_DONE else 0

    @property
    def elements(self):
        """Each element's byte span ``(start, end)``."""
        return [(self.s.elems[k].start, self.s.elems[k].end) for k in range(len(self))]

    @property
    def memo_entries(self):
        """``(memo index, start, end)`` of each memo entry, in the order they were stored."""
        if self.s.status != PS_DONE:
            return []
        return [(self.s.defs[k].memo, self.s.defs[k].start, self.s.defs[k].end)
                for k in range(self.s.n_defs)]

    @property
    def gets(self):
        """``(position, memo index)`` of each GET."""
        if self.s.status != PS_DONE:
            return []
        return [(self.s.uses[k].pos, self.s.defs[self.s.uses[k].def_].memo)
                for k in range(self.s.n_uses)]

    def element_memo(self, Py_ssize_t i):
        """Element ``i``'s memo indices: (those it stores, those it reads from before it)."""
        start, end = self.elements[i]
        defines = sorted(m for m, a, _ in self.memo_entries if start <= a < end)
        uses = sorted({m for pos, m in self.gets if start <= pos < end}
                      - {m for m, a, _ in self.memo_entries if start <= a < end})
        return defines, uses

    cdef object _synthetic(self, Py_ssize_t i):
        cdef Py_buffer buf
        if i < 0 or i >= PS_LIMIT:
            return R_NO_ELEMENT
        if self.s.status != PS_DONE:
            return self.s.reason if self.s.status == PS_FALLBACK else R_NOT_DONE
        PyObject_GetBuffer(self.data, &buf, PyBUF_SIMPLE)
        self._reading += 1  # ps_synthetic releases the GIL: feed() and reset() must wait
        try:
            return ps_synthetic(self.s, <const unsigned char*>buf.buf, <uint32_t>i)
        finally:
            self._reading -= 1
            PyBuffer_Release(&buf)

    def synthetic(self, Py_ssize_t i):
        """Element ``i``'s synthetic pickle (bytes), or None: unpickle the whole block."""
        out = self._synthetic(i)
        return out if isinstance(out, bytes) else None

    def element_reason(self, Py_ssize_t i):
        """Why element ``i`` must come from the whole block, or None."""
        out = self._synthetic(i)
        return None if isinstance(out, bytes) else ps_reason(out).decode()

    def load(self, Py_ssize_t i, loads=pickle.loads):
        """Element ``i`` through ``loads``: from its synthetic pickle, else the whole block."""
        out = self._synthetic(i)
        if isinstance(out, bytes):
            return loads(out)
        return loads(self.data)[i]


def scan(data):
    """A ``PickleScanner`` fed the whole block ``data``."""
    scanner = PickleScanner()
    scanner.feed(data, True)
    return scanner
