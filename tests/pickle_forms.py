"""Hand-made block pickles of protocols 2-5: the opcodes of ``pickle.dumps`` re-encoded in the
other forms the unpickler accepts (imported as ``pickle_forms``; tests/ is on sys.path).

A reader meets pickles that ``pickle.dumps`` never writes (other picklers, other versions,
hand-written tools): memo puts as MEMOIZE, BINPUT, LONG_BINPUT or PUT, renumbered or dropped
when unread; gets in every width; ints, strings and bytes in every width their protocol has;
frames anywhere between opcodes, or none; the top-level list built by APPENDS batches of any
size, by APPEND, or by MARK ... LIST; and elements built by opcodes ``pickle.dumps`` does not
use (DICT, LIST, TUPLE, ADDITEMS, FROZENSET) or reading an earlier element through the memo.
``hand_made_block`` draws one from a seed; ``pickle.loads`` of it is what it holds.
"""

from __future__ import annotations

import pickle
import pickletools
import random
import struct

import numpy as np

__all__ = ["hand_made_block", "sample_examples"]

_OPS = {op.name: op for op in pickletools.opcodes}
_CODE = {name: op.code.encode("latin-1") for name, op in _OPS.items()}
_PUTS = {"MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT"}
_GETS = {"BINGET", "LONG_BINGET", "GET"}
_INTS = {"BININT1", "BININT2", "BININT", "LONG1", "LONG4", "INT", "LONG"}
_STRS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"}
_BYTES = {"SHORT_BINBYTES", "BINBYTES", "BINBYTES8"}
# The forms of the ops that carry a number (PUT, GET: a memo index; TEXT, DATA: the length of
# the UTF-8 or the bytes that follow it), in the order a draw picks from: the opcode and the
# number's struct format ("\n": decimal digits and a newline). A form is drawn from those its
# protocol allows whose width holds the number.
_NUMBERED = {
    "PUT": (("PUT", "\n"), ("LONG_BINPUT", "<I"), ("BINPUT", "<B")),
    "GET": (("GET", "\n"), ("LONG_BINGET", "<I"), ("BINGET", "<B")),
    "TEXT": (("BINUNICODE", "<I"), ("BINUNICODE8", "<Q"), ("SHORT_BINUNICODE", "<B")),
    "DATA": (("BINBYTES", "<I"), ("BINBYTES8", "<Q"), ("SHORT_BINBYTES", "<B")),
}


def sample_examples(rng: random.Random, n: int) -> list:
    """``n`` examples of the kinds datasets hold: documents (dicts sharing key names), numpy
    arrays of several dtypes, tuples of scalars, bytes, nested lists, shared objects."""
    shared = {"source": "shared", "ids": [1, 2, 3]}
    out = []
    for i in range(n):
        kind = rng.randrange(6)
        if kind == 0:
            out.append({"id": i, "text": "word " * rng.randrange(1, 9), "score": i / 3})
        elif kind == 1:
            dtype = rng.choice(["i8", "u2", "f4", "i4", "f8", "?"])
            out.append(np.arange(rng.randrange(0, 9)).astype(dtype))
        elif kind == 2:
            out.append((i, -(2**40) - i, 1.5, None, True, b"\x00\xff" * rng.randrange(3)))
        elif kind == 3:
            out.append([str(i), [i, [i + 1, {"k": i}]], set(range(i % 4))])
        elif kind == 4:
            out.append(shared)  # the same object in several examples: the memo
        else:
            out.append("é" * rng.randrange(0, 300) + "x")
    return out


