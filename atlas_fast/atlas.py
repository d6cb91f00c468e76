"""Readers of Atlas datasets: ``AtlasDataset`` and ``AtlasDatasetShard``.

Same names, signatures and behaviour as ``torch_atlas_ds.atlas``, without its defects: reads
are correct after ``fork``, readers pickle at any time, file descriptors stay bounded, indices
below ``-len`` raise ``IndexError``, empty shards and roots read as empty, methods are safe to
call from several threads, and zstd frames without a recorded size are read too.

The hot path (``__getitem__``, batches, iteration, the block cache) comes from the backend's
``ShardCore`` and ``DatasetCore``, reached only through ``atlas_fast._contract``; this module
adds what is not hot: metadata, shard discovery, pickling, settings.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ._backend import core as _core
from ._checks import check_int
from ._compat import lazy_classes, torch_data_bases
from ._contract import cache_limits
from ._errors import InvalidArgumentError, InvalidArgumentTypeError
from ._format import (
    DATA_FILE,
    DICT_FILE,
    AtlasDatasetMetadata,
    AtlasDatasetShardMetadata,
    CompressionStrategy,
    check_shard_sizes,
    read_dataset_metadata,
    read_dict_file,
    read_shard_metadata,
    shard_dir_names,
    widened_shard_dir,
)
from ._safe_pickle import make_loads
from .storage import Location
from .storage._dataset import (
    RemoteDataset,
    ShardSource,
    is_remote,
    open_disk_cache,
    to_local,
)

__all__ = [  # noqa: F822 (the readers are made by __getattr__, at the end)
    "AtlasDataset",
    "AtlasDatasetShard",
    "AtlasDatasetMetadata",
    "AtlasDatasetShardMetadata",
    "CompressionStrategy",
]


def _rebuild(cls, args, kwargs):
    return cls(*args, **kwargs)


def _check_root(who: str, root) -> None:
    """A reader's ``root`` is a path or a URL: refused, naming it, when it is neither."""
    if not isinstance(root, (str, os.PathLike)):
        raise InvalidArgumentTypeError(
            f"{who}: root must be a path (str or os.PathLike) or a URL, not "
            f"{type(root).__name__} ({root!r:.80})"
        )


def _named_as(public: str, init) -> None:
    """Python's own argument errors (an unknown keyword, a missing argument) name the
    function by its qualified name: the public class's, not this module's mixin's."""
    init.__qualname__ = f"{public}.__init__"


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


def _block_loads(trusted: bool, allowed_globals: tuple):
    """The ``loads`` a core calls on each block's pickle bytes."""
    if trusted:
        return pickle.loads
    return make_loads(allowed_globals)


