"""Shared by the export tests: datasets to export, reading them back, no leftovers (rows for
Parquet and Hugging Face are convert_helpers' ``arrow_rows``)."""

from __future__ import annotations

import decimal
from pathlib import Path

import numpy as np

import atlas_fast


def write(path, examples, shard_size=300, block_size=40) -> Path:
    with atlas_fast.AtlasDatasetWriter(path, shard_size=shard_size, block_size=block_size) as w:
        for example in examples:
            w.add_example(example)
    return Path(path)


def read_back(atlas, path) -> list:
    with atlas.AtlasDataset(path) as ds:
        return list(ds)


def assert_absent(dst: Path) -> None:
    """Neither DST nor a staging directory next to it is left."""
    dst = Path(dst)
    assert not dst.exists()
    left = [p.name for p in dst.parent.iterdir() if p.name.startswith(f".{dst.name}.")]
    assert left == []


def json_values(n: int) -> list:
    """Values JSON lines hold exactly: dicts, and any other JSON value, nested."""
    out = []
    for i in range(n):
        if i % 10 == 9:
            out.append([i, "x", None, {"deep": [True, 1.5]}])
        elif i % 10 == 8:
            out.append(f"just a string {i}")
        else:
            out.append(
                {
                    "id": i,
                    "text": "naïve \u2028 " * (i % 3),
                    "f": i / 7,
                    "big": 10**30 + i,
                    "nested": {"l": [i, {"x": None}], "b": i % 2 == 0},
                }
            )
    return out


def wds_samples(n: int) -> list:
    """Samples as ``convert --from wds --decode`` gives them (no ``__url__``)."""
    return [
        {
            "__key__": f"sample{i:05d}",
            "txt": f"caption {i} é",
            "cls": i % 10 - 3,
            "json": {"i": i, "l": [1, None]},
            "npy": np.arange(i % 5 + 1, dtype=np.float32).reshape(-1, 1),
            "jpg": bytes([i % 256]) * 50,
        }
        for i in range(n)
    ]


def mds_samples(n: int) -> list:
    """Samples of every type the MDS target encodes."""
    return [
        {
            "bytes": bytes([i % 256]) * (i % 7),
            "str": f"text {i} é",
            "int": i - 500,
            "huge": 2**70 + i,
            "float": i / 3,
            "dec": decimal.Decimal(i) / 8,
            "u8": np.uint8(i % 256),
            "f32": np.float32(i / 4),
            "arr": np.arange(i % 6 + 1, dtype=np.int16).reshape(1, -1),
            "json": {"a": [i, None], "b": True} if i % 2 else None,
        }
        for i in range(n)
    ]
