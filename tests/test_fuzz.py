"""Fuzzing: damaged copies of real datasets never crash or hang a reader.

Hypothesis mutates copies of reference fixtures and of datasets our writer wrote (with
checksum sidecars): truncations, byte flips and overwrites in data.bin / index.npy /
zstd_dict.bin / checksums.npy, edited meta.json values, appended bytes and deleted files.
Then it opens the copy and reads every example (trusted or not, per draw) on the backend of
the ``atlas`` fixture. The only outcomes allowed are examples, ``AtlasFormatError``,
``UnsafePickleError`` or ``IndexError``. A corrupt byte may also decode to a different but
valid pickle: that is accepted (only list type and length are checkable without checksums).
``verify`` runs on the same copy: it must return a report, never raise, and it must report
a problem whenever reading raised ``AtlasFormatError`` or ``UnsafePickleError``.

The normal suite runs a small deterministic sample; ``ATLAS_FAST_FUZZ_EXAMPLES=20000`` runs
a long random one (see CONTRIBUTING.md).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pickle_forms
import pytest
from corrupt import write_blocks, write_dataset
from helpers import case_dataset, memory_errors, run_capped
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from atlas_fast import AtlasDatasetWriter, AtlasFormatError, UnsafePickleError
from atlas_fast.cli.verify import verify

_LONG = int(os.environ.get("ATLAS_FAST_FUZZ_EXAMPLES", "0") or 0)
MAX_EXAMPLES = _LONG or 40
FIXTURE_BASES = ["mixed_s0_b4", "mixed_s1_b4", "mixed_s2_b4", "mixed_s3_b4", "one_example_s2"]
FIXTURE_BASES += ["tiny_index_s0", "block1_s3", "eleven_shards_s1"]

META_VALUES = [-1, 0, 1, 2, 3, 4, 7, 100, 2**31, 2**63, 2**64, -(2**63), 1.5, "1", None, True]
META_VALUES += [[], {}, [1, 2], float("nan")]

META_KEYS = ["version", "block_size", "stored_examples", "compression_strategy", "shard_sizes"]
META_KEYS += ["compression_level", "compression_dict_size", "extra"]

OUTCOMES: Counter = Counter()


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> list:
    """Intact datasets to damage: fixture copies and our own (strategies 0-3, checksums)."""
    root = tmp_path_factory.mktemp("fuzz-bases")
    found = [case_dataset(case) for case in FIXTURE_BASES]  # tests/golden: always there
    for strategy in range(4):
        path = root / f"ours_s{strategy}"
        write_dataset(path, strategy, n=60, shard_size=30, block_size=3, checksums=True)
        found.append(path)
    return found


def _files(root: Path) -> list:
    return sorted(p for p in root.rglob("*") if p.is_file())


@st.composite
def mutation(draw, files: list, root: Path):
    # Mostly the binary files: damaged metadata is refused at open, which is cheap to reach.
    metas = [p for p in files if p.name == "meta.json"]
    binaries = [p for p in files if p.name != "meta.json"] or metas
    path = draw(st.sampled_from(draw(st.sampled_from([binaries] * 3 + [metas]))))
    size = path.stat().st_size if path.exists() else 0
    if path.name == "meta.json":
        kind = draw(st.sampled_from(["meta", "meta", "flip", "truncate", "delete"]))
    else:
        kind = draw(st.sampled_from(["flip", "flip", "flip", "overwrite", "truncate", "append"]))
        kind = draw(st.sampled_from([kind] * 7 + ["delete"]))
    if kind == "meta":
        key = draw(st.sampled_from(META_KEYS))
        return ("meta", path, key, draw(st.sampled_from(META_VALUES)))
    if kind == "flip":
        # Bias towards the start: headers (npy, zstd frame, pickle protocol) matter most.
        pos = draw(st.one_of(st.integers(0, 32), st.integers(0, max(0, size - 1))))
        return ("flip", path, pos, draw(st.integers(1, 255)))
    if kind == "overwrite":
        pos = draw(st.integers(0, max(0, size - 1)))
        return ("overwrite", path, pos, draw(st.binary(min_size=1, max_size=16)))
    if kind == "truncate":
        return ("truncate", path, draw(st.integers(0, max(0, size - 1))))
    if kind == "append":
        return ("append", path, draw(st.binary(min_size=1, max_size=32)))
    return ("delete", path)


def _apply(m) -> None:
    kind, path = m[0], m[1]
    if not path.exists():
        return
    if kind == "delete":
        path.unlink()
    elif kind == "truncate":
        os.truncate(path, m[2])
    elif kind == "append":
        with open(path, "ab") as f:
            f.write(m[2])
    elif kind == "flip":
        data = bytearray(path.read_bytes())
        if data:
            data[m[2] % len(data)] ^= m[3]
            path.write_bytes(bytes(data))
    elif kind == "overwrite":
        data = bytearray(path.read_bytes())
        pos = min(m[2], len(data))
        data[pos : pos + len(m[3])] = m[3]
        path.write_bytes(bytes(data))
    elif kind == "meta":
        try:
            value = json.loads(path.read_text())
        except ValueError:
            return
        if isinstance(value, dict):
            value[m[2]] = m[3]
            path.write_text(json.dumps(value))


def _bounded(atlas, trusted: bool) -> bool:
    """Whether reading a block never asks the unpickler for more than the block can hold
    (tests/test_bounded.py): every read but the pure-Python core's trusted ones."""
    return atlas.__name__ != "atlas_fast._python" or not trusted


