"""Datasets for the loader and sampler tests, written with atlas_fast's own writer."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest

from atlas_fast import AtlasDatasetWriter, CompressionStrategy


def example(i: int) -> dict:
    return {"id": i, "text": f"document {i} " + "abcdefgh"[i % 8] * (i % 41)}


def write_dataset(
    path: Path,
    n: int,
    shard_size: int,
    block_size: int,
    strategy=CompressionStrategy.SHARED_DICTIONARY_COMPRESSION,
) -> Path:
    """A dataset of ``example(0) .. example(n - 1)``."""
    with AtlasDatasetWriter(path, shard_size, block_size, compression_strategy=strategy) as w:
        for i in range(n):
            w.add_example(example(i))
    return path


def keep_shards(root: Path, dest: Path, numbers: list) -> Path:
    """A copy of ``root`` holding only the shards ``numbers`` (as on one node of many)."""
    dest.mkdir()
    for item in root.iterdir():
        if item.is_dir():
            if int(item.name) in numbers:
                shutil.copytree(item, dest / item.name)
        else:
            shutil.copy(item, dest / item.name)
    return dest


class FreezeProbe:
    """A map-style dataset over ``ds`` that returns, for each example read, the collector's
    frozen-object count (``gc.get_freeze_count()``) in the process that read it, and checks the
    example on the way."""

    def __init__(self, ds) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int):
        import gc

        assert self.ds[i] == example(i)
        return gc.get_freeze_count()


@contextlib.contextmanager
def counted_read_ahead(backend: str, monkeypatch):
    """Blocks decoded ahead, counted: yields a function giving the count so far (the
    compiled core's read-ahead jobs taken; the Python core's calls of its pool's decode, a
    private name, since the pool is not observable otherwise), small blocks included."""
    import atlas_fast._core._pool
    import atlas_fast._core._reader_py

    monkeypatch.setattr(atlas_fast._core._pool, "POOL_MIN_BLOCK_BYTES", 0)  # small blocks
    if backend == "cython":
        reader = pytest.importorskip("atlas_fast._core._reader")
        old = reader._readahead_min_bytes(0)
        try:
            yield lambda: reader._readahead_info()["taken"]
        finally:
            reader._readahead_min_bytes(old)
        return
    calls = []
    real = atlas_fast._core._pool.decode_on_pool
    monkeypatch.setattr(
        atlas_fast._core._reader_py, "decode_on_pool", lambda r, b: calls.append(b) or real(r, b)
    )
    yield calls.__len__
