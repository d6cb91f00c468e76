"""A conversion into object storage (DST a URL: s3://, gs://, az:// ...).

The dataset is converted as into a local DST, in a temporary directory (under
``staging_dir``, default the system's), then uploaded (``_writing.upload.upload_dataset``:
shards in parallel, multipart; each dataset's root meta.json last) and the local copy removed.
So DST in the store holds the bytes a local conversion writes, and no root meta.json until
every shard is stored. The local disk holds the whole converted dataset meanwhile.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from .._writing.upload import open_destination, remove_objects, upload_dataset
from ..storage._upload import Destination

__all__ = ["RemoteDestination"]


class RemoteDestination:
    """DST at ``url``: refused if objects are there (unless ``overwrite``); ``local`` is the
    directory to convert into, ``upload(splits)`` puts it in the store."""

    def __init__(self, url, storage_options=None, overwrite=False, staging_dir=None) -> None:
        self.dest = open_destination(url, storage_options, overwrite=overwrite, who="convert")
        self.url = self.dest.location.url
        if staging_dir is not None:
            Path(staging_dir).mkdir(parents=True, exist_ok=True)
        self.top = Path(tempfile.mkdtemp(prefix="atlas-fast-convert-", dir=staging_dir))
        self.local = self.top / "dataset"

    def label(self, split) -> str:
        return self.url if split is None else f"{self.url}/{split}"

    def upload(self, splits: list) -> None:
        """Upload the converted dataset(s) (``splits``: each source's split, None for one
        dataset at DST); on failure, what was uploaded is deleted and open uploads aborted."""
        try:
            for split in splits:
                if split is None:
                    upload_dataset(self.local, self.dest)
                else:
                    upload_dataset(self.local / split, Destination(self.dest.location.child(split)))
        except BaseException:
            try:  # DST held nothing before: all under it is this conversion's
                remove_objects(self.dest, self.dest.names())
            except Exception:
                pass
            raise

    def remove(self) -> None:
        shutil.rmtree(self.top, ignore_errors=True)
