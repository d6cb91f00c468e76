# Included by _reader.pyx (one extension module): token sequences out of blocks, in C.
# Directives are set once, in setup.py.
#
# The twin is atlas_fast/_core/_tokens_py.py (its module doc says what the three functions
# do). Here a block's pickle is not unpickled: a small simulation of the unpickler over the
# opcodes that pickle.dumps of token documents makes (numpy arrays of any protocol from 2 on,
# lists of ints, dicts holding one of those) finds, for each document, where its tokens are:
# the raw buffer of a numpy array inside the pickle, or its ints decoded into an arena. No
# Python object is made. Anything else in a block (an opcode outside that set, a global other
# than numpy's array and dtype builders, a document that is not a 1-D integer sequence)
# sends the whole block to the twin, which unpickles it and says what is wrong.
#
# The tokens are then copied, converted to the output dtype, straight into the rows.
# Scanning and copying run with the GIL released; the blocks' bytes are held by the caller.

from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport calloc
from libc.string cimport memchr, memcmp, memmove, memset

import numpy as np

from ._tokens_py import block_tokens as _twin_block_tokens
from ._tokens_py import index_mismatch as _index_mismatch

cdef extern from *:
    """
    #include <string.h>
    #include <stdint.h>
    /* An element type: bits 0-1 its size (1, 2, 4, 8 bytes), bit 2 signed, bit 3 byte-swapped. */
    #define TK_SIGNED 4
    #define TK_SWAP 8
    static inline int64_t tk_load(const unsigned char* p, int code) {
        unsigned char b[8];
        int size = 1 << (code & 3);
        if (code & TK_SWAP) {
            for (int k = 0; k < size; k++) b[k] = p[size - 1 - k];
            p = b;
        }
        switch (code & 7) {
            case 0: return p[0];
            case 4: return (int8_t)p[0];
            case 1: { uint16_t v; memcpy(&v, p, 2); return v; }
            case 5: { int16_t v; memcpy(&v, p, 2); return v; }
            case 2: { uint32_t v; memcpy(&v, p, 4); return v; }
            case 6: { int32_t v; memcpy(&v, p, 4); return v; }
            case 3: { uint64_t v; memcpy(&v, p, 8); return (int64_t)v; }
            default: { int64_t v; memcpy(&v, p, 8); return v; }
        }
    }
    #define TK_COPY(ST, DT) { \
        const unsigned char* restrict s_ = src; DT* restrict d_ = (DT*)dst; \
        for (Py_ssize_t i_ = 0; i_ < n; i_++) { \
            ST v_; memcpy(&v_, s_ + i_ * sizeof(ST), sizeof(ST)); d_[i_] = (DT)v_; } \
        return; }
    #define TK_FROM(DT) switch (sc) { \
        case 0: TK_COPY(uint8_t, DT) case 4: TK_COPY(int8_t, DT) \
        case 1: TK_COPY(uint16_t, DT) case 5: TK_COPY(int16_t, DT) \
        case 2: TK_COPY(uint32_t, DT) case 6: TK_COPY(int32_t, DT) \
        case 3: TK_COPY(uint64_t, DT) default: TK_COPY(int64_t, DT) }
    /* n elements of type sc at src into dst (type dc, never swapped), converted as C casts. */
    static void tk_convert(const unsigned char* src, int sc, void* dst, int dc, Py_ssize_t n) {
        if (sc & TK_SWAP) {
            int size = 1 << (sc & 3);
            for (Py_ssize_t i = 0; i < n; i++) {
                int64_t v = tk_load(src + i * size, sc);
                switch (dc & 7) {
                    case 0: ((uint8_t*)dst)[i] = (uint8_t)v; break;
                    case 4: ((int8_t*)dst)[i] = (int8_t)v; break;
                    case 1: ((uint16_t*)dst)[i] = (uint16_t)v; break;
                    case 5: ((int16_t*)dst)[i] = (int16_t)v; break;
                    case 2: ((uint32_t*)dst)[i] = (uint32_t)v; break;
                    case 6: ((int32_t*)dst)[i] = (int32_t)v; break;
                    case 3: ((uint64_t*)dst)[i] = (uint64_t)v; break;
                    default: ((int64_t*)dst)[i] = v; break;
                }
            }
            return;
        }
        switch (dc & 7) {
            case 0: TK_FROM(uint8_t) case 4: TK_FROM(int8_t)
            case 1: TK_FROM(uint16_t) case 5: TK_FROM(int16_t)
            case 2: TK_FROM(uint32_t) case 6: TK_FROM(int32_t)
            case 3: TK_FROM(uint64_t) default: TK_FROM(int64_t)
        }
    }
    #define TK_MINMAX(T) { const unsigned char* restrict s_ = p; \
        T v_; memcpy(&v_, s_, sizeof(T)); int64_t lo_ = (int64_t)v_, hi_ = lo_; \
        for (Py_ssize_t i_ = 1; i_ < n; i_++) { memcpy(&v_, s_ + i_ * sizeof(T), sizeof(T)); \
            int64_t x_ = (int64_t)v_; lo_ = x_ < lo_ ? x_ : lo_; hi_ = x_ > hi_ ? x_ : hi_; } \
        *low = lo_; *high = hi_; return; }
    /* The smallest and largest of n >= 1 elements of type code at p (uint64: as int64). */
    static void tk_minmax(const unsigned char* p, int code, Py_ssize_t n, int64_t* low,
                          int64_t* high) {
        if (code & TK_SWAP) {
            int64_t lo = tk_load(p, code), hi = lo;
            int size = 1 << (code & 3);
            for (Py_ssize_t i = 1; i < n; i++) {
                int64_t v = tk_load(p + i * size, code);
                lo = v < lo ? v : lo; hi = v > hi ? v : hi;
            }
            *low = lo; *high = hi; return;
        }
        switch (code & 7) {
            case 0: TK_MINMAX(uint8_t) case 4: TK_MINMAX(int8_t)
            case 1: TK_MINMAX(uint16_t) case 5: TK_MINMAX(int16_t)
            case 2: TK_MINMAX(uint32_t) case 6: TK_MINMAX(int32_t)
            case 3: TK_MINMAX(uint64_t) default: TK_MINMAX(int64_t)
        }
    }
    /* start, start + 1, ... into dst (type dc). */
    static void tk_iota(void* dst, int dc, int64_t start, Py_ssize_t n) {
        Py_ssize_t i;
        if ((dc & 7) == 6) { for (i = 0; i < n; i++) ((int32_t*)dst)[i] = (int32_t)(start + i); }
        else { for (i = 0; i < n; i++) ((int64_t*)dst)[i] = start + i; }
    }
    static void tk_store(void* dst, int dc, int64_t v) {
        switch (dc & 7) {
            case 0: *(uint8_t*)dst = (uint8_t)v; break;
            case 4: *(int8_t*)dst = (int8_t)v; break;
            case 1: *(uint16_t*)dst = (uint16_t)v; break;
            case 5: *(int16_t*)dst = (int16_t)v; break;
            case 2: *(uint32_t*)dst = (uint32_t)v; break;
            case 6: *(int32_t*)dst = (int32_t)v; break;
            case 3: *(uint64_t*)dst = (uint64_t)v; break;
            default: *(int64_t*)dst = v; break;
        }
    }
    """
    int64_t tk_load(const unsigned char* p, int code) noexcept nogil
    void tk_convert(const unsigned char* src, int sc, void* dst, int dc,
                    Py_ssize_t n) noexcept nogil
    void tk_iota(void* dst, int dc, int64_t start, Py_ssize_t n) noexcept nogil
    void tk_store(void* dst, int dc, int64_t v) noexcept nogil
    void tk_minmax(const unsigned char* p, int code, Py_ssize_t n, int64_t* low,
                   int64_t* high) noexcept nogil
    const int TK_SIGNED
    const int TK_SWAP

