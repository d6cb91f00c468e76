"""The contract between the facade (``atlas.py``, ``sampler.py``, ``verify``, ``info``) and a core.

A core is a module (``atlas_fast._core._reader``, compiled, or ``atlas_fast._core._reader_py``,
pure Python) that offers what ``CoreModule`` declares. The facade calls nothing else of it: no
private attribute, no class-hierarchy test. The public reader classes subclass the core's
``ShardCore`` / ``DatasetCore`` (so that ``ds[i]`` is the core's own ``__getitem__``, a C slot
in the compiled core) and add only what is not hot.

The block cache
---------------
Decoded blocks live in one ``BlockCache`` per dataset object, shared by all its shards (a
standalone ``AtlasDatasetShard`` has its own). ``ds[i]``, ``__getitems__``, ``iter(ds)`` and
``read_block`` all read through it. Least recently used blocks are evicted first, while the
cache holds more than ``max_bytes`` bytes or more than ``max_blocks`` blocks (``None``: no bound
of that kind), but the ``reserved`` most recently used blocks (at least 1) are always kept.

Passes in order (``iter(ds)``; ``ds[i]`` for ``i`` in order, from a shard's first example or
continuing from the example before, across shards too; a ``__getitems__`` batch of a pass in
order, ``run_start``) follow one rule. With ``passes_fill`` (a budget the user set:
``cache_bytes`` or ``cache_blocks``) a pass keeps each block it has read while the cache has
room for it, and never evicts one to keep its own: one pass warms a cache sized for the
dataset. Without (the default budget) it keeps none: it holds only the block it is reading
(``ds[i]`` holds it in the cache, for its next hits) and drops it when it moves on. A block
the cache held before the pass read it stays.

A block held whole is charged what its examples take as Python objects: its decoded pickle's
size times the ratio of objects to pickle bytes the cache has measured lately, never less than
the pickle's size (``atlas_fast._core._objsize.ChargeMeter``), so that a budget bounds memory
whether the examples are text and arrays (about their pickle's size) or rows of small objects
(several times more). A block held as its pickle only (after partial decoding, the compiled
core) is charged its size; a block the Python core remembers only in its place (decoded whole
for one random read) the few hundred bytes its entry takes. The Python core keeps that block's
examples, beyond the budget, until the cache's next block is decoded if it decodes to 4 MiB or
more (``SPARE_MIN_BYTES``; as the reference keeps the block it read last): one block at most
per cache. So does it with a compressed block of that size that a pass in order has just
left and did not keep (``BlockCache._forget``); read again, that one is decoded again.

Errors: ``AtlasFormatError`` (a dataset on disk is malformed; ``MissingSharedDictionary`` a
strategy-2 shard opened without its dictionary), ``UnsafePickleError`` (``trusted=False``),
``IndexError`` (an index or block number out of range), ``TypeError`` (not an integer).
"""

from __future__ import annotations

import operator
from collections import namedtuple
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from ._checks import check_int
from ._errors import AtlasFormatError, MissingSharedDictionary, UnsafePickleError

__all__ = [
    "CacheInfo",
    "DEFAULT_CACHE_BYTES",
    "cache_limits",
    "normalize_index",
    "run_start",
    "hinted_readers",
    "BlockCacheCore",
    "ShardCoreProtocol",
    "DatasetCoreProtocol",
    "BatchSource",
    "ShardSourceProtocol",
    "CoreModule",
    "RAISES",
]

RAISES = (AtlasFormatError, MissingSharedDictionary, UnsafePickleError, IndexError, TypeError)

CacheInfo = namedtuple("CacheInfo", "hits misses max_bytes currsize blocks max_blocks")
CacheInfo.__doc__ = """What ``cache_info()`` reports, as ``functools.lru_cache`` does.

``hits`` / ``misses``: block look-ups served from the cache / that decoded the block (one per
``ds[i]``, one per distinct block of a ``__getitems__`` batch but one per example of a batch of
a pass in order (``run_start``), one per block of ``iter(ds)``);
``currsize``: bytes held (what the blocks' objects take, see above); ``max_bytes``: the budget
(None: unbounded); ``blocks``: blocks held; ``max_blocks``: the block bound (None: unbounded)."""

