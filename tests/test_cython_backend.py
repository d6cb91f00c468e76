"""The compiled backend: selected by default, bound to a real libzstd, and as correct as the
pure-Python one on the cases where a C reader could go wrong (frames without a size, corrupt
frames, threads, fork, thousands of shards)."""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import zstandard
from helpers import assert_same, child_report, fork_check, open_fd_count

import atlas_fast
import atlas_fast._python
import atlas_fast.atlas
from atlas_fast import AtlasFormatError, CompressionStrategy
from atlas_fast._format import dump_meta, index_dtype

ROOT = Path(__file__).resolve().parents[1]
COMPILED = atlas_fast.BACKEND == "cython"
BOTH = [atlas_fast.atlas, atlas_fast._python] if COMPILED else [atlas_fast._python]
needs_compiled = pytest.mark.skipif(not COMPILED, reason="the compiled backend is not in use")


def _examples(n, seed=0):
    return [
        {"id": seed + i, "text": f"document {seed + i} " * (i % 7 + 1), "n": np.arange(i % 5)}
        for i in range(n)
    ]


def write_shard(path: Path, examples, block_size, strategy=0, compress=None, zdict=None):
    """A shard written by hand: ``compress(pickled_block) -> stored bytes`` for each block."""
    path.mkdir(parents=True)
    blocks = [examples[k : k + block_size] for k in range(0, len(examples), block_size)]
    offsets = [0]
    with open(path / "data.bin", "wb") as f:
        for block in blocks:
            data = pickle.dumps(block)
            if compress is not None:
                data = compress(data)
            f.write(data)
            offsets.append(offsets[-1] + len(data))
    np.save(path / "index.npy", np.array(offsets, dtype=index_dtype(offsets[-1])))
    if zdict is not None:
        (path / "zstd_dict.bin").write_bytes(zdict)
    fields = {
        "version": 1,
        "block_size": block_size,
        "stored_examples": len(examples),
        "compression_strategy": strategy,
        "compression_level": 3,
        "compression_dict_size": 0.01,
    }
    dump_meta(path / "meta.json", fields)
    return path


def _error_of(call) -> tuple:
    try:
        call()
    except Exception as exc:
        return type(exc), str(exc)
    return None, None


# -- selection and libzstd ----------------------------------------------------------------------


def test_default_import_selects_the_compiled_backend():
    if os.environ.get("ATLAS_FAST_NO_EXTENSIONS", "").strip().lower() not in ("", "0", "false"):
        pytest.skip("ATLAS_FAST_NO_EXTENSIONS is set: the pure-Python backend was asked for")
    if os.name == "nt":
        pytest.skip("no compiled core on Windows: tests/test_install.py checks the Python one")
    env = {k: v for k, v in os.environ.items() if k not in ("ATLAS_FAST_LIBZSTD",)}
    code = (
        "import warnings; warnings.simplefilter('error');"
        "import atlas_fast, json;"
        "print(json.dumps([atlas_fast.BACKEND, atlas_fast.zstd_library()]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    backend, library = json.loads(out.stdout)
    assert backend == "cython", library


@needs_compiled
def test_zstd_library_reports_a_real_library():
    info = atlas_fast.zstd_library()
    assert info["backend"] == "cython"
    assert os.path.isfile(info["path"]), info
    assert info["version"].count(".") == 2 and info["version"][0].isdigit(), info
    major, minor, patch = map(int, info["version"].split("."))
    assert info["version_number"] == major * 10000 + minor * 100 + patch
    assert (major, minor) >= (1, 4)
    assert "dlopen" in info["binding"]


@needs_compiled
def test_system_libzstd_comes_first_only_as_python_zstandards_release(monkeypatch):
    """Private name: the binding's search order, which the library report does not show."""
    from atlas_fast._core import _reader

    monkeypatch.delenv("ATLAS_FAST_LIBZSTD", raising=False)
    found = _reader._candidates()
    major, minor, patch = zstandard.ZSTD_VERSION
    assert found[0][1:] == ("the system libzstd", major * 10000 + minor * 100 + patch)
    assert [how for _, how, release in found if release is None][-1] == "the system libzstd"


@needs_compiled
def test_libzstd_from_the_environment_variable():
    from atlas_fast._core import _reader

    wanted = _reader.zstd_library()["path"]
    code = "import atlas_fast._core._reader as r, json; print(json.dumps(r.zstd_library()))"
    env = dict(os.environ, ATLAS_FAST_LIBZSTD=wanted)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["path"] == wanted and "ATLAS_FAST_LIBZSTD" in info["binding"]


@needs_compiled
def test_unusable_libzstd_falls_back_with_one_warning():
    code = (
        "import warnings, json\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    import atlas_fast, atlas_fast._core._reader as r\n"
        "print(json.dumps([atlas_fast.BACKEND, r.zstd_available(), r.zstd_load_error(),\n"
        "                  [str(x.message) for x in w]]))\n"
    )
    env = dict(os.environ, ATLAS_FAST_LIBZSTD="/nonexistent/libzstd.so.1")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True)
    assert out.returncode == 0, out.stderr
    backend, available, error, warned = json.loads(out.stdout)
    assert backend == "python" and available is False
    assert "/nonexistent/libzstd.so.1" in error
    assert len(warned) == 1 and "pure-Python" in warned[0]


