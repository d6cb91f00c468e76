"""Finding input files and reading JSON lines: what the jsonl and Dolma converters share."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import zlib
from collections.abc import Iterator
from pathlib import Path

from ._source import SourceError

__all__ = ["JSON_LINES_SUFFIXES", "find_files", "open_decompressed", "read_json_lines"]

_COMPRESSED = (".gz", ".zst", ".zstd", ".bz2", ".xz")
JSON_LINES_SUFFIXES = tuple(
    base + comp for base in (".jsonl", ".json", ".ndjson") for comp in ("", *_COMPRESSED)
)


def find_files(src, suffixes: tuple, what: str) -> list:
    """``src`` itself if it is a file, else the files under it whose names end with one of
    ``suffixes``, in sorted order of their relative paths (hidden names skipped)."""
    src = Path(src)
    if src.is_file():
        return [src]
    if not src.is_dir():
        raise SourceError(f"{src}: no such file or directory")
    found = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found.extend(
            Path(dirpath) / name
            for name in filenames
            if name.endswith(suffixes) and not name.startswith(".")
        )
    if not found:
        raise SourceError(f"{src}: no {what} files in it (looked for {', '.join(suffixes)})")
    return sorted(found, key=lambda p: p.relative_to(src).parts)


def open_decompressed(path: Path):
    """A binary file object over ``path``'s content, decompressed by its suffix."""
    name = path.name
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    if name.endswith((".zst", ".zstd")):
        import zstandard

        raw = open(path, "rb")
        reader = zstandard.ZstdDecompressor().stream_reader(
            raw, read_across_frames=True, closefd=True
        )
        return io.BufferedReader(reader, 1 << 20)
    if name.endswith(".bz2"):
        return bz2.open(path, "rb")
    if name.endswith(".xz"):
        return lzma.open(path, "rb")
    return open(path, "rb", buffering=1 << 20)


def _read_errors() -> tuple:
    import zstandard

    return (OSError, EOFError, zlib.error, lzma.LZMAError, zstandard.ZstdError)


def read_json_lines(path) -> Iterator:
    """Yield ``(line_number, value)`` for each non-blank line of a JSON lines file.

    A line that is not JSON, or a file that cannot be read or decompressed, raises
    ``SourceError`` naming the file and the line.
    """
    path = Path(path)
    loads = json.loads
    errors = _read_errors()
    number = 0
    try:
        with open_decompressed(path) as f:
            for number, line in enumerate(f, 1):
                try:
                    value = loads(line)
                except ValueError as exc:
                    if line.isspace():
                        continue
                    raise SourceError(f"{path}: line {number}: not valid JSON ({exc})") from None
                yield number, value
    except errors as exc:
        raise SourceError(
            f"{path}: line {number + 1}: cannot read the file ({type(exc).__name__}: {exc})"
        ) from None
