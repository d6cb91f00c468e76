"""trusted=False: plain data reads, anything that would run code is refused before it runs."""

from __future__ import annotations

import array
import collections
import datetime
import decimal
import fractions
import io
import ipaddress
import os
import pathlib
import pickle
import types
import uuid

import numpy as np
import pytest
from corrupt import read_all, read_blocks, write_blocks, write_dataset
from helpers import assert_same, case_dataset, load_expected

from atlas_fast import AtlasDatasetShardWriter, AtlasDatasetWriter, UnsafePickleError
from atlas_fast._safe_pickle import make_loads


class Exploit:
    """Pickles as a call of os.system: unpickling it with pickle.loads runs a shell command."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class Point:
    """A user class, allowed only when listed in allowed_globals."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return type(other) is Point and (self.x, self.y) == (other.x, other.y)

    def __hash__(self):
        return hash((self.x, self.y))


PLAIN = [
    0,
    -(2**100),
    1.5,
    float("inf"),
    True,
    None,
    2 - 3j,
    "text ✓",
    b"\x00bytes",
    bytearray(b"mutable"),
    [1, [2, [3]]],
    (1, "a"),
    {"k": {"nested": [1, 2]}},
    {1, 2, 3},
    frozenset({"a"}),
    collections.OrderedDict(a=1, b=2),
    decimal.Decimal("3.14"),
    slice(1, 10, 2),
    datetime.datetime(2024, 5, 17, 12, 30, tzinfo=datetime.timezone.utc),
    datetime.date(2020, 2, 29),
    datetime.time(23, 59, 1),
    datetime.timedelta(days=3, seconds=7),
    np.arange(12, dtype=np.int64).reshape(3, 4),
    np.linspace(0, 1, 7, dtype=np.float32),
    np.array(["a", "bc"]),
    np.array([b"x", b"yz"]),
    np.array([1, "mixed", None], dtype=object),
    np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")]),
    np.asfortranarray(np.ones((2, 3))),
    np.array(["2020-01-01", "2021-06-30"], dtype="datetime64[D]"),
    np.float64(2.5),
    np.int8(-3),
    np.bool_(True),
    np.complex64(1j),
    np.datetime64("2020-01-01T00:00"),
    np.dtype("<u2"),
]

# The standard library's plain value types trusted=False admits (each pickled in every
# protocol by test_plain_data_loads and read through both backends by
# test_untrusted_reads_plain_data).
STDLIB_VALUES = [
    fractions.Fraction(-22, 7),
    fractions.Fraction(10**40 + 1, 3),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    uuid.uuid4(),
    collections.deque([1, "two", 3.0], maxlen=5),
    collections.deque(),
    collections.Counter("abracadabra"),
    collections.defaultdict(list, {"a": [1], "b": []}),
    collections.defaultdict(None, {1: 2}),
    collections.OrderedDict([("z", 1), ("a", collections.OrderedDict(b=2))]),
    ipaddress.IPv4Address("192.0.2.1"),
    ipaddress.IPv6Address("2001:db8::1"),
    ipaddress.IPv4Network("198.51.100.0/24"),
    ipaddress.IPv6Network("2001:db8::/32"),
    ipaddress.IPv4Interface("192.0.2.5/24"),
    ipaddress.IPv6Interface("2001:db8::5/64"),
    pathlib.PurePosixPath("data/shard/0"),
    pathlib.PureWindowsPath("C:/data/file.txt"),
    pathlib.PosixPath("/var/data/x.bin"),
    array.array("i", [1, -2, 3]),
    array.array("d", [0.5, 1e300]),
    array.array("u", "text"),
    types.SimpleNamespace(a=1, b=[2, 3], c=types.SimpleNamespace()),
    range(3, 100, 7),
    decimal.Decimal("-1.5e-7"),
]
PLAIN += STDLIB_VALUES


def _same(a, b):
    if isinstance(a, np.dtype):
        return a == b
    if isinstance(a, np.ndarray) and a.dtype.hasobject:
        return b.dtype == a.dtype and a.tolist() == b.tolist()
    if isinstance(a, np.generic):
        return type(a) is type(b) and a == b
    if isinstance(a, collections.defaultdict):
        return type(b) is type(a) and a == b and a.default_factory is b.default_factory
    if isinstance(a, collections.OrderedDict):
        return type(b) is type(a) and list(a.items()) == list(b.items())
    if isinstance(a, collections.deque):
        return type(b) is type(a) and a == b and a.maxlen == b.maxlen
    if isinstance(a, array.array):
        return type(b) is type(a) and a.typecode == b.typecode and a == b
    if isinstance(
        a,
        (
            set,
            frozenset,
            decimal.Decimal,
            slice,
            bytearray,
            complex,
            fractions.Fraction,
            uuid.UUID,
            collections.Counter,
            ipaddress.IPv4Address,
            ipaddress.IPv6Address,
            ipaddress.IPv4Network,
            ipaddress.IPv6Network,
            pathlib.PurePath,
            types.SimpleNamespace,
            range,
        ),
    ):
        return type(a) is type(b) and a == b
    from helpers import same

    return same(a, b)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_plain_data_loads(protocol):
    loads = make_loads()
    for value in PLAIN:
        got = loads(pickle.dumps(value, protocol=protocol))
        assert _same(value, got), (protocol, value, got)


