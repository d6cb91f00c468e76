"""A damaged or crafted block costs bounded memory: operands the unpickler allocates by.

CPython's unpickler (3.10-3.14) honours some operands before it checks them against the
stream: a memo put (PUT's decimal text, LONG_BINPUT) grows the memo table to twice the index,
zero-filled; BINBYTES, BINBYTES8 and BYTEARRAY8 allocate their count before reading it. A few
bytes can ask for tens of GiB. Both cores refuse such a block before unpickling it
(``atlas_fast._core._pickle_scan.bound_check`` / ``_pickle_scan_py.find_unbounded``) with an
``AtlasFormatError`` naming the file and the block; the pure-Python core does it for
``trusted=False`` readers (a Python walk of the opcodes costs more than the unpickling it
guards, see docs/safety.md).

Every read here runs in a forked child whose address space is capped a few GiB above what it
has mapped: a reader that lets the allocation through gets a MemoryError (then wrapped as an
``AtlasFormatError``) instead of eating the machine, and the test fails on the MemoryError in
the error's chain.
"""

from __future__ import annotations

import pickle
import random
import struct

import pytest
import zstandard
from corrupt import write_blocks
from helpers import memory_errors, run_capped

from atlas_fast import AtlasDatasetWriter, AtlasFormatError, BlockShuffleSampler
from atlas_fast.cli.verify import verify

HEADROOM = 3 << 30  # the cap: this much above what the child has mapped
BLOCK_SIZE = 4
N_BLOCKS = 3
BAD = 1  # the block holding the operand

# (name, the element's opcodes): each asks the unpickler for 8-32 GiB before any check.
BOMBS = {
    "PUT": b"]p1000000000\n",  # a memo index of 10**9: a 16 GiB memo table
    "PUT, spaced": b"]p 1_900_000_000 \n",  # PyLong_FromString's spaces and underscores
    "LONG_BINPUT": b"]r" + struct.pack("<I", 0x7FFFFFF0),
    "BINBYTES": b"B" + struct.pack("<I", 0xFFFFFFF0) + b"abc",
    "BINBYTES8": b"\x8e" + struct.pack("<Q", 9 << 30) + b"abc",
    "BYTEARRAY8": b"\x96" + struct.pack("<Q", 9 << 30) + b"abc",
}
PROTOCOLS = [2, 3, 4, 5]


def bomb_block(element: bytes, protocol: int, framed: bool = False) -> bytes:
    """A block of BLOCK_SIZE elements (small ints, then ``element``'s opcodes) in
    ``protocol``; ``framed``: the body in one FRAME, as pickle.dumps frames protocols 4-5."""
    body = b"](K\x00K\x01K\x02" + element + b"e."
    if framed:
        body = b"\x95" + struct.pack("<Q", len(body)) + body
    return bytes([0x80, protocol]) + body


def good_block(b: int, protocol: int) -> bytes:
    return pickle.dumps([b * BLOCK_SIZE + k for k in range(BLOCK_SIZE)], protocol)


def make_dataset(root, bad_block: bytes, protocol: int, strategy: int):
    """A one-shard dataset of N_BLOCKS blocks, block BAD being ``bad_block``."""
    with AtlasDatasetWriter(root, 100, BLOCK_SIZE, compression_strategy=strategy) as w:
        for k in range(N_BLOCKS * BLOCK_SIZE):
            w.add_example(k)
    blocks = [good_block(b, protocol) for b in range(N_BLOCKS)]
    blocks[BAD] = bad_block
    if strategy:
        blocks = [zstandard.ZstdCompressor().compress(b) for b in blocks]
    write_blocks(root / "0", blocks)
    return root / "0" / "data.bin"


def _refused(read, data_path) -> bool:
    """``read()`` raises an AtlasFormatError naming ``data_path`` and block BAD, before any
    allocation failed."""
    try:
        read()
    except AtlasFormatError as exc:
        assert str(data_path) in str(exc) and f"block {BAD}" in str(exc), exc
        assert not memory_errors(exc), f"the allocation was attempted: {exc!r}"
        return True
    raise AssertionError("the block was read")


def _expect(request, atlas, trusted):
    """The pure-Python core lets a trusted block's operands through (and fails here)."""
    if atlas.__name__ == "atlas_fast._python" and trusted:
        reason = (
            "the pure-Python core checks operands for trusted=False readers only: a Python walk "
            "of the opcodes costs 1.2-3.8x the unpickling (docs/safety.md)"
        )
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


# -- each opcode, each protocol, each way of reading ------------------------------------------