class _Settings:
    """Settings shared by shards and datasets: trust, the cache, pickling, ``with``."""

    def _init_settings(
        self,
        cache_blocks,
        cache_bytes,
        trusted,
        allowed_globals,
        storage_options=None,
        cache_dir=None,
        cache_dir_bytes=None,
    ) -> tuple:
        limits = cache_limits(cache_blocks, cache_bytes)
        if storage_options is not None and not isinstance(storage_options, dict):
            raise InvalidArgumentTypeError(
                f"storage_options must be a dict or None, not {type(storage_options).__name__}"
            )
        if cache_dir is None:
            if cache_dir_bytes is not None:
                raise InvalidArgumentError(
                    "cache_dir_bytes limits the disk cache: pass cache_dir too"
                )
        else:
            if not isinstance(cache_dir, (str, os.PathLike)):
                raise InvalidArgumentTypeError(
                    f"cache_dir must be a path (str or os.PathLike), not {type(cache_dir).__name__}"
                )
            if cache_dir_bytes is None:
                raise InvalidArgumentError(
                    "cache_dir needs cache_dir_bytes, the most bytes the disk cache may hold"
                )
            cache_dir_bytes = check_int("cache_dir_bytes", cache_dir_bytes, minimum=1)
        self.cache_dir = cache_dir
        self.cache_dir_bytes = cache_dir_bytes
        self.storage_options = storage_options
        self.cache_blocks = cache_blocks
        self.cache_bytes = cache_bytes
        self.trusted, self.allowed_globals = _check_trust(trusted, allowed_globals)
        return limits

    def _settings_kwargs(self) -> dict:
        """The keyword arguments a reader pickles with: its cache and trust settings."""
        kwargs = {
            "cache_blocks": self.cache_blocks,
            "cache_bytes": self.cache_bytes,
            **_trust_kwargs(self),
        }
        if self.storage_options is not None:
            kwargs["storage_options"] = self.storage_options
        if self.cache_dir is not None:
            kwargs["cache_dir"] = self.cache_dir
            kwargs["cache_dir_bytes"] = self.cache_dir_bytes
        return kwargs

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __setstate__(self, state) -> None:
        # What pickling keeps beyond the constructor's arguments: the blocks reserved in the
        # cache (a BlockShuffleSampler's window) and the extents it reads in, so DataLoader
        # workers keep them too.
        self.cache_reserve(state["cache_reserved"])
        if state.get("extent_blocks"):
            self._set_extents(state["extent_blocks"])

    def _pickled_state(self) -> dict:
        return {"cache_reserved": self._block_cache.reserved, "extent_blocks": self._extent_blocks}

    # -- reading in extents (BlockShuffleSampler) -------------------------------------------

    _extent_blocks = 0

    @property
    def _in_object_storage(self) -> bool:
        """Whether this dataset or shard is read through ``atlas_fast.storage`` (a URL)."""
        return self._storage() is not None

    def _plan_extents(self, extent_bytes: int) -> int:
        """Blocks per extent of about ``extent_bytes`` stored bytes (at least 1), from the
        first shard's average block (a remote shard's index.npy is read for it); from now on
        (and in pickled copies) a block missed is fetched with its extent."""
        per_block = self._stored_bytes_per_block()
        blocks = max(1, round(extent_bytes / per_block)) if per_block else 1
        self._set_extents(blocks)
        return blocks

    def _set_extents(self, blocks: int) -> None:
        self._extent_blocks = blocks
        storage = self._storage()
        if storage is not None:
            storage.set_extents(blocks)


