"""``atlas-fast verify PATH``: check a dataset (or one shard) completely, reporting every problem.

Checks the metadata and structure (the same validation the readers do when they open a
dataset), then decodes every block in a small thread pool (decompression releases the GIL)
through the selected backend's reader and checks its example count. Shards written with
``checksums=True`` also have every block's stored bytes checked against ``checksums.npy``,
which finds corruption that still decompresses and unpickles. It keeps going after a problem
and ends with a summary. Exit status: 0 clean, 1 problems found, 2 usage error.

PATH may be a URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``file://`` or another
fsspec scheme), read as the readers read it: credentials and endpoints from the standard
environment variables, nothing listed (a remote dataset's shards are those its root meta.json
counts), blocks fetched by exact ranges, neighbours merged.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ._common import add_dataset_arguments, check_path, print_json, usage_error

__all__ = ["add_arguments", "run", "verify", "Target", "ShardFiles", "open_target", "check_path"]


def add_arguments(parser) -> None:
    add_dataset_arguments(parser, "report")
    parser.add_argument(
        "--untrusted",
        action="store_true",
        help="unpickle with the restricted unpickler (trusted=False): refuse any global "
        "that is not plain data",
    )
    parser.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="MODULE.QUALNAME",
        help="with --untrusted, also allow this global (repeatable)",
    )
    parser.add_argument(
        "--partial",
        action="store_true",
        help="the copy holds only some of the dataset's shards (a node's part): check those "
        "present; without it, shards missing are a problem",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(4, os.cpu_count() or 1),
        help="threads decoding blocks (default: min(4, CPUs))",
    )
    parser.add_argument(
        "--repair",
        action="store_true",
        help="first remove what interrupted appends and merges left next to PATH (or, for "
        "a URL, under it): run it while nothing writes there",
    )


class ShardFiles:
    """One shard's files as the commands read them: a local folder (``where``, a ``Path``) or a
    folder in object storage (``where``, its URL; ``source``, the ``ShardSource`` its files are
    read through). ``file(name)`` names one of them in reports."""

    def __init__(self, where, source=None) -> None:
        self.where = where
        self.source = source
        self.name = where.name if source is None else where.rpartition("/")[2]

    @property
    def remote(self) -> bool:
        return self.source is not None

    def __str__(self) -> str:
        return str(self.where)

    def file(self, name: str):
        return self.where / name if self.source is None else f"{self.where}/{name}"

    def metadata(self):
        from .._format import read_shard_metadata

        if self.source is None:
            return read_shard_metadata(self.where)
        return self.source.metadata()

    def offsets(self, metadata):
        from .._format import load_offsets

        if self.source is None:
            return load_offsets(self.where, metadata)
        return self.source.offsets(metadata)

    def checksums(self, n_blocks: int):
        """The block checksums (``checksums.npy``), or None when the shard has none."""
        from .._errors import AtlasFormatError, ObjectNotFoundError
        from .._format import (
            CHECKSUM_FILE,
            NPY_HEADER_LIMIT,
            check_checksums,
            load_checksums,
            parse_npy,
        )

        if self.source is None:
            return load_checksums(self.where, n_blocks)
        obj = self.source.location.object(CHECKSUM_FILE)
        try:
            data = obj.read(NPY_HEADER_LIMIT + 8 * n_blocks)
        except ObjectNotFoundError:
            return None
        except ValueError as exc:
            raise AtlasFormatError(f"{exc}: not the .npy array expected here") from None
        return check_checksums(parse_npy(data, obj.url), obj.url, n_blocks)

    def disk_bytes(self):
        """Bytes of the shard's files on disk (None in object storage: nothing is listed)."""
        if self.source is not None:
            return None
        return sum(p.stat().st_size for p in self.where.iterdir() if p.is_file())

    def reader(self, readers, dict_bytes, source=None, **kwargs):
        """The shard's ``readers.AtlasDatasetShard`` (a remote one reads through ``source``,
        by default this shard's)."""
        return readers.AtlasDatasetShard(
            self.where,
            compression_dict_bytes=dict_bytes,
            _source=source if source is not None else self.source,
            **kwargs,
        )


