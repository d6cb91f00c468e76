"""Errors in a shard keep their type and name the shard directory, once, whichever thread met them.

The error raised is the one met (the same object: its type, message and attributes); where it
happened is a note (``atlas_fast: <shard>: finishing the shard``), and an ``OSError`` that names
no file is made to name the file being written. A shard closed on another thread
(``workers=2``; under strategy 3 every full shard is) raises its error on the calling thread,
noted ``<shard>: finishing the shard`` unless it names the shard already (our writers mark the
errors they note; an ``OSError`` names its file). What the message says is never looked at:
an error whose message happens to hold a path is treated as any other. (An example that does
not pickle is the user's argument, not the writer's failure: ``UnpicklableExampleError``,
naming it, below.)
"""

from __future__ import annotations

import errno
import os
import threading
import warnings

import numpy as np
import pytest

import atlas_fast._backend
import atlas_fast.writer
from atlas_fast import AtlasDatasetShardWriter, AtlasDatasetWriter, CompressionStrategy
from atlas_fast._core._compress_py import PoolCompressor

# Strategy 3 finishes every full shard on the pool when workers > 1; workers=1 on this thread.
WORKERS = [1, 2]


def write_failing(root, examples, workers, strategy=3, shard_size=10, block_size=4):
    """Write ``examples`` to ``root``; the error the writer raises (its warning silenced:
    tests/test_writer_dropin.py and test_writer_parallel.py pin it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(Exception) as info:  # each test checks what it is
            with AtlasDatasetWriter(
                root, shard_size, block_size, compression_strategy=strategy, workers=workers
            ) as w:
                for x in examples:
                    w.add_example(x)
    assert not (root / "meta.json").exists()
    return info.value


def notes(error) -> list:
    return getattr(error, "__notes__", [])


def names_once(error, place) -> bool:
    """``place`` is in the error's message or its notes, once."""
    return "\n".join([str(error), *notes(error)]).count(str(place)) == 1


def real_shards_with(monkeypatch, shard_name, prepare):
    """Shard writers are ours; ``prepare(path)`` runs on shard ``shard_name``'s directory as
    soon as it is made."""
    real = atlas_fast.writer.AtlasDatasetShardWriter

    def factory(**kwargs):
        shard = real(**kwargs)
        if kwargs["path"].name == shard_name:
            prepare(kwargs["path"])
        return shard

    monkeypatch.setattr(atlas_fast.writer, "AtlasDatasetShardWriter", factory)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("size", [10, 20_000])  # the flush at close fails, or the write itself
@pytest.mark.parametrize("workers", WORKERS)
def test_a_full_disk_names_the_file(tmp_path, monkeypatch, workers, size):
    """data.bin of shard 1 is /dev/full: every write to it fails with ENOSPC, and a failed
    write names no file of its own."""
    real_shards_with(monkeypatch, "1", lambda path: (path / "data.bin").symlink_to("/dev/full"))
    root = tmp_path / "ds"
    examples = [bytes([i % 251]) + os.urandom(size) for i in range(30)]
    error = write_failing(root, examples, workers)
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC
    assert error.filename == str(root / "1" / "data.bin")
    assert names_once(error, root / "1")
    assert (root / "0" / "meta.json").is_file()
    assert not (root / "1" / "meta.json").exists()


@pytest.mark.parametrize("workers", WORKERS)
def test_a_file_that_cannot_be_opened_names_itself(tmp_path, monkeypatch, workers):
    """As open() refuses a file without write permission (the tests may run as root, whom
    permissions do not stop, so numpy's save is made to refuse it)."""
    real_save = np.save

    def save(file, array, *args, **kwargs):
        if os.path.basename(os.path.dirname(file)) == "1":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
        return real_save(file, array, *args, **kwargs)

    monkeypatch.setattr(np, "save", save)
    root = tmp_path / "ds"
    error = write_failing(root, [f"example {i}" for i in range(30)], workers)
    assert type(error) is PermissionError and error.errno == errno.EACCES
    assert error.filename == str(root / "1" / "index.npy")
    assert names_once(error, root / "1")


