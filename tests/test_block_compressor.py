"""The writer's block compressors (``block_compressor`` of ``_compress``, compiled, and its twin
``_compress_py``): the frames of
python-zstandard's ``ZstdCompressor.compress`` byte for byte, in block order, whatever the
number of workers, with a fixed number of blocks in flight."""

from __future__ import annotations

import errno
import os
import pickle
import random

import pytest
import zstandard

import atlas_fast
import atlas_fast._core._compress_py
from atlas_fast._core._compress_py import PoolCompressor, zstandard_version_number

CORES = [atlas_fast._core._compress_py]
if atlas_fast.BACKEND == "cython":
    import atlas_fast._core._compress

    CORES.append(atlas_fast._core._compress)


def _backend_of(module) -> str:
    return "python" if module.__name__.endswith("_py") else "cython"


@pytest.fixture(params=CORES, ids=_backend_of)
def core(request):
    return request.param


def blocks():
    rnd = random.Random(7)
    words = ["atlas", "shard", "block", "zstd", "pickle", "index", "the", "of", "data"]
    docs = [
        {"id": i, "text": " ".join(rnd.choice(words) for _ in range(rnd.randrange(400)))}
        for i in range(600)
    ]
    out = [pickle.dumps(docs[i : i + 25]) for i in range(0, len(docs), 25)]
    out += [b"x", b"ab" * 70000, rnd.randbytes(50000), pickle.dumps(list(range(100000)))]
    return out


BLOCKS = blocks()
TRAINED = zstandard.train_dictionary(4096, BLOCKS[:20], level=3)


@pytest.mark.parametrize("level", [1, 3, 9, -1])
@pytest.mark.parametrize("dictionary", ["none", "trained", "from bytes"])
@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("checksum", [False, True])
def test_frames_are_python_zstandards(core, level, dictionary, workers, checksum):
    # The compiled core reuses the contexts of closed compressors: the parametrizations
    # before this one have left it contexts of other levels and dictionaries.
    zdict = {"none": None, "trained": TRAINED}.get(dictionary)
    if dictionary == "from bytes":
        zdict = zstandard.ZstdCompressionDict(TRAINED.as_bytes())
    options = {"level": level, "write_checksum": checksum}
    if zdict is not None:
        options["dict_data"] = zdict
    want = [zstandard.ZstdCompressor(**options).compress(b) for b in BLOCKS]
    zc = core.block_compressor(
        level, None if zdict is None else zdict.as_bytes(), workers, checksum=checksum
    )
    got = []
    for b in BLOCKS:
        got += zc.submit(b)
    got += zc.finish()
    zc.close()
    zc.close()
    assert got == want


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_at_most_two_blocks_per_worker_in_flight(core, workers):
    zc = core.block_compressor(3, None, workers)
    returned = 0
    for n, b in enumerate(BLOCKS, 1):
        returned += len(zc.submit(b))
        in_flight = n - returned
        assert in_flight <= (0 if workers == 1 else 2 * workers)
    assert returned + len(zc.finish()) == len(BLOCKS)
    zc.close()


def test_close_drops_queued_blocks(core):
    zc = core.block_compressor(3, None, 3)
    for b in BLOCKS[:5]:
        zc.submit(b)
    zc.close()


@pytest.mark.skipif(atlas_fast.BACKEND != "cython", reason="the compiled core")
def test_compiled_core_compresses_with_libzstd_when_versions_match():
    from atlas_fast._core import _compress

    assert atlas_fast._backend.compressor is _compress
    zc = _compress.block_compressor(3, None, 2)
    zc.close()
    if _compress.zstd_compress_version() == zstandard_version_number():
        assert isinstance(zc, _compress.BlockCompressor)
        with pytest.raises(ValueError, match="closed"):
            zc.submit(b"x")
    else:
        assert isinstance(zc, PoolCompressor)


@pytest.mark.parametrize("level", [3, None])  # None: the blocks as they are (strategy 0)
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_out_writes_the_frames_in_order_and_returns_their_sizes(core, tmp_path, level, workers):
    want = (
        BLOCKS if level is None else [zstandard.ZstdCompressor(level=3).compress(b) for b in BLOCKS]
    )
    path = tmp_path / "data.bin"
    with open(path, "wb") as f:
        zc = core.block_compressor(level, None, workers, out=f.fileno())
        sizes = []
        for b in BLOCKS:
            sizes += zc.submit(b)
        sizes += zc.finish()
        zc.close()
    assert sizes == [len(frame) for frame in want]
    assert path.read_bytes() == b"".join(want)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_blocks_as_they_are_without_out(core, workers):
    zc = core.block_compressor(None, None, workers)
    got = []
    for b in BLOCKS:
        got += zc.submit(b)
    got += zc.finish()
    zc.close()
    assert got == BLOCKS


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("level", [3, None])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_failed_write_is_an_oserror_and_stops_the_writes(core, tmp_path, level, workers):
    """/dev/full refuses every write with ENOSPC: the first block's size is never returned,
    its error is, as an OSError with that errno, by the call that would return it; the
    blocks after it are not written (those returned say so)."""
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        zc = core.block_compressor(level, None, workers, out=fd)
        errors = []
        for b in BLOCKS[:6]:
            try:
                assert zc.submit(b) == []
            except OSError as exc:
                errors.append(exc)
        while True:
            try:
                assert zc.finish() == []
                break
            except OSError as exc:
                errors.append(exc)
        zc.close()
    finally:
        os.close(fd)
    # (a submit that raises may not have queued its own block: at most one error per block)
    assert 1 <= len(errors) <= 6 and errors[0].errno == errno.ENOSPC
    assert all(e.errno == errno.EIO for e in errors[1:])


@pytest.mark.parametrize("workers", [1, 3])
def test_out_is_written_through_a_descriptor_of_its_own(core, tmp_path, workers):
    """The caller may close its descriptor (a shard writer dropped without close()): the
    compressor writes through its own duplicate, never to a number reused meanwhile."""
    path = tmp_path / "data.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    zc = core.block_compressor(3, None, workers, out=fd)
    os.close(fd)
    other = tmp_path / "other"
    with open(other, "wb"):  # likely given the number just closed
        sizes = []
        for b in BLOCKS:
            sizes += zc.submit(b)
        sizes += zc.finish()
    zc.close()
    assert path.read_bytes() == b"".join(
        zstandard.ZstdCompressor(level=3).compress(b) for b in BLOCKS
    )
    assert other.read_bytes() == b""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_is_told_the_compressor_is_not_its_own(core):
    """Its threads stayed in the parent: a call in the child raises at once (never waits for
    blocks no thread will compress)."""
    zc = core.block_compressor(3, None, 2)
    first = zc.submit(BLOCKS[0])
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only for the expected error
        code = 1
        try:
            zc.submit(BLOCKS[1])
        except RuntimeError as exc:
            code = 0 if "another process" in str(exc) else 2
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(first) + len(zc.finish()) == 1  # the parent's compressor is untouched
    zc.close()