def _normalised(data: bytes) -> list:
    """The opcodes of ``data`` as ``[name, arg]``, memo puts as ("PUT", index) (MEMOIZE
    numbered), gets as ("GET", index), ints/strings/bytes by kind; no PROTO, FRAME or STOP."""
    ops = []
    memo = 0
    for op, arg, _pos in pickletools.genops(data):
        name = op.name
        if name in ("PROTO", "FRAME", "STOP"):
            continue
        if name in _PUTS:
            index = memo if name == "MEMOIZE" else int(arg)
            memo = max(memo, index + 1)
            ops.append(["PUT", index])
        elif name in _GETS:
            ops.append(["GET", int(arg)])
        elif name in _INTS:
            ops.append(["INTEGER", int(arg)])
        elif name in _STRS:
            ops.append(["TEXT", arg])
        elif name in _BYTES:
            ops.append(["DATA", bytes(arg)])
        else:
            ops.append([name, arg])
    return ops


def _effect(name: str) -> tuple:
    """(pops to the top mark, items popped, items pushed) of opcode ``name``."""
    if name in ("PUT", "GET", "INTEGER", "TEXT", "DATA"):
        return (False, 0, 0 if name == "PUT" else 1)
    op = _OPS[name]
    before = op.stack_before
    to_mark = pickletools.markobject in before
    after = [x for x in op.stack_after if x is not pickletools.markobject]
    popped = 0 if to_mark else len(before)
    if to_mark:  # items below the mark it also pops (APPENDS: the list; SETITEMS: the dict)
        popped = before.index(pickletools.markobject)
    return (to_mark, popped, len(after))


def _elements(ops: list) -> list:
    """The op lists of the top-level list's elements (``ops`` from _normalised of a list:
    EMPTY_LIST, its PUT, then ``MARK ... APPENDS`` batches or one element and APPEND)."""
    assert ops[0][0] == "EMPTY_LIST", ops[:3]
    p = 2 if len(ops) > 1 and ops[1][0] == "PUT" else 1
    elements = []
    while p < len(ops):
        q = p
        closing = "APPEND"
        if ops[p][0] == "MARK":  # a batch, unless the mark is the element's own (a TUPLE)
            depth = 0
            for r in range(p, len(ops)):
                if ops[r][0] == "MARK":
                    depth += 1
                elif _effect(ops[r][0])[0]:
                    depth -= 1
                    if depth == 0:
                        closing = "APPENDS" if ops[r][0] == "APPENDS" else "APPEND"
                        break
        height = 0  # items above the list
        marks: list = []
        while True:  # the opcode that closes this batch: at the list's own level
            name = ops[q][0]
            to_mark, popped, pushed = _effect(name)
            if name == "MARK":
                marks.append(height)
            elif to_mark:
                if name == closing and len(marks) == 1:
                    break
                height = marks.pop() - popped + pushed
            else:
                if name == closing and height == 1 and not marks:
                    break
                height += pushed - popped
            q += 1
        if closing == "APPENDS":
            elements.extend(_split(ops[p + 1 : q]))
        else:
            elements.append(ops[p:q])
        p = q + 1
    return elements


def _split(ops: list) -> list:
    """The ops of one ``MARK ... APPENDS`` batch split into its elements: element k ends at
    the first op after which k + 1 items are above the mark and no later op reaches below
    that (SETITEMS reaches the dict it fills); the PUTs that follow go with it."""
    heights = []
    lows = []  # the lowest height each op reaches (to its mark, then what it pops below)
    height = 0
    marks: list = []
    for op in ops:
        name = op[0]
        to_mark, popped, pushed = _effect(name)
        if name == "MARK":
            marks.append(height)
            low = height
        elif to_mark:
            low = marks.pop() - popped
            height = low + pushed
        else:
            low = height - popped
            height += pushed - popped
        heights.append(height if not marks else -1)
        lows.append(low)
    n = len(ops)
    suffix = [10**9] * (n + 1)
    for p in range(n - 1, -1, -1):
        suffix[p] = min(lows[p], suffix[p + 1])
    out = []
    start = 0
    count = 0
    p = 0
    while p < n:
        if heights[p] == count + 1 and suffix[p + 1] >= count + 1:
            end = p + 1
            while end < n and ops[end][0] == "PUT":
                end += 1
            out.append(ops[start:end])
            start = end
            count += 1
            p = end
            continue
        p += 1
    assert start == n, "elements do not cover the batch"
    return out


