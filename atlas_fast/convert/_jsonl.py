"""``--from jsonl``: JSON lines files (plain, .gz, .zst, .bz2, .xz); each line an example.

Every non-blank line becomes one example: the value ``json.loads`` gives for it (usually a
dict). A directory is searched recursively; its files are read in sorted order of their paths.
A file is one part; an uncompressed file larger than 4 MB is cut into parts of whole lines
of about 4 MB (byte ranges that start at a line), so ``--workers`` can share it.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from . import _files
from ._files import (
    JSON_LINES_SUFFIXES,
    _lines_before,
    find_files,
    is_compressed,
    line_ranges,
    read_json_lines,
)
from ._pickled import PICKLED, from_json_value
from ._source import Part, Source

__all__ = ["sources"]


def _read(path: str, start: int = 0, stop=None, unpickle: bool = False):
    for number, value in read_json_lines(path, start, stop):
        if type(value) is dict and PICKLED in value:
            value = from_json_value(value, unpickle, lambda n=number: _line(path, start, n))
        yield value


def _line(path: str, start: int, n: int) -> str:
    """Line ``n`` of the part starting at byte ``start``, named by its number in the file."""
    return f"{path}: line {n + (_lines_before(Path(path), start) if start else 0)}"


def sources(src, unpickle: bool = False) -> list:
    """One source; one part per file, or per run of lines of a big uncompressed file.
    ``unpickle``: give back the examples ``atlas-fast export --pickle`` stored pickled (a
    line ``{"__atlas_pickle__": "<base64>"}``)."""
    parts = []
    for path in find_files(src, JSON_LINES_SUFFIXES, "JSON lines"):
        size = path.stat().st_size
        ranges = [] if is_compressed(path) else line_ranges(path, _files.PART_BYTES)
        if len(ranges) <= 1:
            parts.append(Part(str(path), size, partial(_read, str(path), 0, None, unpickle)))
            continue
        for start, stop in ranges:
            label = f"{path} (bytes {start}-{stop})"
            read = partial(_read, str(path), start, stop, unpickle)
            parts.append(Part(label, stop - start, read))
    return [Source(parts)]