def test_stdlib_values_load_each_alone():
    """Each admitted standard-library type, alone and as the whole pickle, in every protocol
    (``Fraction`` text as it pickles, with and without spaces and sign)."""
    loads = make_loads()
    for value in STDLIB_VALUES:
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            got = loads(pickle.dumps(value, protocol=protocol))
            assert _same(value, got), (protocol, value, got)
    for text, want in [("3/4", fractions.Fraction(3, 4)), (" -12 ", fractions.Fraction(-12))]:
        data = f"cfractions\nFraction\n(V{text}\ntR.".encode()
        assert loads(data) == want


def _stack_global(module: str, name: str) -> bytes:
    """A protocol-4 pickle's start naming ``module``'s ``name`` (a dotted qualified name)."""
    out = b"\x80\x04"
    for text in (module.encode(), name.encode()):
        out += b"\x8c" + bytes([len(text)]) + text
    return out + b"\x93"


@pytest.mark.parametrize(
    "payload, refused",
    [
        # Fraction from text with an exponent: 10**999999999 from a few bytes
        (b"cfractions\nFraction\n(S'1e999999999'\ntR.", "Fraction"),
        (b"cfractions\nFraction\n(S'1.5'\ntR.", "Fraction"),
        # the helpers of admitted types, for another type
        (b"carray\n_array_reconstructor\n(ccollections\nOrderedDict\nS'i'\nI8\nC\x00tR.", "array"),
        (
            b"ccopyreg\n_reconstructor\n(ccollections\nOrderedDict\ncbuiltins\nobject\nNtR.",
            "copyreg",
        ),
        (b"ccopyreg\n_reconstructor\n(cuuid\nUUID\ncbuiltins\nint\nI5\ntR.", "copyreg"),
        # methods, attributes and neighbours of admitted types and modules
        (_stack_global("pathlib", "PosixPath.touch") + b".", "PosixPath.touch"),
        (_stack_global("pathlib", "Path.write_text") + b".", "Path.write_text"),
        (_stack_global("uuid", "UUID.__new__") + b".", "UUID.__new__"),
        (b"ctypes\nFunctionType\n.", "types.FunctionType"),
        (b"ctypes\nCodeType\n.", "types.CodeType"),
        (b"cuuid\n_load_system_functions\n(tR.", "uuid._load_system_functions"),
        (b"cipaddress\nip_address\n(S'1.2.3.4'\ntR.", "ipaddress.ip_address"),
        (b"czoneinfo\nZoneInfo\n(S'UTC'\ntR.", "zoneinfo.ZoneInfo"),
        (b"ccollections\nnamedtuple\n(S'P'\nS'x y'\ntR.", "collections.namedtuple"),
        (b"cpathlib\nPath\n(S'/'\ntR.", "pathlib.Path"),
        (b"cdecimal\ngetcontext\n(tR.", "decimal.getcontext"),
    ],
)
def test_hostile_reduce_of_a_type_not_admitted_is_refused(payload, refused):
    with pytest.raises(UnsafePickleError, match=refused.replace(".", r"\.")):
        make_loads()(payload)