# -- frames ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", [1, 19])
def test_frames_without_content_size(atlas, tmp_path, level):
    examples = _examples(50)
    cctx = zstandard.ZstdCompressor(level=level, write_content_size=False)
    path = write_shard(tmp_path / "0", examples, 8, strategy=1, compress=cctx.compress)
    with open(path / "data.bin", "rb") as f:
        assert zstandard.frame_content_size(f.read()) == -1
    shard = atlas.AtlasDatasetShard(path)
    for i in [*range(len(examples)), 3, 49, 0]:
        assert_same(shard[i], examples[i], f"[{i}]")


def test_large_frame_without_content_size_streams_past_the_first_buffer(atlas, tmp_path):
    examples = [os.urandom(50_000) for _ in range(12)]  # 600 KB per block, incompressible
    cctx = zstandard.ZstdCompressor(write_content_size=False)
    path = write_shard(tmp_path / "0", examples, 6, strategy=1, compress=cctx.compress)
    shard = atlas.AtlasDatasetShard(path)
    assert [shard[i] for i in range(12)] == examples


def test_frame_without_content_size_over_the_limit(atlas, tmp_path, monkeypatch):
    cctx = zstandard.ZstdCompressor(write_content_size=False)
    path = write_shard(tmp_path / "0", [b"x" * 200_000], 1, strategy=1, compress=cctx.compress)
    monkeypatch.setenv("ATLAS_FAST_MAX_BLOCK_BYTES", "100000")
    with pytest.raises(AtlasFormatError, match=r"more than 100000 bytes"):
        atlas.AtlasDatasetShard(path)[0]


def test_declared_size_over_the_limit(atlas, tmp_path, monkeypatch):
    cctx = zstandard.ZstdCompressor()
    path = write_shard(tmp_path / "0", [b"x" * 200_000], 1, strategy=1, compress=cctx.compress)
    monkeypatch.setenv("ATLAS_FAST_MAX_BLOCK_BYTES", "100000")
    with pytest.raises(AtlasFormatError, match=r"over the 100000-byte limit"):
        atlas.AtlasDatasetShard(path)[0]


def _dictionary(examples):
    samples = [pickle.dumps(examples[k : k + 4]) for k in range(0, len(examples), 4)]
    return zstandard.train_dictionary(4096, samples * 4)


# A frame that declares 0 decoded bytes (python-zstandard's decompress() returns b"" for it
# without decoding anything, so both backends stream such a frame and check it).
ZERO_FRAME = zstandard.ZstdCompressor().compress(b"")


