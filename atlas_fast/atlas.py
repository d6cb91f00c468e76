"""Readers of Atlas datasets: ``AtlasDataset`` and ``AtlasDatasetShard``.

Same names, signatures and behaviour as ``torch_atlas_ds.atlas``, without its defects: reads
are correct after ``fork``, readers pickle at any time, file descriptors stay bounded, indices
below ``-len`` raise ``IndexError``, empty shards and roots read as empty, methods are safe to
call from several threads, and zstd frames without a recorded size are read too.

The hot path (``__getitem__`` and block decoding) comes from the backend's ``ShardCore`` and
``DatasetCore``; this module adds what is not hot.
"""

from __future__ import annotations

import pickle
import sys
import threading
import weakref
from pathlib import Path

import numpy as np

from ._backend import core as _core
from ._batch import DatasetLoading, ShardLoading, check_cache_limits
from ._compat import torch_dataset_bases
from ._errors import AtlasFormatError
from ._format import (
    DATA_FILE,
    DICT_FILE,
    META_FILE,
    AtlasDatasetMetadata,
    AtlasDatasetShardMetadata,
    CompressionStrategy,
    check_shard_sizes,
    find_shard_dirs,
    load_offsets,
    read_dataset_metadata,
    read_dict_file,
    read_shard_metadata,
)
from ._safe_pickle import make_loads

__all__ = [
    "AtlasDataset",
    "AtlasDatasetShard",
    "AtlasDatasetMetadata",
    "AtlasDatasetShardMetadata",
    "CompressionStrategy",
]

_TORCH_BASES = torch_dataset_bases()

# One digested dictionary per backend and distinct dictionary content, shared by every shard
# that uses it (strategy 2 digests its shared dictionary once per process, not once per shard).
# Keyed by backend too: a backend's cores accept only its own ZstdDict.
_dicts: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_dicts_lock = threading.Lock()


def _digested_dict(core, data: bytes, path) -> object:
    key = (core.BACKEND, data)
    with _dicts_lock:
        zdict = _dicts.get(key)
        if zdict is None:
            try:
                zdict = core.ZstdDict(data, str(path))
            except Exception as exc:
                raise AtlasFormatError(f"{path}: not a usable zstd dictionary: {exc}") from exc
            _dicts[key] = zdict
        return zdict


class _NeedsSharedDict(AtlasFormatError):
    """A strategy-2 shard opened without the shared dictionary (the dataset rewords it)."""

    def __init__(self, shard_root, message: str) -> None:
        super().__init__(message)
        self.shard_root = shard_root


def _rebuild(cls, args, kwargs):
    return cls(*args, **kwargs)


# -- trusted / allowed_globals (safe loading) -----------------------------------------------


def _check_trust(trusted, allowed_globals) -> tuple:
    if not isinstance(trusted, bool):
        raise TypeError(f"trusted must be True or False, not {trusted!r}")
    allowed = (allowed_globals,) if isinstance(allowed_globals, str) else tuple(allowed_globals)
    if trusted and allowed:
        raise ValueError("allowed_globals restricts untrusted reading: pass trusted=False too")
    return trusted, allowed


def _trust_kwargs(reader) -> dict:
    return {"trusted": reader.trusted, "allowed_globals": reader.allowed_globals}


def _settings_kwargs(reader) -> dict:
    """The keyword arguments a reader pickles with: its cache and trust settings."""
    return {
        "cache_blocks": reader.cache_blocks,
        "cache_bytes": reader.cache_bytes,
        **_trust_kwargs(reader),
    }


def _block_loads(trusted: bool, allowed_globals: tuple):
    """The ``loads`` a shard core calls on each block's pickle bytes."""
    if trusted:
        return pickle.loads
    return make_loads(allowed_globals)


class _ShardMethods(ShardLoading):
    """One shard of an Atlas dataset, read block by block.

    ``shard[i]`` returns example ``i`` (negative counts from the end). Files are opened on
    first access; ``close()`` (or leaving a ``with`` block) releases them and the cached block,
    and the shard stays usable. For strategy 2, ``compression_dict_bytes`` must hold the
    dataset's shared dictionary. ``mmap_index`` is accepted for compatibility: the index is
    small, so it is read once into memory and validated.

    ``trusted=False`` unpickles blocks with a restricted unpickler that admits only plain
    data (builtin scalars and containers, datetime, numpy arrays, dtypes and scalars) and the
    globals listed in ``allowed_globals`` ("module.qualname" strings or the objects); any other
    global raises ``atlas_fast.UnsafePickleError`` before its code runs. The default,
    ``trusted=True``, unpickles as the reference does: only open datasets you trust with it.

    Beyond the reference: ``cache_blocks`` / ``cache_bytes`` bound a cache of decoded blocks
    (least recently used evicted; default: the last block only), ``shard.__getitems__(indices)``
    reads a batch decoding each block once, in parallel, and ``iter(shard)`` reads ahead.
    """

    VERSION = 1

    def __init__(
        self,
        root,
        mmap_index=True,
        compression_dict_bytes=None,
        *,
        cache_blocks=1,
        cache_bytes=None,
        trusted=True,
        allowed_globals=(),
    ):
        check_cache_limits(cache_blocks, cache_bytes)
        self.root = Path(root)
        self.mmap_index = mmap_index
        self.compression_dict_bytes = compression_dict_bytes
        self.trusted, self.allowed_globals = _check_trust(trusted, allowed_globals)
        self.metadata = read_shard_metadata(self.root)
        strategy = self.metadata.compression_strategy
        if (
            strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
            and self.metadata.stored_examples
            and compression_dict_bytes is None
        ):
            raise _NeedsSharedDict(
                self.root,
                f"{self.root}: the shard uses a shared dictionary "
                "(compression_strategy 2): pass compression_dict_bytes, the bytes of the "
                "dataset's zstd_dict.bin, or open the dataset with AtlasDataset",
            )
        self._core_init(
            str(self.root),
            str(self.root / DATA_FILE),
            self.metadata.stored_examples,
            self.metadata.block_size,
            strategy != CompressionStrategy.NO_COMPRESSION,
            _block_loads(self.trusted, self.allowed_globals),
        )
        self._init_loading(cache_blocks, cache_bytes)

    def _open_files(self):
        """Load and check what reading needs: (validated offsets, digested dictionary)."""
        offsets = load_offsets(self.root, self.metadata)
        strategy = self.metadata.compression_strategy
        if strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            path = self.root / DICT_FILE
            zdict = _digested_dict(self._core, read_dict_file(path), path)
        elif strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
            zdict = _digested_dict(
                self._core, bytes(self.compression_dict_bytes), self.root.parent / DICT_FILE
            )
        else:
            zdict = None
        return offsets, zdict

    def close(self) -> None:
        """Release the shard's files and cached blocks (it reopens on next use)."""
        self._close()
        self._forget_blocks()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __reduce__(self):
        return _rebuild, (
            type(self),
            (self.root, self.mmap_index, self.compression_dict_bytes),
            _settings_kwargs(self),
        )

    def __repr__(self):
        return (
            f"{type(self).__name__}({str(self.root)!r}, examples={len(self)}, "
            f"block_size={self.metadata.block_size}, "
            f"strategy={self.metadata.compression_strategy})"
        )


