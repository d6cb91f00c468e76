"""Shared by the converter tests: source documents, reading a dataset back, no leftovers."""

from __future__ import annotations

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