class Target:
    """What PATH holds: a dataset root or one shard, with what reading its shards needs.
    ``shard_dirs`` are ``ShardFiles``."""

    def __init__(self, path) -> None:
        self.path = path
        self.kind = "dataset"
        self.metadata = None  # AtlasDatasetMetadata of a dataset root (None if unreadable)
        self.shard_dirs: list = []
        self.dict_bytes = None  # the shared dictionary (strategy 2), if any
        self.dict_path = None

    @property
    def remote(self) -> bool:
        return isinstance(self.path, str)

    def file(self, name: str):
        return f"{self.path}/{name}" if self.remote else self.path / name


def open_target(path, problems: list) -> Target:
    """Work out what ``path`` is and read its top level, recording problems instead of raising.

    A directory whose meta.json has a ``block_size`` (or that has no meta.json but a data.bin
    or index.npy) is a shard; any other directory is a dataset root. ``path`` may be a URL
    (str): see ``open_remote_target``.
    """
    from ..storage._dataset import is_remote

    if is_remote(path):
        return open_remote_target(path, problems)
    from .._errors import AtlasFormatError
    from .._format import (
        DATA_FILE,
        DICT_FILE,
        INDEX_FILE,
        META_FILE,
        CompressionStrategy,
        find_shard_dirs,
        read_dataset_metadata,
        read_dict_file,
    )

    target = Target(path)
    meta = _peek_json(path / META_FILE)
    if (isinstance(meta, dict) and "block_size" in meta) or (
        meta is None and ((path / DATA_FILE).exists() or (path / INDEX_FILE).exists())
    ):
        target.kind = "shard"
        target.shard_dirs = [ShardFiles(path)]
        shared = path.parent / DICT_FILE
        if isinstance(meta, dict) and meta.get("compression_strategy") == 2:
            target.dict_path = shared
            _record(problems, shared, None, lambda: _set(target, read_dict_file(shared)))
        return target

    try:
        target.metadata = read_dataset_metadata(path)
    except AtlasFormatError as exc:
        problems.append(_problem(path / META_FILE, None, exc))
    strategy = target.metadata.compression_strategy if target.metadata else None
    if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION or (
        strategy is None and (path / DICT_FILE).exists()
    ):
        target.dict_path = path / DICT_FILE
        _record(
            problems, target.dict_path, None, lambda: _set(target, read_dict_file(target.dict_path))
        )
    try:
        target.shard_dirs = [ShardFiles(d) for d in find_shard_dirs(path)]
    except AtlasFormatError as exc:
        problems.append(_problem(path, None, exc))
    return target


