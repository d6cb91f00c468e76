"""Opening a shard's files, for both cores: layout checks, dictionaries, lazy opening.

Part of the core side of the contract (``_contract``): called by the cores only.
"""

from __future__ import annotations

import os
import threading
import weakref
from pathlib import Path

from .._errors import AtlasFormatError, MissingSharedDictionary
from .._fork import after_fork_in_child
from .._format import (
    DATA_FILE,
    DICT_FILE,
    META_FILE,
    CompressionStrategy,
    block_count,
    load_offsets,
    read_dict_file,
    read_shard_metadata,
    widened_shard_dir,
)

__all__ = [
    "check_shared_dict",
    "shard_layout",
    "open_dictionary",
    "open_files",
    "ShardOpener",
    "renamed_root",
]

# -- opening a shard ------------------------------------------------------------------------

# One digested dictionary per backend and distinct dictionary content, shared by every shard
# that uses it (strategy 2 digests its shared dictionary once per process, not once per shard).
_dicts: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_dicts_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # A lock held by a thread of the parent at fork time would never be released here.
    global _dicts_lock
    _dicts_lock = threading.Lock()


after_fork_in_child(_after_fork_in_child)


class _Content:
    """A dictionary's bytes as a key of ``_dicts``: hashed on a sample (its length and ends),
    compared whole. Hashing all of a dictionary of hundreds of KB, read again at each opening,
    costs a strategy-2 or -3 dataset more than the rest of opening it and reading an example."""

    __slots__ = ("data", "_hash")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._hash = hash((len(data), data[:_HASHED_END], data[-_HASHED_END:]))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return type(other) is _Content and self.data == other.data


# Bytes at each end of a dictionary that its key hashes (its header holds its id).
_HASHED_END = 256


def _digested_dict(zstd_dict_type, data: bytes, path):
    key = (zstd_dict_type, _Content(data))
    with _dicts_lock:
        zdict = _dicts.get(key)
        if zdict is None:
            try:
                zdict = zstd_dict_type(data, str(path))
            except Exception as exc:
                raise AtlasFormatError(f"{path}: not a usable zstd dictionary: {exc}") from exc
            _dicts[key] = zdict
        return zdict


def check_shared_dict(root, metadata, dict_bytes) -> None:
    """Refuse a strategy-2 shard with examples but no shared dictionary."""
    if (
        metadata.compression_strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
        and metadata.stored_examples
        and dict_bytes is None
    ):
        raise MissingSharedDictionary(
            f"{root}: the shard uses a shared dictionary (compression_strategy 2): pass "
            "compression_dict_bytes, the bytes of the dataset's zstd_dict.bin, or open the "
            "dataset with AtlasDataset",
            root,
        )


def shard_layout(root, metadata, dict_bytes) -> tuple:
    """What a shard core derives from its arguments, computed once for both cores:
    ``(root, data path, examples, block size, blocks, compressed)``; refuses a strategy-2
    shard without its dictionary."""
    check_shared_dict(root, metadata, dict_bytes)
    root = str(root)
    n = metadata.stored_examples
    size = metadata.block_size
    compressed = metadata.compression_strategy != CompressionStrategy.NO_COMPRESSION
    return root, os.path.join(root, DATA_FILE), n, size, block_count(n, size), compressed


def renamed_root(root: str):
    """``(root, data path)`` of a local shard whose folder ``root`` is gone because an append
    widened the dataset's shard names since the shard object was made (see
    ``widened_shard_dir``), or None: the cores call it as they open a shard's files."""
    if os.path.isdir(root):
        return None
    moved = widened_shard_dir(root)
    return None if moved is None else (moved, os.path.join(moved, DATA_FILE))


def open_files(root: str, metadata, dict_bytes, zstd_dict_type, source=None) -> tuple:
    """What reading a shard needs: (validated offsets, digested dictionary or None). A remote
    shard's (``source``: a ``storage._dataset.ShardSource``) come from it."""
    if source is None:
        offsets = load_offsets(root, metadata)
    else:
        offsets = source.offsets(metadata)
    return offsets, open_dictionary(root, metadata, dict_bytes, zstd_dict_type, source)


def open_dictionary(root: str, metadata, dict_bytes, zstd_dict_type, source=None):
    """The shard's digested dictionary, or None when its strategy uses none."""
    strategy = metadata.compression_strategy
    if strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
        if source is not None:
            path = f"{source.url}/{DICT_FILE}"
            return _digested_dict(zstd_dict_type, source.dictionary(), path)
        path = Path(root) / DICT_FILE
        return _digested_dict(zstd_dict_type, read_dict_file(path), path)
    if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
        path = f"{root.rpartition('/')[0]}/{DICT_FILE}" if source else Path(root).parent / DICT_FILE
        return _digested_dict(zstd_dict_type, bytes(dict_bytes), path)
    return None


class ShardOpener:
    """What a dataset core needs to make the reader of shard ``s`` on its first use."""

    __slots__ = (
        "root",
        "shard_dirs",
        "sizes",
        "metadatas",
        "dict_bytes",
        "loads",
        "cache",
        "sources",
    )

    def __init__(
        self, root, shard_dirs, sizes, metadatas, dict_bytes, loads, cache, sources=None
    ) -> None:
        self.root = str(root)
        self.shard_dirs = list(shard_dirs)
        self.sizes = list(sizes)
        self.metadatas = list(metadatas)
        self.dict_bytes = dict_bytes
        self.loads = loads
        self.cache = cache
        self.sources = sources  # s -> shard s's ShardSource (a remote dataset), or None

    def make(self, shard_type, s: int):
        """Shard ``s``'s reader. Its meta.json, when not parsed yet, is read now and must
        agree with the size the dataset's meta.json gives it."""
        shard_dir = self.shard_dirs[s]
        metadata = self.metadatas[s]
        source = None if self.sources is None else self.sources(s)
        if source is None and not os.path.isdir(shard_dir):
            # Opened before an append that widened the names: the same shard, renamed.
            shard_dir = self.shard_dirs[s] = widened_shard_dir(shard_dir) or shard_dir
        if metadata is None:
            metadata = read_shard_metadata(shard_dir) if source is None else source.metadata()
            if metadata.stored_examples != self.sizes[s]:
                where = os.path.join(shard_dir, META_FILE) if source is None else source.url
                raise AtlasFormatError(
                    f"{where}: stored_examples is "
                    f"{metadata.stored_examples} but {os.path.join(self.root, META_FILE)} "
                    f"lists {self.sizes[s]} for shard {s}"
                )
        try:
            return shard_type(
                shard_dir, metadata, self.dict_bytes, self.loads, self.cache, s, source
            )
        except MissingSharedDictionary as exc:
            raise AtlasFormatError(
                f"{os.path.join(self.root, META_FILE)}: the dataset has no shared dictionary "
                f"(its compression_strategy is not 2), but shard {exc.shard_root} uses one "
                "(compression_strategy 2)"
            ) from None
