"""Partial decoding: the pickle scanners (compiled and pure Python) give, for every element of
a block, a synthetic pickle that loads to what ``pickle.loads(block)[i]`` holds.

The scanners are private (``atlas_fast._core._pickle_scan``; ``pickle_scan_py``, a model kept
in tests/): their contract is what the cores build on, so it is pinned here directly. Both are
checked against
``pickle.loads`` and against each other (same spans, memo entries and synthetic bytes).
"""

from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import io
import os
import pickle
import threading
import uuid

import numpy as np
import pickle_scan_py as _pyscan
import pytest
from helpers import case_dataset, fixture_cases, reference_blocks, run_threads, same
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atlas_fast._errors import UnsafePickleError
from atlas_fast._safe_pickle import make_loads

try:
    from atlas_fast._core import _pickle_scan, _reader
except ImportError:  # a pure-Python install: only the twin is there
    _pickle_scan = _reader = None

SCANNERS = {"python": _pyscan}
if _pickle_scan is not None:
    SCANNERS["cython"] = _pickle_scan


@pytest.fixture(params=sorted(SCANNERS))
def scanner(request):
    return SCANNERS[request.param]


def _dumps_all(x, protocol) -> bytes:
    """``x`` pickled to compare structure too (shared objects inside an element)."""
    return pickle.dumps(x, protocol=protocol)


def check_block(block: bytes, *, loads=pickle.loads, partial=True, deep=True) -> int:
    """Every element of ``block`` through every scanner, against ``pickle.loads(block)``.

    ``partial``: every element must take the partial path (no fallback). ``deep``: compare
    with ``helpers.same`` too (not for recursive values; their pickles are compared). Returns
    how many elements had to come from the whole block.
    """
    equal = same if deep else (lambda a, b: _dumps_all(a, 5) == _dumps_all(b, 5))
    whole = pickle.loads(block)
    scans = {name: mod.scan(block) for name, mod in SCANNERS.items()}
    for name, s in scans.items():
        assert s.status == "done", (name, s.reason)
        assert len(s) == len(whole), name
    fallbacks = 0
    for i, expected in enumerate(whole):
        synthetic = {name: s.synthetic(i) for name, s in scans.items()}
        assert len(set(synthetic.values())) == 1, f"scanners disagree on element {i}"
        data = synthetic["python"]
        if data is None:
            assert not partial, f"element {i}: {scans['python'].element_reason(i)}"
            fallbacks += 1
            for s in scans.values():
                assert equal(s.load(i, loads), expected)
            continue
        got = loads(data)
        assert equal(got, expected), f"element {i}: {got!r:.200} != {expected!r:.200}"
        # Same structure, shared objects included (numpy dtypes compare equal anyway).
        assert _dumps_all(got, 5) == _dumps_all(expected, 5), f"element {i}"
        for s in scans.values():
            assert equal(s.load(i, loads), expected)
    if len(scans) == 2:
        a, b = scans["python"], scans["cython"]
        assert a.elements == b.elements
        assert a.memo_entries == b.memo_entries
        assert a.gets == b.gets
        assert a.protocol == b.protocol
    return fallbacks


# ---------------------------------------------------------------------------------------------
# Reference-written blocks


@pytest.mark.parametrize("case", fixture_cases())
def test_every_fixture_block(case):
    blocks = list(reference_blocks(case_dataset(case)))
    assert blocks
    for block in blocks:
        check_block(block)


# ---------------------------------------------------------------------------------------------
# Generated blocks, every protocol

PROTOCOLS = [2, 3, 4, 5]


def _documents(n):
    return [
        {
            "id": f"doc-{i}",
            "text": "word " * (i % 7) + "é ✓" * (i % 3),
            "added": "2024-01-01",
            "score": i / 3,
            "tags": ["a", "b", str(i % 4)],
            "span": (i, i + 1),
            "meta": {"n": i, "flag": i % 2 == 0, "none": None, "big": 10**30 + i},
        }
        for i in range(n)
    ]


DTYPES = [
    "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16", "?",
    "M8[s]", "m8[ms]", "U5", "S3", ">i4", "<f8", "V4",
]  # fmt: skip


