"""Atlas datasets in object storage: the format's files, read through this package's objects.

The one module of ``atlas_fast.storage`` that knows the format (``atlas_fast._format``); the
others read objects and byte ranges. Used by the readers and the command line, below the
contract (plain Python, shared by both cores). Metadata is read once
per object and process: opening a dataset reads its root meta.json (one request; a strategy-2
dataset also its shared zstd_dict.bin); each shard's meta.json and index.npy are read on its
first use. Nothing is listed: a remote dataset is whole, its shards those its root meta.json
counts, named as the writer names them (numbers zero-padded to the width of the last), and a
missing one is an error naming it when it is first read.

A ``ShardSource`` is what a core reads a remote shard's bytes through
(``_contract.ShardSourceProtocol``).
"""

from __future__ import annotations

import hashlib
import os
import threading
import weakref

from .._errors import AtlasFormatError, InvalidArgumentError, ObjectNotFoundError
from .._fork import before_fork, started_result
from .._format import (
    DATA_FILE,
    DICT_FILE,
    INDEX_FILE,
    MAX_META_BYTES,
    META_FILE,
    NPY_HEADER_LIMIT,
    block_count,
    check_dict_bytes,
    check_offsets,
    dataset_metadata_from,
    parse_json_object,
    parse_npy,
    shard_metadata_from,
)
from ._blocks import BlockFetcher, give_read_ahead, take_read_ahead
from ._diskcache import DiskCache, window_bytes
from ._object import Location, fetch_pool
from ._url import is_url, local_path

__all__ = [
    "is_remote",
    "Pending",
    "RemoteDataset",
    "ShardSource",
    "shard_names",
    "missing_bucket",
    "open_disk_cache",
]


def is_remote(path) -> bool:
    """Whether ``path`` names a dataset to read through storage (a URL other than file://)."""
    return is_url(path) and not (isinstance(path, str) and path[:7].lower() == "file://")


def to_local(path):
    """``path`` with a ``file://`` URL turned into the local path it names."""
    return local_path(path) if isinstance(path, str) else path


def open_disk_cache(cache_dir, cache_dir_bytes, location: Location):
    """The ``DiskCache`` of a remote dataset or shard at ``location`` (None without
    ``cache_dir``). A limit smaller than one read-ahead window is refused
    (InvalidArgumentError, naming the URL and both sizes)."""
    if cache_dir is None:
        return None
    limit = cache_dir_bytes
    window = window_bytes(location.settings)
    if limit < window:
        raise InvalidArgumentError(
            f"{location.url}: cache_dir_bytes={limit} is smaller than one read-ahead window "
            f"({window} bytes: storage_options' read_ahead_bytes and request_bytes); give the "
            "disk cache at least that, or lower read_ahead_bytes"
        )
    return DiskCache(cache_dir, limit)


def shard_names(count: int) -> list:
    """The shard folder names a writer gives ``count`` shards: numbers, zero-padded to the
    width of the last one."""
    width = len(str(count - 1)) if count else 1
    return [str(k).zfill(width) for k in range(count)]


def missing_bucket(exc: ObjectNotFoundError) -> bool:
    """Whether ``exc`` says the bucket itself does not exist (not only the object)."""
    return "bucket" in str(exc)[len(exc.url or "") :]


def _read(obj, what: str, limit: int | None = None) -> bytes:
    """The whole of ``obj``; a missing object is an ``AtlasFormatError`` worded by ``what``
    (a missing bucket stays an ``ObjectNotFoundError``)."""
    try:
        return obj.read(limit)
    except ObjectNotFoundError as exc:
        if missing_bucket(exc):
            raise
        raise AtlasFormatError(f"{obj.url}: missing{what}") from exc
    except ValueError as exc:
        raise AtlasFormatError(f"{exc}{what}") from exc


def _read_meta(location, what: str, found=None) -> tuple:
    """``(the JSON object of location's meta.json, its URL)``; a missing one is worded by
    ``what`` (see ``_read``). ``found``: a dict that receives ``"etag"`` and ``"digest"``
    (of the bytes read) of the object."""
    obj = location.object(META_FILE)
    data = _read(obj, what, MAX_META_BYTES)
    if found is not None:
        found["etag"] = obj.etag
        found["digest"] = hashlib.sha256(data).hexdigest()[:16]
    return parse_json_object(data, obj.url), obj.url


def _weakly(method, *args):
    """``method(*args)`` for as long as its object lives (then None): no reference cycle, so
    a dropped dataset is freed at once, with the bytes its fetchers held ahead."""
    ref = weakref.WeakMethod(method)

    def call():
        bound = ref()
        return None if bound is None else bound(*args)

    return call