@pytest.mark.parametrize("trusted", [True, False], ids=["trusted", "untrusted"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("bomb", list(BOMBS))
def test_each_operand_is_refused_before_it_allocates(
    request, atlas, tmp_path, bomb, protocol, trusted
):
    _expect(request, atlas, trusted)
    data_path = make_dataset(tmp_path / "ds", bomb_block(BOMBS[bomb], protocol), protocol, 0)
    root = tmp_path / "ds"
    inside = BAD * BLOCK_SIZE + 2

    def check():
        ds = atlas.AtlasDataset(root, trusted=trusted)
        assert _refused(lambda: ds[inside], data_path)  # a random read: the block's first
        assert ds[0] == 0 and ds[(BAD + 1) * BLOCK_SIZE] == (BAD + 1) * BLOCK_SIZE
        assert _refused(lambda: ds[inside], data_path)  # and again
        ds = atlas.AtlasDataset(root, trusted=trusted)
        assert _refused(lambda: ds.__getitems__([1, inside, 2 * BLOCK_SIZE + 1]), data_path)
        ds = atlas.AtlasDataset(root, trusted=trusted)
        assert _refused(lambda: list(ds), data_path)
        ds = atlas.AtlasDataset(root, trusted=trusted)
        assert _refused(lambda: [ds[i] for i in range(len(ds))], data_path)  # in order
        return True

    assert run_capped(check, HEADROOM)


@pytest.mark.parametrize("trusted", [True, False], ids=["trusted", "untrusted"])
@pytest.mark.parametrize("strategy", [0, 1])
@pytest.mark.parametrize("bomb", ["LONG_BINPUT", "PUT", "BYTEARRAY8"])
def test_framed_and_compressed_blocks_through_the_sampler(
    request, atlas, tmp_path, bomb, strategy, trusted
):
    """Inside a FRAME (protocols 4-5), stored compressed or not, read in the order
    BlockShuffleSampler gives, one example at a time and in batches; verify reports it."""
    _expect(request, atlas, trusted)
    root = tmp_path / "ds"
    data_path = make_dataset(root, bomb_block(BOMBS[bomb], 5, framed=True), 5, strategy)

    def check():
        ds = atlas.AtlasDataset(root, trusted=trusted)
        order = list(BlockShuffleSampler(ds, window_blocks=2, seed=3))
        assert _refused(lambda: [ds[i] for i in order], data_path)
        ds = atlas.AtlasDataset(root, trusted=trusted)
        batches = [order[k : k + 3] for k in range(0, len(order), 3)]
        assert _refused(lambda: [ds.__getitems__(batch) for batch in batches], data_path)
        ds.close()
        report = verify(root, trusted=trusted, jobs=1, readers=atlas)
        (problem,) = report["problems"]
        assert problem["block"] == BAD and problem["kind"] == "AtlasFormatError", problem
        assert "memo" in problem["message"] or "counts" in problem["message"], problem
        return True

    assert run_capped(check, HEADROOM)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_operands_within_the_block_are_read(atlas, tmp_path, protocol):
    """The rule refuses nothing a pickler writes: BINPUT 255, a PUT and a LONG_BINPUT of an
    index below the block's length, and counts that fit all read (untrusted: checked on both
    cores)."""
    element = (
        b"]q\xff]p250\n]r" + struct.pack("<I", 260) + b"C\x02ab\x8e" + struct.pack("<Q", 1) + b"z"
    )
    block = bomb_block(element, protocol)[:-2] + b"e."
    block = block.replace(b"K\x00K\x01K\x02", b"")
    assert len(pickle.loads(block)) == 5
    root = tmp_path / "ds"
    with AtlasDatasetWriter(root, 100, 5, compression_strategy=0) as w:
        for k in range(5):
            w.add_example(k)
    write_blocks(root / "0", [block])
    ds = atlas.AtlasDataset(root, trusted=False)
    assert [ds[i] for i in range(5)] == [[], [], [], b"ab", b"z"]


# -- the rule, on both cores: the compiled check and its Python twin --------------------------


def _twin():
    from atlas_fast._core import _pickle_scan_py

    return _pickle_scan_py


def _checks():
    try:
        checks = [_twin().find_unbounded]
    except ImportError:  # a tree without the check (the tests' own run against an old tree)
        return []
    try:
        from atlas_fast._core import _pickle_scan
    except ImportError:
        return checks
    return [_pickle_scan.bound_check, *checks]


def test_memo_slack_is_one_constant():
    pytest.importorskip("atlas_fast._core._pickle_scan")
    from atlas_fast._core import _pickle_scan

    assert _pickle_scan.MEMO_SLACK == _twin().MEMO_SLACK


@pytest.mark.parametrize("check", _checks(), ids=lambda f: f.__module__.rsplit(".", 1)[-1])
def test_what_the_check_finds(check):
    for name, element in BOMBS.items():
        for protocol in PROTOCOLS:
            block = bomb_block(element, protocol, framed=protocol >= 4)
            found = check(block)
            assert found is not None, (name, protocol)
            op, pos, value, limit = found
            assert block[pos] == op and value > limit, (name, found)
    for protocol in range(6):
        for sample in (
            [],
            [1, "x" * 300, b"y" * 70000, bytearray(b"z")],
            [[i] for i in range(999)],
        ):
            assert check(pickle.dumps(sample, protocol)) is None
    # A count past the end is refused whatever it counts; a negative one is the load's to say.
    assert check(b"\x80\x02X\xff\x00\x00\x00ab.")[:3] == (0x58, 2, 255)
    assert check(b"\x80\x02\x8b\xff\xff\xff\xff.") is None
    assert check(b"\x80\x02]p12") is None  # no newline: the load fails first


def test_the_compiled_check_and_its_twin_agree():
    pytest.importorskip("atlas_fast._core._pickle_scan")
    from atlas_fast._core import _pickle_scan

    rng = random.Random(7)
    samples = [
        [{"id": i, "text": "r" * i, "b": b"B" * i, "f": i / 3} for i in range(20)],
        [bytearray(b"\x96" * 40), ("p1\n", 2**70), {"x": [None, True]}],
        # Dense opcodes over kilobytes: the compiled check walks those in lanes.
        [{"id": i, "k": "r" * (i % 7), "v": i * 0.5, "n": -i} for i in range(400)],
    ]
    found = 0
    for _ in range(3000):
        block = bytearray(pickle.dumps(rng.choice(samples), rng.randrange(6)))
        for _ in range(rng.randrange(1, 4)):
            block[rng.randrange(len(block))] = rng.randrange(256)
        c = _pickle_scan.bound_check(bytes(block))
        p = _twin().find_unbounded(bytes(block))
        assert (c is None) == (p is None) and (c is None or c[:2] == p[:2]), (bytes(block), c, p)
        found += c is not None
    assert found > 30  # the damage drew operands of the class
