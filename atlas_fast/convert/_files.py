"""Finding input files and reading JSON lines: what the jsonl and Dolma converters share."""

from __future__ import annotations

import bz2
import gzip
import io
import itertools
import json
import lzma
import os
import zlib
from collections.abc import Iterator
from pathlib import Path

from ._source import SourceError

__all__ = [
    "JSON_LINES_SUFFIXES",
    "PART_BYTES",
    "find_files",
    "is_compressed",
    "line_ranges",
    "open_decompressed",
    "read_json_lines",
]

# A file larger than this is cut into parts of about this many bytes (whole lines, row groups
# or record batches), so --workers can share one big file.
PART_BYTES = 4 << 20

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


def is_compressed(path: Path) -> bool:
    return path.name.endswith(_COMPRESSED)


def line_ranges(path: Path, target: int) -> list:
    """Cut an uncompressed file into ``(start, stop)`` byte ranges of about ``target`` bytes,
    each starting at the beginning of a line (one range for a small file)."""
    size = path.stat().st_size
    cuts = [0]
    with open(path, "rb") as f:
        while cuts[-1] + target < size:
            f.seek(cuts[-1] + target)
            f.readline()  # to the start of the next line
            if f.tell() >= size:
                break
            cuts.append(f.tell())
    cuts.append(size)
    return list(itertools.pairwise(cuts))


def _lines_before(path: Path, offset: int) -> int:
    """How many lines an uncompressed file holds before byte ``offset`` (for messages)."""
    count, left = 0, offset
    with open(path, "rb") as f:
        while left > 0:
            chunk = f.read(min(left, 1 << 24))
            if not chunk:
                break
            count += chunk.count(b"\n")
            left -= len(chunk)
    return count


def _limited(lines, budget: int):
    for line in lines:
        if budget <= 0:
            return
        budget -= len(line)
        yield line


def read_json_lines(path, start: int = 0, stop: int | None = None) -> Iterator:
    """Yield ``(line_number, value)`` for each non-blank line of a JSON lines file (of its
    lines from byte ``start`` to ``stop``, for an uncompressed file).

    A line that is not JSON, or a file that cannot be read or decompressed, raises
    ``SourceError`` naming the file and the line.
    """
    path = Path(path)
    loads = json.loads
    errors = _read_errors()
    number = 0

    def line(n: int) -> str:
        return f"line {n + (_lines_before(path, start) if start else 0)}"

    try:
        with open_decompressed(path) as f:
            lines = f
            if start or stop is not None:
                f.seek(start)
                lines = _limited(f, (stop if stop is not None else 1 << 62) - start)
            for number, text in enumerate(lines, 1):
                try:
                    value = loads(text.decode())  # UTF-8, as JSON lines are
                except ValueError as exc:
                    if text.isspace():
                        continue
                    try:
                        value = loads(text)  # what json detects: a BOM, UTF-16 or -32
                    except ValueError:
                        raise SourceError(
                            f"{path}: {line(number)}: not valid JSON ({exc})"
                        ) from None
                yield number, value
    except errors as exc:
        raise SourceError(
            f"{path}: {line(number + 1)}: cannot read the file ({type(exc).__name__}: {exc})"
        ) from None