# Values on the simulated stack. Lists, dicts, arrays and dtypes are objects (tk_obj, by
# index), since the pickle changes them after they were memoized (APPENDS, SETITEMS, BUILD).
cdef enum:
    V_OTHER = 0  # anything not followed: a document holding it is not tokens
    V_NONE
    V_BOOL
    V_INT
    V_STR
    V_BYTES
    V_TUPLE  # i: first item in the value arena, n: items
    V_GLOBAL  # i: which (G_*)
    V_OBJ  # i: the object

cdef enum:
    G_OTHER = 0
    G_RECONSTRUCT  # numpy's _reconstruct (an ndarray made empty, then BUILD)
    G_NDARRAY
    G_DTYPE
    G_FROMBUFFER  # numpy's _frombuffer (protocol 5)

cdef enum:
    O_LIST = 1
    O_DICT
    O_ARRAY  # an ndarray: made by _reconstruct, complete once built with a 1-D integer state
    O_DTYPE

cdef enum:
    OF_TOP = 1  # the block's own list
    OF_MIXED = 2  # a list holding something else than ints
    OF_DONE = 4  # an array whose data is set (p, n, code)
    OF_BAD = 8  # an array or dtype that is not a 1-D integer one

cdef struct tk_val:
    int kind
    int64_t i
    int64_t n
    const unsigned char* p

cdef struct tk_obj:
    int kind
    int flags
    int code  # element type of an array or dtype (-1: not an integer type)
    char order  # a dtype's byte order
    int64_t start  # a list's first int in the int arena; a dict's field value in the value arena
    int64_t n  # a list's ints; an array's elements
    const unsigned char* p  # an array's data

cdef struct tk_doc:
    const unsigned char* p
    int64_t n
    int code

cdef struct tk_scan:
    tk_val* stack
    Py_ssize_t height
    Py_ssize_t cap_stack
    Py_ssize_t* marks
    Py_ssize_t n_marks
    Py_ssize_t cap_marks
    tk_val* memo
    Py_ssize_t cap_memo
    Py_ssize_t n_memoized  # MEMOIZE's next index
    tk_val* vals  # tuple items and dict field values
    Py_ssize_t n_vals
    Py_ssize_t cap_vals
    tk_obj* objs
    Py_ssize_t n_objs
    Py_ssize_t cap_objs
    int64_t* ints
    Py_ssize_t n_ints
    Py_ssize_t cap_ints
    tk_val* elems  # what the block's list holds
    Py_ssize_t n_elems
    Py_ssize_t cap_elems
    int top  # the block's list (an object), or -1
    const char* field
    Py_ssize_t field_len


cdef int _tk_grow(void** arr, Py_ssize_t* cap, Py_ssize_t need, size_t item) noexcept nogil:
    cdef Py_ssize_t new_cap
    cdef void* grown
    if need <= cap[0]:
        return 0
    new_cap = cap[0] * 2 if cap[0] >= 16 else 16
    if new_cap < need:
        new_cap = need
    grown = realloc(arr[0], <size_t>new_cap * item)
    if grown == NULL:
        return -1
    arr[0] = grown
    cap[0] = new_cap
    return 0


cdef void _tk_free(tk_scan* s) noexcept nogil:
    free(s.stack)
    free(s.marks)
    free(s.memo)
    free(s.vals)
    free(s.objs)
    free(s.ints)
    free(s.elems)


cdef int _tk_push(tk_scan* s, int kind, int64_t i, int64_t n,
                  const unsigned char* p) noexcept nogil:
    if _tk_grow(<void**>&s.stack, &s.cap_stack, s.height + 1, sizeof(tk_val)) < 0:
        return -1
    s.stack[s.height].kind = kind
    s.stack[s.height].i = i
    s.stack[s.height].n = n
    s.stack[s.height].p = p
    s.height += 1
    return 0


cdef int _tk_new_obj(tk_scan* s, int kind) noexcept nogil:
    """A new object (an index), or -1."""
    if _tk_grow(<void**>&s.objs, &s.cap_objs, s.n_objs + 1, sizeof(tk_obj)) < 0:
        return -1
    memset(&s.objs[s.n_objs], 0, sizeof(tk_obj))
    s.objs[s.n_objs].kind = kind
    s.objs[s.n_objs].code = -1
    s.objs[s.n_objs].start = -1
    s.n_objs += 1
    return <int>(s.n_objs - 1)