def _corrupt_cases(tmp_path):
    """(name, shard path, dictionary bytes or None, index) of shards whose block 1 is bad."""
    examples = _examples(40)
    other = _dictionary(_examples(40, seed=1000))
    right = _dictionary(examples)
    plain = zstandard.ZstdCompressor()
    sizeless = zstandard.ZstdCompressor(write_content_size=False)
    cases = []

    def bad_block_1(fn, cctx):
        count = iter(range(1000))
        return lambda data: fn(cctx.compress(data)) if next(count) == 1 else cctx.compress(data)

    variants = {
        "truncated": lambda c: c[: len(c) - 7],
        "truncated_header": lambda c: c[:3],
        "flipped": lambda c: c[:12] + bytes(b ^ 0x5A for b in c[12:40]) + c[40:],
        "not_zstd": lambda c: b"definitely not a zstd frame" + c,
        "trailing": lambda c: c + b"\x00\x01\x02",
        "two_frames": lambda c: c + c,
        "empty_frame_then_data": lambda c: ZERO_FRAME + c,
        "empty_frame_truncated": lambda c: ZERO_FRAME[:-1],
    }
    for name, fn in variants.items():
        for label, cctx in (("sized", plain), ("sizeless", sizeless)):
            path = write_shard(
                tmp_path / f"{name}_{label}", examples, 4, 1, compress=bad_block_1(fn, cctx)
            )
            cases.append((f"{name}_{label}", path, None, 5))
    # A block compressed with another dictionary than the shard's.
    wrong = zstandard.ZstdCompressor(dict_data=other)
    path = write_shard(
        tmp_path / "wrong_dict", examples, 4, 3, compress=wrong.compress, zdict=right.as_bytes()
    )
    cases.append(("wrong_dict", path, None, 0))
    # A dictionary-compressed block read without its dictionary (strategy says none).
    path = write_shard(
        tmp_path / "missing_dict",
        examples,
        4,
        1,
        compress=zstandard.ZstdCompressor(dict_data=right).compress,
    )
    cases.append(("missing_dict", path, None, 0))
    return cases


@needs_compiled
def test_corrupt_frames_fail_alike_on_both_backends(tmp_path):
    for name, path, _dict, index in _corrupt_cases(tmp_path):
        errors = []
        for module in BOTH:
            shard = module.AtlasDatasetShard(path)
            errors.append(_error_of(lambda shard=shard, index=index: shard[index]))
            if "dict" not in name:  # the shard stays usable: other blocks still read
                assert shard[len(shard) - 1]["id"] == len(shard) - 1
        (cy_type, cy_msg), (py_type, py_msg) = errors
        assert cy_type is not None and issubclass(cy_type, AtlasFormatError), (name, errors)
        assert (cy_type, cy_msg) == (py_type, py_msg), name
        assert str(path / "data.bin") in cy_msg


def test_corrupt_frames_raise_format_errors(atlas, tmp_path):
    expected = {
        "truncated": "the zstd frame is truncated",
        "truncated_header": "the zstd frame is truncated",
        "flipped": "corrupt zstd frame",
        "not_zstd": "corrupt zstd frame",
        "trailing": "3 bytes follow the zstd frame",
        "empty_frame_truncated": "the zstd frame is truncated",
    }
    for name, path, _dict, index in _corrupt_cases(tmp_path):
        shard = atlas.AtlasDatasetShard(path)
        match = expected.get(name.rsplit("_", 1)[0], "")
        with pytest.raises(AtlasFormatError, match=rf"data\.bin: block {index // 4}\b.*{match}"):
            shard[index]
    # Bytes after a frame are counted whether the frame records its size or not.
    cases = {name: path for name, path, *_ in _corrupt_cases(tmp_path / "again")}
    for label in ("sized", "sizeless"):
        stored = atlas.AtlasDatasetShard(cases[f"two_frames_{label}"])._raw_block(1)
        with pytest.raises(AtlasFormatError, match=rf"block 1: {len(stored) // 2} bytes follow"):
            atlas.AtlasDatasetShard(cases[f"two_frames_{label}"])[5]


