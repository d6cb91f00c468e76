"""Writing objects: whole files and bytes put into a location, retried within its deadline,
large files as multipart uploads whose parts go up in parallel; failed uploads aborted.

``Destination(location)`` is a location written to (S3, GCS, Azure through obstore; other
fsspec schemes through the filesystem). It knows nothing of the Atlas format: the dataset
writers (``atlas_fast.storage._dataset_upload``) build on it.

Retries. Each request is retried by the engine itself (obstore: connection errors, resets,
5xx, throttling, with exponential backoff) within the location's ``deadline``; an object
whose upload still fails is put again from the start, up to ``max_attempts`` times within
the same deadline. What cannot be written raises ``StorageError`` naming the object and the
attempts. A multipart upload that failed is aborted: on S3 the uploads left open under the
object's key are listed and aborted before it is put again (an upload whose creation was
answered with an error may exist all the same), and ``abort_uploads()`` sweeps a whole prefix.
A process killed mid-upload cannot abort anything: a bucket lifecycle rule
(AbortIncompleteMultipartUpload on S3) removes what it left.
"""

from __future__ import annotations

import datetime
import os
import random
import threading
import time
from pathlib import Path

from .._errors import ObjectNotFoundError, StorageError
from .._fork import after_fork_in_child
from ._engines import Changed, Denied, Fatal, NotFound, Transient, _shorten
from ._object import Location

__all__ = ["Destination", "PART_BYTES", "MAX_PARTS"]

# The size of a multipart upload's parts (the last excepted): large enough that an object of
# a few hundred MiB is a few dozen requests, small enough that many are in flight at once.
PART_BYTES = 8 << 20
# S3 allows 10,000 parts: parts grow beyond PART_BYTES to keep an object within this many.
MAX_PARTS = 9_000

_writers: dict = {}
_writers_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _writers_lock
    _writers.clear()
    _writers_lock = threading.Lock()


after_fork_in_child(_after_fork_in_child)