def test_hostile_method_of_an_admitted_type_runs_nothing_through_either_backend(atlas, tmp_path):
    """``pathlib.Path.touch`` is not ``pathlib.PosixPath``: a block that would create a file
    through it under ``pickle.loads`` is refused, the file never made, both backends."""
    marker = tmp_path / "pwned"
    touch = pickle.dumps(pathlib.PosixPath.touch, protocol=4)  # by qualified name: Path.touch
    hostile = (
        b"\x80\x04"
        + touch[2:-1]  # the STACK_GLOBAL of pathlib Path.touch, without its STOP
        + pickle.dumps((pathlib.PosixPath(marker),), protocol=4)[2:-1]
        + b"R"  # REDUCE: PosixPath.touch(PosixPath(marker))
        + b"."
    )
    pickle.loads(hostile)  # what the reference's pickle.loads does with it
    assert marker.exists()
    marker.unlink()
    root = tmp_path / "ds"
    examples = write_dataset(root, 0)
    blocks = read_blocks(root / "1")
    blocks[2] = b"\x80\x04](K\x01K\x02K\x03" + hostile[2:-1] + b"e."
    write_blocks(root / "1", blocks)
    ds = atlas.AtlasDataset(root, trusted=False)
    with pytest.raises(UnsafePickleError, match=r"pathlib\.Path\.touch.*block 2"):
        ds[40 + 2 * 4 + 3]
    with pytest.raises(UnsafePickleError, match=r"pathlib\.Path\.touch"):
        atlas.AtlasDatasetShard(root / "1", trusted=False).read_block(2)
    assert not marker.exists()
    assert_same(ds[40 + 3 * 4], examples[40 + 3 * 4])  # the other blocks still read


def test_numpy_1x_names_load():
    """Pickles written under numpy 1.x name numpy.core.*; they load without the numpy 2 shim."""
    data = pickle.dumps([np.arange(3), np.float64(1.5)], protocol=2)
    old = data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    if old == data:
        old = data.replace(b"numpy.core.multiarray", b"numpy._core.multiarray")
    got = make_loads()(old)
    assert np.array_equal(got[0], np.arange(3)) and got[1] == 1.5


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_exploit_refused_before_it_runs(tmp_path, protocol):
    marker = tmp_path / "pwned"
    data = pickle.dumps([1, Exploit(f"touch {marker}")], protocol=protocol)
    with pytest.raises(UnsafePickleError, match=r"(posix|os|nt)\.system"):
        make_loads()(data)
    assert not marker.exists()


@pytest.mark.parametrize(
    "payload",
    [
        b"cos\nsystem\n(S'true'\ntR.",  # GLOBAL + REDUCE
        b"(cos\nsystem\nS'true'\no.",  # OBJ
        b"(S'true'\nios\nsystem\n.",  # INST
        b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x04true\x85R.",  # STACK_GLOBAL
        b"cbuiltins\ngetattr\n(cbuiltins\nstr\nS'join'\ntR.",  # getattr: a door to anything
        b"cbuiltins\neval\n(S'1'\ntR.",
        b"c__builtin__\neval\n(S'1'\ntR.",  # Python 2 name, mapped by fix_imports
        b"csubprocess\ncheck_call\n(S'true'\ntR.",
        b"cnumpy\nload\n(S'x'\ntR.",
        b"cnumpy.testing._private.utils\nrunstring\n(S'1'\n}tR.",
        b"Pabc\n.",  # persistent id
        b"\x80\x02\x82\x01.",  # EXT1 (extension registry)
    ],
)
def test_import_paths_refused(payload):
    with pytest.raises((UnsafePickleError, pickle.UnpicklingError, ValueError)) as info:
        make_loads()(payload)
    if b"\x82" not in payload:  # EXT1 with an empty registry is refused by pickle itself
        assert isinstance(info.value, UnsafePickleError)


def test_memory_bombs_refused():
    loads = make_loads()
    with pytest.raises(UnsafePickleError, match="bytearray"):
        loads(b"cbuiltins\nbytearray\n(I10000000000000\ntR.")
    with pytest.raises(UnsafePickleError, match="bytes"):
        loads(b"cbuiltins\nbytes\n(I10000000000000\ntR.")
    with pytest.raises(UnsafePickleError, match="encode"):
        loads(b"c_codecs\nencode\n(S'x'\nS'rot13'\ntR.")


def test_allowed_globals_admit_listed_names():
    data = pickle.dumps([Point(1, 2)])
    with pytest.raises(UnsafePickleError, match="Point"):
        make_loads()(data)
    assert make_loads([Point])(data) == [Point(1, 2)]
    assert make_loads([f"{Point.__module__}.Point"])(data) == [Point(1, 2)]
    assert make_loads(f"{Point.__module__}.Point")(data) == [Point(1, 2)]
    with pytest.raises(UnsafePickleError, match="system"):
        make_loads([Point])(pickle.dumps(Exploit("true")))


def test_allowed_globals_validation():
    with pytest.raises(ValueError):
        make_loads(["nodots"])
    with pytest.raises(TypeError):
        make_loads([42])


# -- through the readers ------------------------------------------------------------------


@pytest.fixture
def exploit_dataset(tmp_path):
    """A dataset whose second block, once unpickled by pickle.loads, creates a marker file."""
    marker = tmp_path / "pwned"
    root = tmp_path / "ds"
    with AtlasDatasetWriter(root, 20, 4, compression_strategy=1) as w:
        for i in range(20):
            w.add_example(Exploit(f"touch {marker}") if i == 6 else {"i": i})
    return root, marker