@pytest.mark.parametrize("workers", WORKERS)
def test_an_example_that_does_not_pickle_names_its_shard_and_block(tmp_path, workers):
    """Example 9 is in shard 0's last block, pickled when the shard is finished: on the pool
    with workers=2. The error names the example, its shard and block, pickle's error is its
    cause, and the writer removed the directory it had begun."""
    examples = [threading.Lock() if i == 9 else f"example {i}" for i in range(30)]
    error = write_failing(tmp_path / "ds", examples, workers)
    assert type(error) is atlas_fast.UnpicklableExampleError and error.index == 9
    assert str(error).startswith(f"{tmp_path / 'ds'}: example 9 (shard 0, block 2) does not")
    assert type(error.__cause__) is TypeError and "cannot pickle" in str(error)
    assert not (tmp_path / "ds").exists()


POISON = b"\x00POISON\x00"


class FailingCompressor:
    """The writer's block compressor, failing on a block that holds POISON."""

    def __init__(self, level, zdict, workers, checksum=False, out=None):
        self.real = PoolCompressor(level, zdict, 1, checksum, out)

    def submit(self, block):
        if POISON in block:
            raise RuntimeError("zstd: injected failure")
        return self.real.submit(block)

    def finish(self):
        return self.real.finish()

    def close(self):
        self.real.close()


@pytest.mark.parametrize("strategy", [1, 3])  # compressed as it is added, or at close
@pytest.mark.parametrize("workers", WORKERS)
def test_a_compression_failure_names_its_shard_and_block(tmp_path, monkeypatch, workers, strategy):
    monkeypatch.setattr(atlas_fast._backend.compressor, "block_compressor", FailingCompressor)
    examples = [POISON if i == 25 else f"example {i}" for i in range(40)]
    error = write_failing(tmp_path / "ds", examples, workers, strategy=strategy)
    assert type(error) is RuntimeError
    shard = tmp_path / "ds" / "2"
    assert str(error) == "zstd: injected failure"
    assert notes(error) == [f"atlas_fast: {shard}: compressing block 1"]


class FailingShardWriter:
    """A shard writer double (the reference's keywords only) whose close() raises ``error``
    made by ``make(path)``."""

    make = staticmethod(lambda path: ValueError("disk on fire"))

    def __init__(self, **kwargs):
        self.path = kwargs["path"]
        self.path.mkdir()
        self.examples = []

    def add_example(self, example):
        self.examples.append(example)

    def __len__(self):
        return len(self.examples)

    def close(self):
        raise type(self).make(self.path)


class NeedsTwoArguments(Exception):
    def __init__(self, what, where):
        super().__init__(f"{what} at {where}")


MADE = {
    "plain": lambda path: ValueError("disk on fire"),
    "path in the message": lambda path: ValueError(f"disk on fire at {path}"),
    "file in the message": lambda path: ValueError(f"disk on fire at {path / 'data.bin'}"),
    "os error without a file": lambda path: OSError(errno.ENOSPC, "No space left on device"),
}


@pytest.mark.parametrize("made", list(MADE))
def test_an_error_of_a_shard_writer_double_names_the_shard(tmp_path, monkeypatch, made):
    """Closed on the pool (strategy 3), the double's error is raised here as it is (an
    OSError keeps its errno), the shard in its note: whether the message holds a path
    changes nothing."""
    raised = []
    make = MADE[made]
    monkeypatch.setattr(
        FailingShardWriter,
        "make",
        staticmethod(lambda path: raised.append(make(path)) or raised[-1]),
    )
    monkeypatch.setattr(atlas_fast.writer, "AtlasDatasetShardWriter", FailingShardWriter)
    root = tmp_path / "ds"
    error = write_failing(root, range(30), workers=2)
    shard = root / "0"
    assert error is raised[0]
    assert str(error) == str(make(shard))
    assert notes(error) == [f"atlas_fast: {shard}: finishing the shard"]


def test_an_error_whose_class_takes_other_arguments_keeps_its_type(tmp_path, monkeypatch):
    """An exception class whose __init__ takes other arguments than a message is raised as
    it is too (no rebuilt error of another type)."""
    monkeypatch.setattr(
        FailingShardWriter, "make", staticmethod(lambda path: NeedsTwoArguments("fire", path))
    )
    monkeypatch.setattr(atlas_fast.writer, "AtlasDatasetShardWriter", FailingShardWriter)
    root = tmp_path / "ds"
    error = write_failing(root, range(30), workers=2)
    assert type(error) is NeedsTwoArguments
    assert str(error) == f"fire at {root / '0'}"
    assert notes(error) == [f"atlas_fast: {root / '0'}: finishing the shard"]


