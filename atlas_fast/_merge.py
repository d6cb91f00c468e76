"""``atlas_fast.merge``: one dataset of the examples of several, without decompressing any.

Shards are files that need no change to belong to another dataset: they are hard-linked
(or copied, across file systems) into the new dataset, renumbered, or copied within the
store when the destination is a URL. Only two files are ever written anew: the root
meta.json, and the meta.json of a strategy-2 shard whose dataset's shared dictionary is not
the merged dataset's (see ``plan_strategy``).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ._errors import AtlasFormatError, InvalidArgumentError, destination_exists
from ._format import (
    DICT_FILE,
    MAX_META_BYTES,
    META_FILE,
    VERSION,
    AtlasDatasetMetadata,
    CompressionStrategy,
    meta_text,
    parse_json_object,
)
from ._writing.commit import dump_meta_atomic
from ._writing.grow import Aside, final_names, link_tree, open_existing, remove_leftovers
from ._writing.upload import is_remote

__all__ = ["merge", "plan_strategy"]

_SHARED = CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
_OWN = CompressionStrategy.DICTIONARY_COMPRESSION


@dataclass
class _Source:
    """One dataset merged: where it is, its metadata, its shards' names (or for a URL its
    objects per shard) and its shared dictionary."""

    where: str
    metadata: AtlasDatasetMetadata
    names: list
    shard_strategies: list
    dict_bytes: bytes | None
    root: Path | None = None  # a local dataset
    growth: object = None  # a dataset at a URL: its grow_remote.RemoteGrowth


def plan_strategy(sources: list) -> int:
    """The merged dataset's compression strategy: the sources' own when they share it (and,
    for strategy 2, the dictionary); otherwise 3, under which each shard says in its
    meta.json how it is compressed, a strategy-2 shard then carrying its dataset's
    dictionary as its own (the reference reads every shard by its own strategy, and a
    dictionary's bytes are what a shard was compressed with, wherever it is stored)."""
    strategies = {s.metadata.compression_strategy for s in sources}
    dicts = {s.dict_bytes for s in sources if s.dict_bytes is not None}
    if len(strategies) == 1 and len(dicts) <= 1:
        return strategies.pop()
    return int(_OWN)


def _versions(sources: list, storage_options) -> None:
    """Refuse datasets of different format versions, naming each (before anything else is
    read of them: a reader of one version would refuse the other with a vaguer message)."""
    found = {}
    for source in sources:
        try:
            if is_remote(source):
                from .storage import Location

                obj = Location(source, storage_options).object(META_FILE)
                value = parse_json_object(obj.read(MAX_META_BYTES), obj.url)
            else:
                path = Path(source) / META_FILE
                value = parse_json_object(path.read_bytes(), path)
        except (OSError, ValueError):
            continue  # said when the dataset is opened
        found[str(source)] = value.get("version")
    if len({repr(v) for v in found.values()}) > 1:
        listed = ", ".join(f"{where} is version {v!r}" for where, v in found.items())
        raise AtlasFormatError(
            f"merge: the datasets are of different format versions ({listed}): a dataset "
            "has one version; convert them to one first"
        )


def _open_sources(sources: list, storage_options) -> list:
    out = []
    for source in sources:
        if is_remote(source):
            from ._writing.grow_remote import RemoteGrowth

            growth = RemoteGrowth.open(source, storage_options, "merge", clean=False)
            names = list(growth.objects)
            out.append(
                _Source(
                    growth.url,
                    growth.metadata,
                    names,
                    [None] * len(names),  # read when needed (strategy 2 converted)
                    growth.dict_bytes,
                    growth=growth,
                )
            )
        else:
            existing = open_existing(source, "merge")
            out.append(
                _Source(
                    str(existing.root),
                    existing.metadata,
                    existing.names,
                    [m.compression_strategy for m in existing.shard_metadatas],
                    existing.dict_bytes,
                    root=existing.root,
                )
            )
    return out


def merge(sources, dst, *, storage_options=None) -> AtlasDatasetMetadata:
    """Write at ``dst`` one dataset of the examples of the datasets ``sources``, in order
    (those of the first, then the second's, ...); return its metadata.

    Nothing is decompressed or recompressed: each shard is hard-linked into ``dst`` (copied
    where ``dst`` is on another file system), renumbered, or, to a URL, copied within the
    store (each source in the same bucket as ``dst``) or uploaded (a local source). Datasets
    with one compression strategy (and, for strategy 2, one shared dictionary) keep it;
    otherwise the merged dataset has strategy 3 (``plan_strategy``), and each shard of a
    strategy-2 source carries that source's dictionary as its own ``zstd_dict.bin``.
    Root files other than meta.json and the shared dictionary are not carried over: each
    describes its own dataset's shards.

    ``dst`` must be absent (or an empty directory; for a URL, hold no object). Atomic as
    every write: the merged dataset is built in a folder next to ``dst`` and renamed into
    place (to a URL: the root meta.json is put last), so a crash leaves no dataset at
    ``dst``; the next write there (or ``atlas-fast verify --repair``) removes what it left.
    Every source is checked first (as ``atlas-fast verify`` checks its files, blocks
    aside): one that is not a whole dataset raises ``AtlasFormatError`` naming it, datasets
    of different format versions too, and nothing is written. ``storage_options`` (as for
    reading) applies to every URL.
    """
    if isinstance(sources, (str, os.PathLike)):
        raise InvalidArgumentError(
            "merge: sources must be a list of datasets (paths or URLs), not one path"
        )
    sources = [s if is_remote(s) else Path(os.fspath(s)) for s in sources]
    if not sources:
        raise InvalidArgumentError("merge: no source dataset given")
    _versions(sources, storage_options)
    if is_remote(dst):
        return _merge_to_url(sources, dst, storage_options)
    remote = [s for s in sources if is_remote(s)]
    if remote:
        raise InvalidArgumentError(
            f"merge: {remote[0]} is a URL and {dst} a local path: merge copies shards into "
            "a local dataset from local datasets only (download it first, or merge to a URL)"
        )
    dst = Path(os.fspath(dst))
    remove_leftovers(dst)
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise destination_exists(dst, "merge", empty_dir_ok=True)
    opened = _open_sources(sources, storage_options)
    strategy = plan_strategy(opened)
    dst.parent.mkdir(parents=True, exist_ok=True)
    aside = Aside(dst)
    try:
        sizes = _link_shards(opened, aside, strategy)
        if strategy == _SHARED and opened[0].dict_bytes is not None:
            os.link(opened[0].root / DICT_FILE, aside.dir / DICT_FILE)
        metadata = AtlasDatasetMetadata(VERSION, sizes, int(strategy))
        aside.commit_new(metadata._asdict())
    except BaseException:
        aside.abandon()
        raise
    return metadata


def _link_shards(opened: list, aside: Aside, strategy: int) -> list:
    """Every shard of the sources, in order, linked into ``aside`` under its final name (a
    strategy-2 shard given its own dictionary when ``strategy`` is 3); the shard sizes."""
    total = sum(len(s.names) for s in opened)
    names = iter(final_names(total))
    sizes = []
    for source in opened:
        for name, shard_strategy, size in zip(
            source.names, source.shard_strategies, source.metadata.shard_sizes
        ):
            target = aside.dir / next(names)
            if shard_strategy == _SHARED and strategy != _SHARED:
                aside.copied += link_tree(source.root / name, target, skip=(META_FILE, DICT_FILE))
                os.link(source.root / DICT_FILE, target / DICT_FILE)
                _own_dictionary_meta(source.root / name / META_FILE, target / META_FILE)
            else:
                aside.copied += link_tree(source.root / name, target)
            sizes.append(size)
    return sizes


def _own_fields(meta_bytes: bytes, where) -> dict:
    """A strategy-2 shard's meta.json fields, saying strategy 3 (its dictionary its own)."""
    fields = json.loads(meta_bytes)
    if fields.get("compression_strategy") != _SHARED:
        raise AtlasFormatError(f"{where}: expected compression_strategy 2")
    fields["compression_strategy"] = int(_OWN)
    return fields


def _own_dictionary_meta(source: Path, target: Path) -> None:
    dump_meta_atomic(target, _own_fields(source.read_bytes(), source), fsync=False)


# -- to a URL ---------------------------------------------------------------------------------


def _merge_to_url(sources: list, dst, storage_options) -> AtlasDatasetMetadata:
    from ._writing.upload import open_destination, remove_objects, upload_shard
    from .storage import Location
    from .storage._upload import Destination

    target = Location(dst, storage_options)
    for source in sources:
        if is_remote(source):
            where = Location(source, storage_options)
            if (where.scheme, where.container) != (target.scheme, target.container):
                raise InvalidArgumentError(
                    f"merge: {source} and {dst} are in different stores: merge copies shards "
                    "within one bucket (or uploads local ones); copy it there first"
                )
    dest = open_destination(dst, storage_options, overwrite=False, who="merge")
    opened = _open_sources(sources, storage_options)
    strategy = plan_strategy(opened)
    bucket = Destination(Location(f"{target.scheme}://{target.container}", storage_options))
    put: list = []  # objects put so far, deleted if the merge fails
    names = iter(final_names(sum(len(s.names) for s in opened)))
    sizes = []
    try:
        with tempfile.TemporaryDirectory(prefix="atlas-fast-merge-") as tmp:
            for source in opened:
                convert = strategy != _SHARED and source.metadata.compression_strategy == _SHARED
                for name, size in zip(source.names, source.metadata.shard_sizes):
                    final = next(names)
                    if source.root is not None:
                        put += _upload_local_shard(
                            dest, source, name, final, convert, Path(tmp), upload_shard
                        )
                    else:
                        put += _copy_remote_shard(dest, bucket, source, name, final, convert)
                    sizes.append(size)
        if strategy == _SHARED and opened[0].dict_bytes is not None:
            dest.put_bytes(DICT_FILE, opened[0].dict_bytes)
            put.append(DICT_FILE)
        metadata = AtlasDatasetMetadata(VERSION, sizes, int(strategy))
        dest.abort_uploads()
        dest.put_bytes(META_FILE, meta_text(metadata._asdict()).encode())  # the commit
    except BaseException:
        try:
            remove_objects(dest, put)
            dest.abort_uploads()
        except Exception:
            pass  # the error raised is the merge's; what is left is no dataset
        raise
    return metadata


def _upload_local_shard(dest, source, name, final, convert, tmp: Path, upload_shard) -> list:
    """A local source's shard ``name`` uploaded as ``final`` (``convert``: with its
    dataset's dictionary as its own); the objects put."""
    shard = source.root / name
    shard_strategy = source.shard_strategies[source.names.index(name)]
    if convert and shard_strategy == _SHARED:
        staged = tmp / final
        link_tree(shard, staged, skip=(META_FILE, DICT_FILE))
        (staged / DICT_FILE).write_bytes(source.dict_bytes)
        _own_dictionary_meta(shard / META_FILE, staged / META_FILE)
        return upload_shard(dest, staged, final)
    return upload_shard(dest, shard, final)


def _copy_remote_shard(dest, bucket, source, name, final, convert) -> list:
    """A shard of a source in the same bucket copied within the store as ``final``
    (``convert``: with its dataset's dictionary as its own); the objects put."""
    from ._writing.grow_remote import copy_objects

    growth = source.growth
    objects = [o for o in growth.objects[name] if o != f"{name}/{META_FILE}"]
    pairs = [
        (growth.dest.key(o), dest.key(f"{final}/{o[len(name) + 1 :]}"))
        for o in objects
        if not (convert and o == f"{name}/{DICT_FILE}")
    ]
    copy_objects(bucket, pairs)
    put = [f"{final}/{o[len(name) + 1 :]}" for o in objects]
    meta_obj = growth.dest.location.object(f"{name}/{META_FILE}")
    meta_bytes = meta_obj.read(MAX_META_BYTES)
    if convert and json.loads(meta_bytes).get("compression_strategy") == _SHARED:
        dest.put_bytes(f"{final}/{DICT_FILE}", source.dict_bytes)
        put.append(f"{final}/{DICT_FILE}")
        meta_bytes = meta_text(_own_fields(meta_bytes, meta_obj.url)).encode()
    dest.put_bytes(f"{final}/{META_FILE}", meta_bytes)  # a shard's meta.json last, as written
    put.append(f"{final}/{META_FILE}")
    return put