def test_wrong_dictionary_message(atlas, tmp_path):
    cases = {name: path for name, path, *_ in _corrupt_cases(tmp_path)}
    dict_path = cases["wrong_dict"] / "zstd_dict.bin"
    with pytest.raises(
        AtlasFormatError,
        match=rf"block 0: the zstd frame needs dictionary \d+ but {dict_path} is dictionary "
        r"\d+: wrong dictionary",
    ):
        atlas.AtlasDatasetShard(cases["wrong_dict"])[0]
    with pytest.raises(
        AtlasFormatError,
        match=r"block 0: the zstd frame needs dictionary \d+ but the shard's "
        "compression_strategy uses no dictionary",
    ):
        atlas.AtlasDatasetShard(cases["missing_dict"])[3]


def _mutants(rng, block: bytes) -> list:
    """Damaged copies of one stored block: flips, cuts, overwrites, appended bytes."""
    out = []
    for _ in range(6):
        damaged = bytearray(block)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        out.append(bytes(damaged))
    out.append(block[: rng.randrange(len(block))])
    out.append(block + rng.randbytes(rng.randint(1, 9)))
    at = rng.randrange(4, len(block))
    out.append(block[:at] + rng.randbytes(min(8, len(block) - at)) + block[at + 8 :])
    out.append(block[:4] + rng.randbytes(len(block) - 4))  # the magic number kept
    return out


@needs_compiled
@pytest.mark.parametrize("limit", [None, "3000"])
def test_damaged_frames_fail_alike_on_both_backends(tmp_path, monkeypatch, limit):
    """Seeded random damage to one block: both backends raise the same error, word for word."""
    import random

    if limit:  # small enough that some damaged frames decode past it
        monkeypatch.setenv("ATLAS_FAST_MAX_BLOCK_BYTES", limit)
    rng = random.Random(20240611)
    examples = _examples(16)
    zd = _dictionary(_examples(40))
    compressors = {
        "sized": (1, zstandard.ZstdCompressor(), None),
        "sizeless": (1, zstandard.ZstdCompressor(write_content_size=False), None),
        "dict": (3, zstandard.ZstdCompressor(dict_data=zd), zd.as_bytes()),
        "dict_sizeless": (
            3,
            zstandard.ZstdCompressor(dict_data=zd, write_content_size=False),
            zd.as_bytes(),
        ),
    }
    compared = 0
    for label, (strategy, cctx, zdict) in compressors.items():
        base = write_shard(tmp_path / label, examples, 4, strategy, cctx.compress, zdict)
        blocks = [atlas_fast._python.AtlasDatasetShard(base)._raw_block(b) for b in range(4)]
        for k in range(12):
            for n, mutant in enumerate(_mutants(rng, blocks[2])):
                path = write_shard(tmp_path / f"{label}_{k}_{n}", [], 4, strategy, zdict=zdict)
                damaged = [*blocks[:2], mutant, *blocks[3:]]
                offsets = np.cumsum([0] + [len(x) for x in damaged])
                (path / "data.bin").write_bytes(b"".join(damaged))
                np.save(path / "index.npy", offsets.astype(index_dtype(int(offsets[-1]))))
                meta = json.loads((path / "meta.json").read_text())
                dump_meta(path / "meta.json", {**meta, "stored_examples": len(examples)})
                errors = [
                    _error_of(lambda m=module, p=path: m.AtlasDatasetShard(p).read_block(2))
                    for module in BOTH
                ]
                assert errors[0] == errors[1], (label, mutant)
                compared += errors[0][0] is not None
    assert compared > 100  # most damage is detected (the rest decodes to a valid block)


def test_block_level_methods_agree(tmp_path):
    examples = _examples(30)
    zd = _dictionary(examples)
    paths = [
        write_shard(tmp_path / "s0", examples, 8, 0),
        write_shard(tmp_path / "s1", examples, 8, 1, compress=zstandard.ZstdCompressor().compress),
        write_shard(
            tmp_path / "s3",
            examples,
            8,
            3,
            compress=zstandard.ZstdCompressor(dict_data=zd).compress,
            zdict=zd.as_bytes(),
        ),
    ]
    for path in paths:
        shards = [module.AtlasDatasetShard(path) for module in BOTH]
        for b in range(4):
            raws = [s._raw_block(b) for s in shards]
            datas = [s._block_bytes(b) for s in shards]
            assert all(type(x) is bytes for x in raws + datas)
            assert len(set(raws)) == 1 and len(set(datas)) == 1
            for s in shards:
                assert_same(s.read_block(b), examples[b * 8 : b * 8 + 8])
                assert s._block_offsets().tolist() == shards[-1]._block_offsets().tolist()
        for bad in (-1, 4, 100):
            errors = {_error_of(lambda s=s, bad=bad: s._block_bytes(bad)) for s in shards}
            assert len(errors) == 1 and next(iter(errors))[0] is IndexError
        for s in shards:
            s.close()
            assert_same(s[29], examples[29])