def open_remote_target(url: str, problems: list, storage_options=None) -> Target:
    """``open_target`` for a URL: its meta.json says what it is (a ``block_size``: a shard),
    and a dataset's shards are those the root's meta.json counts, named as the writer names
    them (nothing is listed; a missing one is a problem when it is read)."""
    from .._errors import AtlasFormatError, ObjectNotFoundError, StorageError
    from .._format import (
        DICT_FILE,
        MAX_META_BYTES,
        META_FILE,
        CompressionStrategy,
        dataset_metadata_from,
        parse_json_object,
    )
    from ..storage import Location
    from ..storage._dataset import ShardSource, missing_bucket, shard_names

    location = Location(url, storage_options)
    target = Target(location.url)
    obj = location.object(META_FILE)
    try:
        meta = parse_json_object(obj.read(MAX_META_BYTES), obj.url)
    except ValueError as exc:  # AtlasFormatError too
        if not isinstance(exc, AtlasFormatError):
            exc = AtlasFormatError(f"{exc}: not a meta.json")
        problems.append(_problem(obj.url, None, exc))
        return target
    except StorageError as exc:
        if isinstance(exc, ObjectNotFoundError) and not missing_bucket(exc):
            exc = AtlasFormatError(
                f"{obj.url}: missing: {url} is not an Atlas dataset or shard (no meta.json: its "
                "writer did not finish, or the URL does not name one)"
            )
        problems.append(_problem(obj.url, None, exc))
        return target

    def read_dict(where) -> None:
        dict_obj = where.object(DICT_FILE)
        target.dict_path = dict_obj.url
        try:
            data = dict_obj.read()
        except FileNotFoundError:
            raise AtlasFormatError(
                f"{dict_obj.url}: missing (the compression strategy needs it)"
            ) from None
        if not data:
            raise AtlasFormatError(f"{dict_obj.url}: empty dictionary")
        target.dict_bytes = data

    shared = CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
    if "block_size" in meta:
        target.kind = "shard"
        target.shard_dirs = [ShardFiles(location.url, ShardSource(location))]
        if meta.get("compression_strategy") == shared:
            parent = Location(location.url.rpartition("/")[0], storage_options)
            _record(problems, parent.object(DICT_FILE).url, None, lambda: read_dict(parent))
        return target
    try:
        target.metadata = dataset_metadata_from(meta, obj.url)
    except AtlasFormatError as exc:
        problems.append(_problem(obj.url, None, exc))
        return target
    names = shard_names(len(target.metadata.shard_sizes))
    if target.metadata.compression_strategy == shared and names:
        _record(problems, location.object(DICT_FILE).url, None, lambda: read_dict(location))
    target.shard_dirs = [
        ShardFiles(location.child(name).url, ShardSource(location.child(name), k))
        for k, name in enumerate(names)
    ]
    return target


def read_shard(target: Target, shard_dir: ShardFiles, problems: list, absent=None):
    """The metadata of ``shard_dir``, a shard of ``target``, checked against the root's
    ``shard_sizes`` (a disagreement is recorded, the metadata still returned); None, recorded,
    when its meta.json does not read. ``absent``: a list, given, gets the number of a shard of
    a URL dataset that has no meta.json object (a copy without it) instead of a problem."""
    from .._errors import AtlasFormatError, ObjectNotFoundError, StorageError
    from .._format import META_FILE, check_shard_sizes

    meta_file = shard_dir.file(META_FILE)
    try:
        metadata = shard_dir.metadata()
    except (AtlasFormatError, StorageError) as exc:
        if (
            absent is not None
            and shard_dir.remote
            and target.kind == "dataset"
            and isinstance(exc.__cause__, ObjectNotFoundError)
        ):
            absent.append(int(shard_dir.name))
        else:
            problems.append(_problem(meta_file, None, exc))
        return None
    if target.kind == "dataset" and target.metadata is not None:
        if shard_dir.remote:  # a whole dataset: shard k is the k-th of shard_sizes
            listed = target.metadata.shard_sizes[int(shard_dir.name)]
            if listed != metadata.stored_examples:
                message = (
                    f"{meta_file}: stored_examples is {metadata.stored_examples} but "
                    f"{target.file(META_FILE)} lists {listed} for shard {int(shard_dir.name)}"
                )
                problems.append(_problem(meta_file, None, AtlasFormatError(message)))
            return metadata
        _record(
            problems,
            meta_file,
            None,
            lambda: check_shard_sizes(target.path, target.metadata, [(shard_dir.where, metadata)]),
        )
    return metadata


