"""Shared by the converter and export tests (tests/convert is on sys.path for the whole suite:
pyproject's ``pythonpath``): source documents and rows, reading a dataset back, no leftovers."""

from __future__ import annotations

import datetime
import decimal
import gzip
import json
import random
from pathlib import Path

WORDS = ["atlas", "shard", "block", "zstd", "pickle", "naïve", "日本語", "", "x" * 300]


def documents(n: int, seed: int = 0, start: int = 0) -> list:
    """Dolma-like documents: id, text, source, added, nested metadata with mixed types."""
    rng = random.Random(seed)
    docs = []
    for i in range(start, start + n):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 40)))
        docs.append(
            {
                "id": f"doc-{i}",
                "text": text,
                "source": rng.choice(["web", "books"]),
                "added": "2024-01-02T03:04:05Z",
                "metadata": {"length": len(text), "score": rng.random(), "tags": ["a", i]},
            }
        )
    return docs


def arrow_rows(n: int, start: int = 0) -> list:
    """Rows Parquet and Hugging Face hold exactly: scalars of every kind, nulls, lists,
    structs, timestamps, decimals (under 10, so a schema inferred from any batch of them
    holds them all)."""
    return [
        {
            "id": i,
            "text": f"row {i} é 日本",
            "score": i / 3,
            "flag": i % 2 == 0,
            "blob": bytes([i % 256]) * (i % 5),
            "tags": [f"t{j}" for j in range(i % 4)],
            "meta": {"a": i, "b": None if i % 3 else "x"},
            "when": datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=i),
            "price": decimal.Decimal(i % 1000) / 100,
            "maybe": None if i % 7 == 0 else i,
        }
        for i in range(start, start + n)
    ]


def arrow_table(rows: list):
    """``rows`` of ``arrow_rows`` as a pyarrow Table of their full schema."""
    import pyarrow as pa

    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("text", pa.string()),
            ("score", pa.float64()),
            ("flag", pa.bool_()),
            ("blob", pa.binary()),
            ("tags", pa.list_(pa.string())),
            ("meta", pa.struct([("a", pa.int64()), ("b", pa.string())])),
            ("when", pa.timestamp("us")),
            ("price", pa.decimal128(10, 2)),
            ("maybe", pa.int64()),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def write_jsonl(path: Path, values, *, blank_lines: bool = False) -> Path:
    """JSON lines as text; ``.gz`` / ``.zst`` / ``.bz2`` compressed by the path's suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(v) + ("\n\n" if blank_lines else "\n") for v in values)
    data = text.encode()
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    elif path.name.endswith(".zst"):
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    elif path.name.endswith(".bz2"):
        import bz2

        data = bz2.compress(data)
    path.write_bytes(data)
    return path


def read_back(atlas, path) -> list:
    with atlas.AtlasDataset(path) as ds:
        return [ds[i] for i in range(len(ds))]


def assert_absent(dst: Path) -> None:
    """Neither DST nor a staging directory next to it is left."""
    dst = Path(dst)
    assert not dst.exists()
    left = [p.name for p in dst.parent.iterdir() if p.name.startswith(f".{dst.name}.")]
    assert left == []