def test_index_errors_alike(tmp_path):
    examples = _examples(10)
    write_shard(tmp_path / "ds" / "0", examples[:4], 3)
    write_shard(tmp_path / "ds" / "1", [], 3)
    write_shard(tmp_path / "ds" / "2", examples[4:], 3)
    dump_meta(
        tmp_path / "ds" / "meta.json",
        {"version": 1, "shard_sizes": [4, 0, 6], "compression_strategy": 0},
    )
    datasets = [module.AtlasDataset(tmp_path / "ds") for module in BOTH]
    for i in [*range(-10, 10), 3, 4]:
        for ds in datasets:
            assert_same(ds[i], examples[i])
    for ds in datasets:
        assert_same(ds[True], examples[1])
    for bad in (10, -11, 2**70, -(2**70), 1.0, "1", None):
        errors = {_error_of(lambda ds=ds, bad=bad: ds[bad]) for ds in datasets}
        errors |= {_error_of(lambda ds=ds, bad=bad: ds.__getitems__([bad])) for ds in datasets}
        assert len(errors) == 1 and None not in next(iter(errors)), (bad, errors)
    shards = [ds.shards[2] for ds in datasets]
    for bad in (6, -7, 2**64, np.int64(6)):
        errors = {_error_of(lambda s=s, bad=bad: s[bad]) for s in shards}
        assert len(errors) == 1 and next(iter(errors))[0] is IndexError, (bad, errors)
    assert_same(shards[0][np.int32(-1)], examples[-1])


# -- threads, fork, descriptors ------------------------------------------------------------------


@pytest.mark.parametrize("strategy", [0, 1, 3])
def test_threads_read_correct_examples(atlas, tmp_path, strategy):
    examples = _examples(600)
    kwargs = {}
    if strategy:
        zd = _dictionary(examples) if strategy == 3 else None
        cctx = zstandard.ZstdCompressor(dict_data=zd) if zd else zstandard.ZstdCompressor()
        kwargs = {"compress": cctx.compress, "zdict": zd.as_bytes() if zd else None}
    for k in range(3):
        write_shard(tmp_path / f"{k}", examples[k * 200 : k * 200 + 200], 7, strategy, **kwargs)
    dump_meta(
        tmp_path / "meta.json",
        {"version": 1, "shard_sizes": [200] * 3, "compression_strategy": strategy},
    )
    ds = atlas.AtlasDataset(tmp_path)
    failures = []
    start = threading.Barrier(8)

    def reader(seed):
        order = np.random.default_rng(seed).permutation(len(examples)).tolist()
        start.wait()
        for n, i in enumerate(order * 2):
            got = ds[i]
            if got["id"] != i or got["text"] != examples[i]["text"]:
                failures.append((seed, i, got["id"]))
            if seed == 0 and n % 300 == 0:
                ds.shards[n % 3].close()  # closing under other readers is safe

    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("strategy", [0, 3])