def lacks_shared_dict(target: Target, shard_dir: ShardFiles, metadata, problems: list, verb: str):
    """Whether the strategy-2 shard ``shard_dir`` has blocks but its shared dictionary is
    unavailable (recorded as a problem: its blocks not ``verb``)."""
    from .._errors import AtlasFormatError
    from .._format import DICT_FILE, META_FILE, block_count

    n_blocks = block_count(metadata.stored_examples, metadata.block_size)
    if metadata.compression_strategy != 2 or not n_blocks or target.dict_bytes is not None:
        return False
    if target.dict_path is not None:
        where = target.dict_path
    elif shard_dir.remote:
        where = f"{str(shard_dir).rpartition('/')[0]}/{DICT_FILE}"
    else:
        where = shard_dir.where.parent / DICT_FILE
    meta_file = shard_dir.file(META_FILE)
    message = (
        f"{meta_file}: compression_strategy 2 needs the shared dictionary {where}, "
        f"which is unavailable: {n_blocks} blocks not {verb}"
    )
    problems.append(_problem(meta_file, None, AtlasFormatError(message)))
    return True


def _set(target: Target, dict_bytes: bytes) -> None:
    target.dict_bytes = dict_bytes


def _peek_json(path: Path):
    """meta.json's content if it is a small regular file of JSON, else None (never blocks)."""
    from .._format import MAX_META_BYTES

    try:
        if not path.is_file() or path.stat().st_size > MAX_META_BYTES:
            return None
        return json.loads(path.read_bytes())
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _problem(file, block, exc) -> dict:
    message = str(exc)
    if not isinstance(exc, Exception) or type(exc).__name__ not in (
        "AtlasFormatError",
        "UnsafePickleError",
        "StorageError",
        "ObjectNotFoundError",
        "ObjectChangedError",
    ):
        message = f"{file}: unexpected {type(exc).__name__}: {exc}" if file else str(exc)
    return {
        "file": str(file) if file is not None else None,
        "block": block,
        "kind": type(exc).__name__,
        "message": message,
    }


def _record(problems: list, file, block, action) -> bool:
    """Run ``action``; on an error record it as a problem. True if it succeeded."""
    try:
        action()
    except Exception as exc:
        problems.append(_problem(file, block, exc))
        return False
    return True


