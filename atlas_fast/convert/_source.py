"""What every converter reads: a source as ordered parts that worker processes read apart.

A format module turns its input into one ``Source`` per output dataset (formats with splits,
such as Energon and flat-tokens, give one per split). A ``Source`` is a list of ``Part``s whose
examples, read in list order, are the dataset's examples in order: ``--workers N`` gives each
process a contiguous run of parts and commits their shards in part order, so the result holds
the same examples in the same order as a serial run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Part", "Source", "SourceError"]


class SourceError(ValueError):
    """The input of a conversion is malformed: the message starts with the file (and the
    position in it: line, member, sample or row) and says what is wrong."""


@dataclass(frozen=True)
class Part:
    """One independently readable piece of a source: a file, a shard, a row group range.

    ``read`` must be picklable (a module-level function, or ``functools.partial`` of one) so
    a worker process can call it; it yields this part's examples in order and raises
    ``SourceError`` for malformed input.
    """

    label: str  # what the progress bar and error messages call it (usually a path)
    nbytes: int  # input bytes this part reads, for progress and the summary
    read: Callable[[], Iterator[Any]]
    # How many examples ``read`` yields, when the source says so without reading them (the
    # rows of Parquet row groups or Arrow record batches); None: not known before reading.
    examples: int | None = None


@dataclass(frozen=True)
class Source:
    """The input of one output dataset. ``split`` names the sub-directory of DST it is
    written to (None: DST itself)."""

    parts: list = field(default_factory=list)
    split: str | None = None