def _arrays():
    out = [np.arange(6).astype(dt).reshape(2, 3) for dt in DTYPES]
    out.append(np.zeros(3, dtype=[("x", "<f4"), ("name", "U4"), ("n", ">i2", (2,))]))
    out.append(np.array([1, "two", None, (3,)], dtype=object))
    out.append(np.arange(10, dtype="u2")[::2])  # not contiguous
    out.append(np.asfortranarray(np.arange(6, dtype="f8").reshape(2, 3)))
    out.append(np.float64(2.5))
    out.append(np.int32(-3))
    out.append(np.arange(0, dtype="i8"))
    return out + out[:5]  # repeats: dtypes and globals come from the memo


def _stdlib_objects():
    return [
        datetime.datetime(2024, 1, 2, 3, 4, 5, 6),
        datetime.datetime(2024, 1, 2, tzinfo=datetime.timezone.utc),
        datetime.date(2020, 2, 29),
        datetime.time(1, 2, 3),
        datetime.timedelta(days=3, seconds=5),
        decimal.Decimal("1.50"),
        decimal.Decimal("-Infinity"),
        fractions.Fraction(3, 7),
        uuid.UUID(int=12345),
        collections.OrderedDict([("b", 1), ("a", 2)]),
        collections.Counter("hello"),
        collections.deque([1, 2, 3]),
        complex(1, -2),
        range(3, 9, 2),
        slice(1, None, 2),
        frozenset({1, 2}),
        {3, 4},
        bytearray(b"\x00\xff"),
        b"raw bytes",
        "text",
        float("nan"),
        -(2**70),
        True,
        None,
        datetime.datetime(2024, 1, 2, 3, 4, 5, 6),
        decimal.Decimal("1.50"),
    ]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("make", [_documents, _arrays, _stdlib_objects], ids=lambda f: f.__name__)
def test_generated_blocks(protocol, make):
    examples = make(40) if make is _documents else make()
    check_block(pickle.dumps(examples, protocol=protocol))
    # The pure-Python pickler writes the same opcodes its own way (PUT/MEMOIZE, framing).
    f = io.BytesIO()
    pickle._Pickler(f, protocol=protocol).dump(examples)
    check_block(f.getvalue())


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_shared_references(protocol):
    shared = {"k": [1, 2, "s"], "t": (1, "x")}
    text = "a string shared by several elements"
    inner = [text, shared]
    examples = [shared, [shared, shared], (shared, text), inner, {"inner": inner}, text, 3]
    check_block(pickle.dumps(examples, protocol=protocol))