def test_forked_child_reads_correctly(atlas, tmp_path, strategy):
    examples = _examples(300)
    path = tmp_path / "ds"
    with atlas_fast.AtlasDatasetWriter(path, 100, 10, strategy) as writer:
        for x in examples:
            writer.add_example(x)
    ds = atlas.AtlasDataset(path)
    for i in range(0, 300, 3):  # the parent opens, maps and caches first
        assert ds[i]["id"] == i
    # Another thread of the parent holds a shard's lock at fork time: it is opening the shard
    # (the first function the core calls to open it, a private name patched to hold it there).
    held = threading.Event()
    release = threading.Event()
    core = atlas.AtlasDataset._backend
    opener_name = "load_offsets" if core.BACKEND == "cython" else "open_files"
    original = getattr(core, opener_name)

    def slow_open(*args):
        if not held.is_set():
            held.set()
            release.wait(10)
        return original(*args)

    ds.close()
    setattr(core, opener_name, slow_open)
    try:
        opener = threading.Thread(target=lambda: ds[150])
        opener.start()
        assert held.wait(10)
        order = np.random.default_rng(1).permutation(300).tolist()
        pid, read = fork_check(
            lambda: all(ds[i]["id"] == i and ds[i]["text"] == examples[i]["text"] for i in order)
        )
        release.set()
        opener.join()
    finally:
        setattr(core, opener_name, original)
    report = child_report(pid, read)
    assert report == b"ok", report
    assert [ds[i]["id"] for i in range(300)] == list(range(300))


def test_two_thousand_shards_keep_descriptors_bounded(atlas, tmp_path_factory):
    path = _many_shards(tmp_path_factory)
    ds = atlas.AtlasDataset(path)
    assert len(ds.shards) == 2000
    before = open_fd_count()
    peak = before
    for i in range(len(ds)):
        assert ds[i] == i
        if i % 250 == 0:
            peak = max(peak, open_fd_count())
    peak = max(peak, open_fd_count())
    assert peak - before <= 70, (before, peak)
    ds.close()


_MANY = {}


def _many_shards(tmp_path_factory):
    if "path" not in _MANY:
        path = tmp_path_factory.mktemp("many") / "ds"
        strategy = CompressionStrategy.STANDARD_COMPRESSION
        with atlas_fast.AtlasDatasetWriter(path, 1, 1, strategy) as writer:
            for i in range(2000):
                writer.add_example(i)
        _MANY["path"] = path
    return _MANY["path"]


@needs_compiled
def test_compiled_shard_descriptors_are_bounded_and_released(tmp_path):
    """A mapped data.bin keeps its descriptor for the size checks: at most 32 in the process
    (the most recently mapped), each closed with its mapping."""
    examples = _examples(20)
    shards = [
        atlas_fast.atlas.AtlasDatasetShard(write_shard(tmp_path / f"{k}", examples, 4, 0))
        for k in range(40)
    ]
    before = open_fd_count()
    assert_same(shards[0][7], examples[7])
    assert open_fd_count() == before + 1
    shards[0].close()
    assert open_fd_count() == before
    for shard in shards:
        assert_same(shard[19], examples[19])
    assert open_fd_count() <= before + 32
    os.truncate(shards[0].root / "data.bin", 10)  # its descriptor was given up: checked by path
    with pytest.raises(AtlasFormatError, match="block 0 is truncated"):
        shards[0][0]
    for shard in shards:
        shard.close()
    assert open_fd_count() == before


@needs_compiled
def test_data_file_changed_after_index_check(tmp_path, monkeypatch):
    examples = _examples(20)
    path = write_shard(tmp_path / "0", examples, 4, 0)
    shard = atlas_fast.atlas.AtlasDatasetShard(path)
    # The core's ``load_offsets`` (private) is patched to change data.bin right after the
    # index was read: the mapping must notice.
    original = atlas_fast._core._reader.load_offsets

    def grow_then_open(*args):
        result = original(*args)
        with open(path / "data.bin", "ab") as f:
            f.write(b"extra")
        return result

    monkeypatch.setattr(atlas_fast._core._reader, "load_offsets", grow_then_open)
    with pytest.raises(AtlasFormatError, match=r"index\.npy: the last offset is \d+ but .* bytes"):
        shard[0]


