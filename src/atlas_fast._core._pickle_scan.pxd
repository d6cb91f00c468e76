# The C-level API of atlas_fast._core._pickle_scan: a scanner of a block's pickle opcodes that finds
# each top-level element's byte span and the memo entries it shares with earlier elements, so
# that one element can be unpickled alone (see _pickle_scan.pyx for the semantics).
#
# A PickleScan is owned by one holder (a PickleScanner, or the reader's scratch scan while a
# random read holds it): ps_feed mutates it and must not run concurrently with anything else
# on the same scan; once ps_feed has returned PS_DONE the scan does not change until reset,
# and ps_plan/ps_synthetic may run on it from any number of threads, without the GIL.

from libc.stdint cimport int32_t, uint32_t, uint64_t

cdef enum:
    PS_MORE = 0  # scanned as far as the bytes given; more are needed
    PS_DONE = 1  # the pickle's STOP was reached: elements are final
    PS_FALLBACK = 2  # not fully understood: unpickle the whole block

ctypedef struct ps_span:
    uint32_t start
    uint32_t end

ctypedef struct ps_def:
    uint32_t start  # where the memoized object's construction starts
    uint32_t end  # where it is over (its stack slot last on top); PS_OPEN until then
    uint32_t memo  # its memo index
    int32_t slot  # its stack slot while open

ctypedef struct ps_use:
    uint32_t pos  # a GET opcode
    uint32_t def_  # the memo entry it reads (index into defs)

ctypedef struct ps_edit:
    uint32_t pos  # a MEMOIZE (rewritten as an explicit put) or a FRAME header (dropped)
    uint32_t memo  # the MEMOIZE's index, or PS_FRAME_EDIT

ctypedef struct ps_slot:
    uint32_t start
    uint32_t last_end
    uint32_t flags

ctypedef struct ps_mark:
    uint32_t height
    uint32_t pos

ctypedef struct PickleScan:
    int status
    int reason
    int proto  # the PROTO opcode's argument, or -1
    uint32_t pos  # the next opcode to scan
    uint32_t need  # with PS_MORE: how many bytes of the block are needed to go on
    uint32_t frame_end  # the furthest end any FRAME declared
    int root_list  # the bottom stack slot is a list built by this pickle
    int keep  # a scratch scan (ps_reset): its arrays outlive the scan, for the next one
    # Results, kept: arrays in position order.
    ps_span* elems
    uint32_t n_elems, cap_elems
    ps_def* defs
    uint32_t n_defs, cap_defs
    ps_use* uses
    uint32_t n_uses, cap_uses
    ps_edit* edits
    uint32_t n_edits, cap_edits
    # Scanning state, freed once the scan is over.
    ps_slot* stack
    uint32_t height, cap_stack
    ps_mark* marks
    uint32_t n_marks, cap_marks
    uint32_t fence  # the top mark's height (0 without marks): the stack below it is hidden
    int32_t* open_defs
    uint32_t n_open, cap_open
    int32_t* memo  # memo index -> def, -1 when unset
    uint32_t cap_memo

cdef PickleScan* ps_new() noexcept nogil
cdef void ps_free(PickleScan* s) noexcept nogil
# Ready ``s`` for another block, keeping its arrays (and keeping them from now on, when a scan
# ends too): a scratch scan reused from one random read to the next allocates nothing.
cdef void ps_reset(PickleScan* s) noexcept nogil
cdef int ps_feed(PickleScan* s, const unsigned char* data, size_t avail, bint final) noexcept nogil
cdef size_t ps_nbytes(const PickleScan* s) noexcept nogil
cdef const char* ps_reason(int reason) noexcept nogil
ctypedef struct ps_plan_t:
    ps_span* spans  # the memo entries to re-create, in block order, then the element
    uint32_t n
    uint32_t cap
    Py_ssize_t size  # bytes of the synthetic pickle
    ps_span small[24]  # spans' storage while they fit

# What element i's synthetic pickle holds: 0, or a reason (ps_reason) to unpickle the whole
# block instead. A plan made (whatever the result) is released with ps_plan_release.
cdef int ps_plan(const PickleScan* s, uint32_t i, ps_plan_t* plan) noexcept nogil
cdef void ps_plan_release(ps_plan_t* plan) noexcept nogil
# Writes the synthetic pickle (plan.size bytes) from the block's bytes into out.
cdef void ps_plan_write(const PickleScan* s, const unsigned char* data, const ps_plan_t* plan,
                        unsigned char* out) noexcept nogil
# Element i's synthetic pickle as bytes, or its fallback reason as an int.
cdef object ps_synthetic(const PickleScan* s, const unsigned char* data, uint32_t i)

# The bound check (no state: any thread, no GIL): 1 and ``out`` filled when an operand of the
# pickle d[0:n] asks CPython's unpickler to allocate by more than the data can hold (a memo
# index at or past n + 65536, a count past the end), else 0.
ctypedef struct ps_bound_t:
    unsigned char op
    size_t pos
    uint64_t value
    uint64_t limit

cdef int ps_bound(const unsigned char* d, size_t n, ps_bound_t* out) noexcept nogil


# The scan of one block as a Python object (what a cache entry can hold): the C scan and the
# bytes it was fed (the block's pickle, or its prefix while scanning).
cdef class PickleScanner:
    cdef PickleScan* s
    cdef object data
    cdef Py_ssize_t _reading  # synthetic pickles being written (the GIL released): no reset
    # Element i's synthetic pickle (bytes), or its fallback reason (int).
    cdef object _synthetic(self, Py_ssize_t i)
    cdef int _check_not_reading(self) except -1