def test_shared_reference_identity_within_an_element():
    shared = [1, 2]
    block = pickle.dumps([shared, {"a": shared, "b": shared}])
    for mod in SCANNERS.values():
        got = pickle.loads(mod.scan(block).synthetic(1))
        assert got["a"] is got["b"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_recursive_structures(protocol):
    inside = []
    inside.append(inside)  # recursive, but within one element
    d = {}
    d["self"] = d
    t_list = []
    t = (t_list,)
    t_list.append(t)  # a tuple reached again while it is being built
    block = pickle.dumps([1, inside, d, t, "end"], protocol=protocol)
    check_block(block, partial=False, deep=False)
    for mod in SCANNERS.values():
        s = mod.scan(block)
        assert s.synthetic(0) is not None and s.synthetic(4) is not None
        got = pickle.loads(s.synthetic(1))
        assert got[0] is got
        got = pickle.loads(s.synthetic(2))
        assert got["self"] is got


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_recursive_reference_to_an_earlier_element_falls_back(protocol):
    outer = []
    cycle = {"outer": outer}
    outer.append(cycle)  # element 0: a list holding a dict holding the list
    block = pickle.dumps([outer, cycle, "x"], protocol=protocol)
    # Element 1 is the dict built inside element 0 while that list was being built: it
    # cannot be re-created without all of element 0, so it comes from the whole block.
    assert check_block(block, partial=False, deep=False) == 1
    for mod in SCANNERS.values():
        s = mod.scan(block)
        assert s.synthetic(1) is None
        assert "recursive" in s.element_reason(1)
        got = s.load(1)
        assert got["outer"][0] is got


def test_the_list_itself_inside_an_element_falls_back():
    block_list: list = [1]
    block_list.append(block_list)
    block_list.append("after")
    block = pickle.dumps(block_list)
    for mod in SCANNERS.values():
        s = mod.scan(block)
        assert s.status == "done"
        assert s.synthetic(0) is not None and s.synthetic(2) is not None
        assert s.synthetic(1) is None
        got = s.load(1)
        assert got[1] is got


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_memo_above_256_entries(protocol):
    strings = [f"string number {i}" for i in range(700)]
    examples = [strings[: i * 50] + strings[:3] for i in range(14)] + [strings[650:], strings[5]]
    block = pickle.dumps(examples, protocol=protocol)
    assert (b"j" if protocol < 4 else b"\x94") in block
    for mod in SCANNERS.values():
        s = mod.scan(block)
        assert max(m for m, _, _ in s.memo_entries) > 256
        assert any(m > 256 for _, m in s.gets)  # LONG_BINGET
        if protocol < 4:
            assert b"r" in s.synthetic(15)  # LONG_BINPUT kept as it was
    check_block(block)


def test_many_memo_entries_and_long_closures():
    # Over 4096 memo entries, and an element reading hundreds of them from earlier elements.
    strings = [f"s{i}" for i in range(5000)]
    examples = [strings[k : k + 1000] for k in range(0, 5000, 1000)]
    examples.append(strings[::7])
    check_block(pickle.dumps(examples, protocol=4))


def _long_put_pickle() -> bytes:
    """A list of 300 shared strings stored with LONG_BINPUT (protocol 2 uses BINPUT <256)."""
    out = bytearray(b"\x80\x02]r\x00\x00\x00\x00(")
    for i in range(300):
        s = f"s{i}".encode()
        out += b"X" + len(s).to_bytes(4, "little") + s + b"r" + (i + 1).to_bytes(4, "little")
    out += b"j" + (299).to_bytes(4, "little") + b"h\x05e."
    return bytes(out)


def _text_pickle() -> bytes:
    """Protocol 0: text opcodes, PUT/GET by decimal index, GLOBAL, INST-free."""
    return pickle.dumps([{"a": 1}, "x", [2.5, None], ("t", 10**20), "x", b"by"], protocol=0)


def _inst_obj_pickle() -> bytes:
    """Protocol 0/1 opcodes CPython 3 no longer writes: MARK LIST, INST, OBJ, text PUT/GET."""
    return (
        b"(lp0\n(icollections\nOrderedDict\np1\na(ccollections\nOrderedDict\nop2\nag1\n"
        b"a(I1\nI2\ntp3\na."
    )


@pytest.mark.parametrize("make", [_long_put_pickle, _text_pickle, _inst_obj_pickle])
def test_hand_written_blocks(make):
    check_block(make())


def test_put_instead_of_memoize_at_protocol_4():
    # A protocol 4 pickle with explicit BINPUT in place of MEMOIZE, written by hand.
    block = b"\x80\x04]q\x00(\x8c\x01aq\x01\x8c\x01bq\x02\x86q\x03h\x01h\x03\x8c\x01cq\x04e."
    assert pickle.loads(block) == [("a", "b"), "a", ("a", "b"), "c"]
    check_block(block)


def test_bytearray_and_picklebuffer_at_protocol_5():
    buf = pickle.PickleBuffer(b"readonly bytes")
    writable = pickle.PickleBuffer(bytearray(b"writable"))
    examples = [buf, writable, bytearray(b"xyz" * 50), {"b": buf}, np.arange(5, dtype="u1")]
    check_block(pickle.dumps(examples, protocol=5))


@pytest.mark.parametrize("protocol", [4, 5])
def test_large_frames(protocol):
    # Several frames (64 KB each), payloads written outside any frame, strings across frames.
    examples = [os.urandom(150_000), "x" * 70_000, *(f"s{i}" * 400 for i in range(300))]
    examples += [examples[1], {"k": examples[0]}]
    block = pickle.dumps(examples, protocol=protocol)
    assert block.count(b"\x95") > 3
    check_block(block)


def test_protocols_0_and_1():
    for protocol in (0, 1):
        check_block(pickle.dumps(_documents(10) + _stdlib_objects(), protocol=protocol))


# ---------------------------------------------------------------------------------------------
# The restricted unpickler on the partial path


class Evil:
    def __reduce__(self):
        return (os.getcwd, ())


def test_restricted_loads_governs_the_partial_path():
    loads = make_loads()
    block = pickle.dumps([1, Evil(), "x", Evil(), {"y": 2}])
    for mod in SCANNERS.values():
        s = mod.scan(block)
        assert loads(s.synthetic(0)) == 1
        assert loads(s.synthetic(4)) == {"y": 2}
        for i in (1, 3):  # element 3 reaches os.getcwd through the memo only
            synthetic = s.synthetic(i)
            assert synthetic is not None
            with pytest.raises(UnsafePickleError, match=r"(posix|os)\.getcwd"):
                loads(synthetic)
            with pytest.raises(UnsafePickleError):
                s.load(i, loads)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_restricted_loads_allows_plain_data_and_numpy(protocol):
    examples = _arrays()[:-6] + _documents(5) + [datetime.date(2024, 1, 1), b"raw"]
    check_block(pickle.dumps(examples, protocol=protocol), loads=make_loads())


# ---------------------------------------------------------------------------------------------
# What the scanner does not understand: a fallback, never a different example, never a crash


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        (pickle.dumps({"not": "a list"}), "not a list"),
        (pickle.dumps(("a", "tuple")), "not a list"),
        (pickle.dumps(5), "not a list"),
        (b"\x80\x05]\x94(K\x01K\x02e", "truncated"),
        (b"\x80\x05]\x94(K\x01\xffK\x02e.", "unknown opcode"),
        (b"\x80\x05](K\x01Q\x02e.", "unsupported opcode"),  # BINPERSID
        (b"\x80\x05](K\x01\x82\x01e.", "unsupported opcode"),  # EXT1
        (b"\x80\x05](K\x012e.", "unsupported opcode"),  # DUP
        (b"\x80\x05](K\x01\x97e.", "unsupported opcode"),  # NEXT_BUFFER
        (b"\x80\x05](h\x07e.", "never stored"),
        (b"\x80\x05](K\x01q\x01K\x02q\x01e.", "stored twice"),
        (b"\x80\x05](K\x01r\xff\xff\xff\x00e.", "out of range"),
        (b"\x80\x05]q\x00(]q\x01h\x01K\x01ae.", "changed after"),  # APPEND to a GET
        (b"\x80\x05](K\x01K\x02e0.", "STOP"),  # POP of the list itself
        (b"\x80\x05]00.", "underflow"),
        (b"\x80\x05](K\x01\x86e.", "underflow"),  # TUPLE2 across the mark
        (b"\x80\x05](K\x01K\x02ee.", "underflow"),
        (b"\x80\x05]K\x01K\x02.", "STOP"),
        (b"\x80\x09](K\x01e.", "PROTO"),
        (b"\x80\x05]\x80\x05(K\x01e.", "PROTO"),
        (b"\x80\x05\x95\xff\x00\x00\x00\x00\x00\x00\x00](K\x01e.", "frame"),
        (b"\x80\x05](T\xff\xff\xff\xffe.", "malformed"),
        (b"\x80\x02](p1x\nK\x01e.", "malformed"),
    ],
)
def test_malformed_blocks_fall_back(scanner, block, reason):
    s = scanner.scan(block)
    assert s.status == "fallback"
    assert reason in s.reason
    assert len(s) == 0 and s.elements == []
    assert s.synthetic(0) is None
    assert s.element_reason(0) == s.reason