class _ShardMethods(_Settings):
    """One shard of an Atlas dataset, read block by block.

    ``shard[i]`` returns example ``i`` (negative counts from the end). Files are opened on
    first access; ``close()`` (or leaving a ``with`` block) releases them and the cached
    blocks, and the shard stays usable. For strategy 2, ``compression_dict_bytes`` must hold
    the dataset's shared dictionary. ``mmap_index`` is accepted for compatibility: the index
    is small, so it is read once into memory and validated.

    ``trusted=False`` unpickles blocks with a restricted unpickler that admits only plain
    data (builtin scalars and containers; the standard library's value types: datetime,
    Decimal, Fraction, UUID, OrderedDict, deque, Counter, defaultdict, ipaddress and pathlib
    values, array, SimpleNamespace; numpy arrays, dtypes and scalars) and the
    globals listed in ``allowed_globals`` ("module.qualname" strings or the objects); any other
    global raises ``atlas_fast.UnsafePickleError`` before its code runs. The default,
    ``trusted=True``, unpickles as the reference does: only open datasets you trust with it.

    Beyond the reference: decoded blocks are kept in a cache bounded in bytes
    (``cache_bytes``, default 32 MiB of decoded pickle) and/or in blocks (``cache_blocks``),
    least recently used evicted first, reported by ``cache_info()``; ``shard.read_block(b)``
    returns block ``b``'s examples; ``shard.__getitems__(indices)`` reads a batch decoding
    each block once, in parallel; ``iter(shard)`` reads ahead.

    ``root`` may be a URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``file://``, or
    any fsspec scheme): see ``AtlasDataset`` and docs/remote.md; ``storage_options`` configures
    the client and the reading (``atlas_fast.storage``), ``cache_dir`` and
    ``cache_dir_bytes`` the local disk cache of fetched blocks (see ``AtlasDataset``).
    """

    VERSION = 1

    def __init__(
        self,
        root,
        mmap_index=True,
        compression_dict_bytes=None,
        *,
        cache_blocks=None,
        cache_bytes=None,
        trusted=True,
        allowed_globals=(),
        storage_options=None,
        cache_dir=None,
        cache_dir_bytes=None,
        _dataset_cache=None,
        _source=None,
    ):
        _check_root("AtlasDatasetShard", root)
        limits = self._init_settings(
            cache_blocks,
            cache_bytes,
            trusted,
            allowed_globals,
            storage_options,
            cache_dir,
            cache_dir_bytes,
        )
        source = _source
        if source is None and is_remote(root):
            location = Location(root, storage_options)
            disk = open_disk_cache(cache_dir, cache_dir_bytes, location)
            source = ShardSource(location, cache=disk)
        self._remote_source = source
        if source is not None:  # in object storage: its files are read through the source
            self.root = source.url
            self.metadata = source.metadata()
        else:
            self.root = Path(to_local(root))
            self.metadata = read_shard_metadata(self.root)
        self.mmap_index = mmap_index
        self.compression_dict_bytes = compression_dict_bytes
        if _dataset_cache is None:  # a shard of its own
            self._block_cache, tag = self._backend.BlockCache(*limits), 0
        else:  # one of AtlasDataset.shards: the dataset's cache, under its shard number
            self._block_cache, tag = _dataset_cache
        super().__init__(
            str(self.root),
            self.metadata,
            compression_dict_bytes,
            _block_loads(self.trusted, self.allowed_globals),
            self._block_cache,
            tag,
            source,
        )

    def __reduce__(self):
        return (
            _rebuild,
            (
                type(self),
                (self.root, self.mmap_index, self.compression_dict_bytes),
                self._settings_kwargs(),
            ),
            self._pickled_state(),
        )

    def _storage(self):
        return self._remote_source

    def _stored_bytes_per_block(self) -> float:
        """Stored bytes of data.bin over its blocks (0: no blocks)."""
        blocks = -(-len(self) // self.metadata.block_size)
        if not blocks:
            return 0.0
        if self._remote_source is not None:
            return self._remote_source.stored_bytes_per_block()
        return os.path.getsize(os.path.join(self.root, DATA_FILE)) / blocks

    def __repr__(self):
        return (
            f"{type(self).__name__}({str(self.root)!r}, examples={len(self)}, "
            f"block_size={self.metadata.block_size}, "
            f"strategy={self.metadata.compression_strategy})"
        )


def _shard_sizes(root: Path, metadata: AtlasDatasetMetadata, names: list) -> tuple:
    """``(sizes, metadatas)`` of the shards in the folders ``names`` of ``root``.

    When the shard folders are exactly those the root's ``shard_sizes`` lists, the sizes come
    from it and no shard is read now (each shard's meta.json is checked against it on first
    use: metadatas are None). Otherwise (a node holding only some shards) each present shard's
    own meta.json gives its size, as the reference reads them.
    """
    listed = metadata.shard_sizes
    if len(names) == len(listed) and all(n.isascii() and n.isdigit() for n in names):
        if [int(n) for n in names] == list(range(len(listed))):
            return list(listed), [None] * len(listed)
    shard_dirs = [root / n for n in names]
    metadatas = [read_shard_metadata(d) for d in shard_dirs]
    check_shard_sizes(root, metadata, list(zip(shard_dirs, metadatas)))
    return [m.stored_examples for m in metadatas], metadatas


class _Shards(Sequence):
    """``AtlasDataset.shards``: the shard objects, each made on first access.

    Each reads through the dataset's block cache, under its shard number. Holds what making
    them needs, not the dataset (no reference cycle: a dataset is freed, and its mappings
    released, as soon as it is dropped).
    """

    def __init__(self, dataset, cache) -> None:
        self._module = type(dataset).__module__
        self._dirs = dataset._shard_dirs
        self._args = (dataset.mmap_index, dataset._dict_bytes)
        self._kwargs = _trust_kwargs(dataset)
        self._remote = dataset._remote
        if self._remote is not None:
            self._kwargs["storage_options"] = dataset.storage_options
            self._kwargs["cache_dir"] = dataset.cache_dir
            self._kwargs["cache_dir_bytes"] = dataset.cache_dir_bytes
        self._cache = cache
        self._made = [None] * len(self._dirs)

    def __len__(self) -> int:
        return len(self._made)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self._made)))]
        shard = self._made[k]
        if shard is None:
            k = k % len(self._made)
            # Looked up in the module at call time, as the reference does, so that patching
            # ``atlas_fast.atlas.AtlasDatasetShard`` is honoured.
            shard_class = sys.modules[self._module].AtlasDatasetShard
            source = None if self._remote is None else self._remote.source(k)
            mmap_index, dict_bytes = self._args
            if source is None and not os.path.isdir(self._dirs[k]):
                # Opened before an append that widened the names: the same shard, renamed.
                self._dirs[k] = widened_shard_dir(self._dirs[k]) or self._dirs[k]
            shard = shard_class(
                self._dirs[k],
                mmap_index,
                None if dict_bytes is None else bytes(dict_bytes),  # a remote one awaited
                **self._kwargs,
                _dataset_cache=(self._cache, k),
                _source=source,
            )
            self._made[k] = shard
        return shard

    def __eq__(self, other):
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None

    def made(self) -> list:
        """The shard objects made so far."""
        return [s for s in self._made if s is not None]

    def __repr__(self) -> str:
        return f"<{len(self)} shards>"


