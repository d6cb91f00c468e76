"""Locations and objects: reading whole objects and exact byte ranges, retried, resumed and
pinned to the version first read."""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from .._errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ObjectChangedError,
    ObjectNotFoundError,
    StorageError,
)
from .._fork import after_fork_in_child
from . import _engines
from ._engines import ENGINE_KEYS, Changed, Denied, NotFound, Transient
from ._url import is_url, join_url, local_path, parse_url

__all__ = ["Settings", "Location", "StoredObject", "merge_ranges", "fetch_pool"]


class Settings:
    """How reading behaves (the keys of ``storage_options`` that are not the engine's).

    ``deadline``: seconds a read may spend retrying (default 120). ``max_attempts``: requests
    per read at most (default 10). ``requests_in_flight``: concurrent requests per process
    (default 16: enough to fill a link at 50 ms of latency with requests of a few MiB).
    ``read_ahead_bytes``: bytes fetched ahead and not yet used, per process (default 64 MiB).
    ``request_bytes``: the size neighbouring blocks are merged up to (default 8 MiB).
    ``merge_gap``: bytes between two wanted ranges fetched rather than split into two
    requests (default 0: only exact neighbours are merged).
    """

    __slots__ = ENGINE_KEYS

    DEFAULTS = {
        "deadline": 120.0,
        "max_attempts": 10,
        "requests_in_flight": 16,
        "read_ahead_bytes": 64 << 20,
        "request_bytes": 8 << 20,
        "merge_gap": 0,
    }

    def __init__(self, options: dict) -> None:
        for name, default in self.DEFAULTS.items():
            value = options.get(name, default)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise InvalidArgumentError(
                    f"storage_options[{name!r}] must be a non-negative number"
                )
            setattr(self, name, type(default)(value))
        if self.max_attempts < 1 or self.requests_in_flight < 1 or self.request_bytes < 1:
            raise InvalidArgumentError(
                "storage_options: max_attempts, requests_in_flight and request_bytes must be "
                "at least 1"
            )


# -- the fetch pool -------------------------------------------------------------------------

_pool = None
_pool_size = 0
_pool_lock = threading.Lock()


def fetch_pool(size: int) -> ThreadPoolExecutor:
    """The process's pool of fetching threads (made on first use; a forked child makes its
    own). Its threads spend their time in the engine, which releases the GIL."""
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < size:
            _pool = ThreadPoolExecutor(size, thread_name_prefix="atlas_fast_fetch")
            _pool_size = size
        return _pool


def _after_fork_in_child() -> None:
    global _pool, _pool_size, _pool_lock
    _pool = None
    _pool_size = 0
    _pool_lock = threading.Lock()


after_fork_in_child(_after_fork_in_child)


# -- locations ------------------------------------------------------------------------------


class Location:
    """A folder of objects: ``scheme://bucket/prefix`` in an object store, an HTTP(S) URL, or a
    local directory (a path or ``file://`` URL). Pickles as its URL and options; the engine
    (client) is made in each process on first use, never carried across ``fork``.

    ``storage_options``: the engine's settings (obstore's configuration keys for S3, GCS,
    Azure and HTTP; the filesystem's arguments for fsspec schemes), over the standard
    environment variables, plus the reading settings of ``Settings``.
    """

    def __init__(self, url, storage_options: dict | None = None) -> None:
        if storage_options is not None and not isinstance(storage_options, dict):
            raise InvalidArgumentTypeError(
                f"storage_options must be a dict or None, not {type(storage_options).__name__}"
            )
        options = dict(storage_options or {})
        self.storage_options = options
        self.settings = Settings(options)
        self._engine_options = {k: v for k, v in options.items() if k not in ENGINE_KEYS}
        path = local_path(os.fspath(url))
        if is_url(path):
            parsed = parse_url(path)
            self.url = parsed.url
            self.scheme, self.container, self.prefix = parsed
            _engines.check_location(path, self.scheme, self.container, self._engine_options)
        else:
            self.url = os.path.abspath(path)
            self.scheme, self.container, self.prefix = "file", "", self.url
        self._engine = None
        self._engine_pid = None

    @property
    def is_local(self) -> bool:
        return self.scheme == "file"

    def child(self, name: str) -> Location:
        """The location ``name`` under this one."""
        out = Location.__new__(Location)
        out.__dict__.update(self.__dict__)
        out._engine = None
        out._engine_pid = None
        if self.is_local:
            out.url = out.prefix = os.path.join(self.url, name)
        else:
            out.url = join_url(self.url, name)
            out.prefix = join_url(self.prefix, name) if self.prefix else name.strip("/")
        return out

    def object(self, name: str) -> StoredObject:
        """The object ``name`` under this location (nothing is requested yet)."""
        return StoredObject(self, name)

    def engine(self, small: bool = False):
        """``(engine, style)`` of this process (see ``_engines.engine_for``); ``small``: for a
        whole small object (a fork-safe engine unless obstore runs in this process already)."""
        if small:
            return _engines.engine_for(self.scheme, self.container, self._engine_options, True)
        pid = os.getpid()
        if self._engine is None or self._engine_pid != pid:
            self._engine = _engines.engine_for(self.scheme, self.container, self._engine_options)
            self._engine_pid = pid
        return self._engine

    def _target(self, name: str, style: str) -> str:
        if style == "path":
            return os.path.join(self.url, name)
        if style == "url":
            return join_url(self.url, name)
        return join_url(self.prefix, name) if self.prefix else name.strip("/")

    def __reduce__(self):
        return (Location, (self.url, self.storage_options))

    def __repr__(self) -> str:
        return f"Location({self.url!r})"