cdef inline Py_ssize_t _tk_fence(tk_scan* s) noexcept nogil:
    return s.marks[s.n_marks - 1] if s.n_marks else 0


cdef int _tk_memo_put(tk_scan* s, uint64_t idx, size_t pos) noexcept nogil:
    cdef Py_ssize_t k, old
    if s.height <= _tk_fence(s) or idx > pos + 256:
        return -1
    if <Py_ssize_t>idx >= s.cap_memo:
        old = s.cap_memo
        if _tk_grow(<void**>&s.memo, &s.cap_memo, <Py_ssize_t>idx + 1, sizeof(tk_val)) < 0:
            return -1
        for k in range(old, s.cap_memo):
            s.memo[k].kind = -1
    s.memo[idx] = s.stack[s.height - 1]
    return 0


cdef int _tk_memo_get(tk_scan* s, uint64_t idx) noexcept nogil:
    cdef tk_val v
    if <Py_ssize_t>idx >= s.cap_memo or s.memo[idx].kind < 0:
        return -1
    v = s.memo[idx]
    return _tk_push(s, v.kind, v.i, v.n, v.p)


cdef int _tk_global(const unsigned char* mod, Py_ssize_t mlen, const unsigned char* name,
                    Py_ssize_t nlen) noexcept nogil:
    """Which global ``mod.name`` is (G_*)."""
    cdef bint core = ((mlen == 21 and memcmp(mod, b"numpy.core.multiarray", 21) == 0)
                      or (mlen == 22 and memcmp(mod, b"numpy._core.multiarray", 22) == 0))
    cdef bint numeric = ((mlen == 18 and memcmp(mod, b"numpy.core.numeric", 18) == 0)
                         or (mlen == 19 and memcmp(mod, b"numpy._core.numeric", 19) == 0))
    if core and nlen == 12 and memcmp(name, b"_reconstruct", 12) == 0:
        return G_RECONSTRUCT
    if numeric and nlen == 11 and memcmp(name, b"_frombuffer", 11) == 0:
        return G_FROMBUFFER
    if mlen == 5 and memcmp(mod, b"numpy", 5) == 0:
        if nlen == 7 and memcmp(name, b"ndarray", 7) == 0:
            return G_NDARRAY
        if nlen == 5 and memcmp(name, b"dtype", 5) == 0:
            return G_DTYPE
    return G_OTHER