def test_a_double_closed_on_this_thread_raises_its_own_error(tmp_path, monkeypatch):
    """workers=1 closes each shard on the calling thread: its error is raised as it is, as
    the reference does."""
    made = []
    monkeypatch.setattr(
        FailingShardWriter,
        "make",
        staticmethod(lambda path: made.append(ValueError(f"disk on fire at {path}")) or made[-1]),
    )
    monkeypatch.setattr(atlas_fast.writer, "AtlasDatasetShardWriter", FailingShardWriter)
    error = write_failing(tmp_path / "ds", range(30), workers=1)
    assert error is made[0]


def test_an_error_of_a_strategy_2_shard_names_it(tmp_path, monkeypatch):
    """Strategy 2 with workers=2: shards after the first are compressed as they fill and
    finished on the pool: the block that fails is named once."""
    monkeypatch.setattr(atlas_fast._backend.compressor, "block_compressor", FailingCompressor)
    examples = [POISON if i == 85 else f"example {i}" for i in range(230)]
    error = write_failing(
        tmp_path / "ds",
        examples,
        2,
        strategy=CompressionStrategy.SHARED_DICTIONARY_COMPRESSION,
        shard_size=40,
    )
    assert type(error) is RuntimeError
    assert str(error) == "zstd: injected failure"
    assert notes(error) == [f"atlas_fast: {tmp_path / 'ds' / '2'}: compressing block 1"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("strategy", [0, 1])
@pytest.mark.parametrize("workers", WORKERS)
def test_a_block_written_by_the_compressor_fails_at_once_naming_the_file(
    tmp_path, workers, strategy
):
    """Blocks of DIRECT_WRITE_MIN bytes or more, without checksums: the block compressor
    writes data.bin itself, unbuffered (with workers=2 on its helper thread), so the first
    block's failed write is raised by a later add_example, not at close, as an OSError naming
    data.bin; the shard is then lost: adding to it or closing it says so, and it gets no
    meta.json."""
    path = tmp_path / "s"
    big = [os.urandom(atlas_fast.writer.DIRECT_WRITE_MIN) for _ in range(12)]  # > in flight
    w = AtlasDatasetShardWriter(path, 1, strategy, workers=workers)
    (path / "data.bin").symlink_to("/dev/full")
    with pytest.raises(OSError) as info:
        for example in big:
            w.add_example(example)
    assert info.value.errno == errno.ENOSPC
    assert info.value.filename == str(path / "data.bin")
    with pytest.raises(ValueError, match=r"an earlier block was lost .*the shard cannot be"):
        w.add_example(big[0])
    assert_not_finished(w, path)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("workers", WORKERS)
def test_a_caught_write_error_does_not_finish_the_shard(tmp_path, workers):
    """Small blocks wait in data.bin's buffer: a failed flush raised by add_example and
    caught leaves a shard that close() refuses to finish (no meta.json over lost blocks)."""
    path = tmp_path / "s"
    w = AtlasDatasetShardWriter(path, 4, 1, workers=workers)
    (path / "data.bin").symlink_to("/dev/full")
    with pytest.raises(OSError):
        for i in range(100_000):
            w.add_example(f"example {i}")
    assert_not_finished(w, path)


def assert_not_finished(w, path):
    """A shard writer that lost a block: close() says so and writes no meta.json."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(ValueError, match="an earlier block was lost"):
            w.close()
    assert not (path / "meta.json").exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_shard_writer_that_cannot_flush_while_abandoned_keeps_the_with_blocks_error(tmp_path):
    """Blocks small enough to wait in data.bin's buffer (smaller than DIRECT_WRITE_MIN, or
    any with checksums) fail only when it is closed: while the shard is abandoned, that error
    is the warning's (and a note), not the one raised."""
    path = tmp_path / "s"
    boom = KeyError("boom")
    with pytest.warns(RuntimeWarning) as caught, pytest.raises(KeyError) as info:
        with AtlasDatasetShardWriter(path, 1, 1, workers=1) as w:
            (path / "data.bin").symlink_to("/dev/full")
            for i in range(5):
                w.add_example(i)
            raise boom
    assert info.value is boom
    failure = f"OSError: [Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)}: '{path / 'data.bin'}'"
    [warning] = [str(c.message) for c in caught]
    assert warning.endswith(f"Abandoning it also failed: {failure}")
    if hasattr(boom, "add_note"):
        assert boom.__notes__ == [f"atlas_fast: abandoning {path}: {failure}"]
    assert not (path / "meta.json").exists()