class Destination:
    """A location (``Location``) objects are written to: ``put_file``, ``put_bytes``,
    ``copy``, ``delete``, ``names`` (listing) and ``abort_uploads``. Safe to use from several
    threads; the client is made in the process that uses it. A plain HTTP(S) URL cannot be
    written to (ValueError); local paths are not destinations (callers write them as files).
    """

    def __init__(self, location: Location) -> None:
        if location.is_local:
            raise ValueError(f"{location.url}: a local path, written as files, not uploaded")
        if location.scheme in ("http", "https"):
            raise ValueError(
                f"{location.url}: an HTTP(S) URL can be read but not written; write to "
                "s3://, gs://, az:// or a local path"
            )
        self.location = location
        self.settings = location.settings
        # Upload attempts that failed in this process (each followed by an abort of what
        # it may have left open, which can fail too): a final sweep is due when not 0.
        self.failed_uploads = 0

    def __reduce__(self):
        return (Destination, (self.location,))  # a fresh count of failed uploads

    def url(self, name: str) -> str:
        return self.location.object(name).url

    def _writer(self):
        # One per process, store and options: the writers take whole keys, never a prefix.
        options = self.location.storage_options  # the engine's and the retries' settings
        key = (os.getpid(), self.location.scheme, self.location.container, repr(options))
        with _writers_lock:
            writer = _writers.get(key)
        if writer is None:
            from ._url import OBSTORE_SCHEMES

            kind = OBSTORE_SCHEMES.get(self.location.scheme)
            if kind is not None:
                writer = _ObstoreWriter(kind, self.location, self.settings)
            else:
                writer = _FsspecWriter(self.location)
            with _writers_lock:
                writer = _writers.setdefault(key, writer)
        return writer

    def key(self, name: str) -> str:
        """The object key (or fsspec URL) of ``name`` under this location ("": the
        location's own prefix)."""
        location = self.location
        name = name.strip("/")
        if location.scheme not in _obstore_schemes():
            return location.object(name).url if name else location.url
        if not name:
            return location.prefix
        return f"{location.prefix}/{name}" if location.prefix else name

    # -- writing -------------------------------------------------------------------------------

    def put_file(self, name: str, path) -> None:
        """Upload the local file ``path`` as the object ``name`` (multipart when large)."""
        path = Path(path)
        writer = self._writer()
        self._retrying(name, lambda: writer.put_file(self.key(name), path), upload=True)

    def put_bytes(self, name: str, data: bytes) -> None:
        """Write ``data`` as the object ``name`` (one request)."""
        writer = self._writer()
        self._retrying(name, lambda: writer.put_bytes(self.key(name), bytes(data)))

    def copy(self, source: str, target: str) -> None:
        """Copy the object ``source`` to ``target`` within the store (no data through here)."""
        writer = self._writer()
        self._retrying(target, lambda: writer.copy(self.key(source), self.key(target)))

    def delete(self, names) -> None:
        """Delete the objects ``names`` (missing ones are no error)."""
        names = list(names)
        if not names:
            return
        writer = self._writer()
        keys = [self.key(n) for n in names]
        self._retrying(names[0], lambda: writer.delete(keys))

    def names(self, under: str = "", limit: int | None = None) -> list:
        """The names of the objects under ``under`` (a folder of this location, "" for all
        of it), relative to this location; at most ``limit`` of them."""
        writer = self._writer()
        top = self.key(under)
        found = self._retrying(under or "", lambda: writer.names(top, limit), what="listed")
        base = self.key("")
        return [k[len(base) + 1 :] if base else k for k in found]

    def total_bytes(self, under: str = "") -> int:
        """The bytes of the objects under ``under`` (a folder of this location, "" for all)."""
        writer = self._writer()
        top = self.key(under)
        return self._retrying(under or "", lambda: writer.total_bytes(top), what="listed")

    def abort_uploads(self, under: str = "", exact: bool = False) -> int:
        """Abort the multipart uploads left open under ``under`` (``exact``: of that one
        object); how many. Only S3 lists them: elsewhere a no-op returning 0 (GCS and Azure
        drop uncommitted parts themselves, or by a lifecycle rule)."""
        writer = self._writer()
        key = self.key(under)
        return self._retrying(
            under or "", lambda: writer.abort_uploads(key, exact), what="cleaned up"
        )

    # -- retrying ------------------------------------------------------------------------------

    def _retrying(self, name: str, call, *, upload: bool = False, what: str = "written"):
        settings = self.settings
        deadline = time.monotonic() + settings.deadline
        delay = 0.05
        attempts = 0
        url = self.url(name) if name else self.location.url
        writer = self._writer()
        while True:
            attempts += 1
            try:
                return call()
            except Exception as exc:
                failure = writer.sort(exc)
            if upload:
                self.failed_uploads += 1
                try:  # a multipart upload the failed attempt left open
                    writer.abort_uploads(self.key(name), True)
                except Exception:
                    pass  # swept again when the dataset is committed or abandoned
            if isinstance(failure, NotFound):
                if failure.code == "NoSuchBucket" or upload or what == "written":
                    raise ObjectNotFoundError(
                        f"{url}: could not be {what}: the bucket "
                        f"{self.location.container!r} does not exist ({failure.detail})",
                        url,
                        None,
                        None,
                        attempts,
                    ) from None
                raise ObjectNotFoundError(
                    f"{url}: no such object", url, None, None, attempts
                ) from None
            if isinstance(failure, Denied):
                raise StorageError(
                    f"{url}: could not be {what}: access denied: check the credentials "
                    "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or storage_options) and the "
                    f"permissions: {failure.detail}",
                    url,
                    None,
                    None,
                    attempts,
                ) from None
            if not isinstance(failure, Transient):
                raise StorageError(
                    f"{url}: could not be {what}: {failure.detail}", url, None, None, attempts
                ) from None
            pause = delay * (0.5 + random.random())
            if attempts >= settings.max_attempts or time.monotonic() + pause > deadline:
                raise StorageError(
                    f"{url}: could not be {what}: failed after {attempts} attempts "
                    f"({failure.detail})",
                    url,
                    None,
                    None,
                    attempts,
                ) from None
            time.sleep(pause)
            delay = min(delay * 2, 5.0)


def _obstore_schemes():
    from ._url import OBSTORE_SCHEMES

    return OBSTORE_SCHEMES