# The default budget of a dataset's cache when neither cache_bytes nor cache_blocks is given:
# small enough that eight DataLoader workers and their parent hold well under 1 GB of decoded
# blocks, large enough for a BlockShuffleSampler window of blocks of a few MB each.
DEFAULT_CACHE_BYTES = 32 << 20


def cache_limits(cache_blocks, cache_bytes) -> tuple:
    """``(max_bytes, max_blocks, passes_fill)``, the ``BlockCache`` arguments for the readers'
    ``cache_blocks`` / ``cache_bytes`` arguments.

    Neither: ``DEFAULT_CACHE_BYTES`` and no block bound, and passes in order do not fill the
    cache (see the module's doc). One: that bound alone. Both: both. Either: passes fill it.
    """
    cache_blocks = check_int("cache_blocks", cache_blocks, minimum=1, none=True)
    cache_bytes = check_int("cache_bytes", cache_bytes, minimum=0, none=True)
    if cache_blocks is None and cache_bytes is None:
        return DEFAULT_CACHE_BYTES, None, False
    return cache_bytes, cache_blocks, True


def normalize_index(i, n: int) -> int:
    """``i`` as an index in ``[0, n)``: negative counts from the end; IndexError outside.

    The one definition of the rule and its messages; the compiled core decides the common case
    in C and calls this to raise.
    """
    i = operator.index(i)
    if i < 0:
        if i + n < 0:
            raise IndexError(f"index {i} out of range for {n} examples")
        return i + n
    if i >= n:
        raise IndexError(f"index {i} out of range for {n} examples")
    return i


def run_start(indices, n: int, resume: int) -> int:
    """The first index if ``indices`` is a batch of a pass in order, else -1: a list or tuple
    of two or more consecutive ints in ``[0, n)``, ascending, starting at 0 or at ``resume``
    (where the reader's last such batch ended), as ``DataLoader(shuffle=False)`` makes them
    without workers. Both cores read such a batch as ``ds[i]`` reads a pass in order (a
    DataLoader worker that gets every other batch does not continue a pass: reading ahead it
    would decode the blocks of the batches it does not get); the compiled core decides it in
    C, by this rule."""
    if type(indices) not in (list, tuple) or len(indices) < 2:
        return -1
    first = indices[0]
    if type(first) is not int or first < 0 or first not in (0, resume) or first + len(indices) > n:
        return -1
    for k, i in enumerate(indices):
        if type(i) is not int or i != first + k:
            return -1
    return first


def hinted_readers(hints, reader_of) -> Iterator:
    """``(reader, examples)`` for each shard named in ``hints`` (a dataset core's
    ``(shard, index in it)`` pairs from ``prefetch``): ``reader_of(shard)`` and the indices
    named in it, shards in the order first named, indices in the order named. A shard whose
    reader cannot be made is passed over: reading an example of it says why. Both cores
    queue a dataset's hints through it."""
    per_shard: dict = {}
    for s, j in hints:
        per_shard.setdefault(s, []).append(j)
    for s, named in per_shard.items():
        try:
            reader = reader_of(s)
        except Exception:
            continue
        yield reader, named


def block_number(b, n_blocks: int) -> int:
    """``b`` as a block number in ``[0, n_blocks)`` (no negative numbers); IndexError outside."""
    k = operator.index(b)
    if not 0 <= k < n_blocks:
        raise IndexError(f"block {b} out of range for {n_blocks} blocks")
    return k


class BlockCacheCore(Protocol):
    """A bounded LRU of decoded blocks (see the module docstring)."""

    def __init__(
        self, max_bytes: int | None, max_blocks: int | None, passes_fill: bool = True
    ) -> None: ...

    def cache_info(self) -> CacheInfo: ...

    def reserve(self, blocks: int) -> None:
        """Always keep at least the ``blocks`` most recently used blocks (never fewer than
        before), whatever the budget: what a ``BlockShuffleSampler`` window needs."""

    @property
    def reserved(self) -> int: ...

    def clear(self) -> None:
        """Drop every block (hit and miss counts stay)."""

    def keys(self) -> list:
        """``(tag, block)`` of the blocks held, least recently used first."""