class Pending:
    """Bytes requested on the fetch pool (``read()``) and awaited on first use: ``bytes()``
    of it. What the request raised is raised by a read made again here, with its context; so
    is a request not started yet (a pool thread may be the one waiting), or one made before a
    fork (never answered in the child)."""

    def __init__(self, read, requests_in_flight: int) -> None:
        self._read = read
        self._value = None
        self._pid = os.getpid()
        self._future = fetch_pool(requests_in_flight).submit(read)
        _PENDING.add(self)

    def __bytes__(self) -> bytes:
        value = self._value
        if value is None:
            future = self._future
            if future is not None and self._pid == os.getpid() and not future.cancel():
                try:
                    value = future.result()
                except Exception:
                    value = None
            if value is None:
                value = self._read()
            self._value = value
            self._future = None
        return value

    def __reduce__(self):
        return (bytes, (bytes(self),))


_PENDING: weakref.WeakSet = weakref.WeakSet()  # Pending objects, until collected


@before_fork
def _settle_pending() -> None:
    """Before a fork, what is still being fetched is awaited: a forked child (a DataLoader
    worker made right after opening) then has the bytes instead of fetching them again."""
    for pending in list(_PENDING):
        if pending._value is None and pending._pid == os.getpid():
            _PENDING.discard(pending)  # once: a failure is the child's to meet (and raise)
            bytes(pending)