def _read_everything(atlas, root: Path, trusted: bool, shuffle_seed=None) -> str:
    """Open and read every example (in order, or in an order shuffled by ``shuffle_seed``:
    the compiled core's random reads decode one example out of a block); returns the outcome,
    raising on a disallowed one (a MemoryError behind an error, where reads are bounded)."""
    try:
        ds = atlas.AtlasDataset(root, trusted=trusted)
    except AtlasFormatError:
        return "refused at open"
    failed = None
    order = list(range(len(ds)))
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(order)
    for i in order:
        try:
            ds[i]
        except (AtlasFormatError, UnsafePickleError) as exc:
            assert str(root) in str(exc), f"the error does not name a file under {root}: {exc}"
            assert not (_bounded(atlas, trusted) and memory_errors(exc)), repr(exc)
            failed = type(exc).__name__
        except IndexError:
            failed = failed or "IndexError"
    try:
        ds[len(ds)]
    except IndexError:
        pass
    else:
        raise AssertionError("reading past the end did not raise IndexError")
    ds.close()
    return f"block error: {failed}" if failed else "read"


def _count_unraisable(unraisable) -> None:
    """numpy and CPython report some failures while tearing down half-built objects of a
    corrupt pickle as "Exception ignored" (numpy 2.4: ``get_clear_loop not set``), which no
    caller can catch. They are not crashes: count them instead of failing on them."""
    OUTCOMES[f"unraisable: {type(unraisable.exc_value).__name__}"] += 1


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=not _LONG,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_fuzz_damaged_datasets(atlas, bases, data):
    base = data.draw(st.sampled_from(bases), label="base")
    trusted = data.draw(st.booleans(), label="trusted")
    with tempfile.TemporaryDirectory(prefix="atlas-fuzz-") as tmp:
        root = Path(tmp) / "ds"
        shutil.copytree(base, root)
        files = _files(root)
        mutations = data.draw(st.lists(mutation(files, root), min_size=1, max_size=3))
        for m in mutations:
            _apply(m)
        shuffle_seed = data.draw(st.none() | st.integers(0, 2**16), label="random order")

        def read_and_verify():
            OUTCOMES.clear()  # the child's own counts go back
            hook, sys.unraisablehook = sys.unraisablehook, _count_unraisable
            try:
                outcome = _read_everything(atlas, root, trusted, shuffle_seed)
            finally:
                sys.unraisablehook = hook
            report = verify(root, trusted=trusted, jobs=2, readers=atlas)
            if outcome != "read":
                assert not report["ok"], f"reading gave {outcome!r} but verify found nothing"
            return outcome, dict(OUTCOMES)

        # Under an address-space cap: a damaged operand the reader let through fails there.
        outcome, seen = run_capped(read_and_verify)
        OUTCOMES.update(seen)
        OUTCOMES[outcome] += 1


def test_fuzz_outcomes_were_varied():
    """The bounded run exercises both clean reads and errors (guards a broken harness)."""
    if not OUTCOMES:
        pytest.skip("run together with test_fuzz_damaged_datasets")
    print(f"\nfuzz outcomes: {dict(OUTCOMES)}")
    assert any(k != "read" and not k.startswith("unraisable") for k in OUTCOMES)