# -- objects --------------------------------------------------------------------------------


class StoredObject:
    """One object: its whole bytes or exact ranges, each read retried within the location's
    deadline (connection errors, timeouts, 5xx, throttling, short bodies), a short body
    resumed from its last byte. The first answer pins the object: its ETag (sent as If-Match
    from then on) and its size; a later answer of another version raises
    ``ObjectChangedError``. Safe to use from several threads."""

    def __init__(self, location: Location, name: str) -> None:
        self.location = location
        self.name = name
        if location.is_local:
            self.url = os.path.join(location.url, name)
        else:
            self.url = join_url(location.url, name)
        self.size: int | None = None
        self.etag: str | None = None
        self._lock = threading.Lock()

    def __reduce__(self):
        return (StoredObject, (self.location, self.name))

    # -- reading ---------------------------------------------------------------------------

    def read(self, limit: int | None = None, *, what: str = "") -> bytes:
        """The whole object. ``limit``: refuse one larger (an ``ObjectChangedError`` naming the
        size is not right here: a ``ValueError``, worded by the caller with ``what``)."""
        data = self._read(None, None, what=what)
        if limit is not None and len(data) > limit:
            raise ValueError(f"{self.url}: larger than {limit} bytes{what}")
        return data

    def read_range(self, start: int, end: int, *, shard=None, block=None) -> bytes:
        """Bytes ``start..end`` (end exclusive), exactly: a shorter object is
        ``ObjectChangedError``."""
        if not 0 <= start < end:
            raise ValueError(f"{self.url}: bad range {start}..{end}")
        return self._read(start, end, shard=shard, block=block)

    def read_head(self, n: int, *, shard=None) -> bytes:
        """The first ``n`` bytes, or the whole object when it is shorter (one request: a
        range request past its end is answered with the bytes it has)."""
        if n < 1:
            raise ValueError(f"{self.url}: bad head size {n}")
        return self._read(0, n, shard=shard, block=0, clip=True)

    def read_ranges(self, ranges: list, *, shard=None) -> list:
        """The bytes of each ``(start, end)`` of ``ranges``: neighbouring ranges (closer than
        the location's ``merge_gap``) merged into requests of up to ``request_bytes``, the
        requests made concurrently on the fetch pool."""
        settings = self.location.settings
        runs = merge_ranges(ranges, settings.request_bytes, settings.merge_gap)
        if len(runs) == 1:
            datas = [self.read_range(runs[0][0], runs[0][1], shard=shard)]
        else:
            pool = fetch_pool(settings.requests_in_flight)
            futures = [pool.submit(self.read_range, s, e, shard=shard) for s, e, _ in runs]
            datas = [f.result() for f in futures]
        out = [None] * len(ranges)
        for (start, _end, members), data in zip(runs, datas):
            view = memoryview(data)
            for k in members:
                s, e = ranges[k]
                out[k] = bytes(view[s - start : e - start])
        return out

    def _read(
        self, start, end, *, shard=None, block=None, what: str = "", clip: bool = False
    ) -> bytes:
        settings = self.location.settings
        deadline = time.monotonic() + settings.deadline
        parts: list = []
        got = 0
        attempts = 0
        delay = 0.05
        first = start or 0
        while True:
            attempts += 1
            engine, style = self.location.engine(end is None)
            if start is None and not got:
                begin = stop = None  # the whole object, its size not known yet
            else:
                begin, stop = first + got, end if end is not None else self.size
            try:
                target = self.location._target(self.name, style)
                response = engine.get(target, begin, stop, self.etag)
                self._pin(response)
                if end is not None and end > response.size:
                    if not clip:
                        raise Changed(f"it has {response.size} bytes, not {end} or more")
                    end = response.size  # clip: the bytes it has
                for chunk in response.chunks:
                    if chunk:
                        parts.append(chunk)
                        got += len(chunk)
                wanted = (end if end is not None else response.size) - first
                if got < wanted:
                    raise Transient(f"short body: {got} of {wanted} bytes")
                break
            except NotFound as exc:
                raise self._error(
                    ObjectNotFoundError, self._not_found(exc), shard, block, attempts
                ) from None
            except Changed as exc:
                raise self._error(
                    ObjectChangedError,
                    f"changed since it was first read (first read: {self.size} bytes, ETag "
                    f"{self.etag}; now: {exc.detail}): the dataset was replaced while being "
                    "read",
                    shard,
                    block,
                    attempts,
                ) from None
            except Denied as exc:
                raise self._error(
                    StorageError,
                    f"access denied: check the credentials (AWS_ACCESS_KEY_ID and "
                    f"AWS_SECRET_ACCESS_KEY, or storage_options) and the permissions: "
                    f"{exc.detail}",
                    shard,
                    block,
                    attempts,
                ) from None
            except Transient as exc:
                now = time.monotonic()
                pause = delay * (0.5 + random.random())
                if attempts >= settings.max_attempts or now + pause > deadline:
                    raise self._error(
                        StorageError,
                        f"failed after {attempts} attempts ({exc.detail})",
                        shard,
                        block,
                        attempts,
                    ) from None
                time.sleep(pause)
                delay = min(delay * 2, 5.0)
            except _engines.Fatal as exc:
                raise self._error(StorageError, exc.detail, shard, block, attempts) from None
        if len(parts) == 1:
            return parts[0] if type(parts[0]) is bytes else bytes(parts[0])
        return b"".join(parts)

    def _pin(self, response) -> None:
        with self._lock:
            if self.size is None:
                self.size = response.size
                self.etag = response.etag
                return
            if response.size != self.size or (
                response.etag is not None and self.etag is not None and response.etag != self.etag
            ):
                raise Changed(f"{response.size} bytes, ETag {response.etag}")

    def _not_found(self, exc) -> str:
        if exc.code == "NoSuchBucket":
            return f"the bucket {self.location.container!r} does not exist"
        return "no such object"

    def _error(self, kind, message, shard, block, attempts) -> StorageError:
        where = self.url
        if shard is not None:
            where += f" (shard {shard}"
            where += f", block {block})" if block is not None else ")"
        elif block is not None:
            where += f" (block {block})"
        return kind(f"{where}: {message}", self.url, shard, block, attempts)


def merge_ranges(ranges: list, max_bytes: int, gap: int) -> list:
    """Runs ``(start, end, [indices into ranges])`` covering ``ranges``: ranges sorted by start,
    a range joined to the run before when it begins at most ``gap`` bytes after that run's end
    and the run stays within ``max_bytes`` (a single range larger than that is a run alone)."""
    order = sorted(range(len(ranges)), key=lambda k: ranges[k][0])
    runs: list = []
    for k in order:
        s, e = ranges[k]
        if runs:
            rs, re_, members = runs[-1]
            if s >= rs and s - re_ <= gap and max(e, re_) - rs <= max_bytes:
                members.append(k)
                runs[-1] = (rs, max(e, re_), members)
                continue
        runs.append((s, e, [k]))
    return runs
