"""Reading Arrow data as examples: what the Parquet and Hugging Face converters share."""

from __future__ import annotations

from .._extras import require
from . import _files

__all__ = ["group_ranges", "pyarrow", "rows"]


def pyarrow(extra: str, feature: str):
    """``pyarrow`` itself, or the one-line error naming ``extra``."""
    return require("pyarrow", extra, feature)


def group_ranges(sizes: list, target: int | None = None) -> list:
    """Cut consecutive units of ``sizes`` bytes into ``(start, stop)`` ranges of about
    ``target`` bytes each (default ``_files.PART_BYTES``; at least one unit per range; one
    range for an empty list)."""
    if target is None:
        target = _files.PART_BYTES
    ranges, start, acc = [], 0, 0
    for i, size in enumerate(sizes):
        acc += size
        if acc >= target and i + 1 < len(sizes):
            ranges.append((start, i + 1))
            start, acc = i + 1, 0
    ranges.append((start, len(sizes)))
    return ranges


def _row_dicts(batch) -> list:
    """``batch.to_pylist()``, built column by column (faster: one conversion per column)."""
    columns = batch.to_pydict()
    if not columns or len(columns) != batch.num_columns:  # no columns, or repeated names
        return batch.to_pylist()
    names = list(columns)
    return [dict(zip(names, values)) for values in zip(*columns.values())]


def rows(batches, where, unpickle: bool = False):
    """Yield each row of each record batch as a dict (as ``to_pylist``). ``where(rows_done)``
    names the position for an error raised while reading. A batch with the column
    ``_pickled.PICKLED`` (written by ``atlas-fast export --pickle``) gives its pickled rows'
    examples with ``unpickle``, else raises ``SourceError`` on the first."""
    pa = pyarrow("convert", "reading Arrow data")
    from ._pickled import PICKLED, from_arrow_row
    from ._source import SourceError

    done = 0
    try:
        for batch in batches:
            examples = _row_dicts(batch)
            if PICKLED in batch.schema.names:
                examples = [
                    from_arrow_row(row, unpickle, lambda j=done + j: where(j))
                    for j, row in enumerate(examples)
                ]
            done += len(examples)
            yield from examples
    except (pa.ArrowException, OSError) as exc:
        raise SourceError(f"{where(done)}: cannot read ({exc})") from None
