"""An Atlas dataset as the source of ``tokenize``: a directory or a URL, one part per shard.

Each example is the one the dataset holds (``AtlasDataset`` reads it, so a URL works as for
reading: credentials and endpoints from the standard environment variables). Parts know their
examples (the root meta.json's shard sizes) and, for a local dataset, their bytes on disk.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ._source import Part, Source, SourceError

__all__ = ["is_atlas_dataset", "sources"]


def is_atlas_dataset(src) -> bool:
    """Whether ``src`` is an Atlas dataset root (a directory or URL with a meta.json that
    is a dataset's): what ``tokenize`` reads when no format is given."""
    from .._errors import AtlasFormatError, StorageError
    from .._format import META_FILE, read_dataset_metadata
    from ..storage._dataset import is_remote, to_local

    if is_remote(src):
        from .. import atlas

        try:
            atlas.AtlasDataset(src).close()
        except (AtlasFormatError, StorageError):
            return False
        return True
    root = Path(to_local(src))
    if not (root / META_FILE).is_file():
        return False
    try:
        read_dataset_metadata(root)
    except AtlasFormatError:
        return False
    return True


def sources(src) -> list:
    """One source; one part per shard."""
    from .. import atlas
    from .._errors import AtlasFormatError, StorageError
    from ..storage._dataset import is_remote

    try:
        with atlas.AtlasDataset(src) as ds:
            root = str(ds.root)
            sizes = [int(n) for n in ds.actual_shard_sizes]
            dirs = [str(shard.root) for shard in ds.shards] if not is_remote(src) else None
    except (AtlasFormatError, StorageError) as exc:
        raise SourceError(f"{src}: not a readable Atlas dataset ({exc})") from None
    parts = []
    for k, size in enumerate(sizes):
        nbytes = 0
        label = f"{root} (shard {k})"
        if dirs is not None:
            nbytes = sum(p.stat().st_size for p in Path(dirs[k]).iterdir() if p.is_file())
            label = dirs[k]
        parts.append(Part(label, nbytes, partial(_read, root, k), size))
    return [Source(parts)]


def _read(root: str, k: int):
    from .. import atlas

    with atlas.AtlasDataset(root) as ds:
        yield from ds.shards[k]