def test_untrusted_dataset_refuses_exploit(atlas, exploit_dataset):
    root, marker = exploit_dataset
    ds = atlas.AtlasDataset(root, trusted=False)
    assert ds[0] == {"i": 0}
    # The example that reaches the refused global is refused, however it is decoded (the
    # compiled core's partial decoding may still serve the other examples of its block).
    with pytest.raises(UnsafePickleError) as info:
        ds[6]
    message = str(info.value)
    assert "system" in message
    assert str(root / "0" / "data.bin") in message and "block 1" in message
    assert not marker.exists()
    assert ds[8] == {"i": 8}  # other blocks still read
    shard = atlas.AtlasDatasetShard(root / "0", trusted=False)
    with pytest.raises(UnsafePickleError):
        shard[6]
    assert not marker.exists()


def test_trusted_is_the_default(atlas, exploit_dataset):
    """The default unpickles as the reference does (and so runs the exploit)."""
    root, marker = exploit_dataset
    ds = atlas.AtlasDataset(root)
    assert ds.trusted is True
    ds[6]
    assert marker.exists()


def test_untrusted_allowed_globals_admit_class(atlas, tmp_path):
    root = tmp_path / "points"
    with AtlasDatasetShardWriter(root, 4, compression_strategy=0) as w:
        for i in range(10):
            w.add_example(Point(i, -i))
    with pytest.raises(UnsafePickleError, match="Point"):
        atlas.AtlasDatasetShard(root, trusted=False)[0]
    shard = atlas.AtlasDatasetShard(root, trusted=False, allowed_globals=[Point])
    assert read_all(shard) == [Point(i, -i) for i in range(10)]
    name = f"{Point.__module__}.Point"
    shard = atlas.AtlasDatasetShard(root, trusted=False, allowed_globals=(name,))
    assert shard[9] == Point(9, -9)


def test_allowed_globals_need_untrusted(atlas, tmp_path):
    root = tmp_path / "ds"
    write_dataset(root, 0)
    with pytest.raises(ValueError, match="trusted=False"):
        atlas.AtlasDataset(root, allowed_globals=["x.y"])
    with pytest.raises(TypeError):
        atlas.AtlasDataset(root, trusted="no")


@pytest.mark.parametrize("strategy", [0, 1, 2, 3])
def test_untrusted_reads_plain_data(atlas, tmp_path, strategy):
    root = tmp_path / "plain"
    examples = PLAIN * 2
    with AtlasDatasetWriter(root, 40, 4, compression_strategy=strategy) as w:
        for x in examples:
            w.add_example(x)
    ds = atlas.AtlasDataset(root, trusted=False)
    for i, want in enumerate(examples):
        assert _same(want, ds[i]), (i, want)


def test_untrusted_reads_reference_fixtures(atlas, reference_case):
    expected = load_expected(reference_case)
    ds = atlas.AtlasDataset(case_dataset(reference_case), trusted=False)
    for i, want in enumerate(expected):
        assert_same(ds[i], want, f"{reference_case}[{i}]")


def test_untrusted_survives_pickling(atlas, tmp_path):
    root = tmp_path / "points"
    with AtlasDatasetWriter(root, 10, 4, compression_strategy=0) as w:
        for i in range(10):
            w.add_example(Point(i, i))
    ds = atlas.AtlasDataset(root, trusted=False, allowed_globals=[Point])
    ds[0]
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.trusted is False and copy.allowed_globals == (Point,)
    assert copy.shards[0].trusted is False
    assert copy[9] == Point(9, 9)
    shard = pickle.loads(pickle.dumps(ds.shards[0]))
    assert shard.trusted is False and shard[1] == Point(1, 1)
    plain = pickle.loads(pickle.dumps(atlas.AtlasDataset(root)))
    assert plain.trusted is True


def test_untrusted_refusal_is_located_in_any_block(atlas, tmp_path):
    root = tmp_path / "ds"
    write_dataset(root, 0)
    shard_dir = root / "1"
    blocks = read_blocks(shard_dir)
    blocks[7] = pickle.dumps([1, 2, 3, io.BytesIO()])
    write_blocks(shard_dir, blocks)
    ds = atlas.AtlasDataset(root, trusted=False)
    with pytest.raises(UnsafePickleError, match=r"_io\.BytesIO.*data\.bin, block 7"):
        ds[40 + 7 * 4 + 3]  # the example holding the refused global
