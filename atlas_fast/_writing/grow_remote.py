"""Growing a dataset in object storage (append), and the objects a merge copies there.

A dataset at a URL is what its root meta.json counts: readers list nothing, they read
``meta.json`` and then the shards ``shard_names(n)``. So an append uploads its new shards
under names no reader of the old meta.json looks at (the numbers after the last), and the
new root meta.json, put last, is the commit, as for a new dataset. When the count crosses a
power of ten the old shards are copied within the store to their wider names first (a
request per object, no data through this machine, but the store bills the copies' bytes
as new objects until the old names are deleted, right after the commit).

Leftovers of an interrupted append are objects under shard-like folders (all digits) that
the committed dataset does not count, and open multipart uploads: ``remove_remote_leftovers``
(the next append, ``atlas-fast verify --repair``) deletes them. Nothing is locked in object
storage: one writer at a time per dataset (a second one's leftovers removal would delete the
first one's uploads; the commit then refuses, finding them gone).

Root objects other than meta.json (the shared dictionary; files other tools keep there) are
carried over unchanged: an append never rewrites or deletes them.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .._errors import AtlasFormatError, StorageError
from .._format import (
    DATA_FILE,
    DICT_FILE,
    INDEX_FILE,
    MAX_META_BYTES,
    META_FILE,
    AtlasDatasetMetadata,
    CompressionStrategy,
    block_count,
    check_dict_bytes,
    dataset_metadata_from,
    meta_text,
    parse_json_object,
    shard_metadata_from,
)
from ..storage import Location
from ..storage._upload import Destination
from .grow import check_strategy
from .upload import remove_objects, shard_names

__all__ = ["RemoteGrowth", "commit_remote_append", "remove_remote_leftovers"]

# Requests in flight at once for the many small objects (meta.json files, copies).
_THREADS = 8


def _shard_folder(name: str) -> str | None:
    """The shard-like folder an object ``name`` is under (all digits), or None."""
    top, slash, _ = name.partition("/")
    return top if slash and top.isascii() and top.isdigit() else None


def remote_leftovers(objects: list, count: int) -> list:
    """The objects of ``objects`` (a dataset's listing) under shard-like folders that a
    dataset of ``count`` shards does not count: what interrupted appends left."""
    names = set(shard_names(count))
    return [o for o in objects if (f := _shard_folder(o)) is not None and f not in names]


def remove_remote_leftovers(dest: Destination, objects: list, count: int) -> list:
    """Delete what interrupted appends left under ``dest`` (see ``remote_leftovers``) and
    abort the multipart uploads left open; the objects deleted."""
    stale = remote_leftovers(objects, count)
    remove_objects(dest, stale)
    dest.abort_uploads()
    return stale


@dataclass
class RemoteGrowth:
    """The dataset at a URL, opened to be grown: checked (its meta.json files read and
    checked against each other, each shard's files present), its leftovers removed."""

    dest: Destination
    metadata: AtlasDatasetMetadata
    objects: dict  # shard name -> its objects' names
    root_objects: list  # the objects of the root folder
    dict_bytes: bytes | None
    removed: list  # leftovers removed when opened

    @property
    def url(self) -> str:
        return self.dest.location.url

    @property
    def count(self) -> int:
        return len(self.metadata.shard_sizes)

    @property
    def strategy(self) -> int:
        return self.metadata.compression_strategy

    def strategy_for(self, asked) -> int:
        return check_strategy(asked, self.strategy, self.url)

    @classmethod
    def open(cls, url, storage_options, who: str, *, clean: bool = True) -> RemoteGrowth:
        location = Location(url, storage_options)
        dest = Destination(location)
        url = location.url
        prefix = f"{url}: {who} needs a whole, readable Atlas dataset here"
        try:
            listing = dest.names()
            meta_obj = location.object(META_FILE)
            if META_FILE not in listing:
                raise AtlasFormatError(f"{meta_obj.url}: missing (no dataset at this URL)")
            metadata = dataset_metadata_from(
                parse_json_object(meta_obj.read(MAX_META_BYTES), meta_obj.url), meta_obj.url
            )
            names = shard_names(len(metadata.shard_sizes))
            objects = {name: [] for name in names}
            for obj in listing:
                folder = _shard_folder(obj)
                if folder in objects:
                    objects[folder].append(obj)
            dict_bytes = None
            if metadata.compression_strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
                dict_obj = location.object(DICT_FILE)
                if names or DICT_FILE in listing:
                    if DICT_FILE not in listing:
                        raise AtlasFormatError(
                            f"{dict_obj.url}: missing (the compression strategy needs it)"
                        )
                    dict_bytes = check_dict_bytes(dict_obj.read(), dict_obj.url)
            with ThreadPoolExecutor(_THREADS) as pool:
                checks = [
                    pool.submit(_check_shard, location, name, objects[name], size, dict_bytes)
                    for name, size in zip(names, metadata.shard_sizes)
                ]
                for check in checks:
                    check.result()
        except (AtlasFormatError, StorageError) as exc:
            raise AtlasFormatError(f"{prefix}: {exc}") from exc
        removed = remove_remote_leftovers(dest, listing, len(names)) if clean else []
        root_objects = [o for o in listing if "/" not in o]
        return cls(dest, metadata, objects, root_objects, dict_bytes, removed)


def _check_shard(location: Location, name: str, objects: list, size: int, dict_bytes) -> None:
    """Shard ``name``'s meta.json read and checked against the root's ``size``; the files
    its strategy needs present among ``objects``."""
    meta_obj = location.object(f"{name}/{META_FILE}")
    if f"{name}/{META_FILE}" not in objects:
        raise AtlasFormatError(f"{meta_obj.url}: missing")
    metadata = shard_metadata_from(
        parse_json_object(meta_obj.read(MAX_META_BYTES), meta_obj.url), meta_obj.url
    )
    if metadata.stored_examples != size:
        raise AtlasFormatError(
            f"{meta_obj.url}: stored_examples is {metadata.stored_examples} but the root "
            f"meta.json lists {size}"
        )
    needed = [INDEX_FILE]
    if block_count(metadata.stored_examples, metadata.block_size):
        needed.append(DATA_FILE)
    if metadata.compression_strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
        needed.append(DICT_FILE)
    if metadata.compression_strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
        if dict_bytes is None and metadata.stored_examples:
            raise AtlasFormatError(
                f"{meta_obj.url}: uses the shared dictionary (compression_strategy 2), which "
                "the dataset does not have"
            )
    for file in needed:
        if f"{name}/{file}" not in objects:
            raise AtlasFormatError(f"{location.object(f'{name}/{file}').url}: missing")


def copy_objects(dest: Destination, pairs: list) -> None:
    """Copy each ``(object, new name)`` of ``pairs`` within the store (no data through
    here), ``_THREADS`` at once."""
    if not pairs:
        return
    with ThreadPoolExecutor(_THREADS) as pool:
        for future in [pool.submit(dest.copy, a, b) for a, b in pairs]:
            future.result()


def commit_remote_append(
    grown: RemoteGrowth, new: list, sizes: list, strategy: int
) -> AtlasDatasetMetadata:
    """Commit an append to ``grown``: ``new`` lists the new shards, in order, as
    ``(name, [objects])`` (uploaded under any names but the dataset's), ``sizes`` their
    examples. Every shard is copied to its final name where it is not under it (the old
    ones only when the width grew), the uploads checked present, the root meta.json put;
    then the objects under names no longer counted deleted."""
    dest = grown.dest
    old = grown.metadata
    total = grown.count + len(new)
    final = shard_names(total)
    copies = []
    stale = []
    for (name, objects), target in zip(
        [(n, grown.objects[n]) for n in shard_names(grown.count)] + list(new), final
    ):
        if name != target:
            copies += [(obj, f"{target}/{obj[len(name) + 1 :]}") for obj in objects]
            stale += objects
    copy_objects(dest, copies)
    present = set(dest.names())
    wanted = {b for _, b in copies}
    for (name, objects), target in zip(new, final[grown.count :]):
        if name == target:
            wanted.update(objects)
    missing = sorted(wanted - present)
    if missing:
        raise StorageError(
            f"{dest.url(missing[0])}: missing before the commit ({len(missing)} object(s)): "
            "another writer removed them; the dataset is unchanged",
            url=dest.url(missing[0]),
        )
    metadata = AtlasDatasetMetadata(old.version, [*old.shard_sizes, *sizes], int(strategy))
    dest.put_bytes(META_FILE, meta_text(metadata._asdict()).encode())  # the commit
    try:
        remove_objects(dest, stale)
    except Exception:  # committed: what is left is a leftover the next append removes
        pass
    return metadata
