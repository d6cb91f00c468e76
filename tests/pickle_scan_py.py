"""Partial decoding of a block in pure Python: the twin of the compiled ``_pickle_scan``.

A block is ``pickle.dumps(list_of_examples)``. ``PickleScanner`` walks the block's opcodes
(protocols 0-5), simulating the unpickler's stack without building any object, and records:

- each top-level element's byte span (``elements``);
- each memo entry's span: from where the stack slot of the object stored there was created
  to where that slot was last on top of the stack, so a memoized list or dict filled by later
  APPENDS or SETITEMS is included whole (``memo_entries``);
- each GET and the entry it reads (``gets``).

Element ``i`` is then unpickled from a synthetic pickle (``synthetic(i)``): PROTO, the spans
of every memo entry it reads that was built before it (recursively, in block order, an entry
built inside another one re-created with it, each followed by POP), its own span, STOP; MEMOIZE
opcodes become explicit puts at their original index, FRAME headers are dropped. Whatever
``loads`` the caller passes (``pickle.loads`` or the restricted unpickler) loads it, so a global
the restricted unpickler refuses stays refused.

Anything not fully understood makes the scan a fallback (``status == "fallback"``,
``reason`` says why): unpickle the whole block. One element falls back alone
(``synthetic(i)`` is None) when it needs an object whose construction was not over when it
read it (a recursive structure reaching outside the element). Elements are known only once
the pickle's STOP has been scanned: a prefix does not determine them (``MARK K1 K2`` starts
``[1, 2]`` as well as ``[(1, 2)]``).

The compiled twin is ``atlas_fast._core._pickle_scan.PickleScanner``: same API, same results
(tests/test_pickle_scan.py checks both against each other and against ``pickle.loads``).
"""

from __future__ import annotations

import pickle
import struct

__all__ = ["PickleScanner", "scan", "MAX_PROTOCOL"]

MAX_PROTOCOL = 5
_LIMIT = 0xFFFFFFF0  # as the compiled scanner: offsets are 32-bit there
_MEMO_SLACK = 256  # an explicit memo index may exceed its opcode's offset by this much
_OPEN = 0xFFFFFFFF  # a memo entry's end while its object is being built
_FRAME = -1  # the memo index of an edit that drops a FRAME header

_REASONS = {
    "unknown": "unknown opcode",
    "unsupported": (
        "unsupported opcode (DUP, persistent id, extension registry or out-of-band buffer)"
    ),
    "truncated": "truncated pickle",
    "too_large": "block too large to scan",
    "proto": "unsupported or misplaced PROTO",
    "underflow": "stack underflow or misplaced mark",
    "memo_range": "memo index out of range",
    "memo_twice": "memo index stored twice",
    "memo_unset": "GET of a memo index never stored",
    "mutation": "an object is changed after it was built",
    "not_list": "the top level is not a list",
    "stop": "STOP with a stack other than one list, or a frame past STOP",
    "argument": "malformed opcode argument",
    "recursive": "refers to an object whose construction is not over (recursive)",
    "no_element": "no such element",
    "not_done": "the scan is not complete",
}


