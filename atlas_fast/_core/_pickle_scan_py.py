"""The bound check on a block's pickle before it is unpickled, in plain Python (its compiled
twin: ``bound_check`` of ``atlas_fast._core._pickle_scan``; the scanner's partial decoding has
a pure-Python twin under tests/, the Python core does not decode partially).

CPython's unpickler (3.10-3.14) sizes some allocations by an operand before it checks that
operand against the stream. A memo put (PUT's decimal text, BINPUT, LONG_BINPUT) grows the
memo table to twice the index and zero-fills it: four bytes can ask for 64 GiB, a decimal line
for any amount. BINBYTES, BINBYTES8 and BYTEARRAY8 allocate their count before reading it,
also from an in-memory pickle. (3.15 keeps sparse memo indices in a dict and reads large
counts in chunks.) A damaged block can hold such an operand by chance (one flipped length
byte makes the unpickler read an "r" inside a string as LONG_BINPUT), a crafted one on purpose.

``find_unbounded(data)`` walks the opcodes as the unpickler reads them and returns the first
operand that asks for more than the data can hold, or None: a memo index at or past
``len(data) + MEMO_SLACK`` (no pickler numbers its memo past the count of its opcodes; the
slack spares small damage that the unpickler survives, so both cores read it alike), a
counted argument that ends past the data (such a pickle cannot load). Refusing those bounds
what unpickling a block allocates by its length. The walk stops where the unpickler fails
anyway, before any large allocation: an unknown opcode, a text argument without its newline,
a negative count. Both cores run the same rule and raise ``unbounded_error``.
"""

from __future__ import annotations

from .._errors import AtlasFormatError

__all__ = ["MEMO_SLACK", "find_unbounded", "unbounded_error"]

# A memo index may exceed the data's length by this much: the memo table it asks for is then at
# most 16 bytes per byte of the data, plus 1 MiB (the compiled check's PS_BOUND_SLACK: tests
# check them equal).
MEMO_SLACK = 1 << 16

# What follows each opcode byte: a fixed-size argument of ARG[op] >= 0 bytes, or a kind below.
_COUNT1, _COUNT4, _SIGNED4, _COUNT8, _FRAME = -1, -2, -3, -4, -5
_LONG_BINPUT, _PUT, _LINE, _LINES2, _END = -6, -7, -8, -9, -10
_ARG = [_END] * 256  # unknown opcodes and STOP end the walk
for _op in b"N)]}(eastuldo012Rb\x81\x85\x86\x87\x88\x89\x8f\x90\x91\x92\x93\x94Q\x97\x98":
    _ARG[_op] = 0
for _ops, _size in ((b"Khq\x80\x82", 1), (b"M\x83", 2), (b"Jj\x84", 4), (b"G", 8)):
    for _op in _ops:
        _ARG[_op] = _size
for _ops, _kind in (
    (b"\x8cCU\x8a", _COUNT1),
    (b"XB", _COUNT4),
    (b"T\x8b", _SIGNED4),
    (b"\x8d\x8e\x96", _COUNT8),
    (b"\x95", _FRAME),
    (b"r", _LONG_BINPUT),
    (b"p", _PUT),
    (b"ILFSVgP", _LINE),
    (b"ci", _LINES2),
):
    for _op in _ops:
        _ARG[_op] = _kind
del _op, _ops, _size, _kind

_NOT_DIGITS = bytes(c for c in range(256) if not 48 <= c <= 57)
_SATURATED = (1 << 64) - 1  # a PUT index of more than 19 digits

_NAMES = {
    0x70: "PUT",
    0x71: "BINPUT",
    0x72: "LONG_BINPUT",
    0x8C: "SHORT_BINUNICODE",
    0x43: "SHORT_BINBYTES",
    0x55: "SHORT_BINSTRING",
    0x8A: "LONG1",
    0x58: "BINUNICODE",
    0x42: "BINBYTES",
    0x54: "BINSTRING",
    0x8B: "LONG4",
    0x8D: "BINUNICODE8",
    0x8E: "BINBYTES8",
    0x96: "BYTEARRAY8",
    0x95: "FRAME",
}


def find_unbounded(data) -> tuple | None:
    """``(opcode, position, value, limit)`` of the first operand of the pickle ``data`` that
    asks for more than the data can hold, or None (see the module's docstring)."""
    if type(data) is not bytes:
        data = bytes(data)
    n = len(data)
    limit = n + MEMO_SLACK
    arg = _ARG
    p = 0
    while p < n:
        op = data[p]
        k = arg[op]
        if k >= 0:
            p += k + 1
            continue
        q = p + 1
        if k == _COUNT1:
            if q >= n:
                return None
            end = q + 1 + data[q]
            if end > n:
                return (op, p, data[q], n - q - 1)
            p = end
        elif k >= _FRAME:  # _COUNT4, _SIGNED4, _COUNT8, _FRAME
            q += 4 if k >= _SIGNED4 else 8
            if q > n:
                return None
            v = int.from_bytes(data[p + 1 : q], "little")
            if k == _SIGNED4 and v > 0x7FFFFFFF:
                return None  # negative: refused by the unpickler as it is read
            if v > n - q:
                return (op, p, v, n - q)
            p = q if k == _FRAME else q + v
        elif k == _LONG_BINPUT:
            v = int.from_bytes(data[q : q + 4], "little")
            if v >= limit and q + 4 <= n:
                return (op, p, v, limit)
            p = q + 4
        elif k == _END:
            return None
        else:  # text: _PUT, _LINE, _LINES2
            end = data.find(b"\n", q)
            if end < 0:
                return None
            if k == _PUT:
                # The digits' value, whatever else the line holds (PyLong_FromString takes
                # spaces and underscores; anything else fails the load, harmlessly).
                digits = data[q:end].translate(None, _NOT_DIGITS).lstrip(b"0")
                v = int(digits) if 0 < len(digits) <= 19 else (_SATURATED if digits else 0)
                if v >= limit:
                    return (op, p, v, limit)
            elif k == _LINES2:
                end = data.find(b"\n", end + 1)
                if end < 0:
                    return None
            p = end + 1
    return None


def unbounded_error(found: tuple, data_path, b: int) -> AtlasFormatError:
    """The error for block ``b`` of ``data_path``, whose pickle holds the operand ``found``
    (a result of ``find_unbounded``)."""
    op, pos, value, limit = found
    name = _NAMES.get(op, f"opcode {op:#04x}")
    if op in (0x70, 0x71, 0x72):
        detail = (
            f"{name} at byte {pos} stores memo index {value}, past any this block can hold "
            f"(below {limit}): unpickling it would allocate a memo table of "
            f"{_gib(16 * value)} first"
        )
    else:
        detail = f"{name} at byte {pos} counts {value} bytes but only {limit} follow"
        if op in (0x42, 0x8E, 0x96):
            detail += f": unpickling it would allocate {_gib(value)} first"
    return AtlasFormatError(f"{data_path}: block {b} does not unpickle: {detail}")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n} bytes"