def _extra_element(rng: random.Random, protocol: int, defined: list) -> list:
    """An element made by opcodes pickle.dumps does not use for it (memo puts as "NEW")."""
    kind = rng.randrange(9 if protocol >= 4 else 7)
    text = ["TEXT", f"k{rng.randrange(100)}"]
    if kind == 0:
        return [["MARK", None], ["INTEGER", 7], text, ["LIST", None], ["PUT", "NEW"]]
    if kind == 1:
        return [["MARK", None], text, ["INTEGER", 1], ["TEXT", "v"], ["NONE", None], ["DICT", None]]
    if kind == 2:
        return [["MARK", None], ["INTEGER", -3], ["BINFLOAT", 0.25], ["TUPLE", None]]
    if kind == 3:
        return [["EMPTY_LIST", None], ["PUT", "NEW"], ["INTEGER", 2**70], ["APPEND", None]]
    if kind == 4:
        return [["EMPTY_DICT", None], text, ["NEWTRUE", None], ["SETITEM", None]]
    if kind == 5 and defined:
        return [["GET", rng.choice(defined)]]  # an object of an earlier element
    if kind == 6:
        return [["EMPTY_TUPLE", None], ["INTEGER", 300], ["TUPLE2", None]]
    if kind == 7:
        return [["EMPTY_SET", None], ["PUT", "NEW"], ["MARK", None], ["INTEGER", 5], text]
    return [["MARK", None], ["INTEGER", 1], ["INTEGER", 2], ["FROZENSET", None]]


def _fix_extra(ops: list) -> list:
    """Complete an EMPTY_SET element (its ADDITEMS)."""
    if ops and ops[0][0] == "EMPTY_SET":
        return [*ops, ["ADDITEMS", None]]
    return ops


def _encode(rng: random.Random, protocol: int, name: str, arg) -> bytes:
    code = _CODE
    if name in _NUMBERED:
        if name in ("PUT", "GET"):
            number, payload = arg, b""  # the memo index
        else:
            payload = arg.encode("utf-8", "surrogatepass") if name == "TEXT" else arg
            number = len(payload)
        forms = [
            (form, fmt)
            for form, fmt in _NUMBERED[name]
            if _OPS[form].proto <= protocol
            and (fmt == "\n" or number < 256 ** struct.calcsize(fmt))
        ]
        form, fmt = rng.choice(forms)
        if fmt == "\n":
            return code[form] + str(number).encode() + b"\n"
        return code[form] + struct.pack(fmt, number) + payload
    if name == "MEMOIZE":
        return code["MEMOIZE"]
    if name == "INTEGER":
        choices = ["LONG1"]
        if 0 <= arg < 256:
            choices.append("BININT1")
        if 0 <= arg < 65536:
            choices.append("BININT2")
        if -(2**31) <= arg < 2**31:
            choices.append("BININT")
        pick = rng.choice(choices)
        if pick == "BININT1":
            return b"K" + bytes([arg])
        if pick == "BININT2":
            return b"M" + struct.pack("<H", arg)
        if pick == "BININT":
            return b"J" + struct.pack("<i", arg)
        raw = pickle.encode_long(arg)
        return b"\x8a" + bytes([len(raw)]) + raw
    if name == "BINFLOAT":
        return b"G" + struct.pack(">d", arg)
    if name == "GLOBAL":
        module, _, attr = arg.partition(" ")
        return b"c" + module.encode() + b"\n" + attr.encode() + b"\n"
    if name in ("BYTEARRAY8",):
        return b"\x96" + struct.pack("<Q", len(arg)) + bytes(arg)
    if name in ("SHORT_BINSTRING", "BINSTRING"):
        raw = arg.encode("latin-1")
        if len(raw) < 256:
            return b"U" + bytes([len(raw)]) + raw
        return b"T" + struct.pack("<i", len(raw)) + raw
    if _OPS[name].arg is not None:
        raise ValueError(f"no encoder for {name}")
    return code[name]


