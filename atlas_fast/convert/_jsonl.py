"""``--from jsonl``: JSON lines files (plain, .gz, .zst, .bz2, .xz); each line an example.

Every non-blank line becomes one example: the value ``json.loads`` gives for it (usually a
dict). A directory is searched recursively; its files are read in sorted order of their paths.
A file is one part; an uncompressed file larger than 4 MB is cut into parts of whole lines
of about 4 MB (byte ranges that start at a line), so ``--workers`` can share it.
"""

from __future__ import annotations

from functools import partial

from . import _files
from ._files import JSON_LINES_SUFFIXES, find_files, is_compressed, line_ranges, read_json_lines
from ._source import Part, Source

__all__ = ["sources"]


def _read(path: str, start: int = 0, stop=None):
    for _, value in read_json_lines(path, start, stop):
        yield value


def sources(src) -> list:
    """One source; one part per file, or per run of lines of a big uncompressed file."""
    parts = []
    for path in find_files(src, JSON_LINES_SUFFIXES, "JSON lines"):
        size = path.stat().st_size
        ranges = [] if is_compressed(path) else line_ranges(path, _files.PART_BYTES)
        if len(ranges) <= 1:
            parts.append(Part(str(path), size, partial(_read, str(path))))
            continue
        for start, stop in ranges:
            label = f"{path} (bytes {start}-{stop})"
            parts.append(Part(label, stop - start, partial(_read, str(path), start, stop)))
    return [Source(parts)]
