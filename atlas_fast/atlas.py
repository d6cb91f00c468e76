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

__all__ = [
    "AtlasDataset",
    "AtlasDatasetShard",
    "AtlasDatasetMetadata",
    "AtlasDatasetShardMetadata",
    "CompressionStrategy",
]

_TORCH_BASES = torch_dataset_bases()

# One digested dictionary per distinct dictionary content, shared by every shard that uses it
# (strategy 2 digests its shared dictionary once per process, not once per shard).
_dicts: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_dicts_lock = threading.Lock()


def _digested_dict(data: bytes, path) -> object:
    with _dicts_lock:
        zdict = _dicts.get(data)
        if zdict is None:
            try:
                zdict = _core.ZstdDict(data, str(path))
            except Exception as exc:
                raise AtlasFormatError(f"{path}: not a usable zstd dictionary: {exc}") from exc
            _dicts[data] = zdict
        return zdict


def _rebuild(cls, args, kwargs):
    return cls(*args, **kwargs)


class _ShardMethods(ShardLoading):
    """One shard of an Atlas dataset, read block by block.

    ``shard[i]`` returns example ``i`` (negative counts from the end). Files are opened on
    first access; ``close()`` (or leaving a ``with`` block) releases them and the cached block,
    and the shard stays usable. For strategy 2, ``compression_dict_bytes`` must hold the
    dataset's shared dictionary. ``mmap_index`` is accepted for compatibility: the index is
    small, so it is read once into memory and validated.

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
    ):
        check_cache_limits(cache_blocks, cache_bytes)
        self.root = Path(root)
        self.mmap_index = mmap_index
        self.compression_dict_bytes = compression_dict_bytes
        self.metadata = read_shard_metadata(self.root)
        strategy = self.metadata.compression_strategy
        if (
            strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
            and self.metadata.stored_examples
            and compression_dict_bytes is None
        ):
            raise AtlasFormatError(
                f"{self.root}: the shard uses a shared dictionary "
                "(compression_strategy 2): pass compression_dict_bytes, the bytes of the "
                "dataset's zstd_dict.bin, or open the dataset with AtlasDataset"
            )
        self._core_init(
            str(self.root),
            str(self.root / DATA_FILE),
            self.metadata.stored_examples,
            self.metadata.block_size,
            strategy != CompressionStrategy.NO_COMPRESSION,
            pickle.loads,
        )
        self._init_loading(cache_blocks, cache_bytes)

    def _open_files(self):
        """Load and check what reading needs: (validated offsets, digested dictionary)."""
        offsets = load_offsets(self.root, self.metadata)
        strategy = self.metadata.compression_strategy
        if strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            path = self.root / DICT_FILE
            zdict = _digested_dict(read_dict_file(path), path)
        elif strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
            zdict = _digested_dict(bytes(self.compression_dict_bytes), self.root.parent / DICT_FILE)
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
            {"cache_blocks": self.cache_blocks, "cache_bytes": self.cache_bytes},
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
    shard's files.

    Beyond the reference: ``cache_blocks`` / ``cache_bytes`` bound one cache of decoded blocks
    shared by all shards (default: the last block only), ``ds.__getitems__(indices)`` reads a
    batch decoding each block once, in parallel, and ``iter(ds)`` reads ahead.
    """

    VERSION = 1

    def __init__(self, root, mmap_index=True, *, cache_blocks=1, cache_bytes=None):
        check_cache_limits(cache_blocks, cache_bytes)
        self.root = Path(root)
        self.mmap_index = mmap_index
        self.metadata = read_dataset_metadata(self.root)
        dict_bytes = None
        if self.metadata.compression_strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
            dict_bytes = read_dict_file(self.root / DICT_FILE)
        shard_dirs = find_shard_dirs(self.root)
        shard_class = self._shard_class
        self.shards = [shard_class(d, mmap_index, dict_bytes) for d in shard_dirs]
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
            {"cache_blocks": self.cache_blocks, "cache_bytes": self.cache_bytes},
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

    class AtlasDataset(_DatasetMethods, core.DatasetCore, *_TORCH_BASES):
        __doc__ = _DatasetMethods.__doc__
        __module__ = module
        __qualname__ = "AtlasDataset"
        _shard_class = AtlasDatasetShard

    return AtlasDataset, AtlasDatasetShard


AtlasDataset, AtlasDatasetShard = _reader_classes(_core, __name__)