cdef int _tk_dtype_code(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    """The element type of numpy's dtype string ``p[:n]`` ('u2', 'i8'...), or -1."""
    cdef int code
    if n != 2 or (p[0] != 105 and p[0] != 117):  # 'i', 'u'
        return -1
    if p[1] == 49:
        code = 0
    elif p[1] == 50:
        code = 1
    elif p[1] == 52:
        code = 2
    elif p[1] == 56:
        code = 3
    else:
        return -1
    return code | (TK_SIGNED if p[0] == 105 else 0)


cdef int _tk_reduce(tk_scan* s) noexcept nogil:
    """REDUCE: the callable and its argument tuple on top become the object they make."""
    cdef tk_val fn = s.stack[s.height - 2]
    cdef tk_val args = s.stack[s.height - 1]
    cdef tk_val* a
    cdef tk_obj* o
    cdef tk_obj* dt
    cdef int k
    s.height -= 2
    if fn.kind != V_GLOBAL or args.kind != V_TUPLE:
        return _tk_push(s, V_OTHER, 0, 0, NULL)
    a = s.vals + args.i
    if fn.i == G_RECONSTRUCT and args.n == 3 and a[0].kind == V_GLOBAL and a[0].i == G_NDARRAY:
        k = _tk_new_obj(s, O_ARRAY)
        return -1 if k < 0 else _tk_push(s, V_OBJ, k, 0, NULL)
    if fn.i == G_DTYPE and args.n == 3 and a[0].kind == V_STR:
        k = _tk_new_obj(s, O_DTYPE)
        if k < 0:
            return -1
        s.objs[k].code = _tk_dtype_code(a[0].p, a[0].n)
        s.objs[k].order = 124  # '|' until its state says
        return _tk_push(s, V_OBJ, k, 0, NULL)
    if fn.i == G_FROMBUFFER and args.n == 4:
        # (buffer, dtype, shape, order)
        k = _tk_new_obj(s, O_ARRAY)
        if k < 0:
            return -1
        o = &s.objs[k]
        o.flags = OF_BAD
        if (a[0].kind == V_BYTES and a[1].kind == V_OBJ and s.objs[a[1].i].kind == O_DTYPE
                and a[2].kind == V_TUPLE and a[2].n == 1 and s.vals[a[2].i].kind == V_INT):
            dt = &s.objs[a[1].i]
            o.n = s.vals[a[2].i].i
            if dt.code >= 0 and 0 <= o.n <= a[0].n and o.n << (dt.code & 3) == a[0].n:
                o.code = dt.code | (TK_SWAP if dt.order == 62 else 0)  # '>'
                o.p = a[0].p
                o.flags = OF_DONE
        return _tk_push(s, V_OBJ, k, 0, NULL)
    return _tk_push(s, V_OTHER, 0, 0, NULL)


cdef int _tk_build(tk_scan* s) noexcept nogil:
    """BUILD: the state on top sets the object below it."""
    cdef tk_val state = s.stack[s.height - 1]
    cdef tk_val target = s.stack[s.height - 2]
    cdef tk_val* a
    cdef tk_obj* o
    cdef tk_obj* dt
    s.height -= 1
    if target.kind != V_OBJ:
        s.stack[s.height - 1].kind = V_OTHER
        return 0
    o = &s.objs[target.i]
    if state.kind != V_TUPLE:
        o.flags |= OF_BAD
        return 0
    a = s.vals + state.i
    if o.kind == O_DTYPE:
        if state.n >= 2 and a[1].kind == V_STR and a[1].n == 1:
            o.order = <char>a[1].p[0]
        else:
            o.code = -1
        return 0
    if o.kind != O_ARRAY or o.flags & OF_DONE:
        o.flags |= OF_BAD
        return 0
    # (version, shape, dtype, is_fortran, data)
    o.flags |= OF_BAD
    if (state.n == 5 and a[1].kind == V_TUPLE and a[1].n == 1 and s.vals[a[1].i].kind == V_INT
            and a[2].kind == V_OBJ and s.objs[a[2].i].kind == O_DTYPE and a[4].kind == V_BYTES):
        dt = &s.objs[a[2].i]
        o.n = s.vals[a[1].i].i
        if dt.code >= 0 and 0 <= o.n <= a[4].n and o.n << (dt.code & 3) == a[4].n:
            o.code = dt.code | (TK_SWAP if dt.order == 62 else 0)  # '>'
            o.p = a[4].p
            o.flags = OF_DONE
    return 0


cdef int _tk_add_items(tk_scan* s, Py_ssize_t target, Py_ssize_t first) noexcept nogil:
    """APPEND(S): the values from ``first`` up go into the list at ``target``."""
    cdef tk_val t = s.stack[target]
    cdef tk_obj* o
    cdef Py_ssize_t k, count = s.height - first
    if t.kind != V_OBJ or s.objs[t.i].kind != O_LIST:
        return -1  # appending to something else: not followed
    o = &s.objs[t.i]
    if o.flags & OF_TOP:
        if _tk_grow(<void**>&s.elems, &s.cap_elems, s.n_elems + count, sizeof(tk_val)) < 0:
            return -1
        memcpy(s.elems + s.n_elems, s.stack + first, count * sizeof(tk_val))
        s.n_elems += count
        s.height = first
        return 0
    if o.n == 0:
        o.start = s.n_ints
    elif o.start + o.n != s.n_ints:
        o.flags |= OF_MIXED  # another list's ints came in between: not followed
    if _tk_grow(<void**>&s.ints, &s.cap_ints, s.n_ints + count, sizeof(int64_t)) < 0:
        return -1
    for k in range(first, s.height):
        if s.stack[k].kind == V_INT:
            s.ints[s.n_ints] = s.stack[k].i
            s.n_ints += 1
            o.n += 1
        else:
            o.flags |= OF_MIXED
    s.height = first
    return 0


cdef int _tk_set_items(tk_scan* s, Py_ssize_t target, Py_ssize_t first) noexcept nogil:
    """SETITEM(S): the key, value pairs from ``first`` up go into the dict at ``target``."""
    cdef tk_val t = s.stack[target]
    cdef tk_val* key
    cdef tk_obj* o
    cdef Py_ssize_t k
    if t.kind != V_OBJ or s.objs[t.i].kind != O_DICT or (s.height - first) % 2:
        return -1
    o = &s.objs[t.i]
    for k in range(first, s.height, 2):
        key = &s.stack[k]
        if (s.field != NULL and key.kind == V_STR and key.n == s.field_len
                and memcmp(key.p, s.field, s.field_len) == 0):
            if _tk_grow(<void**>&s.vals, &s.cap_vals, s.n_vals + 1, sizeof(tk_val)) < 0:
                return -1
            s.vals[s.n_vals] = s.stack[k + 1]
            o.start = s.n_vals
            s.n_vals += 1
    s.height = first
    return 0


cdef int _tk_tuple(tk_scan* s, Py_ssize_t first) noexcept nogil:
    """The values from ``first`` up become one tuple."""
    cdef Py_ssize_t count = s.height - first
    if _tk_grow(<void**>&s.vals, &s.cap_vals, s.n_vals + count, sizeof(tk_val)) < 0:
        return -1
    memcpy(s.vals + s.n_vals, s.stack + first, count * sizeof(tk_val))
    s.height = first
    if _tk_push(s, V_TUPLE, s.n_vals, count, NULL) < 0:
        return -1
    s.n_vals += count
    return 0


cdef inline uint64_t _tk_le(const unsigned char* p, int n) noexcept nogil:
    cdef uint64_t v = 0
    cdef int k
    for k in range(n - 1, -1, -1):
        v = (v << 8) | p[k]
    return v


cdef int _tk_run(tk_scan* s, const unsigned char* d, size_t size) noexcept nogil:
    """Simulate the pickle ``d[:size]``; 0 once STOP is reached with the block's list alone
    on the stack, -1 for anything not followed (the caller unpickles the block)."""
    cdef size_t pos = 0
    cdef size_t q
    cdef uint64_t n, idx
    cdef unsigned char op
    cdef int k, g
    cdef Py_ssize_t fence, first
    cdef const unsigned char* nl
    cdef const unsigned char* nl2
    cdef tk_val a, b
    while pos < size:
        op = d[pos]
        q = pos + 1
        if op == 0x80:  # PROTO
            q += 1
        elif op == 0x95:  # FRAME
            q += 8
        elif op == 0x2E:  # STOP
            if s.n_marks or s.height != 1 or s.top < 0:
                return -1
            if s.stack[0].kind != V_OBJ or s.stack[0].i != s.top:
                return -1
            return 0 if q == size else -1
        elif op == 0x28:  # MARK
            if _tk_grow(<void**>&s.marks, &s.cap_marks, s.n_marks + 1, sizeof(Py_ssize_t)) < 0:
                return -1
            s.marks[s.n_marks] = s.height
            s.n_marks += 1
        elif op == 0x5D or op == 0x7D:  # EMPTY_LIST, EMPTY_DICT
            k = _tk_new_obj(s, O_LIST if op == 0x5D else O_DICT)
            if k < 0:
                return -1
            if op == 0x5D and s.height == 0 and s.top < 0 and s.n_marks == 0:
                s.objs[k].flags = OF_TOP
                s.top = k
            if _tk_push(s, V_OBJ, k, 0, NULL) < 0:
                return -1
        elif op == 0x29:  # EMPTY_TUPLE
            if _tk_push(s, V_TUPLE, s.n_vals, 0, NULL) < 0:
                return -1
        elif op == 0x4E or op == 0x88 or op == 0x89:  # NONE, NEWTRUE, NEWFALSE
            if _tk_push(s, V_NONE if op == 0x4E else V_BOOL, op == 0x88, 0, NULL) < 0:
                return -1
        elif op == 0x4B or op == 0x4D or op == 0x4A:  # BININT1, BININT2, BININT
            k = 1 if op == 0x4B else (2 if op == 0x4D else 4)
            q += k
            if q > size:
                return -1
            n = _tk_le(d + pos + 1, k)
            if k == 4:
                g = _tk_push(s, V_INT, <int32_t>(<uint32_t>n), 0, NULL)
            else:
                g = _tk_push(s, V_INT, <int64_t>n, 0, NULL)
            if g < 0:
                return -1
        elif op == 0x8A:  # LONG1
            if q >= size:
                return -1
            k = d[q]
            q += 1 + k
            if q > size:
                return -1
            if k > 8:
                g = _tk_push(s, V_OTHER, 0, 0, NULL)
            elif k == 0:
                g = _tk_push(s, V_INT, 0, 0, NULL)
            else:
                n = _tk_le(d + pos + 2, k)
                if k < 8 and d[pos + 1 + k] & 0x80:  # negative: sign-extend
                    n |= (<uint64_t>0xFFFFFFFFFFFFFFFF) << (8 * k)
                g = _tk_push(s, V_INT, <int64_t>n, 0, NULL)
            if g < 0:
                return -1
        elif (op == 0x8C or op == 0x58 or op == 0x8D or op == 0x43 or op == 0x42 or op == 0x8E
              or op == 0x96 or op == 0x55 or op == 0x54):
            # SHORT_BINUNICODE, BINUNICODE, BINUNICODE8, SHORT_BINBYTES, BINBYTES, BINBYTES8,
            # BYTEARRAY8, SHORT_BINSTRING, BINSTRING
            k = 1 if op in (0x8C, 0x43, 0x55) else (4 if op in (0x58, 0x42, 0x54) else 8)
            if q + k > size:
                return -1
            n = _tk_le(d + q, k)
            q += k
            if n > size - q:
                return -1
            g = V_STR if op in (0x8C, 0x58, 0x8D, 0x55, 0x54) else V_BYTES
            if _tk_push(s, g, 0, <int64_t>n, d + q) < 0:
                return -1
            q += n
        elif op == 0x94:  # MEMOIZE
            if _tk_memo_put(s, s.n_memoized, pos) < 0:
                return -1
            s.n_memoized += 1
        elif op == 0x71 or op == 0x72 or op == 0x68 or op == 0x6A:
            # BINPUT, LONG_BINPUT, BINGET, LONG_BINGET
            k = 1 if op == 0x71 or op == 0x68 else 4
            q += k
            if q > size:
                return -1
            idx = _tk_le(d + pos + 1, k)
            if op == 0x71 or op == 0x72:
                if _tk_memo_put(s, idx, pos) < 0:
                    return -1
            elif _tk_memo_get(s, idx) < 0:
                return -1
        elif op == 0x63:  # GLOBAL: "module\nname\n"
            nl = <const unsigned char*>memchr(d + q, 10, size - q)
            if nl == NULL:
                return -1
            nl2 = <const unsigned char*>memchr(nl + 1, 10, size - (nl + 1 - d))
            if nl2 == NULL:
                return -1
            g = _tk_global(d + q, nl - (d + q), nl + 1, nl2 - (nl + 1))
            q = <size_t>(nl2 - d) + 1
            if _tk_push(s, V_GLOBAL, g, 0, NULL) < 0:
                return -1
        elif op == 0x93:  # STACK_GLOBAL
            if s.height - _tk_fence(s) < 2:
                return -1
            a = s.stack[s.height - 2]
            b = s.stack[s.height - 1]
            s.height -= 2
            g = G_OTHER
            if a.kind == V_STR and b.kind == V_STR:
                g = _tk_global(a.p, a.n, b.p, b.n)
            if _tk_push(s, V_GLOBAL, g, 0, NULL) < 0:
                return -1
        elif op == 0x52:  # REDUCE
            if s.height - _tk_fence(s) < 2 or _tk_reduce(s) < 0:
                return -1
        elif op == 0x62:  # BUILD
            if s.height - _tk_fence(s) < 2 or _tk_build(s) < 0:
                return -1
        elif op == 0x74 or op == 0x6C or op == 0x64:  # TUPLE, LIST, DICT (from the mark)
            if s.n_marks == 0:
                return -1
            s.n_marks -= 1
            first = s.marks[s.n_marks]
            if op == 0x74:
                if _tk_tuple(s, first) < 0:
                    return -1
            else:
                # The items go into a new list or dict pushed below them.
                k = _tk_new_obj(s, O_LIST if op == 0x6C else O_DICT)
                if k < 0 or _tk_push(s, V_OBJ, k, 0, NULL) < 0:
                    return -1
                a = s.stack[s.height - 1]
                memmove(s.stack + first + 1, s.stack + first,
                        (s.height - 1 - first) * sizeof(tk_val))
                s.stack[first] = a
                if op == 0x6C:
                    g = _tk_add_items(s, first, first + 1)
                else:
                    g = _tk_set_items(s, first, first + 1)
                if g < 0:
                    return -1
        elif op == 0x85 or op == 0x86 or op == 0x87:  # TUPLE1-3
            k = op - 0x84
            if s.height - _tk_fence(s) < k or _tk_tuple(s, s.height - k) < 0:
                return -1
        elif op == 0x61:  # APPEND
            if s.height - _tk_fence(s) < 2 or _tk_add_items(s, s.height - 2, s.height - 1) < 0:
                return -1
        elif op == 0x73:  # SETITEM
            if s.height - _tk_fence(s) < 3 or _tk_set_items(s, s.height - 3, s.height - 2) < 0:
                return -1
        elif op == 0x65 or op == 0x75:  # APPENDS, SETITEMS
            if s.n_marks == 0:
                return -1
            s.n_marks -= 1
            first = s.marks[s.n_marks]
            fence = _tk_fence(s)
            if first <= fence:
                return -1
            if op == 0x65:
                g = _tk_add_items(s, first - 1, first)
            else:
                g = _tk_set_items(s, first - 1, first)
            if g < 0:
                return -1
        elif op == 0x30:  # POP
            if s.height <= _tk_fence(s):
                return -1
            s.height -= 1
        elif op == 0x31:  # POP_MARK
            if s.n_marks == 0:
                return -1
            s.n_marks -= 1
            s.height = s.marks[s.n_marks]
        else:
            return -1
        if q > size:
            return -1
        pos = q
    return -1


cdef int _tk_docs(tk_scan* s, tk_doc* docs, Py_ssize_t count) noexcept nogil:
    """Each element of the block as a document (``count`` of them); -1 if one is not a
    token sequence (or the block holds another number of elements)."""
    cdef Py_ssize_t k
    cdef tk_val v
    cdef tk_obj* o
    if s.n_elems != count:
        return -1
    for k in range(count):
        v = s.elems[k]
        if v.kind == V_OBJ and s.objs[v.i].kind == O_DICT:
            if s.field == NULL or s.objs[v.i].start < 0:
                return -1
            v = s.vals[s.objs[v.i].start]
        elif s.field != NULL:
            return -1
        if v.kind != V_OBJ:
            return -1
        o = &s.objs[v.i]
        if o.kind == O_ARRAY and o.flags == OF_DONE and (o.code & 7) != 3:
            # (uint64 ids beyond int64 are the twin's to refuse)
            docs[k].p = o.p
            docs[k].n = o.n
            docs[k].code = o.code
        elif o.kind == O_LIST and not (o.flags & (OF_MIXED | OF_TOP)):
            docs[k].p = <const unsigned char*>(s.ints + o.start) if o.n else NULL
            docs[k].n = o.n
            docs[k].code = 3 | TK_SIGNED
        else:
            return -1
    return 0


cdef int _tk_scan_block(const unsigned char* d, size_t size, const char* field,
                        Py_ssize_t field_len, tk_doc* docs, Py_ssize_t count,
                        int64_t** ints) noexcept nogil:
    """Locate the ``count`` documents of the block ``d[:size]`` into ``docs``; 0, or -1 (not
    followed: unpickle it). ``*ints`` receives the arena the documents of int lists point
    into (free it after use; NULL when none)."""
    cdef tk_scan s
    cdef int status
    memset(&s, 0, sizeof(tk_scan))
    s.top = -1
    s.field = field
    s.field_len = field_len
    status = _tk_run(&s, d, size)
    if status == 0:
        status = _tk_docs(&s, docs, count)
    ints[0] = NULL
    if status == 0:
        ints[0] = s.ints
        s.ints = NULL
    _tk_free(&s)
    return status


# ---------------------------------------------------------------------------------------------
# Blocks for a batch


cdef int _tk_code(object dtype) except -2:
    """The element type of a numpy integer dtype (native order)."""
    cdef int size = dtype.itemsize
    cdef int code = {1: 0, 2: 1, 4: 2, 8: 3}[size]
    return code | (TK_SIGNED if dtype.kind == "i" else 0)


@cython.final
@cython.auto_pickle(False)
cdef class _TokenBlock:
    """The documents of one block: where their tokens are, and what holds those bytes."""

    cdef tk_doc* docs
    cdef int64_t* starts  # each document's first token in the block, then the block's total
    cdef Py_ssize_t count
    cdef int64_t* ints
    cdef object owner  # the bytes the documents point into (a pickle, a mapping, an array)
    cdef object field  # the field they were read from

    def __dealloc__(self):
        free(self.docs)
        free(self.starts)
        free(self.ints)


# Blocks the scanner did not follow (read by the twin), for tests: a test of the compiled core
# checks that the forms token datasets take are read in C.
cdef Py_ssize_t[1] _tk_fallbacks


def _token_scan_fallbacks():
    """How many blocks the token scanner has handed to the twin in this process."""
    return _tk_fallbacks[0]


cdef _TokenBlock _tk_block(ShardCore reader, Py_ssize_t b, object field, bint cache):
    """Block ``b``'s documents located: scanned in its pickle (from the cache when it holds
    it; decoded, and with ``cache`` kept there as its pickle, otherwise), or from the twin
    when the scanner does not follow it."""
    cdef _TokenBlock out = _TokenBlock.__new__(_TokenBlock)
    cdef Py_ssize_t count = reader._block_size if b < reader._n_blocks - 1 else reader._last_length
    cdef Py_buffer buf
    cdef const char* fptr = NULL
    cdef Py_ssize_t flen = 0
    cdef Py_ssize_t k
    cdef int status = -1
    cdef _Entry e = None
    cdef bytes fbytes = None
    if field is not None:
        fbytes = field.encode()
        fptr = PyBytes_AS_STRING(fbytes)
        flen = PyBytes_GET_SIZE(fbytes)
    out.docs = <tk_doc*>calloc(max(count, 1), sizeof(tk_doc))
    out.starts = <int64_t*>malloc((count + 1) * sizeof(int64_t))
    if out.docs == NULL or out.starts == NULL:
        raise MemoryError()
    out.count = count
    out.field = field
    key = (reader._tag, b)
    data = None
    if cache:
        e = reader._cache._find(key)
        if e is not None:
            reader._cache._hit(e)
            if e.tokens is not None and (<_TokenBlock>e.tokens).field == field:
                return <_TokenBlock>e.tokens
            data = e.data  # None when it holds the examples: the twin reads them
        else:
            reader._cache._misses += 1
    if e is None:
        data = reader._take_ahead(b) if cache else None  # named by prefetch(), decoded ahead
        if data is None:
            data = reader._decoded(b, True, True)
        if cache:
            # Kept as its pickle (a second read unpickles it whole), with its documents'
            # places; an uncompressed block is a view of the mapping: charged its table.
            e = reader._cache._put_partial(
                key, b, data,
                _data_size(data) if reader._compressed else (count + 1) * 32)
    if data is not None:
        PyObject_GetBuffer(data, &buf, PyBUF_SIMPLE)
        try:
            with nogil:
                status = _tk_scan_block(<const unsigned char*>buf.buf, <size_t>buf.len, fptr, flen,
                                        out.docs, count, &out.ints)
        finally:
            PyBuffer_Release(&buf)
    if status == 0:
        out.owner = data
    else:
        _tk_fallbacks[0] += 1
        tokens, lengths = _twin_block_tokens(reader, b, field)
        if len(lengths) != count:
            raise AtlasFormatError(f"{reader._data_path}: block {b}: {len(lengths)} examples")
        out.owner = tokens
        _tk_point(out, tokens, lengths)
    out.starts[0] = 0
    for k in range(count):
        out.starts[k + 1] = out.starts[k] + out.docs[k].n
    if e is not None and e.live and e.data is data and status == 0:
        e.tokens = out
    return out


cdef int _tk_point(_TokenBlock out, object tokens, object lengths) except -1:
    """The documents of the twin's ``(tokens, lengths)`` (one array, native order)."""
    cdef const unsigned char[::1] raw = tokens.view(np.uint8) if len(tokens) else b""
    cdef int code = _tk_code(tokens.dtype)
    cdef Py_ssize_t size = tokens.dtype.itemsize
    cdef Py_ssize_t k
    cdef int64_t at = 0
    cdef const unsigned char* base = &raw[0] if raw.shape[0] else NULL
    for k in range(out.count):
        out.docs[k].p = base + at * size if base != NULL else NULL
        out.docs[k].n = lengths[k]
        out.docs[k].code = code
        at += out.docs[k].n
    return 0


cdef void _tk_piece(const tk_doc* docs, const int64_t* starts, Py_ssize_t n_docs, int64_t start,
                    int64_t count, char* targets, char* inputs, char* positions, int dc, int pc,
                    Py_ssize_t dsize, Py_ssize_t psize, int64_t start_input) noexcept nogil:
    """Tokens ``[start, start + count)`` of a block (its ``n_docs`` documents ``docs``, whose
    first tokens are ``starts``) into the outputs, from their start."""
    cdef Py_ssize_t k = 0
    cdef Py_ssize_t lo = 0
    cdef Py_ssize_t hi = n_docs
    cdef Py_ssize_t mid
    cdef int64_t a, take, size
    cdef const tk_doc* doc
    # The document holding token ``start``: the first that ends past it.
    while lo < hi:
        mid = (lo + hi) >> 1
        if starts[mid + 1] <= start:
            lo = mid + 1
        else:
            hi = mid
    k = lo
    while count > 0 and k < n_docs:
        doc = &docs[k]
        a = start - starts[k]
        take = doc.n - a
        if take > count:
            take = count
        if take > 0:
            size = 1 << (doc.code & 3)
            tk_convert(doc.p + a * size, doc.code, targets, dc, take)
            if positions != NULL:
                tk_iota(positions, pc, a, take)
            if inputs != NULL:
                if a == 0:
                    tk_store(inputs, dc, start_input)
                    tk_convert(doc.p, doc.code, inputs + dsize, dc, take - 1)
                else:
                    tk_convert(doc.p + (a - 1) * size, doc.code, inputs, dc, take)
            targets += take * dsize
            if inputs != NULL:
                inputs += take * dsize
            if positions != NULL:
                positions += take * psize
            start += take
            count -= take
        k += 1


def gather_tokens(DatasetCore dataset, shards, blocks, expected, pieces, targets, inputs,
                  positions, start_input, field, bint docs):
    """The compiled ``_tokens_py.gather_tokens`` (see there)."""
    cdef Py_ssize_t n_slots = len(shards)
    cdef const int64_t[::1] c_shards = np.ascontiguousarray(shards, dtype=np.int64)
    cdef const int64_t[::1] c_blocks = np.ascontiguousarray(blocks, dtype=np.int64)
    cdef const int64_t[::1] c_expected = np.ascontiguousarray(expected, dtype=np.int64)
    cdef const int64_t[:, ::1] c_pieces = np.ascontiguousarray(pieces, dtype=np.int64)
    cdef Py_ssize_t n_pieces = c_pieces.shape[0]
    cdef char[::1] t_view = targets.view(np.uint8)
    cdef char[::1] i_view = inputs.view(np.uint8) if inputs is not None else None
    cdef char[::1] p_view = positions.view(np.uint8) if positions is not None else None
    cdef char* t_ptr = &t_view[0] if t_view.shape[0] else NULL
    cdef char* i_ptr = &i_view[0] if i_view is not None and i_view.shape[0] else NULL
    cdef char* p_ptr = &p_view[0] if p_view is not None and p_view.shape[0] else NULL
    cdef int dc = _tk_code(targets.dtype)
    cdef int pc = _tk_code(positions.dtype) if positions is not None else 7
    cdef Py_ssize_t dsize = targets.dtype.itemsize
    cdef Py_ssize_t psize = positions.dtype.itemsize if positions is not None else 8
    cdef int64_t c_start_input = start_input
    cdef list held = [None] * n_slots  # the _TokenBlocks, alive while their tables are read
    cdef tk_doc** slot_docs = <tk_doc**>malloc(max(n_slots, 1) * sizeof(tk_doc*))
    cdef int64_t** slot_starts = <int64_t**>malloc(max(n_slots, 1) * sizeof(int64_t*))
    cdef Py_ssize_t* slot_count = <Py_ssize_t*>malloc(max(n_slots, 1) * sizeof(Py_ssize_t))
    cdef _TokenBlock blk
    cdef ShardCore reader
    cdef Py_ssize_t t, p, s
    cdef int64_t start, count, out, n
    cdef int64_t* copied_ptr = NULL
    cdef int64_t[::1] copied_view
    copied = np.zeros(n_pieces, dtype=np.int64) if docs else None
    if dataset._hints is not None:  # blocks named by prefetch(): decoded ahead from now
        dataset._queue_hints()
    try:
        if slot_docs == NULL or slot_starts == NULL or slot_count == NULL:
            raise MemoryError()
        for t in range(n_slots):
            reader = dataset._reader_c(c_shards[t])
            blk = _tk_block(reader, c_blocks[t], field, True)
            if c_expected[t] >= 0 and blk.starts[blk.count] != c_expected[t]:
                raise _index_mismatch(reader, c_blocks[t], blk.starts[blk.count], c_expected[t])
            held[t] = blk
            slot_docs[t] = blk.docs
            slot_starts[t] = blk.starts
            slot_count[t] = blk.count
        for p in range(n_pieces):
            if not 0 <= c_pieces[p, 0] < n_slots:
                raise IndexError(f"piece {p}: slot {c_pieces[p, 0]} of {n_slots}")
        if docs and n_pieces:
            copied_view = copied
            copied_ptr = &copied_view[0]
        with nogil:
            for p in range(n_pieces):
                s = c_pieces[p, 0]
                start = c_pieces[p, 1]
                count = c_pieces[p, 2]
                out = c_pieces[p, 3]
                if docs:
                    n = slot_docs[s][start].n if start < slot_count[s] else 0
                    if count > n:
                        count = n
                    copied_ptr[p] = count
                    start = slot_starts[s][start] if start < slot_count[s] else 0
                _tk_piece(slot_docs[s], slot_starts[s], slot_count[s], start, count,
                          t_ptr + out * dsize,
                          i_ptr + out * dsize if i_ptr != NULL else NULL,
                          p_ptr + out * psize if p_ptr != NULL else NULL,
                          dc, pc, dsize, psize, c_start_input)
    finally:
        free(slot_docs)
        free(slot_starts)
        free(slot_count)
    return copied


def block_token_stats(ShardCore reader, Py_ssize_t first, Py_ssize_t stop, field):
    """The compiled ``_tokens_py.block_token_stats`` (see there)."""
    counts = np.zeros(max(stop - first, 0), dtype=np.int64)
    cdef int64_t[::1] c_counts = counts
    cdef _TokenBlock blk
    cdef Py_ssize_t b, k, j
    cdef int64_t low = 0
    cdef int64_t high = 0
    cdef int64_t lo, hi
    cdef bint any_token = False
    cdef tk_doc* doc
    for b in range(first, stop):
        blk = _tk_block(reader, b, field, False)
        c_counts[b - first] = blk.starts[blk.count]
        with nogil:
            for k in range(blk.count):
                doc = &blk.docs[k]
                if doc.n == 0:
                    continue
                tk_minmax(doc.p, doc.code, doc.n, &lo, &hi)
                if not any_token:
                    low, high = lo, hi
                    any_token = True
                else:
                    low = lo if lo < low else low
                    high = hi if hi > high else high
    if not any_token:
        return counts, None, None
    return counts, low, high


cdef extern from "<stdlib.h>" nogil:
    void qsort(void* base, size_t n, size_t size,
               int (*cmp)(const void*, const void*) noexcept nogil)


cdef int _tk_cmp(const void* a, const void* b) noexcept nogil:
    cdef int64_t x = (<const int64_t*>a)[0]
    cdef int64_t y = (<const int64_t*>b)[0]
    return (x > y) - (x < y)


cdef inline Py_ssize_t _tk_block_of(const uint64_t* cum, Py_ssize_t n_blocks,
                                    uint64_t t) noexcept nogil:
    """The last block whose first token is at or before ``t`` (searchsorted right, minus 1)."""
    cdef Py_ssize_t lo = 0
    cdef Py_ssize_t hi = n_blocks + 1
    cdef Py_ssize_t mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if cum[mid] <= t:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


def token_pieces(cum, starts, counts, out):
    """The compiled ``_tokens_py.token_pieces`` (see there)."""
    cdef const uint64_t[::1] c_cum = cum
    cdef const int64_t[::1] c_starts = np.ascontiguousarray(starts, dtype=np.int64)
    cdef const int64_t[::1] c_counts = np.ascontiguousarray(counts, dtype=np.int64)
    cdef const int64_t[::1] c_out = np.ascontiguousarray(out, dtype=np.int64)
    cdef Py_ssize_t n = c_starts.shape[0]
    cdef Py_ssize_t n_blocks = c_cum.shape[0] - 1
    cdef Py_ssize_t r, g, total = 0, k = 0, n_unique = 0, lo, hi, mid
    cdef int64_t s, c, a, b
    cdef const uint64_t* cp
    if c_counts.shape[0] != n or c_out.shape[0] != n:
        raise ValueError("starts, counts and out differ in length")
    if n_blocks < 0:
        raise ValueError("an empty block table")
    cp = &c_cum[0]
    for r in range(n):
        s, c = c_starts[r], c_counts[r]
        if c <= 0:
            continue
        if s < 0 or <uint64_t>(s + c) > cp[n_blocks]:
            raise IndexError(f"tokens [{s}, {s + c}) out of range for {cp[n_blocks]} tokens")
        total += (_tk_block_of(cp, n_blocks, <uint64_t>(s + c - 1))
                  - _tk_block_of(cp, n_blocks, <uint64_t>s) + 1)
    pieces = np.empty((total, 4), dtype=np.int64)
    gs = np.empty(total, dtype=np.int64)
    cdef int64_t[:, ::1] c_pieces = pieces
    cdef int64_t[::1] c_gs = gs
    with nogil:
        for r in range(n):
            s, c = c_starts[r], c_counts[r]
            if c <= 0:
                continue
            g = _tk_block_of(cp, n_blocks, <uint64_t>s)
            while c > 0:
                a = <int64_t>cp[g]
                b = <int64_t>cp[g + 1]
                if b > s:  # (blocks without a token are passed over)
                    b = b - s if b - s < c else c
                    c_pieces[k, 0] = g
                    c_pieces[k, 1] = s - a
                    c_pieces[k, 2] = b
                    c_pieces[k, 3] = c_out[r] + (c_counts[r] - c)
                    c_gs[k] = g
                    k += 1
                    s += b
                    c -= b
                g += 1
        if k:
            qsort(&c_gs[0], k, sizeof(int64_t), _tk_cmp)
            n_unique = 1
            for r in range(1, k):
                if c_gs[r] != c_gs[n_unique - 1]:
                    c_gs[n_unique] = c_gs[r]
                    n_unique += 1
        for r in range(k):
            g = c_pieces[r, 0]
            lo, hi = 0, n_unique
            while lo < hi:
                mid = (lo + hi) >> 1
                if c_gs[mid] < g:
                    lo = mid + 1
                else:
                    hi = mid
            c_pieces[r, 0] = lo
    return gs[:n_unique].copy(), pieces[:k]