class _DatasetMethods(_Settings):
    """An Atlas dataset: the shards under ``root``, indexed as one sequence.

    The shards are the sub-directories of ``root`` in sorted order. When they are exactly the
    shards the root's meta.json lists, opening reads only that file: a shard's own files are
    read on its first use (its meta.json checked against the root's). Otherwise each shard's
    size comes from its own meta.json, so a node holding only some shards reads the ones it
    has, with indices running over the shards present. ``close()`` (or a ``with`` block)
    releases every shard's files. ``trusted`` and ``allowed_globals`` are passed to every
    shard (see ``AtlasDatasetShard``).

    Beyond the reference: one cache of decoded blocks shared by all shards, bounded in bytes
    (``cache_bytes``, default 32 MiB of decoded pickle) and/or in blocks (``cache_blocks``),
    least recently used evicted first, reported by ``cache_info()``;
    ``ds.__getitems__(indices)`` reads a batch decoding each block once, in parallel, and
    ``iter(ds)`` reads ahead.

    ``root`` may be a URL: ``s3://bucket/path``, ``gs://``, ``az://``, ``http(s)://``,
    ``file://``, or any other fsspec scheme (``hf://`` ...). Credentials and endpoints come
    from the standard environment variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY, AWS_REGION, or the GCS and Azure ones) or from
    ``storage_options`` (see ``atlas_fast.storage``). Opening reads the root meta.json alone
    (and a strategy-2 dataset's shared dictionary); nothing is listed: the shards are those it
    counts. Blocks are fetched by exact byte ranges, neighbours merged into large requests for
    batches and passes in order, retried, and pinned to the version first read. The dataset
    pickles as its URL and settings (DataLoader workers make their own clients).

    ``cache_dir`` (with ``cache_dir_bytes``, its hard limit in bytes) keeps the blocks fetched
    from a URL in that local folder, least recently used evicted first, shared safely by the
    processes of one node (DataLoader workers, ranks): a second epoch reads them from disk.
    A limit smaller than one read-ahead window (``read_ahead_bytes``) is refused at open. A
    local dataset has no use for it and ignores it.
    """

    VERSION = 1

    def __init__(
        self,
        root,
        mmap_index=True,
        *,
        cache_blocks=None,
        cache_bytes=None,
        trusted=True,
        allowed_globals=(),
        storage_options=None,
        cache_dir=None,
        cache_dir_bytes=None,
    ):
        _check_root("AtlasDataset", root)
        limits = self._init_settings(
            cache_blocks,
            cache_bytes,
            trusted,
            allowed_globals,
            storage_options,
            cache_dir,
            cache_dir_bytes,
        )
        self.mmap_index = mmap_index
        shared = CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
        dict_bytes = None
        self._remote = sources = None
        if is_remote(root):  # in object storage: one request, nothing listed
            location = Location(root, storage_options)
            disk = open_disk_cache(cache_dir, cache_dir_bytes, location)
            remote = self._remote = RemoteDataset(root, storage_options, disk)
            self.root = remote.url
            self.metadata = remote.metadata
            names = remote.names
            if self.metadata.compression_strategy == shared and names:
                dict_bytes = remote.dictionary_later()  # awaited at first read
            sizes, metadatas = list(self.metadata.shard_sizes), [None] * len(names)
            self._shard_dirs = [remote.shard_url(s) for s in range(len(names))]
            sources = remote.source
        else:
            self.root = Path(to_local(root))
            self.metadata = read_dataset_metadata(self.root)
            names = shard_dir_names(self.root)
            if self.metadata.compression_strategy == shared:
                if names or (self.root / DICT_FILE).exists():  # an empty root needs none
                    dict_bytes = read_dict_file(self.root / DICT_FILE)
            sizes, metadatas = _shard_sizes(self.root, self.metadata, names)
            base = os.path.join(self.root, "")
            self._shard_dirs = [base + n for n in names]  # strings: 10,000 Paths cost
        self._dict_bytes = dict_bytes
        self._block_cache = self._backend.BlockCache(*limits)
        self.actual_shard_sizes = sizes
        self.cumulative_shard_sizes = np.cumsum(sizes, dtype=np.int64)
        self.shards = _Shards(self, self._block_cache)
        super().__init__(
            str(self.root),
            self._shard_dirs,
            sizes,
            metadatas,
            dict_bytes,
            _block_loads(self.trusted, self.allowed_globals),
            self._block_cache,
            sources,
        )

    def close(self) -> None:
        """Release every shard's files and the cached blocks (they reopen on next use)."""
        super().close()  # first: the cache is emptied once, not searched once per shard
        for shard in self.shards.made():
            shard.close()
        if self._remote is not None:
            self._remote.close()  # also the shards read ahead that no shard object reads yet

    def __reduce__(self):
        return (
            _rebuild,
            (type(self), (self.root, self.mmap_index), self._settings_kwargs()),
            self._pickled_state(),
        )

    def _storage(self):
        return self._remote

    def __iter__(self):
        if self._remote is not None:
            self._remote.start_pass()  # the first shard's files requested at once
        return super().__iter__()

    def _read_shard_metadata(self) -> None:
        """Every shard's meta.json read now: concurrently when in object storage (a sampler
        needs every shard's block size)."""
        if self._remote is not None:
            self._remote.read_shard_metadata()

    def _stored_bytes_per_block(self) -> float:
        for k, size in enumerate(self.actual_shard_sizes):
            if size:
                return self.shards[k]._stored_bytes_per_block()
        return 0.0

    def __repr__(self):
        return (
            f"{type(self).__name__}({str(self.root)!r}, examples={len(self)}, "
            f"shards={len(self.shards)}, strategy={self.metadata.compression_strategy})"
        )


