"""``atlas-fast verify PATH``: check a dataset (or one shard) completely, reporting every problem.

Checks the metadata and structure (the same validation the readers do when they open a
dataset), then decodes every block in a small thread pool (decompression releases the GIL)
through the selected backend's reader and checks its example count. Shards written with
``checksums=True`` also have every block's stored bytes checked against ``checksums.npy``,
which finds corruption that still decompresses and unpickles. It keeps going after a problem
and ends with a summary. Exit status: 0 clean, 1 problems found, 2 usage error.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["add_arguments", "run", "verify", "Target", "open_target"]


def add_arguments(parser) -> None:
    parser.add_argument("path", metavar="PATH", help="a dataset root or a single shard directory")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
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
        "--jobs",
        type=int,
        default=min(4, os.cpu_count() or 1),
        help="threads decoding blocks (default: min(4, CPUs))",
    )


class Target:
    """What PATH holds: a dataset root or one shard, with what reading its shards needs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.kind = "dataset"
        self.metadata = None  # AtlasDatasetMetadata of a dataset root (None if unreadable)
        self.shard_dirs: list = []
        self.dict_bytes = None  # the shared dictionary (strategy 2), if any
        self.dict_path = None


def open_target(path: Path, problems: list) -> Target:
    """Work out what ``path`` is and read its top level, recording problems instead of raising.

    A directory whose meta.json has a ``block_size`` (or that has no meta.json but a data.bin
    or index.npy) is a shard; any other directory is a dataset root.
    """
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
        target.shard_dirs = [path]
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
        target.shard_dirs = find_shard_dirs(path)
    except AtlasFormatError as exc:
        problems.append(_problem(path, None, exc))
    return target


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


def verify(path, *, trusted=True, allowed_globals=(), jobs=4, readers=None) -> dict:
    """Check the dataset or shard at ``path``; returns the report.

    The report: ``path``, ``kind`` ("dataset" or "shard"), ``ok``, the counts ``shards``,
    ``blocks``, ``examples`` and ``blocks_checksummed``, ``problems`` (dicts with ``file``,
    ``block`` (None when not about one block), ``kind`` (the exception class) and
    ``message``) and ``notes``. ``readers`` is the module whose ``AtlasDatasetShard`` decodes
    (default ``atlas_fast.atlas``, the selected backend).
    """
    if readers is None:
        from .. import atlas as readers
    from .._core._reader_py import read_at
    from .._errors import AtlasFormatError
    from .._format import (
        CHECKSUM_FILE,
        DATA_FILE,
        DICT_FILE,
        META_FILE,
        block_checksum,
        block_count,
        check_shard_sizes,
        load_checksums,
        load_offsets,
        read_shard_metadata,
    )

    path = Path(path)
    problems: list = []
    notes: list = []
    target = open_target(path, problems)
    totals = {"shards": 0, "blocks": 0, "examples": 0, "blocks_checksummed": 0}

    read_lock = threading.Lock() if not hasattr(os, "pread") else contextlib.nullcontext()

    def check_block(shard, data_fd, offsets, checksums, b):
        data_path = shard.root / DATA_FILE
        found = []
        if checksums is not None:
            start, end = int(offsets[b]), int(offsets[b + 1])
            try:
                with read_lock:  # only contended where there is no pread (Windows)
                    raw = read_at(data_fd, end - start, start)
            except OSError as exc:
                raw = b""
                found.append(_problem(data_path, b, exc))
            want = int(checksums[b])
            got = block_checksum(raw)
            if got != want:
                found.append(
                    _problem(
                        data_path,
                        b,
                        AtlasFormatError(
                            f"{data_path}: block {b}: stored bytes do not match "
                            f"{shard.root / CHECKSUM_FILE} (checksum {got:016x}, expected "
                            f"{want:016x}): the block is corrupt"
                        ),
                    )
                )
        _record(found, data_path, b, lambda: shard.read_block(b))
        return found

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for shard_dir in target.shard_dirs:
            try:
                metadata = read_shard_metadata(shard_dir)
            except AtlasFormatError as exc:
                problems.append(_problem(shard_dir / META_FILE, None, exc))
                continue
            totals["shards"] += 1
            if target.kind == "dataset" and target.metadata is not None:
                try:
                    check_shard_sizes(path, target.metadata, [(shard_dir, metadata)])
                except AtlasFormatError as exc:
                    problems.append(_problem(shard_dir / META_FILE, None, exc))
            n_blocks = block_count(metadata.stored_examples, metadata.block_size)
            if metadata.compression_strategy == 2 and target.dict_bytes is None:
                where = target.dict_path or (shard_dir.parent / DICT_FILE)
                problems.append(
                    _problem(
                        shard_dir / META_FILE,
                        None,
                        AtlasFormatError(
                            f"{shard_dir / META_FILE}: compression_strategy 2 needs the shared "
                            f"dictionary {where}, which is unavailable: {n_blocks} blocks "
                            "not checked"
                        ),
                    )
                )
                continue
            try:
                shard = readers.AtlasDatasetShard(
                    shard_dir,
                    compression_dict_bytes=target.dict_bytes,
                    trusted=trusted,
                    allowed_globals=allowed_globals,
                )
                offsets = load_offsets(shard_dir, metadata)
                shard.offsets()  # index and dictionary, as the reader will load them
            except Exception as exc:  # AtlasFormatError; anything else is reported too
                problems.append(_problem(shard_dir, None, exc))
                continue
            try:
                checksums = load_checksums(shard_dir, n_blocks)
            except AtlasFormatError as exc:
                problems.append(_problem(shard_dir / CHECKSUM_FILE, None, exc))
                checksums = None
            data_fd = None
            if checksums is not None and n_blocks:
                try:
                    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0)
                    data_fd = os.open(shard_dir / DATA_FILE, flags)
                except OSError as exc:
                    problems.append(_problem(shard_dir / DATA_FILE, None, exc))
                    checksums = None
                else:
                    totals["blocks_checksummed"] += n_blocks
            try:
                for found in pool.map(
                    lambda b, s=shard, fd=data_fd, o=offsets, c=checksums: check_block(
                        s, fd, o, c, b
                    ),
                    range(n_blocks),
                ):
                    problems.extend(found)
            finally:
                if data_fd is not None:
                    os.close(data_fd)
                shard.close()
            totals["blocks"] += n_blocks
            totals["examples"] += metadata.stored_examples

    if target.kind == "dataset" and target.metadata is not None:
        present = {int(d.name) for d in target.shard_dirs if d.name.isdigit()}
        missing = [i for i in range(len(target.metadata.shard_sizes)) if i not in present]
        if missing:
            notes.append(
                f"{path / META_FILE} lists {len(target.metadata.shard_sizes)} shards; "
                f"{len(missing)} are not here (shards {_ranges(missing)}): a partial copy "
                "reads the shards present"
            )
    return {
        "path": str(path),
        "kind": target.kind,
        "ok": not problems,
        **totals,
        "problems": problems,
        "notes": notes,
    }


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


def run(args) -> int:
    path = Path(args.path)
    if not path.is_dir():
        print(f"atlas-fast verify: error: {path} is not a directory", file=sys.stderr)
        return 2
    if args.allow and not args.untrusted:
        print("atlas-fast verify: error: --allow needs --untrusted", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print("atlas-fast verify: error: --jobs must be at least 1", file=sys.stderr)
        return 2
    report = verify(
        path, trusted=not args.untrusted, allowed_globals=tuple(args.allow), jobs=args.jobs
    )
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
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
