"""``convert(..., append=True)``: the converted examples added after the last one of the
Atlas dataset at DST (each split's at DST/<split>), as ``AtlasDatasetWriter(append=True)``
adds them (docs/growing.md).

Every dataset appended to is opened for growing before the source is read (``Growths``):
locally locked, its leftovers removed and checked (``_writing.grow.LocalAppend``), at a URL
read and checked (``_writing.grow_remote.RemoteGrowth``). Its compression strategy is the
conversion's and its shared dictionary the runs' (published before they start: none is
trained). The shards are written, committed into a dataset inside the staging directory and
verified there if asked, as a new conversion's are; then, once every source is written,
each append is committed: locally the staged shards moved into the append's folder beside
the dataset (same file system: renames) and the grown dataset exchanged in; to a URL the
new shards, uploaded meanwhile under the numbers after the last, committed by the root
meta.json (``_upload.RemoteDestination``). Bad input (a path that holds no dataset, a
damaged one, another compression strategy) raises before anything is written.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .._format import DICT_FILE, read_dataset_metadata, shard_dir_names

__all__ = ["Growths"]


class Growths:
    """The datasets a conversion appends to, by split (None: DST itself), opened for
    growing with the compression strategy ``asked``; ``remote``: the ``RemoteDestination``
    of a URL DST (None: a local one)."""

    def __init__(self, dst, splits: list, asked, remote=None) -> None:
        from .._writing.grow import LocalAppend
        from .._writing.grow_remote import RemoteGrowth

        self.remote = remote
        self.items: dict = {}
        try:
            for split in splits:
                if remote is not None:
                    self.items[split] = RemoteGrowth.open(
                        remote.label(split), remote.storage_options, "convert --append"
                    )
                else:
                    where = Path(dst) if split is None else Path(dst) / split
                    self.items[split] = LocalAppend(where, "convert --append", asked)
        except BaseException:
            self.abandon()
            raise
        self.asked = asked

    def strategy(self, split) -> int:
        growth = self.items[split]
        if self.remote is not None:
            return growth.strategy_for(self.asked)
        return growth.strategy

    def dict_bytes(self, split):
        growth = self.items[split]
        return growth.dict_bytes if self.remote is not None else growth.existing.dict_bytes

    def options(self, split, options: dict) -> dict:
        """The writer options of ``split``'s shards: the dataset's strategy."""
        return {**options, "compression_strategy": self.strategy(split)}

    def commit_local(self, split, staged_root: Path, fmt: str) -> None:
        """``split``'s append committed: the dataset converted at ``staged_root`` (in the
        staging directory, verified if asked) becomes the shards after the last."""
        growth = self.items.pop(split)
        try:
            metadata = read_dataset_metadata(staged_root)
            names = shard_dir_names(staged_root)
            written = grow_token_indexes(growth.existing, staged_root, growth.aside.dir)
            for k, name in enumerate(names):
                target = growth.shard_dir(growth.first + k)
                if _same_fs(staged_root, target.parent):
                    os.replace(staged_root / name, target)
                else:
                    shutil.move(staged_root / name, target)
            shared = staged_root / DICT_FILE
            if growth.existing.dict_bytes is None and shared.is_file():
                # A strategy-2 dataset of no shard: the dictionary its first new one trained.
                os.replace(shared, growth.aside.dir / DICT_FILE)
                written.append(DICT_FILE)
            growth.commit(metadata.shard_sizes, metadata.compression_strategy, written=written)
        except BaseException:
            growth.abandon()
            raise

    def abandon(self) -> None:
        """Let every dataset not committed go as it was (a local one's aside folder removed,
        its lock released)."""
        items, self.items = self.items, {}
        for growth in items.values():
            if self.remote is None:
                try:
                    growth.abandon()
                except Exception:
                    pass  # the error raised is the conversion's; leftovers go next time


def grow_token_indexes(existing, staged_root: Path, where: Path) -> list:
    """For each token index of the dataset ``existing`` that covers all its shards, the
    grown dataset's written at ``where``: its entries, then those of the shards converted at
    ``staged_root`` (only they are read). An index whose field the new examples do not
    hold is left to the dataset's next ``TokenSequences``. The names written."""
    from .._errors import NotTokensError
    from .._token_index import covering_entries, field_of, index_dataset, index_files, write_index

    written = []
    sizes = existing.metadata.shard_sizes
    new_sizes = read_dataset_metadata(staged_root).shard_sizes
    for name in index_files(existing.root):
        field = field_of(existing.root / name)
        old = None if field is ... else covering_entries(existing.root / name, field, sizes)
        if old is None:
            continue
        try:
            made = index_dataset(staged_root, field, progress=False)
        except NotTokensError:
            continue
        new = covering_entries(made, field, new_sizes)
        made.unlink()
        if new is not None:
            write_index(where / name, field, old + new)
            written.append(name)
    return written


def _same_fs(a: Path, b: Path) -> bool:
    return a.stat().st_dev == b.stat().st_dev