@needs_compiled
def test_public_classes_are_built_on_the_compiled_cores(tmp_path):
    from atlas_fast._core import _reader

    assert issubclass(atlas_fast.AtlasDatasetShard, _reader.ShardCore)
    assert issubclass(atlas_fast.AtlasDataset, _reader.DatasetCore)
    shard = atlas_fast.AtlasDatasetShard(write_shard(tmp_path / "0", _examples(9), 4))
    shard.anything = 1  # a __dict__, from the Python subclass
    clone = pickle.loads(pickle.dumps(shard))
    assert_same(clone[8], shard[8])
    assert type(clone) is type(shard) and not hasattr(clone, "anything")


# -- the backend contract: loader hook, loads, files changing under a reader -------------------


@pytest.mark.parametrize("strategy", [0, 1])
def test_cache_counts_hits_and_misses(atlas, tmp_path, strategy):
    examples = _examples(40)
    compress = zstandard.ZstdCompressor().compress if strategy else None
    path = write_shard(tmp_path / "0", examples, 4, strategy, compress=compress)
    shard = atlas.AtlasDatasetShard(path, cache_blocks=2)

    def counts():
        info = shard.cache_info()
        return info.hits, info.misses

    for i in [0, 1, 3, 2]:  # block 0: one miss, then hits
        assert_same(shard[i], examples[i])
    assert counts() == (3, 1)
    for i in [4, 0, 5, 1, 6]:  # blocks 1 and 0 alternate: both held
        assert_same(shard[i], examples[i])
    assert counts() == (7, 2)
    assert_same(shard.read_block(0), examples[:4])
    assert counts() == (8, 2)
    assert_same(shard[-1], examples[-1])  # block 9 evicts block 1, the least recently used
    assert counts() == (8, 3)
    assert_same(shard[4], examples[4])
    assert counts() == (8, 4)


def test_dataset_cache_counts_every_read(atlas, tmp_path):
    examples = _examples(24)
    for k in range(2):
        write_shard(tmp_path / f"{k}", examples[k * 12 : k * 12 + 12], 4, 0)
    dump_meta(
        tmp_path / "meta.json",
        {"version": 1, "shard_sizes": [12, 12], "compression_strategy": 0},
    )
    ds = atlas.AtlasDataset(tmp_path, cache_blocks=8)
    order = [0, 12, 4, 16, 0, 12, 4, 16, 1, 13]
    assert [ds[i]["id"] for i in order] == order
    assert ds.cache_info()[:2] == (6, 4)
    assert [ds[i]["id"] for i in [13, 14, 15]] == [13, 14, 15]
    assert ds.cache_info()[:2] == (9, 4)


@pytest.mark.parametrize("reader", ["dataset", "shard"])
def test_hit_on_the_block_read_last_makes_it_the_most_recent(atlas, tmp_path, reader):
    """A hit on the block ``ds[i]`` read last, after a batch made another block the most
    recent, moves it back to the front: the next miss evicts the batch's block, not it."""
    examples = _examples(24)
    write_shard(tmp_path / "0", examples, 4, 0)
    dump_meta(
        tmp_path / "meta.json", {"version": 1, "shard_sizes": [24], "compression_strategy": 0}
    )
    if reader == "dataset":
        ds = atlas.AtlasDataset(tmp_path, cache_blocks=2)
    else:
        ds = atlas.AtlasDatasetShard(tmp_path / "0", cache_blocks=2)
    assert ds[1]["id"] == 1  # block 0: a miss
    assert [e["id"] for e in ds.__getitems__([9, 8])] == [9, 8]  # block 2: a miss, the newest
    assert ds[2]["id"] == 2  # block 0 again: a hit, now the newest
    assert ds[17]["id"] == 17  # block 4: a miss, evicts block 2
    assert ds[3]["id"] == 3  # block 0: still held
    assert ds[10]["id"] == 10  # block 2: evicted
    info = ds.cache_info()
    assert (info.hits, info.misses, info.blocks) == (2, 4, 2)
    for i in range(24):  # every example, through hits and misses, negative indices too
        assert_same(ds[i], examples[i])
        assert_same(ds[i - 24], examples[i])


def test_emptied_cached_block_is_not_read_past(atlas, tmp_path):
    path = write_shard(tmp_path / "0", _examples(8), 4, 0)
    shard = atlas.AtlasDatasetShard(path)
    shard.read_block(1).clear()  # the core's cached list, emptied by a caller
    with pytest.raises(IndexError):
        shard[6]
    shard.close()
    assert shard[6]["id"] == 6


