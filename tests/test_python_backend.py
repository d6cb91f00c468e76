"""The pure-Python backend's own I/O paths (about one backend: not parametrized)."""

import os
import threading

import pytest
from helpers import assert_same

import atlas_fast
from atlas_fast import _python
from atlas_fast._core import _reader_py as _pyreader


def _write(root, n=300, block_size=7, strategy=1):
    examples = [{"id": i, "text": "x" * (i % 50)} for i in range(n)]
    with atlas_fast.AtlasDatasetWriter(
        root, shard_size=100, block_size=block_size, compression_strategy=strategy
    ) as writer:
        for example in examples:
            writer.add_example(example)
    return examples


def test_read_at_reads_across_short_reads(tmp_path, monkeypatch):
    path = tmp_path / "f"
    path.write_bytes(bytes(range(256)) * 40)
    calls = []

    def short_pread(fd, size, offset):  # at most 100 bytes per call, as a pipe or a cap would
        calls.append(size)
        return os.pread(fd, min(size, 100), offset)

    if hasattr(os, "pread"):
        monkeypatch.setattr(_pyreader, "_pread", short_pread)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert _pyreader.read_at(fd, 1000, 5) == (bytes(range(256)) * 40)[5:1005]
        assert _pyreader.read_at(fd, 1000, 10_200) == (bytes(range(256)) * 40)[10_200:]
        assert _pyreader.read_at(fd, 10, 20_000) == b""
    finally:
        os.close(fd)
    if hasattr(os, "pread"):
        assert len(calls) > 10  # the loop really went round


@pytest.mark.parametrize("strategy", [0, 1])
def test_without_pread_threads_read_correct_examples(tmp_path, monkeypatch, strategy):
    """Where the OS has no pread (Windows), a seek and a read under the pool lock."""
    monkeypatch.setattr(_pyreader, "_pread", None)
    examples = _write(tmp_path / "ds", strategy=strategy)
    ds = _python.AtlasDataset(tmp_path / "ds")
    errors = []

    def reader(seed):
        try:
            for k in range(600):
                i = (k * 7919 + seed * 104729) % len(examples)
                assert_same(ds[i], examples[i], f"example {i}")
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ds.close()
    assert errors == []