def test_truncated_at_every_offset(scanner):
    block = pickle.dumps(_documents(3) + _arrays()[:4], protocol=5)
    for n in range(len(block)):
        s = scanner.scan(block[:n])
        assert s.status == "fallback" and s.reason == "truncated pickle", n


def test_no_such_element(scanner):
    s = scanner.scan(pickle.dumps([1, 2]))
    assert s.synthetic(2) is None and s.element_reason(2) == "no such element"
    assert s.synthetic(-1) is None


def test_constants_mirror_each_other():
    assert _pyscan.MAX_PROTOCOL == pickle.HIGHEST_PROTOCOL
    if _pickle_scan is not None:
        assert _pickle_scan.MAX_PROTOCOL == _pyscan.MAX_PROTOCOL


def test_a_finished_scan_serves_many_threads(scanner):
    examples = _documents(30) + _arrays()
    block = pickle.dumps(examples, protocol=5)
    s = scanner.scan(block)
    expected = [pickle.dumps(x, protocol=5) for x in pickle.loads(block)]

    def reader(seed):
        for k in range(200):
            i = (seed * 7 + k) % len(expected)
            assert pickle.dumps(pickle.loads(s.synthetic(i)), protocol=5) == expected[i], i

    assert run_threads(reader, 8) == []