class _DatasetMethods(DatasetLoading):
    """An Atlas dataset: the shards under ``root``, indexed as one sequence.

    The shards are the sub-directories of ``root`` in sorted order; each shard's size comes
    from its own meta.json, so a node holding only some shards reads the ones it has, with
    indices running over the shards present. ``close()`` (or a ``with`` block) releases every
    shard's files. ``trusted`` and ``allowed_globals`` are passed to every shard (see
    ``AtlasDatasetShard``).

    Beyond the reference: ``cache_blocks`` / ``cache_bytes`` bound one cache of decoded blocks
    shared by all shards (default: the last block only), ``ds.__getitems__(indices)`` reads a
    batch decoding each block once, in parallel, and ``iter(ds)`` reads ahead.
    """

    VERSION = 1

    def __init__(
        self,
        root,
        mmap_index=True,
        *,
        cache_blocks=1,
        cache_bytes=None,
        trusted=True,
        allowed_globals=(),
    ):
        check_cache_limits(cache_blocks, cache_bytes)
        self.root = Path(root)
        self.mmap_index = mmap_index
        self.trusted, self.allowed_globals = _check_trust(trusted, allowed_globals)
        self.metadata = read_dataset_metadata(self.root)
        shard_dirs = find_shard_dirs(self.root)
        dict_bytes = None
        if self.metadata.compression_strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
            if shard_dirs or (self.root / DICT_FILE).exists():  # an empty root needs none
                dict_bytes = read_dict_file(self.root / DICT_FILE)
        # Looked up in the module at call time, so patching ``atlas.AtlasDatasetShard`` works.
        shard_class = sys.modules[type(self)._classes_module].AtlasDatasetShard
        trust = _trust_kwargs(self)
        try:
            self.shards = [shard_class(d, mmap_index, dict_bytes, **trust) for d in shard_dirs]
        except _NeedsSharedDict as exc:
            strategy = self.metadata.compression_strategy
            raise AtlasFormatError(
                f"{self.root / META_FILE}: compression_strategy {int(strategy)}, but shard "
                f"{exc.shard_root} uses the dataset's shared dictionary "
                "(compression_strategy 2), which only a strategy-2 dataset has"
            ) from None
        check_shard_sizes(self.root, self.metadata, [(s.root, s.metadata) for s in self.shards])
        self.actual_shard_sizes = [len(s) for s in self.shards]
        self.cumulative_shard_sizes = np.cumsum(self.actual_shard_sizes, dtype=np.int64)
        self._core_init(self.shards, self.actual_shard_sizes)
        self._init_loading(cache_blocks, cache_bytes)

    def close(self) -> None:
        """Release every shard's files and cached blocks (they reopen on next use)."""
        for shard in self.shards:
            shard.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __reduce__(self):
        return _rebuild, (
            type(self),
            (self.root, self.mmap_index),
            _settings_kwargs(self),
        )

    def __repr__(self):
        return (
            f"{type(self).__name__}({str(self.root)!r}, examples={len(self)}, "
            f"shards={len(self.shards)}, strategy={self.metadata.compression_strategy})"
        )


def _reader_classes(core, module: str):
    """The public reader classes over a backend's ``core``, named as members of ``module``.

    ``atlas_fast.atlas`` holds them over the selected backend and ``atlas_fast._python`` over
    the pure-Python one (for parity tests and benchmarks); both pickle by name.
    """

    class AtlasDatasetShard(_ShardMethods, core.ShardCore, *_TORCH_BASES):
        __doc__ = _ShardMethods.__doc__
        __module__ = module
        __qualname__ = "AtlasDatasetShard"
        _core = core

    class AtlasDataset(_DatasetMethods, core.DatasetCore, *_TORCH_BASES):
        __doc__ = _DatasetMethods.__doc__
        __module__ = module
        __qualname__ = "AtlasDataset"
        _classes_module = module

    return AtlasDataset, AtlasDatasetShard


AtlasDataset, AtlasDatasetShard = _reader_classes(_core, __name__)