def verify(path, *, trusted=True, allowed_globals=(), jobs=4, readers=None, partial=False) -> dict:
    """Check the dataset or shard at ``path`` (a directory or a URL); returns the report.

    The report: ``path``, ``kind`` ("dataset" or "shard"), ``ok``, the counts ``shards``,
    ``blocks``, ``examples`` and ``blocks_checksummed``, ``problems`` (dicts with ``file``,
    ``block`` (None when not about one block), ``kind`` (the exception class) and
    ``message``) and ``notes``. ``readers`` is the module whose ``AtlasDatasetShard`` decodes
    (default ``atlas_fast.atlas``, the selected backend).

    Shards the root's meta.json lists but the copy lacks (no folder locally; no meta.json
    object at a URL) are one problem, naming them; with ``partial`` (a node holding part of
    the dataset) they are a note, and the shards present are checked. Local and URL copies
    are judged alike.
    """
    if readers is None:
        from .. import atlas as readers
    from .._core._reader_py import read_at
    from .._errors import AtlasFormatError
    from .._format import CHECKSUM_FILE, DATA_FILE, META_FILE, block_checksum, block_count
    from ..storage._dataset import is_remote, to_local

    path = path if is_remote(path) else Path(to_local(path))
    problems: list = []
    notes: list = []
    target = open_target(path, problems)
    totals = {"shards": 0, "blocks": 0, "examples": 0, "blocks_checksummed": 0}

    read_lock = threading.Lock() if not hasattr(os, "pread") else contextlib.nullcontext()

    def check_block(shard, files, kept, data_fd, offsets, checksums, b):
        data_path = files.file(DATA_FILE)
        found = []
        raw = None
        if checksums is not None and data_fd is not None:
            start, end = int(offsets[b]), int(offsets[b + 1])
            try:
                with read_lock:  # only contended where there is no pread (Windows)
                    raw = read_at(data_fd, end - start, start)
            except OSError as exc:
                raw = b""
                found.append(_problem(data_path, b, exc))
        here = len(found)  # the checksum's problem goes before the decoding's
        _record(found, data_path, b, lambda: shard.read_block(b))
        if kept is not None:  # remote: the bytes the reader fetched
            raw = kept.stored.pop(b, None)
        if raw is not None:
            want = int(checksums[b])
            got = block_checksum(raw)
            if got != want:
                found.insert(
                    here,
                    _problem(
                        data_path,
                        b,
                        AtlasFormatError(
                            f"{data_path}: block {b}: stored bytes do not match "
                            f"{files.file(CHECKSUM_FILE)} (checksum {got:016x}, expected "
                            f"{want:016x}): the block is corrupt"
                        ),
                    ),
                )
        return found

    absent = []  # shards the root lists that the copy lacks
    if target.kind == "dataset" and target.metadata is not None and not target.remote:
        present = {int(d.name) for d in target.shard_dirs if d.name.isdigit()}
        absent = [i for i in range(len(target.metadata.shard_sizes)) if i not in present]

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for files in target.shard_dirs:
            metadata = read_shard(target, files, problems, absent)
            if metadata is None:
                continue
            totals["shards"] += 1
            n_blocks = block_count(metadata.stored_examples, metadata.block_size)
            if lacks_shared_dict(target, files, metadata, problems, "checked"):
                continue
            try:
                checksums = files.checksums(n_blocks)
            except Exception as exc:  # AtlasFormatError, StorageError; anything else too
                problems.append(_problem(files.file(CHECKSUM_FILE), None, exc))
                checksums = None
            kept = None
            if files.remote and checksums is not None:
                kept = _KeptBytes(files.source)  # the stored bytes, checked as they arrive
            try:
                shard = files.reader(
                    readers,
                    target.dict_bytes,
                    kept,
                    trusted=trusted,
                    allowed_globals=allowed_globals,
                )
                offsets = files.offsets(metadata)
                shard._block_offsets()  # index and dictionary, as the reader will load them
            except Exception as exc:  # AtlasFormatError; anything else is reported too
                problems.append(_problem(files.where, None, exc))
                continue
            data_fd = None
            if checksums is not None and n_blocks and not files.remote:
                try:
                    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0)
                    data_fd = os.open(files.file(DATA_FILE), flags)
                except OSError as exc:
                    problems.append(_problem(files.file(DATA_FILE), None, exc))
                    checksums = None
            if checksums is not None:
                totals["blocks_checksummed"] += n_blocks
            try:
                for blocks in _batches(files, offsets, n_blocks):
                    if files.remote:
                        files.source.prefetch(blocks)  # neighbours merged, fetched at once
                    for found in pool.map(
                        lambda b, s=shard, f=files, k=kept, fd=data_fd, o=offsets, c=checksums: (
                            check_block(s, f, k, fd, o, c, b)
                        ),
                        blocks,
                    ):
                        problems.extend(found)
            finally:
                if data_fd is not None:
                    os.close(data_fd)
                shard.close()
            totals["blocks"] += n_blocks
            totals["examples"] += metadata.stored_examples

    if absent:
        listed = len(target.metadata.shard_sizes)
        said = (
            f"{target.file(META_FILE)} lists {listed} shards; {len(absent)} of them are not in "
            f"this copy (shards {_ranges(absent)})"
        )
        if partial:
            notes.append(f"{said}: a partial copy (--partial), the shards present checked")
        else:
            problems.insert(
                0,
                _problem(
                    target.file(META_FILE),
                    None,
                    AtlasFormatError(
                        f"{said}: readers read the shards present, with indices running over "
                        "them; pass --partial (partial=True) if this copy is meant to hold part "
                        "of the dataset"
                    ),
                ),
            )
    return {
        "path": str(path),
        "kind": target.kind,
        "ok": not problems,
        **totals,
        "problems": problems,
        "notes": notes,
    }