# -- damaged blocks of hand-made pickles, read in random order --------------------------------
#
# Blocks in the forms other picklers write (tests/pickle_forms.py: protocols 2-5, memo puts and
# gets of every width, frames anywhere, the list built three ways, elements pickle.dumps does
# not write), holding numpy arrays and scalars among documents, damaged, then read at random:
# the compiled core's partial decoding unpickles one example out of a block, so its failures
# must come out as the same named error reading the block whole raises.


def _sample_example(rng: random.Random, i: int):
    kind = rng.randrange(4)
    if kind == 0:
        return np.arange(rng.randrange(6)).astype(rng.choice(["i8", "f8", "u2", "?"]))
    if kind == 1:
        return {"id": i, "text": "é" * rng.randrange(4) + "t", "n": np.int64(i)}
    if kind == 2:
        return (i, "word " * rng.randrange(3), [i, None])
    return np.arange(4).reshape(2, 2) * i


# numpy dtype flags (NPY_ITEM_REFCOUNT, NPY_LIST_PICKLE, NPY_NEEDS_INIT) a damaged state may
# set without numpy reading memory it should not: it fails to free such arrays, and reports it.
_HARMLESS_FLAGS = 0b1011


class _RecordingUnpickler(pickle.Unpickler):
    """pickle's unpickler, noting every numpy dtype it makes (to look at their flags)."""

    def __init__(self, file, made: list) -> None:
        super().__init__(file)
        self.made = made

    def find_class(self, module, name):
        found = super().find_class(module, name)
        if (module, name) != ("numpy", "dtype"):
            return found

        def make(*args):
            dtype = found(*args)
            self.made.append(dtype)
            return dtype

        return make


def _loads_in_a_child(blocks: list) -> bool:
    """Whether unpickling every block returns or raises in a forked child without crashing it
    or building a numpy dtype with other flags than those numpy refuses to use
    (_HARMLESS_FLAGS). Damaged pickles can do both, in numpy, whatever reads them: numpy's
    dtype.__setstate__ crashes on some states, a dtype whose flags say "pointer" makes numpy
    read objects at addresses taken from the block. Such draws are not this test's to make.
    (A memo index near 2**32 that makes the unpickler allocate a memo table that large is: the
    readers refuse it, which the test checks under an address-space cap.)"""
    if not hasattr(os, "fork"):
        return True
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 0
        try:
            import faulthandler
            import io
            import resource

            faulthandler.disable()  # a crash here is an answer, not a report

            with open("/proc/self/statm") as f:
                mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            limit = mapped + (512 << 20)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            made: list = []
            for block in blocks:
                try:
                    _RecordingUnpickler(io.BytesIO(block), made).load()
                except Exception:
                    pass
            for dtype in made:
                try:
                    usual = np.dtype(dtype.str).flags
                except Exception:
                    usual = 0
                if (dtype.flags ^ usual) & ~_HARMLESS_FLAGS:
                    code = 4
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status == 0


# The flags value (0) of a dtype's state, in the int encodings pickle_forms writes, then TUPLE.
_DTYPE_FLAGS = re.compile(rb"(?:K|M\x00|J\x00\x00\x00)\x00t", re.DOTALL)


@st.composite
def _damaged_hand_made_blocks(draw):
    """``(block size, blocks)``: 2-4 hand-made blocks, 1-3 damages among them. Drawn from a
    Random hypothesis seeds (positions, values and seeds uniform: its own integers favour the
    ends of their range, and a damage at byte 0 stops every load at the protocol)."""
    rng = draw(st.randoms(use_true_random=False))
    block_size = rng.choice([3, 6, 16])
    blocks = []
    for _ in range(rng.randrange(2, 5)):
        seed = rng.randrange(2**32)
        r = random.Random(seed)
        examples = [_sample_example(r, i) for i in range(r.randrange(block_size + 1))]
        blocks.append(bytearray(pickle_forms.hand_made_block(seed, block_size, examples)))
    for _ in range(rng.randrange(1, 4)):
        block = rng.choice(blocks)
        # A numpy dtype's state ends in its flags (0, as int opcode + byte) before TUPLE: a
        # damaged byte there is one numpy accepts, giving a dtype that claims to hold objects.
        flags = [m.start() + 1 for m in _DTYPE_FLAGS.finditer(block)]
        how = rng.choice(["dtype flags", "flip", "overwrite", "delete"])
        if how == "dtype flags" and flags:
            block[rng.choice(flags)] = rng.randrange(1, 256) & _HARMLESS_FLAGS or 3
            continue
        at = rng.randrange(len(block))
        if how in ("flip", "dtype flags"):
            block[at] ^= rng.randrange(1, 256)
        elif how == "overwrite":
            block[at : at + 4] = rng.randbytes(rng.randrange(1, 5))
        else:
            del block[at]
    return block_size, [bytes(block) for block in blocks]


