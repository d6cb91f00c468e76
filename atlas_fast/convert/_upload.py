"""A conversion into object storage (DST a URL: s3://, gs://, az:// ...).

Each shard is uploaded as soon as it is finished and its place in the dataset is known
(``verify``: and it is verified), then removed locally (``_stream``): local staging, in a
temporary directory under ``staging_dir`` (default the system's), holds at most
``staging_bytes`` of finished shards (default ``DEFAULT_STAGING_BYTES``) plus a shard per
process and those being written. Each dataset's root meta.json is put at the very end, once
every dataset of the conversion is stored: DST holds the bytes a local conversion writes,
and no root meta.json until then. A failure deletes what was uploaded and aborts the open
multipart uploads.

``ray=True`` writes through ``atlas_fast.ray.write_atlas`` to the URL (its tasks upload);
with ``verify`` too it converts into the temporary directory whole, verifies, then uploads
the dataset (``upload``).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from .._format import VERSION, AtlasDatasetMetadata, meta_text
from .._writing.upload import (
    DEFAULT_STAGING_BYTES,
    ShardUploads,
    open_destination,
    remove_objects,
    upload_dataset,
)
from ..storage import Location
from ..storage._upload import Destination

__all__ = ["RemoteDestination"]


class RemoteDestination:
    """DST at ``url``: refused if objects are there (unless ``overwrite``); ``local`` is the
    local directory a conversion stages in. ``stream`` gives a source's ``ShardStream``,
    ``seal`` stores what is left of its dataset but the root meta.json, ``commit`` puts
    the root meta.jsons; ``fail`` removes what was uploaded."""

    def __init__(
        self,
        url,
        storage_options=None,
        overwrite=False,
        staging_dir=None,
        staging_bytes=None,
        *,
        append=False,
    ) -> None:
        if append:  # the datasets there are opened by ``_append.Growths`` (``growths``)
            self.dest = Destination(Location(url, storage_options))
        else:
            self.dest = open_destination(url, storage_options, overwrite=overwrite, who="convert")
        self.growths = None
        self.url = self.dest.location.url
        self.storage_options = storage_options
        self.limit = DEFAULT_STAGING_BYTES if staging_bytes is None else int(staging_bytes)
        if staging_dir is not None:
            Path(staging_dir).mkdir(parents=True, exist_ok=True)
        self.top = Path(tempfile.mkdtemp(prefix="atlas-fast-convert-", dir=staging_dir))
        self.local = self.top / "dataset"
        self.uploads: list = []  # (split, ShardUploads) of each dataset begun
        self.sealed: list = []  # (ShardUploads, root meta.json fields) of each one stored
        self.bytes_out = 0

    def label(self, split) -> str:
        return self.url if split is None else f"{self.url}/{split}"

    def _dest(self, split) -> Destination:
        return self.dest if split is None else Destination(self.dest.location.child(split))

    def stream(self, source, gate, options: dict, verify: bool, dict_dir):
        """The ``ShardStream`` of ``source``'s dataset (see ``_stream``)."""
        from ._stream import ShardStream

        gate.reset(self.limit)
        uploads = ShardUploads(
            self._dest(source.split), staging_dir=self.top, on_stored=gate.stored
        )
        self.uploads.append((source.split, uploads))
        lower = 1
        counts = [part.examples for part in source.parts]
        if counts and None not in counts:
            lower = -(-sum(counts) // options["shard_size"])
        label = self.label(source.split) if verify else None
        first = 0 if self.growths is None else self.growths.items[source.split].count
        return ShardStream(
            uploads, gate, source.parts, lower=lower, verify=label, dict_dir=dict_dir, first=first
        )

    def seal(self, stream, sizes: list, strategy: int, shared) -> None:
        """Every shard of ``stream``'s dataset stored under its final name, the shared
        dictionary (``shared``: bytes or None) put; its root meta.json waits for ``commit``."""
        uploads = stream.uploads
        if self.growths is not None:  # an append: committed by ``commit``
            growth = self.growths.items[stream_split(self, uploads)]
            self.sealed.append((uploads, (growth, list(sizes), int(strategy), shared)))
            self.bytes_out += stream.stored_bytes
            return
        fields = AtlasDatasetMetadata(VERSION, list(sizes), int(strategy))._asdict()
        uploads.seal(fields, dict_bytes=shared)
        self.sealed.append((uploads, fields))
        self.bytes_out += stream.stored_bytes + len(meta_text(fields).encode())
        if shared is not None:
            self.bytes_out += len(shared)

    def commit(self) -> None:
        """Each dataset's root meta.json, once all are stored: the last objects."""
        for uploads, fields in self.sealed:
            if self.growths is not None:
                _commit_append(uploads, *fields)
            else:
                uploads.put_meta(fields)
            uploads.close()

    def upload(self, splits: list) -> None:
        """Upload the dataset(s) converted into ``local`` (``splits``: each source's split,
        None for one dataset at DST): ``ray=True``."""
        for split in splits:
            local = self.local if split is None else self.local / split
            upload_dataset(local, self._dest(split))
            self.bytes_out += sum(p.stat().st_size for p in local.rglob("*") if p.is_file())

    def stored_bytes(self, ray: bool, verify: bool) -> int:
        """The bytes the conversion stored (listed in the store after ``write_atlas``)."""
        if ray and not verify:
            return self.dest.total_bytes()
        return self.bytes_out

    def fail(self) -> None:
        """The conversion failed: what was uploaded is deleted, open uploads aborted."""
        for _, uploads in self.uploads:
            try:
                uploads.abandon()
            except Exception:
                pass
        if self.growths is not None:  # an append: DST's datasets are left as they were
            return
        try:  # DST held nothing before: all under it is this conversion's
            remove_objects(self.dest, self.dest.names())
            self.dest.abort_uploads()
        except Exception:
            pass

    def remove(self) -> None:
        for _, uploads in self.uploads:
            uploads.close()
        shutil.rmtree(self.top, ignore_errors=True)


def stream_split(remote: RemoteDestination, uploads):
    """The split whose dataset ``uploads`` stores."""
    for split, found in remote.uploads:
        if found is uploads:
            return split
    raise KeyError("uploads of no split")


def _commit_append(uploads, growth, sizes: list, strategy: int, shared) -> None:
    """An append to a URL: the new shards (uploaded under the numbers after the last)
    committed by the grown dataset's root meta.json; a dataset of no shard takes the
    dictionary its first new shard trained."""
    from .._format import DICT_FILE
    from .._writing.grow_remote import commit_remote_append

    new = uploads.uploaded(len(sizes))
    if shared is not None and growth.dict_bytes is None and sizes:
        growth.dest.put_bytes(DICT_FILE, shared)
    commit_remote_append(growth, new, sizes, strategy)
