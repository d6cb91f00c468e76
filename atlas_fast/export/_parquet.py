"""``--to parquet``: a directory of Parquet files, ``part-00000.parquet``, ... in the order of
the examples (the order ``convert --from parquet`` reads them in).

Each example is a row: a dict of its columns (see ``_arrow`` for what is held exactly). A
part of the dataset is written into one file, or more when its examples' keys or types change
(a file has one schema). Row groups hold up to 64 Ki rows; pages are compressed with zstd.
"""

from __future__ import annotations

from pathlib import Path

from ._arrow import ArrowRows, pyarrow

__all__ = ["EXTRA", "PartWriter", "finish"]

EXTRA = "parquet"
SUFFIX = ".parquet"


class PartWriter:
    """Writes one part's examples into ``out/0.parquet``, ``out/1.parquet``, ..."""

    def __init__(self, out: Path, options: dict):
        pyarrow(EXTRA, "exporting to Parquet")
        import pyarrow.parquet as pq

        self.pq = pq
        self.out = out
        self.files: list = []
        self.writer = None
        self.rows = ArrowRows("Parquet", options["pickle"], self._sink, self._close_file)

    def _sink(self, table, first) -> None:
        if self.writer is None:
            path = self.out / f"{len(self.files)}{SUFFIX}"
            self.files.append(path.name)
            self.writer = self.pq.ParquetWriter(path, table.schema, compression="zstd")
        self.writer.write_table(table, row_group_size=1 << 16)

    def _close_file(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def add(self, example, where, index: int) -> None:
        self.rows.add(example, where)

    def close(self) -> dict:
        self.rows.flush()
        self._close_file()
        return {"files": self.files, "pickled": self.rows.pickled}

    def abort(self) -> None:
        self._close_file()


def finish(out: Path, parts: list, options: dict) -> list:
    """Move every part's files (``parts``: ``(part directory, close() result)`` in the
    dataset's order) to ``out/part-NNNNN.parquet``; the names, in order."""
    return rename_in_order(out, parts, "part-", SUFFIX)


def rename_in_order(out: Path, parts: list, prefix: str, suffix: str, width: int = 5) -> list:
    """The parts' files renamed ``out/<prefix><n><suffix>``, numbered in order, zero-padded
    to one width (at least ``width``) so that sorted names keep the order."""
    files = [Path(directory) / name for directory, result in parts for name in result["files"]]
    width = max(width, len(str(len(files) - 1)))
    names = []
    for n, path in enumerate(files):
        name = f"{prefix}{n:0{width}d}{suffix}"
        path.rename(out / name)
        names.append(name)
    return names