class _ObstoreWriter:
    """Writes through obstore, with its own request retries on (each part of a multipart
    upload is retried alone, not the whole object)."""

    def __init__(self, kind: str, location: Location, settings) -> None:
        from ._engines import ObstoreEngine, _mark_obstore_started

        _mark_obstore_started()  # this process's forked children must not use obstore
        self.kind = kind
        self.location = location
        second = datetime.timedelta
        retry = {
            "max_retries": max(0, settings.max_attempts - 1),
            "retry_timeout": second(seconds=settings.deadline),
            "backoff": {
                "init_backoff": second(seconds=0.05),
                "max_backoff": second(seconds=5),
                "base": 2.0,
            },
        }
        # Each request retried by obstore (a failed part of a multipart upload alone, not
        # the whole object); the reading engine's store has retries off.
        engine = ObstoreEngine(
            kind, location.scheme, location.container, location._engine_options, retry
        )
        self._engine = engine
        self._obstore = engine._obstore
        self.store = engine.store
        self.requests = settings.requests_in_flight
        self._boto = None

    def sort(self, exc: Exception):
        if isinstance(exc, (Transient, Denied, NotFound, Changed, Fatal)):
            return exc
        return self._engine._sort(exc)

    def put_file(self, key: str, path: Path) -> None:
        size = path.stat().st_size
        part = max(PART_BYTES, -(-size // MAX_PARTS))
        self._obstore.put(
            self.store,
            key,
            path,
            use_multipart=size > part,
            chunk_size=part,
            max_concurrency=self.requests,
        )

    def put_bytes(self, key: str, data: bytes) -> None:
        self._obstore.put(self.store, key, data, use_multipart=False)

    def copy(self, source: str, target: str) -> None:
        self._obstore.copy(self.store, source, target)

    def delete(self, keys: list) -> None:
        self._obstore.delete(self.store, keys)

    def names(self, prefix: str, limit) -> list:
        """The keys under the folder ``prefix`` (all of the bucket for "")."""
        out = []
        for chunk in self._obstore.list(self.store, prefix or None, chunk_size=limit or 1000):
            for meta in chunk:
                out.append(meta["path"])
                if limit is not None and len(out) >= limit:
                    return out
        return out

    def total_bytes(self, prefix: str) -> int:
        total = 0
        for chunk in self._obstore.list(self.store, prefix or None, chunk_size=1000):
            total += sum(meta["size"] for meta in chunk)
        return total

    def abort_uploads(self, prefix: str, exact: bool) -> int:
        """Abort the open multipart uploads of the key ``prefix`` (``exact``) or under the
        folder ``prefix``."""
        if self.kind != "s3":
            return 0
        client = self._boto_client()
        if not exact and prefix:
            prefix += "/"
        bucket = self.location.container
        aborted = 0
        marker: dict = {}
        while True:
            answer = client.list_multipart_uploads(Bucket=bucket, Prefix=prefix, **marker)
            for upload in answer.get("Uploads", ()):
                if exact and upload["Key"] != prefix:
                    continue
                client.abort_multipart_upload(
                    Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                )
                aborted += 1
            if not answer.get("IsTruncated"):
                return aborted
            marker = {
                "KeyMarker": answer["NextKeyMarker"],
                "UploadIdMarker": answer["NextUploadIdMarker"],
            }

    def _boto_client(self):
        if self._boto is None:
            from ._engines import BotoEngine

            self._boto = BotoEngine(self.location.container, self.location._engine_options).client
        return self._boto


class _FsspecWriter:
    """Writes through an fsspec filesystem (the schemes obstore lacks), one request per
    object as the filesystem does it; it has no multipart uploads to abort."""

    def __init__(self, location: Location) -> None:
        from ._engines import FsspecEngine

        self._engine = FsspecEngine(location.scheme, location._engine_options)
        self.fs = self._engine.fs

    def sort(self, exc: Exception):
        if isinstance(exc, (Transient, Denied, NotFound, Changed, Fatal)):
            return exc
        if isinstance(exc, FileNotFoundError):
            return NotFound(_shorten(exc))
        if isinstance(exc, PermissionError):
            return Denied(_shorten(exc))
        if isinstance(exc, (TypeError, ValueError, NotImplementedError)):
            return Fatal(_shorten(exc))
        return Transient(_shorten(f"{type(exc).__name__}: {exc}"))

    def put_file(self, key: str, path: Path) -> None:
        self.fs.put_file(os.fspath(path), key)

    def put_bytes(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(key, data)

    def copy(self, source: str, target: str) -> None:
        self.fs.copy(source, target)

    def delete(self, keys: list) -> None:
        for key in keys:
            try:
                self.fs.rm_file(key)
            except FileNotFoundError:
                pass

    def names(self, top: str, limit) -> list:
        """The URLs under the folder URL ``top``."""
        scheme, _, root = top.partition("://")
        try:
            found = self.fs.find(top)
        except FileNotFoundError:
            return []
        out = []
        for path in sorted(found):
            path = path.split("://", 1)[-1]
            if path.startswith(root.rstrip("/") + "/"):
                out.append(f"{scheme}://{path}")
        return out[:limit] if limit is not None else out

    def total_bytes(self, top: str) -> int:
        try:
            return int(self.fs.du(top))
        except FileNotFoundError:
            return 0

    def abort_uploads(self, under: str, exact: bool) -> int:
        return 0