def test_huge_block_numbers_are_index_errors(tmp_path):
    path = write_shard(tmp_path / "0", _examples(8), 4, 1, zstandard.ZstdCompressor().compress)
    shards = [module.AtlasDatasetShard(path) for module in BOTH]
    for s in shards:
        assert s[0]["id"] == 0  # (the Python core's empty cache is block -1)
    for bad in (2, -1, 2**63, 2**64, 2**70, -(2**70)):
        for method in ("read_block", "_block_bytes", "_raw_block"):
            errors = {_error_of(lambda s=s, m=method, b=bad: getattr(s, m)(b)) for s in shards}
            assert len(errors) == 1, (bad, method, errors)
            kind, message = next(iter(errors))
            assert kind is IndexError and message == f"block {bad} out of range for 2 blocks"


def test_untrusted_reading_calls_the_restricted_loads(atlas, tmp_path):
    examples = [{"args": argparse.Namespace(x=1)}, {"x": np.arange(3)}, 3, "four"]
    path = write_shard(tmp_path / "0", examples, 1, 1, zstandard.ZstdCompressor().compress)
    shard = atlas.AtlasDatasetShard(path, trusted=False)
    with pytest.raises(atlas_fast.UnsafePickleError, match=r"data\.bin, block 0\)"):
        shard[0]
    assert shard[3] == "four" and shard[2] == 3
    assert_same(shard[1], examples[1])
    allowed = atlas.AtlasDatasetShard(path, trusted=False, allowed_globals=[argparse.Namespace])
    assert allowed[0] == examples[0]


@pytest.mark.parametrize("strategy", [0, 1])
def test_data_shrinking_under_a_reader(tmp_path, strategy):
    """Truncated after opening (mapped by the compiled core): the Python backend's error."""
    examples = _examples(40)
    compress = zstandard.ZstdCompressor().compress if strategy else None
    path = write_shard(tmp_path / "0", examples, 4, strategy, compress=compress)
    data = (path / "data.bin").read_bytes()
    shards = [module.AtlasDatasetShard(path) for module in BOTH]
    for s in shards:
        assert_same(s[0], examples[0])  # opened (mapped), block 0 cached
    offsets = shards[0]._block_offsets().tolist()
    os.truncate(path / "data.bin", offsets[5] + 3)
    for i in (39, 21, 20):  # past the end, then the block cut in two
        errors = {_error_of(lambda s=s, i=i: s[i]) for s in shards}
        assert len(errors) == 1, errors
        kind, message = next(iter(errors))
        assert kind is AtlasFormatError and "is truncated" in message, message
        assert f"the file ends at {offsets[5] + 3}" in message or "ends at" in message
    for s in shards:
        for method in ("_block_bytes", "_raw_block", "read_block"):
            with pytest.raises(AtlasFormatError, match=r"block 9 is truncated"):
                getattr(s, method)(9)
        assert_same(s[19], examples[19])  # blocks still inside the file read
        assert_same(s[0], examples[0])
    (path / "data.bin").write_bytes(data)  # back to full size: the same mapping reads again
    for s in shards:
        assert_same(s[39], examples[39])


@pytest.mark.parametrize("strategy", [0, 3])
def test_dataset_rewritten_at_the_same_path(atlas, tmp_path, strategy):
    """A new reader of a dataset written again where it was reads the new one (not a file
    descriptor or mapping of the old, deleted file)."""
    import shutil

    path = tmp_path / "ds"
    for version in range(3):
        if path.exists():
            shutil.rmtree(path)
        with atlas_fast.AtlasDatasetWriter(path, 50, 5, strategy) as writer:
            for i in range(100):
                writer.add_example(i * 1000 + version)  # same pickled sizes in each version
        ds = atlas.AtlasDataset(path)
        assert [ds[i] for i in range(0, 100, 7)] == [i * 1000 + version for i in range(0, 100, 7)]