class _Reader(Protocol):
    def __len__(self) -> int: ...

    def __getitem__(self, i) -> Any: ...

    def __getitems__(self, indices: Sequence) -> list:
        """The examples at ``indices`` (all checked first), each block decoded once."""

    def __iter__(self) -> Iterator:
        """Every example in order, decoding ahead."""

    def cache_info(self) -> CacheInfo: ...

    def cache_reserve(self, blocks: int) -> None:
        """``BlockCacheCore.reserve`` on this reader's cache."""

    def prefetch(self, indices: Sequence) -> bool:
        """A hint: the blocks holding ``indices`` are read next, in that order (what a sampler
        knows of its next window). The core decodes them ahead from its next read in this
        process on (the compiled core on its read-ahead thread, the Python core on its pool;
        a remote shard's blocks are fetched by its source, neighbours merged, and decoded when
        read), as far as its read-ahead has room, and only the latest hints are kept until
        then: a
        reader read in other processes (a DataLoader's workers) does nothing. Indices are
        checked as ``self[i]`` checks them; no result changes.

        Returns False once the reader knows that hints are of no use to it (its blocks are
        stored uncompressed, or too small on average to be worth decoding on another
        thread): the caller may stop naming blocks."""

    def close(self) -> None:
        """Release files, mappings and cached blocks; the reader reopens on next use."""


class ShardCoreProtocol(_Reader, Protocol):
    """Reads one shard. ``tag`` keys its blocks in ``cache`` (shared with a dataset's)."""

    def __init__(
        self,
        root: str,
        metadata,
        dict_bytes: bytes | None,
        loads: Callable,
        cache: BlockCacheCore,
        tag: int,
        source: ShardSourceProtocol | None = None,
    ) -> None:
        """Nothing is opened yet. Raises ``MissingSharedDictionary`` for a strategy-2 shard
        without ``dict_bytes``. ``source``: a shard in object storage, whose files and
        blocks are read through it (None: the files under ``root``)."""

    def read_block(self, b: int) -> list:
        """The examples of block ``b``, through the cache."""

    def _block_bytes(self, b: int) -> bytes:
        """The decoded pickle bytes of block ``b`` (not cached)."""

    def _raw_block(self, b: int) -> bytes:
        """The stored (possibly compressed) bytes of block ``b``."""

    def _block_offsets(self):
        """The validated block offsets (a read-only uint64 array), opening the shard."""


class DatasetCoreProtocol(_Reader, Protocol):
    """Maps global indices onto shards; a shard's reader is made on its first use.

    ``sizes[s]`` is the number of examples of shard ``shard_dirs[s]``; ``metadatas[s]`` its
    parsed meta.json, or None: then it is read on first use and must agree with ``sizes[s]``
    (an ``AtlasFormatError`` naming both files otherwise).
    """

    def __init__(
        self,
        root: str,
        shard_dirs: Sequence[str],
        sizes: Sequence[int],
        metadatas: Sequence,
        dict_bytes: bytes | None,
        loads: Callable,
        cache: BlockCacheCore,
        sources: Callable | None = None,
    ) -> None:
        """``sources``: a dataset in object storage: ``sources(s)`` is shard ``s``'s
        ``ShardSourceProtocol`` (its metadata, when None in ``metadatas``, comes from it).
        ``dict_bytes`` is then a ``storage._dataset.Pending`` (still being fetched): it is
        read as ``bytes(dict_bytes)`` when a shard is opened, never at construction."""