# ---------------------------------------------------------------------------------------------
# Incremental scanning: a prefix at a time


def test_feeding_prefixes(scanner):
    block = pickle.dumps(_documents(20) + _arrays(), protocol=5)
    whole = scanner.scan(block)
    s = scanner.PickleScanner()
    fed = 0
    step = 97
    while fed < len(block):
        fed = min(len(block), fed + step)
        status = s.feed(block[:fed], final=fed == len(block))
        if fed < len(block):
            # A prefix never yields elements: the top level is known only at STOP.
            assert status == "more" and len(s) == 0 and s.synthetic(0) is None
            assert fed < s.need <= len(block)
    assert s.status == "done"
    assert s.elements == whole.elements
    assert [s.synthetic(i) for i in range(len(s))] == [
        whole.synthetic(i) for i in range(len(whole))
    ]
    with pytest.raises(ValueError, match="from its start"):
        s.feed(block[:10])


def test_scanners_agree_on_every_prefix():
    if len(SCANNERS) < 2:
        pytest.skip("one scanner only: the compiled backend is not built")
    block = pickle.dumps(_documents(3) + _arrays()[:3] + _stdlib_objects()[:6], protocol=4)
    for n in range(0, len(block) + 1, 3):
        outcome = set()
        for mod in SCANNERS.values():
            s = mod.PickleScanner()
            status = s.feed(block[:n], final=False)
            outcome.add((status, s.need, s.reason))
        assert len(outcome) == 1, (n, outcome)


# ---------------------------------------------------------------------------------------------
# Random values and damaged pickles (hypothesis)

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.sampled_from(["shared", "key", "value"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.tuples(inner),
        st.tuples(inner, inner),
        st.tuples(inner, inner, inner, inner),
        st.dictionaries(st.sampled_from(["a", "b", "c", "shared"]), inner, max_size=4),
        st.frozensets(st.integers(0, 5), max_size=3),
    ),
    max_leaves=12,
)


@st.composite
def _blocks(draw):
    pool = draw(st.lists(_values, min_size=1, max_size=6))
    picks = draw(st.lists(st.integers(0, len(pool) - 1), min_size=1, max_size=12))
    examples = [pool[k] for k in picks]  # repeats: objects shared through the memo
    protocol = draw(st.integers(0, 5))
    return pickle.dumps(examples, protocol=protocol)


# ATLAS_FAST_FUZZ_EXAMPLES=20000 runs a long random fuzz, as tests/test_fuzz.py does; the
# normal suite runs a deterministic sample.
_LONG = int(os.environ.get("ATLAS_FAST_FUZZ_EXAMPLES", "0") or 0)