class _Fallback(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(_REASONS[key])
        self.key = key


class _More(Exception):
    def __init__(self, need: int) -> None:
        self.need = need


# Opcode -> (argument kind, action). Argument kinds: None, an int (fixed length), "n1"/"n4"/
# "n4s"/"n8" (a length prefix of that many bytes, "s": signed), "line", "line2".
_PUSH, _PUSH_LIST, _GET, _PUT, _MEMOIZE, _MARK, _POP, _POP_MARK = range(8)
_FROM_MARK, _LIST_FROM_MARK, _MERGE1, _MERGE2, _MERGE3, _APPEND, _APPENDS = range(8, 15)
_SETITEM, _BUILD, _FRAME_OP, _PROTO, _STOP, _UNSUPPORTED = range(15, 21)

_OPS: dict = {}
for _c in b"N\x88\x89)}\x8f":
    _OPS[_c] = (None, _PUSH)
_OPS[ord("]")] = (None, _PUSH_LIST)
for _c, _arg in ((b"K", 1), (b"M", 2), (b"J", 4), (b"G", 8)):
    _OPS[_c[0]] = (_arg, _PUSH)
for _c in b"\x8cCU\x8a":
    _OPS[_c] = ("n1", _PUSH)
for _c in b"XB":
    _OPS[_c] = ("n4", _PUSH)
for _c in b"T\x8b":
    _OPS[_c] = ("n4s", _PUSH)
for _c in b"\x8d\x8e\x96":
    _OPS[_c] = ("n8", _PUSH)
for _c in b"ILFSV":
    _OPS[_c] = ("line", _PUSH)
_OPS[ord("c")] = ("line2", _PUSH)
_OPS[ord("i")] = ("line2", _FROM_MARK)
_OPS[ord("p")] = ("line", _PUT)
_OPS[ord("g")] = ("line", _GET)
_OPS[ord("h")] = (1, _GET)
_OPS[ord("q")] = (1, _PUT)
_OPS[ord("j")] = (4, _GET)
_OPS[ord("r")] = (4, _PUT)
_OPS[0x94] = (None, _MEMOIZE)
_OPS[ord("(")] = (None, _MARK)
_OPS[ord("0")] = (None, _POP)
_OPS[ord("1")] = (None, _POP_MARK)
for _c in b"tdo\x91":
    _OPS[_c] = (None, _FROM_MARK)
_OPS[ord("l")] = (None, _LIST_FROM_MARK)
_OPS[0x85] = (None, _MERGE1)
for _c in b"\x86R\x81\x93":
    _OPS[_c] = (None, _MERGE2)
for _c in b"\x87\x92":
    _OPS[_c] = (None, _MERGE3)
_OPS[ord("a")] = (None, _APPEND)
for _c in b"eu\x90":
    _OPS[_c] = (None, _APPENDS)
_OPS[ord("s")] = (None, _SETITEM)
_OPS[ord("b")] = (None, _BUILD)
_OPS[0x95] = ("n8", _FRAME_OP)
_OPS[0x80] = (1, _PROTO)
_OPS[ord(".")] = (None, _STOP)
for _c in b"2PQ\x82\x83\x84\x97\x98":
    _OPS[_c] = (None, _UNSUPPORTED)
del _c, _arg

_MEMO_OPS = frozenset(b"hqjr")
_APPENDS_OP, _SETITEMS_OP, _DICT_OP, _OBJ_OP = ord("e"), ord("u"), ord("d"), ord("o")
_MERGE_ARITY = {_MERGE1: 1, _MERGE2: 2, _MERGE3: 3}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_BINPUT, _LONG_BINPUT, _POP_OP, _STOP_OP = b"q", b"r", b"0", b"."


class PickleScanner:
    """The scan of one block, fed its bytes (``feed``), then asked for single elements.

    ``feed(data, final)`` scans ``data`` (the whole block, or with ``final=False`` a prefix of
    it, each call's data extending the last one's) and returns ``"done"``, ``"more"`` or
    ``"fallback"``. ``synthetic(i)`` is element ``i``'s synthetic pickle, or None when the
    element must come from the whole block (``element_reason(i)`` says why). ``reset()``
    readies the scanner for another block.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget the scan: ready for another block's bytes."""
        self.status = "more"
        self._reason = None
        self.need = None
        self.protocol = None
        self._pos = 0
        self._frame_end = 0
        self._data = b""
        # Results: lists in position order.
        self._elements: list = []  # (start, end)
        self._defs: list = []  # [memo, start, end, slot]
        self._uses: list = []  # (pos, def)
        self._edits: list = []  # (pos, memo or _FRAME)
        self._use_pos = self._edit_pos = None  # their positions, once the scan is done
        # Scanning state.
        self._stack: list = []  # [start, last_end, is_list, from_get]
        self._marks: list = []  # (height, pos)
        self._open: list = []  # defs whose object is on the stack, by slot
        self._memo: dict = {}  # memo index -> def
        self._root_list = False

    # -- scanning -------------------------------------------------------------------------------

    @property
    def reason(self):
        """Why the scan fell back, or None."""
        return _REASONS[self._reason] if self.status == "fallback" else None

    def feed(self, data, final: bool = True) -> str:
        """Scan ``data`` on from where the last call stopped; the status."""
        data = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        if len(data) < self._pos:
            raise ValueError("feed() needs the block's bytes from its start")
        self._data = data
        if self.status != "more":
            return self.status
        try:
            if len(data) >= _LIMIT:
                raise _Fallback("too_large")
            self._scan(data, final)
        except _More as more:
            if final:
                self._fail("truncated")
            elif more.need >= _LIMIT:
                self._fail("too_large")
            else:
                self.need = more.need
        except _Fallback as fb:
            self._fail(fb.key)
        return self.status

    def _fail(self, key: str) -> None:
        self.status = "fallback"
        self._reason = key
        self.need = None
        self._stack = self._marks = self._open = []
        self._memo = {}

    def _fence(self) -> int:
        return self._marks[-1][0] if self._marks else 0

    def _push(self, start: int, is_list: bool = False, from_get: bool = False) -> None:
        if not self._stack:
            self._root_list = is_list
        self._stack.append([start, start, is_list, from_get])

    def _consume(self, height: int) -> None:
        defs, stack, opened = self._defs, self._stack, self._open
        while opened and defs[opened[-1]][3] >= height:
            d = defs[opened.pop()]
            d[2] = stack[d[3]][1]
        if height == 0:
            self._elements.clear()
            self._root_list = False
        del stack[height:]

    def _add_elements(self, first: int, last: int) -> None:
        self._elements.extend((slot[0], slot[1]) for slot in self._stack[first:last])

    def _argument(self, data, p: int, op: int, kind, avail: int) -> tuple:
        """Where the opcode at ``p`` ends, and its memo index (or None)."""
        q = p + 1
        if kind is None:
            return q, None
        if isinstance(kind, int):
            if q + kind > avail:
                raise _More(q + kind)
            if op in _MEMO_OPS:  # BINGET, BINPUT, LONG_BINGET, LONG_BINPUT
                return q + kind, (data[q] if kind == 1 else _U32.unpack_from(data, q)[0])
            return q + kind, None
        if kind == "n1":
            if q + 1 > avail:
                raise _More(q + 1)
            return q + 1 + data[q], None
        if kind in ("n4", "n4s"):
            if q + 4 > avail:
                raise _More(q + 4)
            n = _U32.unpack_from(data, q)[0]
            if kind == "n4s" and n > 0x7FFFFFFF:
                raise _Fallback("argument")
            return q + 4 + n, None
        if kind == "n8":
            if q + 8 > avail:
                raise _More(q + 8)
            n = _U64.unpack_from(data, q)[0]
            if n >= _LIMIT:
                raise _More(_LIMIT)  # past any block scanned
            if op == 0x95:  # FRAME: its bytes follow as ordinary opcodes
                if q + 8 + n >= _LIMIT:
                    raise _Fallback("too_large")
                self._frame_end = max(self._frame_end, q + 8 + n)
                return q + 8, None
            return q + 8 + n, None
        # "line" / "line2"
        nl = _find_newline(data, q, avail)
        idx = None
        if op in (ord("p"), ord("g")):
            digits = bytes(data[q:nl])
            if not (1 <= len(digits) <= 10 and digits.isdigit() and digits.isascii()):
                raise _Fallback("argument")
            idx = int(digits)
        q = nl + 1
        if kind == "line2":
            q = _find_newline(data, q, avail) + 1
        return q, idx

    def _scan(self, data, final: bool) -> None:
        avail = len(data)
        stack, marks = self._stack, self._marks
        while True:
            p = self._pos
            if p >= avail:
                raise _More(p + 1)
            op = data[p]
            entry = _OPS.get(op)
            if entry is None:
                raise _Fallback("unknown")
            kind, action = entry
            if action == _UNSUPPORTED:
                raise _Fallback("unsupported")
            q, idx = self._argument(data, p, op, kind, avail)
            if q > avail:
                raise _More(q)
            if q >= _LIMIT:
                raise _Fallback("too_large")
            fence = marks[-1][0] if marks else 0
            if action in (_PUSH, _PUSH_LIST):
                self._push(p, is_list=action == _PUSH_LIST)
            elif action == _GET:
                d = self._memo.get(idx)
                if d is None:
                    raise _Fallback("memo_unset")
                self._uses.append((p, d))
                self._push(p, from_get=True)
            elif action in (_PUT, _MEMOIZE):
                if action == _MEMOIZE:
                    idx = len(self._defs)
                    self._edits.append((p, idx))
                self._put(idx, p, fence)
            elif action == _MARK:
                marks.append((len(stack), p))
            elif action == _POP:
                if marks and len(stack) == fence:
                    marks.pop()
                elif len(stack) > fence:
                    self._consume(len(stack) - 1)
                else:
                    raise _Fallback("underflow")
            elif action in (_POP_MARK, _FROM_MARK, _LIST_FROM_MARK, _APPENDS):
                self._from_mark(op, action, fence)
            elif action in _MERGE_ARITY:
                arity = _MERGE_ARITY[action]
                if len(stack) - fence < arity:
                    raise _Fallback("underflow")
                start = stack[len(stack) - arity][0]
                self._consume(len(stack) - arity)
                self._push(start)
            elif action in (_APPEND, _SETITEM, _BUILD):
                arity = 2 if action == _SETITEM else 1
                if len(stack) - fence < arity + 1:
                    raise _Fallback("underflow")
                target = len(stack) - arity - 1
                if stack[target][3]:
                    raise _Fallback("mutation")
                if action == _APPEND and target == 0 and self._root_list:
                    self._add_elements(1, 2)
                self._consume(target + 1)
            elif action == _FRAME_OP:
                self._edits.append((p, _FRAME))
            elif action == _PROTO:
                if p != 0 or data[1] > MAX_PROTOCOL:
                    raise _Fallback("proto")
                self.protocol = data[1]
            elif action == _STOP:
                if marks or len(stack) != 1 or self._frame_end > q:
                    raise _Fallback("stop")
                if not self._root_list:
                    raise _Fallback("not_list")
                self._consume(1)
                for k in self._open:  # the list's own memo entry
                    self._defs[k][2] = stack[0][1]
                self._pos = q
                self.status = "done"
                self.need = None
                self._stack, self._marks, self._open, self._memo = [], [], [], {}
                return
            if action not in (_FRAME_OP, _PROTO) and len(stack) > (marks[-1][0] if marks else 0):
                stack[-1][1] = q
            self._pos = q

    def _put(self, idx: int, p: int, fence: int) -> None:
        if len(self._stack) <= fence:
            raise _Fallback("underflow")
        if idx > p + _MEMO_SLACK:
            raise _Fallback("memo_range")
        if idx in self._memo:
            raise _Fallback("memo_twice")
        slot = len(self._stack) - 1
        self._memo[idx] = len(self._defs)
        self._open.append(len(self._defs))
        self._defs.append([idx, self._stack[slot][0], _OPEN, slot])

    def _from_mark(self, op: int, action: int, fence: int) -> None:
        stack, marks = self._stack, self._marks
        if not marks:
            raise _Fallback("underflow")
        k = len(stack) - fence
        start = marks.pop()[1]
        if action == _APPENDS:
            if fence == 0 or fence <= (marks[-1][0] if marks else 0):
                raise _Fallback("underflow")
            if k and stack[fence - 1][3]:
                raise _Fallback("mutation")
            if op == _SETITEMS_OP and k % 2:
                raise _Fallback("underflow")
            if op == _APPENDS_OP and fence == 1 and self._root_list:
                self._add_elements(1, len(stack))
            self._consume(fence)
        elif action == _POP_MARK:
            self._consume(fence)
        elif (op == _DICT_OP and k % 2) or (op == _OBJ_OP and k == 0):
            raise _Fallback("underflow")
        else:
            items = stack[0:k] if fence == 0 else None
            self._consume(fence)
            if action == _LIST_FROM_MARK and items is not None:
                self._elements.extend((slot[0], slot[1]) for slot in items)
            self._push(start, is_list=action == _LIST_FROM_MARK)

    # -- results --------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._elements) if self.status == "done" else 0

    @property
    def elements(self) -> list:
        """Each element's byte span ``(start, end)``."""
        return list(self._elements) if self.status == "done" else []

    @property
    def memo_entries(self) -> list:
        """``(memo index, start, end)`` of each memo entry, in the order they were stored."""
        return [(d[0], d[1], d[2]) for d in self._defs] if self.status == "done" else []

    @property
    def gets(self) -> list:
        """``(position, memo index)`` of each GET."""
        if self.status != "done":
            return []
        return [(pos, self._defs[d][0]) for pos, d in self._uses]

    def element_memo(self, i: int) -> tuple:
        """Element ``i``'s memo indices: (those it stores, those it reads from before it)."""
        start, end = self.elements[i]
        defines = sorted(m for m, a, _ in self.memo_entries if start <= a < end)
        uses = sorted(
            {m for pos, m in self.gets if start <= pos < end}
            - {m for m, a, _ in self.memo_entries if start <= a < end}
        )
        return defines, uses

    def _plan(self, i: int):
        """The spans element ``i``'s synthetic pickle holds, or a fallback reason key."""
        if self.status != "done":
            return self._reason if self.status == "fallback" else "not_done"
        if not 0 <= i < len(self._elements):
            return "no_element"
        uses, defs = self._uses, self._defs
        if self._use_pos is None:
            self._use_pos = [u[0] for u in uses]
            self._edit_pos = [e[0] for e in self._edits]
        use_pos = self._use_pos
        seen: set = set()
        need: list = []
        todo = [self._elements[i]]
        while todo:
            start, end = todo.pop()
            j = _bisect(use_pos, start)
            while j < len(uses) and uses[j][0] < end:
                pos, di = uses[j]
                d = defs[di]
                if d[1] < start:  # built outside the span: before it
                    if d[2] > pos:
                        return "recursive"
                    if di not in seen:
                        seen.add(di)
                        need.append((d[1], d[2]))
                        todo.append((d[1], d[2]))
                j += 1
        need.sort(key=lambda span: (span[0], -span[1]))
        kept: list = []
        for span in need:
            if not kept or span[0] >= kept[-1][1]:
                kept.append(span)
        kept.append(self._elements[i])
        return kept

    def synthetic(self, i: int):
        """Element ``i``'s synthetic pickle (bytes), or None: unpickle the whole block."""
        plan = self._plan(i)
        if isinstance(plan, str):
            return None
        data, edits, edit_pos = self._data, self._edits, self._edit_pos
        out = bytearray()
        if self.protocol is not None and self.protocol >= 2:
            out += bytes((0x80, self.protocol))
        for n, (start, end) in enumerate(plan):
            at = start
            j = _bisect(edit_pos, start)
            while j < len(edits) and edits[j][0] < end:
                pos, memo = edits[j]
                out += data[at:pos]
                if memo == _FRAME:
                    at = pos + 9
                else:
                    out += (
                        _BINPUT + bytes((memo,)) if memo < 256 else _LONG_BINPUT + _U32.pack(memo)
                    )
                    at = pos + 1
                j += 1
            out += data[at:end]
            out += _POP_OP if n + 1 < len(plan) else _STOP_OP
        return bytes(out)

    def element_reason(self, i: int):
        """Why element ``i`` must come from the whole block, or None."""
        plan = self._plan(i)
        return _REASONS[plan] if isinstance(plan, str) else None

    def load(self, i: int, loads=pickle.loads):
        """Element ``i`` through ``loads``: from its synthetic pickle, else the whole block."""
        synthetic = self.synthetic(i)
        if synthetic is not None:
            return loads(synthetic)
        return loads(self._data)[i]


def _find_newline(data, start: int, avail: int) -> int:
    if start >= avail:
        raise _More(avail + 1)
    if isinstance(data, bytes):
        nl = data.find(b"\n", start, avail)
    else:
        nl = bytes(data[start:avail]).find(b"\n")
        nl = -1 if nl < 0 else nl + start
    if nl < 0:
        raise _More(avail + 1)
    return nl


def _bisect(positions: list, pos: int) -> int:
    lo, hi = 0, len(positions)
    while lo < hi:
        mid = (lo + hi) // 2
        if positions[mid] < pos:
            lo = mid + 1
        else:
            hi = mid
    return lo


def scan(data) -> PickleScanner:
    """A ``PickleScanner`` fed the whole block ``data``."""
    scanner = PickleScanner()
    scanner.feed(data, True)
    return scanner