class ShardSource:
    """The bytes of one remote shard: its meta.json, index.npy, zstd_dict.bin (strategy 3) and
    the blocks of its data.bin by exact ranges (a ``BlockFetcher``). Safe to use from several
    threads and in a forked or spawned child (it pickles as its location)."""

    def __init__(self, location: Location, shard=None, following=None, cache=None) -> None:
        self.location = location
        self.shard = shard
        self.cache = cache  # a _diskcache.DiskCache, or None
        # The next shard's source, when this one is a dataset's (None: the last, or alone):
        # warming this shard reads that one's meta.json too, so a pass finds it read.
        self._following = following
        self.url = location.url
        self.data_url = location.object(DATA_FILE).url
        self._data = location.object(DATA_FILE)
        self._metadata = None
        self._offsets = None
        self._fetcher = None
        self._checked = False
        self._warm_wanted = False
        self._index = None  # the index.npy request made beside meta.json's (a future)
        self._meta = None  # the meta.json request made by ``warm`` (a future)
        self._head = None  # data.bin's first bytes requested by ``warm`` (a future)
        self._extent_blocks = 0  # > 1: a block missed is fetched with its extent
        self._opened_by = None  # the thread that read the index and made the fetcher
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def __reduce__(self):
        # alone: its neighbours stay
        return (ShardSource, (self.location, self.shard, None, self.cache))

    def _locked(self) -> threading.Lock:
        if self._pid != os.getpid():  # forked: the parent's lock may be held forever
            self._lock = threading.Lock()
            # The parent's requests: never answered here (nor is its budget this process's).
            self._index = self._meta = self._head = None
            self._pid = os.getpid()
        return self._lock

    def metadata(self):
        """The shard's parsed meta.json (read on first use; its index.npy is requested at the
        same time, on the fetch pool: a shard whose metadata is read is about to be read, and
        the two requests then cost one round trip)."""
        with self._locked():
            if self._metadata is None:
                if self._offsets is None and self._index is None:
                    pool = fetch_pool(self.location.settings.requests_in_flight)
                    self._index = pool.submit(self.location.object(INDEX_FILE).read)
                obj = self.location.object(META_FILE)
                data = started_result(self._meta)  # requested by warm (None: read here)
                self._meta = None
                if data is None or len(data) > MAX_META_BYTES:
                    value, url = _read_meta(
                        self.location,
                        ": the shard has no meta.json (its writer did not finish, or this is "
                        "not an Atlas shard)",
                    )
                else:
                    value, url = parse_json_object(data, obj.url), obj.url
                self._metadata = shard_metadata_from(value, url)
            return self._metadata

    def offsets(self, metadata):
        """The validated block offsets from index.npy (read on first use)."""
        with self._locked():
            if self._offsets is None:
                obj = self.location.object(INDEX_FILE)
                blocks = block_count(metadata.stored_examples, metadata.block_size)
                limit = NPY_HEADER_LIMIT + 8 * (blocks + 1)
                what = ": not the .npy array expected here"
                future, self._index = self._index, None
                try:
                    data = started_result(future)  # None: read here (again, for its error)
                    if data is not None and len(data) > limit:
                        raise AtlasFormatError(f"{obj.url}: larger than {limit} bytes{what}")
                    if data is None:
                        data = _read(obj, what, limit)
                    offsets = check_offsets(parse_npy(data, obj.url), obj.url, metadata)
                except BaseException:
                    self._drop_head_lock_held()
                    raise
                offsets.setflags(write=False)
                self._opened_by = threading.get_ident()
                fetcher = BlockFetcher(
                    self._data,
                    offsets,
                    self.shard,
                    self.cache,
                    following=_weakly(self._warm_following),
                    extent_blocks=self._extent_blocks,
                )
                # Before any reader waiting for this lock reads a block: the pass warm asked
                # for starts, with the first bytes it requested when there are.
                head, self._head = self._head, None
                if head is not None:
                    size = self.location.settings.request_bytes
                    fetcher.start_pass_with_head(head[0], size, head[1])
                elif self._warm_wanted:
                    fetcher.start_pass(0)
                self._fetcher = fetcher
                self._offsets = offsets
            return self._offsets

    def _drop_head_lock_held(self) -> None:
        """Forget the first bytes ``warm`` requested (the budget they took given back)."""
        head, self._head = self._head, None
        if head is not None:
            head[0].cancel()
            give_read_ahead(head[1])

    def _drop_ready_ahead(self) -> None:
        """(``_blocks._BUDGET`` asks its holders for room: a head requested is not given.)"""

    def set_extents(self, blocks: int) -> None:
        """From now on a block missed is fetched with the rest of its extent (runs of
        ``blocks`` blocks from block 0; 0 or 1: alone): a sampler reads in extents."""
        self._extent_blocks = blocks
        fetcher = self._fetcher
        if fetcher is not None:
            fetcher.extent_blocks = blocks

    def stored_bytes_per_block(self) -> float:
        """The shard's data.bin bytes over its blocks (reads its index.npy on first use)."""
        offsets = self.offsets(self.metadata())
        return float(offsets[-1]) / max(len(offsets) - 1, 1)

    def dictionary(self) -> bytes:
        """The shard's own zstd_dict.bin (strategy 3)."""
        obj = self.location.object(DICT_FILE)
        return check_dict_bytes(_read(obj, " (the compression strategy needs it)"), obj.url)

    def block(self, b: int) -> bytes:
        """Block ``b``'s stored bytes (after ``offsets``)."""
        data = self._fetcher.get(b)
        if not self._checked:
            self._check_size()
        return data

    def prefetch(self, blocks, hint: bool = False) -> None:
        """Fetch ``blocks`` now, neighbours merged (a batch about to be read; ``hint``: blocks
        a sampler reads next, see ``BlockFetcher.prefetch``); a shard not opened yet is opened
        on the fetch pool first, so that the shards of a batch open together (a failure is
        left for the read to raise)."""
        fetcher = self._fetcher
        if fetcher is not None:
            fetcher.prefetch(blocks, hint)
        else:
            blocks = list(blocks)
            fetch_pool(self.location.settings.requests_in_flight).submit(
                self._open_and_fetch, blocks, hint
            )

    def _open_and_fetch(self, blocks: list, hint: bool) -> None:
        try:
            self.offsets(self.metadata())
            if self._opened_by != threading.get_ident():
                return  # a reader opened it first: it may have read these blocks already
            self._fetcher.prefetch(blocks, hint)
        except Exception:
            pass  # raised again, with its context, by the read that needs it

    def warm(self) -> None:
        """A pass in order will read this shard next: read its index.npy and start fetching
        its first blocks now, on the fetch pool (a failure is left for the read to raise).

        A shard none of whose files was requested yet requests its meta.json, index.npy and
        the first ``request_bytes`` of its data.bin at once (one round trip, not three in
        turn: a pass's blocks start at byte 0), unless the bytes fetched ahead are at their
        limit or a disk cache may hold the blocks."""
        fetcher = self._fetcher
        if fetcher is not None:
            fetcher.start_pass(0)  # nothing when this shard is being read
            return
        with self._locked():
            if self._warm_wanted or self._fetcher is not None:
                return
            self._warm_wanted = True
            settings = self.location.settings
            pool = fetch_pool(settings.requests_in_flight)
            if self._metadata is None and self._meta is None:
                self._meta = pool.submit(self.location.object(META_FILE).read, MAX_META_BYTES)
            if self._index is None:
                self._index = pool.submit(self.location.object(INDEX_FILE).read)
            size = settings.request_bytes
            if self.cache is None and take_read_ahead(size, settings.read_ahead_bytes, self):
                head = pool.submit(self._data.read_head, size, shard=self.shard)
                self._head = (head, size)
        pool.submit(self._warm)

    def _warm_following(self) -> None:
        """This shard's read-ahead has asked for its last block: the next shard's starts."""
        following = self._following() if self._following is not None else None
        if following is not None:
            following.warm()

    def _warm(self) -> None:
        try:
            self.offsets(self.metadata())
            following = self._following() if self._following is not None else None
            if following is not None:
                following.metadata()
        except Exception:
            with self._locked():
                self._drop_head_lock_held()
            # raised again, with its context, by the read that needs it

    def close(self) -> None:
        """Drop the bytes fetched and not read (metadata and offsets stay: they are pinned)."""
        fetcher = self._fetcher
        if fetcher is not None:
            fetcher.close()
        with self._locked():
            self._drop_head_lock_held()

    def _check_size(self) -> None:
        size = self._data.size
        end = int(self._offsets[-1])
        if size is not None and size != end:
            raise AtlasFormatError(
                f"{self.location.object(INDEX_FILE).url}: the last offset is {end} but "
                f"{self.data_url} has {size} bytes"
            )
        self._checked = size is not None


