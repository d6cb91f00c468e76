"""``--from parquet``: Parquet files, or directories of them, streamed by record batches.

Each row becomes one example: a dict of its columns as ``pyarrow``'s ``to_pylist`` gives them
(strings, ints, floats, bools, None, bytes for binary, lists, dicts for structs, datetime and
Decimal values). A directory is searched recursively for ``*.parquet`` files, read in sorted
order of their paths. A file is one part, or, when it is larger than 4 MB and holds several
row groups, one part per run of row groups of about 4 MB, so ``--workers`` can share it (a row
group is not cut: decoding it is much of reading it). Each part knows its rows.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ._arrow import group_ranges, pyarrow, rows
from ._files import find_files
from ._source import Part, Source, SourceError

__all__ = ["sources"]

SUFFIXES = (".parquet", ".parq", ".pq")
BATCH_ROWS = 1024


def _open(pq, path):
    pa = pyarrow("parquet", "converting Parquet")
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise SourceError(f"{path}: not a readable Parquet file ({exc})") from None


def sources(src, unpickle: bool = False) -> list:
    """One source; one part per file or per run of row groups. ``unpickle``: give back the
    examples ``atlas-fast export --pickle`` stored pickled (see ``_pickled``)."""
    pyarrow("parquet", "converting Parquet")
    import pyarrow.parquet as pq

    parts = []
    for path in find_files(src, SUFFIXES, "Parquet"):
        size = path.stat().st_size
        with _open(pq, path) as f:
            meta = f.metadata
            groups = [meta.row_group(g) for g in range(meta.num_row_groups)]
        stored = [
            sum(g.column(c).total_compressed_size for c in range(g.num_columns)) for g in groups
        ]
        counts = [g.num_rows for g in groups]
        ranges = group_ranges(stored)
        if len(ranges) <= 1:
            read = partial(_read, str(path), None, 0, unpickle)
            parts.append(Part(str(path), size, read, sum(counts)))
            continue
        total = sum(stored) or 1
        for start, stop in ranges:
            label = f"{path} (row groups {start}-{stop - 1})"
            nbytes = size * sum(stored[start:stop]) // total
            first_row = sum(counts[:start])
            read = partial(_read, str(path), (start, stop), first_row, unpickle)
            parts.append(Part(label, nbytes, read, sum(counts[start:stop])))
    return [Source(parts)]


def _read(path: str, groups, first_row: int, unpickle: bool = False):
    pyarrow("parquet", "converting Parquet")
    import pyarrow.parquet as pq

    with _open(pq, Path(path)) as f:
        row_groups = None if groups is None else list(range(*groups))
        # On the calling thread: a worker of ``convert`` is one core (``workers`` counts
        # them all), not pyarrow's pool of one thread per core.
        batches = f.iter_batches(batch_size=BATCH_ROWS, row_groups=row_groups, use_threads=False)
        yield from rows(batches, lambda done: f"{path}: row {first_row + done}", unpickle)