def _whole(ds, b: int):
    """Block ``b`` of shard 0 read whole: its examples, or the exception raised."""
    try:
        return ds.shards[0].read_block(b)
    except Exception as exc:  # compared with what a random read raises
        return exc


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@settings(
    max_examples=_LONG or 80,
    deadline=None,
    derandomize=not _LONG,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(drawn=_damaged_hand_made_blocks(), order_seed=st.integers(0, 2**16), trusted=st.booleans())
def test_damaged_hand_made_blocks_read_in_random_order(atlas, tmp_path, drawn, order_seed, trusted):
    block_size, blocks = drawn
    assume(_loads_in_a_child(blocks))
    n = block_size * len(blocks)
    with tempfile.TemporaryDirectory(prefix="atlas-fuzz-", dir=tmp_path) as tmp:
        root = Path(tmp) / "ds"
        with AtlasDatasetWriter(root, n, block_size, compression_strategy=0) as w:
            for k in range(n):
                w.add_example(k)
        write_blocks(root / "0", blocks)

        def read():
            OUTCOMES.clear()  # the child's own counts go back
            hook, sys.unraisablehook = sys.unraisablehook, _count_unraisable
            try:
                _read_at_random(atlas, root, trusted, block_size, len(blocks), order_seed)
            finally:
                sys.unraisablehook = hook
            return dict(OUTCOMES)

        OUTCOMES.update(run_capped(read))


def _read_at_random(atlas, root, trusted, block_size, n_blocks, order_seed) -> None:
    whole = [_whole(atlas.AtlasDataset(root, trusted=trusted), b) for b in range(n_blocks)]
    ds = atlas.AtlasDataset(root, trusted=trusted)
    order = list(range(block_size * n_blocks))
    random.Random(order_seed).shuffle(order)
    for i in order:
        b, j = divmod(i, block_size)
        try:
            got = ds[i]
        except (AtlasFormatError, UnsafePickleError) as exc:
            # A random read that fails raises what reading its block whole raises.
            assert type(exc) is type(whole[b]), (i, exc, whole[b])
            assert not (_bounded(atlas, trusted) and memory_errors(exc)), (i, repr(exc))
            assert f"data.bin: block {b}" in str(exc) or f"block {b})" in str(exc), exc
            OUTCOMES[f"random read: {type(exc).__name__}"] += 1
            continue
        if not isinstance(whole[b], Exception) and not _holds_numpy_scalars(whole[b][j]):
            # An example read alone is the one the whole block holds. (Not a numpy scalar: of
            # a damaged dtype saying "pointer", numpy builds it from an address, not from the
            # block, another at each load.)
            assert _same_pickle(got, whole[b][j]), (i, got, whole[b][j])
        OUTCOMES["random read: example"] += 1
    batch = [random.Random(order_seed + k).randrange(len(order)) for k in range(8)]
    try:
        ds.__getitems__(batch)
    except (AtlasFormatError, UnsafePickleError):
        pass
    ds.close()
    # And in order: an iteration stops at the first block that fails, with its error.
    first_bad = next((b for b, w in enumerate(whole) if isinstance(w, Exception)), None)
    read = 0
    try:
        for _ in atlas.AtlasDataset(root, trusted=trusted):
            read += 1
    except (AtlasFormatError, UnsafePickleError) as exc:
        assert first_bad is not None and type(exc) is type(whole[first_bad]), (exc, whole)
        assert read == first_bad * block_size
    else:
        assert first_bad is None


def _holds_numpy_scalars(x) -> bool:
    if isinstance(x, np.generic):
        return True
    if isinstance(x, (list, tuple)):
        return any(_holds_numpy_scalars(y) for y in x)
    if isinstance(x, dict):
        return any(_holds_numpy_scalars(y) for y in x.values())
    return False


def _same_pickle(a, b) -> bool:
    """Equal as pickles (numpy arrays and the objects a damaged block may build compare
    there, where ``==`` may not)."""
    try:
        return pickle.dumps(a, protocol=5) == pickle.dumps(b, protocol=5)
    except Exception:
        return type(a) is type(b)