def hand_made_block(seed: int, n: int, examples=None, protocol=None) -> bytes:
    """A pickle of a list of ``n`` elements, of protocol 2-5, in forms drawn from ``seed``:
    ``examples`` (or sample ones) pickled, re-encoded, with hand-made elements among them."""
    rng = random.Random(seed)
    if protocol is None:
        protocol = rng.randrange(2, 6)
    extras = rng.randrange(0, n + 1) if n else 0
    if examples is None:
        examples = sample_examples(rng, n - extras)
    else:
        extras = n - len(examples)
    ops = _normalised(pickle.dumps(list(examples), protocol=protocol))
    elements = _elements(ops) if examples else []
    assert len(elements) == len(examples), (len(elements), len(examples))
    # Hand-made elements at random places; memo indices they read exist before them.
    for _ in range(extras):
        at = rng.randrange(len(elements) + 1)
        defined = [op[1] for e in elements[:at] for op in e if op[0] == "PUT" and op[1] != "NEW"]
        elements.insert(at, _fix_extra(_extra_element(rng, protocol, defined)))
    # The top-level list, in one of its forms.
    form = rng.choice(["appends", "appends", "append", "list"])
    body: list = []
    if form == "list":
        body.append(["MARK", None])
        for e in elements:
            body.extend(e)
        body.append(["LIST", None])
    else:
        body += [["EMPTY_LIST", None], ["PUT", 0 if rng.random() < 0.8 else None]]
        k = 0
        while k < len(elements):
            if form == "append" or rng.random() < 0.2:
                body.extend(elements[k])
                body.append(["APPEND", None])
                k += 1
                continue
            size = rng.randrange(1, len(elements) - k + 1)
            body.append(["MARK", None])
            for e in elements[k : k + size]:
                body.extend(e)
            body.append(["APPENDS", None])
            k += size
    # Memo indices renumbered in the order of the puts, unread puts dropped at times (the
    # top-level list is never read through the memo).
    read = {op[1] for op in body if op[0] == "GET"}
    drop_unread = rng.random() < 0.5
    renumber: dict = {}
    count = 0
    out_ops = []
    for op in body:
        if op[0] == "PUT":
            old = op[1]
            if old is None or (drop_unread and old != "NEW" and old not in read):
                continue
            if old != "NEW":
                renumber[old] = count
            out_ops.append(["PUT", count])
            count += 1
        elif op[0] == "GET":
            out_ops.append(["GET", renumber[op[1]]])
        else:
            out_ops.append(op)
    # Encode; MEMOIZE where the protocol has it and the index is the next one.
    chunks = []
    memo_len = 0
    for name, arg in out_ops:
        if name == "PUT" and protocol >= 4 and arg == memo_len and rng.random() < 0.7:
            chunks.append(_CODE["MEMOIZE"])
        else:
            chunks.append(_encode(rng, protocol, name, arg))
        if name == "PUT":
            memo_len = max(memo_len, arg + 1)
    chunks.append(b".")
    out = bytearray(b"\x80" + bytes([protocol]))
    if protocol >= 4 and rng.random() < 0.7:
        # Frames between opcodes (STOP may sit in the last one or after it).
        k = 0
        while k < len(chunks):
            size = rng.randrange(1, len(chunks) - k + 1)
            frame = b"".join(chunks[k : k + size])
            out += b"\x95" + struct.pack("<Q", len(frame)) + frame
            k += size
    else:
        out += b"".join(chunks)
    data = bytes(out)
    loaded = pickle.loads(data)
    assert type(loaded) is list and len(loaded) == n, (len(loaded), n)
    return data