class ShardSourceProtocol(Protocol):
    """Where a remote shard's bytes come from (``atlas_fast.storage._dataset.ShardSource``).
    A core given one reads nothing under ``root``; it decodes the stored bytes of a block as
    it decodes a mapped block's. Errors: ``AtlasFormatError``
    (malformed or missing files), ``atlas_fast.StorageError`` and its subclasses (the object
    store: after retries; ``ObjectChangedError`` when the dataset was replaced)."""

    url: str  # the shard's URL, for messages

    def metadata(self):
        """The shard's parsed meta.json (``AtlasDatasetShardMetadata``)."""

    def offsets(self, metadata):
        """The validated block offsets (read-only uint64 array) from index.npy."""

    def dictionary(self) -> bytes:
        """The shard's own zstd_dict.bin (strategy 3)."""

    def block(self, b: int) -> bytes:
        """Block ``b``'s stored bytes, exactly (after ``offsets``)."""

    def prefetch(self, blocks, hint: bool = False) -> None:
        """Fetch ``blocks`` now, neighbours merged: a batch about to be read (``hint``: blocks
        a sampler reads next, in an order of its own, not a pass in order's batch)."""

    def warm(self) -> None:
        """A pass in order reaches this shard soon: fetch its index and first blocks now."""

    def close(self) -> None:
        """Drop the bytes fetched and not read."""


class BatchSource(Protocol):
    """What ``_pool`` (shared by both cores, below this contract: the facade never calls it)
    needs of a core's shard reader to gather a batch. Core-internal, hence the underscores;
    declared here so that both cores are checked to offer it and ``_pool`` to use nothing
    else."""

    _root: str  # the shard's directory
    _block_size: int
    _n_blocks: int
    _compressed: bool
    _source: ShardSourceProtocol | None  # a remote shard's (None: local files)

    def _lookup(self, b: int) -> list | None:
        """Block ``b``'s cached examples or None, counted as a hit or a miss."""

    def _held(self, b: int) -> list | None:
        """For ``iter``: as ``_lookup``, but a block the cache holds as its pickle only (or
        remembers only, the Python core) is a hit, unpickled (decoded) and held whole."""

    def _ahead(self, b: int) -> list | None:
        """Block ``b``'s examples if it was decoded ahead (``prefetch``), now cached, or None
        (not decoded ahead, or that failed: decoding it again says why)."""

    def _load(self, b: int) -> list:
        """Block ``b``'s examples (stored uncompressed) read now and cached: not looked up
        again (the caller's ``_lookup`` counted its miss)."""

    def _store(self, b: int, data) -> list:
        """Unpickle ``data`` (block ``b``'s decoded bytes), check and cache the examples."""

    def _pass_block(self, b: int, data) -> list:
        """The same as ``_store`` for a pass in order: cached only as such a pass keeps its
        blocks (see the module's doc)."""

    def _block_bytes(self, b: int) -> bytes: ...

    def _prefetch(self, blocks) -> None:
        """A remote shard: ask its source for ``blocks`` at once (no-op for local files)."""


class BlockCompressorProtocol(Protocol):
    """The writer's compression of pickled blocks: the frames are those of
    ``zstandard.ZstdCompressor(level=level, dict_data=ZstdCompressionDict(zdict),
    write_checksum=checksum).compress(block)``, byte for byte, whatever the backend and the number
    of workers; with ``level=None`` the blocks themselves. Called from one thread at a time; an
    error is raised by the call that would return the failing block's frame.

    Made with ``out`` (a file descriptor open for writing), it writes the frames there in block
    order (on whichever of its threads is free) and returns their sizes instead of the frames; a
    failed write is an ``OSError`` with its errno, and no later frame is written."""

    def submit(self, block: bytes) -> list:
        """Queue a block; the frames (or sizes) finished since the last call, in block order."""

    def finish(self) -> list:
        """The frames (or sizes) of every block still queued, in block order."""

    def close(self) -> None:
        """Stop the threads; blocks still queued are dropped. Idempotent."""


class CoreModule(Protocol):
    """What a backend module offers."""

    BACKEND: str
    BlockCache: type
    ShardCore: type
    DatasetCore: type

    def zstd_library(self) -> dict: ...


class CompressorModule(Protocol):
    """What a backend's compressor module offers the writer."""

    def block_compressor(
        self,
        level: int | None,
        zdict: bytes | None,
        workers: int,
        checksum: bool = False,
        out: int | None = None,
    ) -> BlockCompressorProtocol: ...
