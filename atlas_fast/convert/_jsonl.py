"""``--from jsonl``: JSON lines files (plain, .gz, .zst, .bz2, .xz); each line an example.

Every non-blank line becomes one example: the value ``json.loads`` gives for it (usually a
dict). A directory is searched recursively; its files are read in sorted order of their paths.
"""

from __future__ import annotations

from functools import partial

from ._files import JSON_LINES_SUFFIXES, find_files, read_json_lines
from ._source import Part, Source

__all__ = ["sources"]


def _read(path: str):
    for _, value in read_json_lines(path):
        yield value


def sources(src) -> list:
    """One source, one part per file."""
    files = find_files(src, JSON_LINES_SUFFIXES, "JSON lines")
    parts = [Part(str(p), p.stat().st_size, partial(_read, str(p))) for p in files]
    return [Source(parts)]
