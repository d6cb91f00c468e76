"""Where a conversion writes before its result appears at DST.

The staging directory, ``.<DST name>.converting-XXXX`` next to DST (``tokenizing-`` for
``tokenize``)::

    work/<source>/<run>/<n>/     shards written by the worker of that run of parts
    work/<source>/dict/          strategy 2: the shared dictionary, published by run 0
    out/[<split>/]               the committed dataset(s), renamed to DST at the very end

Nothing at DST changes until that final rename, and until then no root meta.json exists
outside the staging directory: a failed, interrupted or mismatching (``verify``) conversion
removes the staging directory and leaves DST as it was.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path

__all__ = ["Staging", "check_destination"]


def check_destination(dst: Path) -> None:
    """Refuse a destination that is not absent or an empty directory."""
    from .._errors import destination_exists

    if (dst.is_dir() and any(dst.iterdir())) or (
        not dst.is_dir() and (dst.exists() or dst.is_symlink())
    ):
        raise destination_exists(dst, "convert", empty_dir_ok=True)


class Staging:
    """The staging directory of a conversion into ``dst`` (made next to it, with its parent
    directories): ``out`` is what becomes DST, ``work(s)`` where source ``s`` is written."""

    def __init__(self, dst: Path, doing: str = "converting"):
        self.dst = dst
        dst.parent.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix=f".{dst.name}.{doing}-", dir=dst.parent))
        self.out = self.path / "out"

    def work(self, s: int) -> Path:
        return self.path / "work" / str(s)

    def move_in(self) -> None:
        """Rename ``out`` to DST (checked again: it must still be new or empty)."""
        check_destination(self.dst)
        if self.dst.is_dir():
            self.dst.rmdir()
        os.rename(self.out, self.dst)

    def remove(self) -> None:
        """Remove the staging directory (what is left of it); a warning if it stays."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self.path.exists():
            warnings.warn(
                f"{self.path}: could not remove this staging directory of the conversion; "
                "it is not a dataset, remove it by hand",
                RuntimeWarning,
                stacklevel=3,
            )