@settings(
    max_examples=_LONG or 150,
    deadline=None,
    derandomize=not _LONG,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(_blocks())
def test_random_blocks(block):
    check_block(block)


def _damaged_outcome(mod, damaged: bytes, whole):
    """Scan a damaged block: a fallback, or elements equal to the whole block's."""
    s = mod.scan(damaged)
    assert s.status in ("done", "fallback")
    if s.status == "fallback":
        assert s.synthetic(0) is None
        return ("fallback", s.reason)
    if isinstance(whole, Exception):  # the block itself does not load: anything but a crash
        out = []
        for i in range(len(s)):
            synthetic = s.synthetic(i)
            try:
                out.append(pickle.loads(synthetic) if synthetic is not None else None)
            except Exception as exc:
                out.append(type(exc))
        return ("done", len(s))
    assert isinstance(whole, list) and len(s) == len(whole)
    for i, expected in enumerate(whole):
        synthetic = s.synthetic(i)
        if synthetic is not None:
            assert _same_damaged(pickle.loads(synthetic), expected)
    return ("done", len(s))


def _same_damaged(a, b) -> bool:
    """``same``, for objects a damaged pickle may have built half (a UUID without ``int``
    cannot even be compared): then their pickles, else their types."""
    try:
        return same(a, b)
    except Exception:
        pass
    try:
        return _dumps_all(a, 5) == _dumps_all(b, 5)
    except Exception:
        return type(a) is type(b)


_TYPED_BLOCKS = [
    pickle.dumps(make(), protocol=protocol)
    for make in (_arrays, _stdlib_objects, lambda: _documents(4))
    for protocol in PROTOCOLS
]


@settings(
    max_examples=_LONG or 300,
    deadline=None,
    derandomize=not _LONG,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.one_of(_blocks(), st.sampled_from(_TYPED_BLOCKS)), st.data())
def test_damaged_blocks_never_crash(block, data):
    damaged = bytearray(block)
    for _ in range(data.draw(st.integers(1, 4))):
        how = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        at = data.draw(st.integers(0, max(0, len(damaged) - 1)))
        if how == "flip" and damaged:
            damaged[at] ^= 1 << data.draw(st.integers(0, 7))
        elif how == "cut":
            del damaged[at:]
        elif how == "insert":
            damaged[at:at] = data.draw(st.binary(min_size=1, max_size=9))
        elif damaged:
            del damaged[at]
    damaged = bytes(damaged)
    try:
        whole = pickle.loads(damaged)
    except Exception as exc:
        whole = exc
    outcomes = {name: _damaged_outcome(mod, damaged, whole) for name, mod in SCANNERS.items()}
    assert len(set(outcomes.values())) == 1, outcomes
    for name, mod in SCANNERS.items():  # a scanner reused from one example to the next
        fresh, reused = mod.scan(damaged), _REUSED[name]
        reused.reset()
        assert reused.feed(damaged) == fresh.status
        assert (reused.reason, reused.memo_entries) == (fresh.reason, fresh.memo_entries)
        assert [reused.synthetic(i) for i in range(len(reused))] == [
            fresh.synthetic(i) for i in range(len(fresh))
        ]


_REUSED = {name: mod.PickleScanner() for name, mod in SCANNERS.items()}


# ---------------------------------------------------------------------------------------------
# The bench corpora: every element takes the partial path


def _rows(n):
    """Table rows as a DataFrame-to-records export writes them."""
    return [
        {
            "row": i,
            "city": ["Paris", "Lima", "Oslo"][i % 3],
            "temperature": 12.5 + i / 10,
            "when": datetime.datetime(2024, 1, 1) + datetime.timedelta(hours=i),
            "price": decimal.Decimal(f"{i}.99"),
            "ok": i % 5 != 0,
            "count": np.int64(i),
            "ratio": np.float32(i / 7),
        }
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def bench_corpora():
    from atlas_fast.bench.corpus import blobs, stdlib_documents, token_arrays

    documents = list(stdlib_documents(300))
    return {
        "documents": documents,
        "tokens": list(token_arrays(iter(documents), 64)),
        "blobs": list(blobs(6)),
        "rows": _rows(200),
    }


@pytest.mark.parametrize("corpus", ["documents", "tokens", "blobs", "rows"])
@pytest.mark.parametrize("block_size", [16, 100])
def test_bench_corpora_take_the_partial_path(bench_corpora, corpus, block_size):
    examples = bench_corpora[corpus]
    blocks = [
        pickle.dumps(examples[k : k + block_size]) for k in range(0, len(examples), block_size)
    ]
    fallbacks = sum(check_block(block) for block in blocks)
    assert fallbacks == 0
    assert sum(len(pickle.loads(b)) for b in blocks) == len(examples)


def test_a_prefix_does_not_decide_an_element():
    """Why a block is decoded whole before any element is known: two lists pickled by
    CPython share a prefix that ends past where either's first element could end."""
    a = pickle.dumps([{}, 1, 2, 3], 2)
    b = pickle.dumps([{1: 2}, 3], 2)
    prefix = a[: next(k for k in range(len(a)) if a[k] != b[k])]
    assert prefix.endswith(b"K\x01K\x02")  # both first elements could still be open
    assert pickle.loads(a)[0] != pickle.loads(b)[0]
    for mod in [_pyscan] + ([_pickle_scan] if _pickle_scan is not None else []):
        s = mod.PickleScanner()
        assert s.feed(prefix, False) == "more" and len(s) == 0
        assert mod.scan(a).elements[0] != mod.scan(b).elements[0]


def test_reset_leaves_nothing_of_the_last_block(scanner):
    """A reset scanner (the compiled reader reuses one from a random read to the next) finds
    in a block what a fresh one finds: no memo entry, element or fallback of the last block."""
    shared = {"id": 0, "text": "t", "tags": ["a"]}
    blocks = [
        pickle.dumps([dict(shared, id=k) for k in range(6)], protocol=4),
        b"\x80\x04]\x94(h\x03K\x01e.",  # GET of index 3: stored by the block before only
        b"\x80\x04]\x94(K\x012K\x022e.",  # DUP: a fallback
        pickle.dumps([{f"k{m}": [m] for m in range(k, k + 900)} for k in range(3)], protocol=4),
        pickle.dumps([[k, "x", (k, "x")] for k in range(5)], protocol=2),
        pickle.dumps(["a", "b"], protocol=5)[:-3],  # truncated
        pickle.dumps([dict(shared, id=k) for k in range(2)], protocol=5),
    ]
    reused = scanner.PickleScanner()
    for block in blocks + blocks[::-1]:
        fresh = scanner.scan(block)
        reused.reset()
        assert reused.feed(block) == fresh.status
        assert (reused.reason, len(reused)) == (fresh.reason, len(fresh))
        assert reused.memo_entries == fresh.memo_entries
        assert reused.gets == fresh.gets
        for i in range(len(fresh)):
            assert reused.synthetic(i) == fresh.synthetic(i)
    assert scanner.scan(blocks[1]).reason == "GET of a memo index never stored"


def test_a_fallback_keeps_the_position_of_the_opcode_it_stopped_at(scanner):
    """Both scanners stop a fallback at the offending opcode: feeding fewer bytes after it
    is refused alike."""
    block = b"\x80\x04]\x94(K\x012e."  # DUP at offset 7
    s = scanner.PickleScanner()
    assert s.feed(block) == "fallback"
    with pytest.raises(ValueError, match="from its start"):
        s.feed(block[:2])


@pytest.mark.skipif(_pickle_scan is None, reason="the compiled scanner's threads")
def test_a_scan_being_read_cannot_be_reset():
    """synthetic() writes without the GIL: another thread's reset() or feed() then raises
    instead of changing the arrays under it."""
    block = pickle.dumps([{"k": "v" * 50_000, "n": [k] * 2000} for k in range(40)], protocol=4)
    s = _pickle_scan.scan(block)
    stop = threading.Event()
    errors = []

    def read():
        while not stop.is_set():
            for i in range(len(s)):
                if s.synthetic(i) is None:
                    errors.append(i)

    t = threading.Thread(target=read)
    t.start()
    refused = 0
    try:
        for _ in range(2000):
            try:
                s.reset()
            except RuntimeError:
                refused += 1
                continue
            s.feed(block)
    finally:
        stop.set()
        t.join()
    assert errors == []
    assert refused  # the reader was caught writing at least once
    for i in range(len(s)):
        assert pickle.loads(s.synthetic(i)) == pickle.loads(block)[i]