@pytest.mark.parametrize(
    ("examples", "left"),
    [
        (6, "shard 0 finished (with its meta.json), shard 1 unfinished (no meta.json)"),
        (10, "shards 0-1 finished (with their meta.json), shard 2 unfinished (no meta.json)"),
        (2, "shard 0 unfinished (no meta.json)"),
    ],
)
def test_the_warning_of_an_abandoned_dataset_names_its_shards(tmp_path, examples, left):
    """The warning lists the shard directories left, by number: "shard 0 finished", never a
    bare "finished ...: 0" that reads as a count."""
    root = tmp_path / "ds"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(KeyError):
            with AtlasDatasetWriter(root, 4, 2, compression_strategy=1, workers=1) as w:
                for x in range(examples):
                    w.add_example(x)
                raise KeyError("stop")
    [warning] = [str(c.message) for c in caught]
    assert warning == (
        f"{root}: the dataset is incomplete and has no meta.json: the with block raised "
        f"KeyError. Shard directories left in it for inspection: {left}; remove the "
        "directory before writing there again."
    )


class DiskGone(OSError):
    """An OSError subclass whose __init__ takes other arguments than OSError's."""

    def __init__(self, device, errno_=errno.EIO):
        if errno_ is None:
            super().__init__(f"{device} is gone")
        else:
            super().__init__(errno_, f"{device} is gone")
        self.device = device


OS_ERRORS = {
    "subclass with its own __init__": lambda: DiskGone("sdz"),
    "subclass without an errno": lambda: DiskGone("sdz", errno_=None),
    "FileNotFoundError": lambda: FileNotFoundError(errno.ENOENT, "gone"),
    "FileNotFoundError naming its file": lambda: FileNotFoundError(
        errno.ENOENT, "gone", "/elsewhere/file"
    ),
}


@pytest.mark.parametrize("made", list(OS_ERRORS))
@pytest.mark.parametrize("workers", WORKERS)
def test_an_os_error_writing_the_index_keeps_its_type(tmp_path, monkeypatch, workers, made):
    """Raised by numpy's save of shard 1's index.npy (on the pool with workers=2): the same
    exception reaches the caller; one with an errno but no file is made to name index.npy."""
    raised = []
    real_save = np.save

    def save(file, array, *args, **kwargs):
        if os.path.basename(os.path.dirname(file)) == "1":
            raised.append(OS_ERRORS[made]())
            raise raised[-1]
        return real_save(file, array, *args, **kwargs)

    monkeypatch.setattr(np, "save", save)
    root = tmp_path / "ds"
    error = write_failing(root, [f"example {i}" for i in range(30)], workers)
    assert error is raised[0]
    original = OS_ERRORS[made]()
    assert type(error) is type(original) and error.errno == original.errno
    if isinstance(error, DiskGone):
        assert error.device == "sdz"
    index = root / "1" / "index.npy"
    if original.filename is None and original.errno is not None:
        assert error.filename == str(index)
        assert notes(error) == []
    else:  # a file of its own, or none it could name: the note names index.npy
        assert error.filename == original.filename
        assert notes(error) == [f"atlas_fast: writing {index}"]
    assert names_once(error, root / "1")


class OSErrorCompressor(FailingCompressor):
    """The block compressor, failing on a block that holds POISON with ``error()``."""

    error = staticmethod(lambda: DiskGone("sdz"))

    def submit(self, block):
        if POISON in block:
            raise type(self).error()
        return self.real.submit(block)


@pytest.mark.parametrize("made", list(OS_ERRORS))
@pytest.mark.parametrize("workers", WORKERS)
def test_an_os_error_of_the_compressor_keeps_its_type(tmp_path, monkeypatch, workers, made):
    """As a failed write of data.bin (an errno, no file: it is made to name data.bin), or
    another error of the compressor (noted as the block's)."""
    monkeypatch.setattr(OSErrorCompressor, "error", staticmethod(OS_ERRORS[made]))
    monkeypatch.setattr(atlas_fast._backend.compressor, "block_compressor", OSErrorCompressor)
    examples = [POISON if i == 25 else f"example {i}" for i in range(40)]
    error = write_failing(tmp_path / "ds", examples, workers, strategy=1)
    original = OS_ERRORS[made]()
    shard = tmp_path / "ds" / "2"
    assert type(error) is type(original) and error.errno == original.errno
    if original.filename is not None:
        assert error.filename == original.filename
        assert notes(error) == [f"atlas_fast: {shard}: compressing block 1"]
    elif original.errno is not None:
        assert error.filename == str(shard / "data.bin")
        assert notes(error) == []
    else:
        assert notes(error) == [f"atlas_fast: {shard}: compressing block 1"]