class RemoteDataset:
    """A dataset root in object storage: its meta.json, shared dictionary and shards."""

    def __init__(self, url: str, storage_options: dict | None = None, cache=None) -> None:
        self.location = Location(url, storage_options)
        self.url = self.location.url
        self.cache = cache
        found: dict = {}
        value, url = _read_meta(
            self.location,
            ": not an Atlas dataset, or an incomplete dataset (no root meta.json: its writer "
            "did not finish, or the URL does not name a dataset root)",
            found,
        )
        # What this version of the dataset is known by: its commit's ETag and bytes (a
        # rewrite commits a new root meta.json).
        self.identity = f"{found['etag'] or ''}:{found['digest']}"
        self.metadata = dataset_metadata_from(value, url)
        self.names = shard_names(len(self.metadata.shard_sizes))
        self._sources: list = [None] * len(self.names)
        self._lock = threading.Lock()
        self.extent_blocks = 0

    def shard_url(self, s: int) -> str:
        return self.location.child(self.names[s]).url

    def dictionary(self) -> bytes:
        """The dataset's shared zstd_dict.bin (strategy 2)."""
        obj = self.location.object(DICT_FILE)
        return check_dict_bytes(_read(obj, " (the compression strategy needs it)"), obj.url)

    def root_file(self, name: str, limit: int) -> bytes | None:
        """The object ``name`` at the dataset's root (at most ``limit`` bytes: a larger one is
        an ``AtlasFormatError``), or None when there is none."""
        obj = self.location.object(name)
        try:
            return obj.read(limit)
        except ObjectNotFoundError as exc:
            if missing_bucket(exc):
                raise
            return None
        except ValueError as exc:
            raise AtlasFormatError(str(exc)) from exc

    def dictionary_later(self) -> Pending:
        """The dataset's shared zstd_dict.bin, requested now on the fetch pool and awaited on
        first use (``bytes(pending)``): opening does not wait for it, so it arrives together
        with the first shard's meta.json and index.npy (a missing or bad one is an error when
        the first shard is read)."""
        return Pending(self.dictionary, self.location.settings.requests_in_flight)

    def source(self, s: int) -> ShardSource:
        """Shard ``s``'s source (one per shard and dataset)."""
        source = self._sources[s]
        if source is None:
            following = _weakly(self.source, s + 1) if s + 1 < len(self.names) else None
            made = ShardSource(self.location.child(self.names[s]), s, following, self.cache)
            with self._lock:
                source = self._sources[s]
                if source is None:
                    source = self._sources[s] = made
                    made.set_extents(self.extent_blocks)
        return source

    def start_pass(self) -> None:
        """A pass in order over the dataset is starting: its first shard with examples is
        warmed (``ShardSource.warm``: its meta.json, index.npy and first data requested at
        once, while the dataset's dictionary may still be arriving)."""
        for s, size in enumerate(self.metadata.shard_sizes):
            if size:
                self.source(s).warm()
                return

    def read_shard_metadata(self) -> None:
        """Read every shard's meta.json and index.npy now, concurrently (a failure is left
        for the read that needs it to raise)."""
        pool = fetch_pool(self.location.settings.requests_in_flight)

        def read(s):
            source = self.source(s)
            try:
                source.offsets(source.metadata())
            except Exception:
                pass

        list(pool.map(read, range(len(self.names))))

    def close(self) -> None:
        """Every shard source's ``close``: what was fetched and not read is dropped."""
        for source in [x for x in self._sources if x is not None]:
            source.close()

    def set_extents(self, blocks: int) -> None:
        """Every shard's ``ShardSource.set_extents(blocks)``, now and when made."""
        with self._lock:
            self.extent_blocks = blocks
            sources = [x for x in self._sources if x is not None]
        for source in sources:
            source.set_extents(blocks)

    def __reduce__(self):
        return (
            _rebuild_dataset,
            (self.location, self.metadata, self.names, self.cache, self.identity),
        )


def _rebuild_dataset(location, metadata, names, cache=None, identity=""):
    out = RemoteDataset.__new__(RemoteDataset)
    out.identity = identity
    out.location = location
    out.cache = cache
    out.url = location.url
    out.metadata = metadata
    out.names = names
    out._sources = [None] * len(names)
    out._lock = threading.Lock()
    out.extent_blocks = 0  # the facade sets it again (a sampler's)
    return out