class _KeptBytes:
    """A remote shard's source that keeps the stored bytes of each block it hands the reader
    (``stored``: block -> bytes, taken by the checksum check): each block is fetched once."""

    def __init__(self, source) -> None:
        self._source = source
        self.stored: dict = {}

    def __getattr__(self, name):
        return getattr(self._source, name)

    def block(self, b: int) -> bytes:
        data = self._source.block(b)
        self.stored[b] = data
        return data


def _batches(files: ShardFiles, offsets, n_blocks: int) -> list:
    """The blocks of a shard in the groups verify checks one after the other: all at once for
    a local shard; for a remote one, runs of neighbours of up to a read-ahead's bytes, each
    fetched in a few large requests before its blocks are decoded."""
    if not files.remote:
        return [range(n_blocks)]
    limit = max(1, files.source.location.settings.read_ahead_bytes // 2)
    out = []
    first = 0
    for b in range(n_blocks):
        if b > first and int(offsets[b + 1]) - int(offsets[first]) > limit:
            out.append(range(first, b))
            first = b
    if first < n_blocks:
        out.append(range(first, n_blocks))
    return out


def _ranges(numbers: list) -> str:
    parts = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(parts)


def repair(path) -> list:
    """Remove what interrupted appends and merges to the dataset at ``path`` left: local
    aside folders next to it whose process is gone (an old tree set aside by the fallback
    exchange is put back first), or, for a URL, objects under shard folders its meta.json
    does not count and open multipart uploads. What was removed, as strings."""
    from ..storage._dataset import is_remote

    if not is_remote(path):
        from .._writing.grow import remove_leftovers

        return [str(p) for p in remove_leftovers(path)]
    from .._errors import StorageError
    from .._format import MAX_META_BYTES, META_FILE, dataset_metadata_from, parse_json_object
    from .._writing.grow_remote import remove_remote_leftovers
    from ..storage import Location
    from ..storage._upload import Destination

    location = Location(path)
    obj = location.object(META_FILE)
    try:
        metadata = dataset_metadata_from(
            parse_json_object(obj.read(MAX_META_BYTES), obj.url), obj.url
        )
    except (StorageError, ValueError):
        return []  # no readable root meta.json (verify says so): nothing is counted
    dest = Destination(location)
    stale = remove_remote_leftovers(dest, dest.names(), len(metadata.shard_sizes))
    return [dest.url(o) for o in stale]


def run(args) -> int:
    if args.repair:
        from ..storage._dataset import is_remote, to_local

        if not is_remote(args.path) and not os.path.lexists(to_local(args.path)):
            # An interrupted fallback exchange: the dataset is put back before the check.
            from .._writing.grow import remove_leftovers

            remove_leftovers(to_local(args.path))
    path = check_path("verify", args.path)
    if path is None:
        return 2
    if args.allow and not args.untrusted:
        return usage_error("verify", "--allow needs --untrusted")
    if args.jobs < 1:
        return usage_error("verify", "--jobs must be at least 1")
    repaired = repair(path) if args.repair else None
    report = verify(
        path,
        trusted=not args.untrusted,
        allowed_globals=tuple(args.allow),
        jobs=args.jobs,
        partial=args.partial,
    )
    if repaired is not None:
        report["repaired"] = repaired
    if args.json:
        print_json(report)
    else:
        for item in repaired or ():
            print(f"repaired: removed {item}")
        for problem in report["problems"]:
            print(f"PROBLEM {problem['message']}")
        for note in report["notes"]:
            print(f"note: {note}")
        status = "OK" if report["ok"] else f"{len(report['problems'])} problem(s)"
        checked = (
            f", {report['blocks_checksummed']} against checksums"
            if report["blocks_checksummed"]
            else ""
        )
        print(
            f"{status}: {report['path']} ({report['kind']}): {report['shards']} shard(s), "
            f"{report['blocks']} block(s){checked}, {report['examples']} example(s) checked"
        )
    return 0 if report["ok"] else 1