_named_as("AtlasDatasetShard", _ShardMethods.__init__)
_named_as("AtlasDataset", _DatasetMethods.__init__)


def _reader_classes(core, module: str) -> dict:
    """The public reader classes over a backend's ``core``, named as members of ``module``:
    ``{"AtlasDataset": ..., "AtlasDatasetShard": ...}``, subclasses of torch's ``Dataset``
    when torch is installed (it is imported now).

    ``atlas_fast.atlas`` holds them over the selected backend and ``atlas_fast._python`` over
    the pure-Python one (for parity tests and benchmarks); both pickle by name. Each module
    makes them on first lookup (``_compat.lazy_classes``), so that importing atlas_fast does
    not import torch.
    """
    torch_bases = torch_data_bases("Dataset")

    class AtlasDatasetShard(_ShardMethods, core.ShardCore, *torch_bases):
        __doc__ = _ShardMethods.__doc__
        __module__ = module
        __qualname__ = "AtlasDatasetShard"
        _backend = core

    class AtlasDataset(_DatasetMethods, core.DatasetCore, *torch_bases):
        __doc__ = _DatasetMethods.__doc__
        __module__ = module
        __qualname__ = "AtlasDataset"
        _backend = core

    return {"AtlasDataset": AtlasDataset, "AtlasDatasetShard": AtlasDatasetShard}


def _make_readers() -> dict:
    return _reader_classes(_core, __name__)


__getattr__, __dir__ = lazy_classes(
    globals(), {"AtlasDataset": _make_readers, "AtlasDatasetShard": _make_readers}
)
