"""Atlas datasets written to object storage: shards staged on local disk, uploaded, committed.

Every writer writes a shard as files into a local staging directory, exactly as it would
write it in place; those files are then uploaded (``atlas_fast.storage._upload``: large ones
as multipart uploads, their parts in parallel) and removed locally. So the objects in the
store are byte for byte the files a local write makes. The dataset's root meta.json is put
last, once every shard is stored under its final name: a store holding no root meta.json is
no dataset (readers say it is incomplete), whatever happened before.

``ShardUploads`` is the dataset writer's: shards go up on threads of their own while the next
is written, the finished shards waiting on local disk held under ``staging_bytes``.
``upload_dataset`` puts a dataset finished on local disk (``convert``). ``commit_uploaded``
turns shards uploaded under staging names (Ray Data's tasks) into the dataset.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .._errors import destination_exists
from .._format import DICT_FILE, INDEX_FILE, META_FILE, meta_text
from ..storage import Location, is_url
from ..storage._upload import Destination

__all__ = [
    "DEFAULT_STAGING_BYTES",
    "STAGING_PREFIX",
    "ShardUploads",
    "commit_uploaded",
    "is_remote",
    "open_destination",
    "remove_objects",
    "shard_names",
    "staging_left",
    "upload_dataset",
    "upload_shard",
]

# Finished shards waiting on local disk for their upload hold at most this many bytes (one
# shard larger than that waits alone); the shards being written add their own.
DEFAULT_STAGING_BYTES = 2 << 30
# The staging area of a Ray Data write (AtlasDatasink): a folder (or prefix) of the dataset's
# root named ``STAGING_PREFIX + <job>``, gone once the job has committed or failed.
STAGING_PREFIX = ".atlas-staging-"
# Shards uploaded at once (each a multipart upload of parallel parts): the next shard's upload
# starts while the last parts of one are in flight.
UPLOAD_THREADS = 2


def is_remote(path) -> bool:
    """Whether ``path`` is written through object storage: a URL, not ``file://``."""
    return isinstance(path, str) and is_url(path) and path[:7].lower() != "file://"


def shard_names(count: int) -> list:
    """The folder names of ``count`` shards: numbers zero-padded to the width of the last."""
    width = len(str(count - 1)) if count else 1
    return [str(k).zfill(width) for k in range(count)]


def staging_left(name: str, what_to_do: str) -> str:
    """The state a destination holding ``name``, the staging area of a failed Ray Data write,
    is refused in (for destination_exists), with ``what_to_do`` once its tasks stopped."""
    return (
        f" and holds {name}, left by a failed Ray Data write whose tasks may still be running "
        f"(once they have stopped, {what_to_do})"
    )


def open_destination(url, storage_options, *, overwrite: bool, who: str) -> Destination:
    """The destination of a new dataset at ``url``: refused (``FileExistsError``, worded as
    for a local path) when objects are there already, unless ``overwrite``, which deletes
    them (the root meta.json first, so what is there never reads as a dataset meanwhile)."""
    dest = Destination(Location(url, storage_options))
    found = dest.names(limit=1)
    if found:
        if not overwrite:
            how = "overwrite=True" + (
                ", or --overwrite," if who in ("convert", "export", "tokenize") else ""
            )
            state = f" and holds objects (pass {how} to replace them)"
            if found[0].startswith(STAGING_PREFIX):  # listed first: "." sorts before digits
                state = staging_left(found[0], f"pass {how} to replace it")
            raise destination_exists(dest.location.url, who, state=state)
        dest.delete([META_FILE])
        remove_objects(dest, dest.names())
    return dest


def remove_objects(dest: Destination, names) -> None:
    """Delete ``names`` (in batches: S3 deletes up to 1000 objects per request)."""
    names = list(names)
    for start in range(0, len(names), 1000):
        dest.delete(names[start : start + 1000])


def _shard_files(local_dir: Path) -> list:
    """The files of a shard directory, its meta.json last (temporary files left out)."""
    files = sorted(
        (p for p in local_dir.iterdir() if p.is_file() and not p.name.startswith(".")),
        key=lambda p: (p.name == META_FILE, p.name),
    )
    return files


def upload_shard(dest: Destination, local_dir: Path, name: str) -> list:
    """Upload the files of the shard directory ``local_dir`` as ``name/...``, all at once
    (a round trip for the small ones while data.bin's parts go up); their names."""
    files = _shard_files(Path(local_dir))
    targets = [f"{name}/{path.name}" for path in files]
    if len(files) == 1:
        dest.put_file(targets[0], files[0])
        return targets
    with ThreadPoolExecutor(len(files), thread_name_prefix="atlas-fast-upload-file") as pool:
        futures = [pool.submit(dest.put_file, t, p) for t, p in zip(targets, files)]
        for future in futures:
            future.result()
    return targets


def _put_root(dest: Destination, fields: dict, dict_bytes, *, sweep: bool = True) -> None:
    """The root's files: the shared dictionary (unless None), then (last of all) meta.json.
    Multipart uploads left open under the dataset (by a failed attempt whose abort failed)
    are aborted first: ``sweep``, or when an upload of this process failed."""
    if dict_bytes is not None:
        dest.put_bytes(DICT_FILE, dict_bytes)
    if sweep or dest.failed_uploads:
        dest.abort_uploads()
    dest.put_bytes(META_FILE, meta_text(fields).encode())


class ShardUploads:
    """The shards of one dataset writer going up to ``dest`` while the next are written.

    ``local`` is a new staging directory (under ``staging_dir``, default the system's
    temporary directory) in which the writer writes the dataset as it would in place.
    ``add(number, started)`` uploads finished shard ``number`` (``started``: shards begun
    so far, which sets the width of its name, or ``expected`` when more) and removes it
    locally once stored; it waits while the shards not yet stored hold more than
    ``staging_bytes``. ``put`` uploads a shard named by the caller, who bounds what waits.
    ``commit`` waits for them all, gives them their final names and puts the root's files,
    meta.json last (``seal``, then ``put_meta``).
    ``abandon`` stops: nothing more is uploaded, what was uploaded is deleted, the uploads
    left open are aborted and the staging directory is removed.
    """

    def __init__(
        self, dest: Destination, *, staging_dir=None, staging_bytes=None, on_stored=None
    ) -> None:
        self.dest = dest
        self.on_stored = on_stored  # called with a shard's bytes once it has left local disk
        self.limit = DEFAULT_STAGING_BYTES if staging_bytes is None else int(staging_bytes)
        if staging_dir is not None:
            Path(staging_dir).mkdir(parents=True, exist_ok=True)
        self._top = Path(tempfile.mkdtemp(prefix="atlas-fast-upload-", dir=staging_dir))
        self.local = self._top / "dataset"
        self._pool = ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="atlas-fast-upload")
        self._lock = threading.Condition()
        self._held = 0  # bytes of shards handed over and not yet stored (under _lock)
        self._futures: list = []  # (number, future) in the order handed over
        self.names: dict = {}  # shard number -> name it is stored under
        self.objects: list = []  # every object stored so far (under _lock)
        self._shared = None  # the upload of the shared dictionary (strategy 2), once begun
        self._error = None
        # The shard count the dataset is expected to reach (the writer's expected_examples):
        # names take its width from the start.
        self.expected = 0
        # With keep_offsets, each shard's block offsets (its index.npy) by number, read
        # before it goes up: what the token index of the dataset is made from.
        self.keep_offsets = False
        self.offsets: dict = {}
        self.grown = None  # an append's grow_remote.RemoteGrowth (the dataset grown)

    def add(self, number: int, started: int) -> None:
        """Upload finished shard ``number`` (see the class)."""
        self.check()
        local_dir = self.local / str(number)
        size = sum(p.stat().st_size for p in local_dir.iterdir() if p.is_file())
        if self.keep_offsets:
            self.offsets[number] = np.load(local_dir / INDEX_FILE)
        name = str(number).zfill(len(str(max(started, number + 1, self.expected) - 1)))
        with self._lock:
            while self._held and self._held + size > self.limit and self._error is None:
                self._lock.wait()
        self.put(local_dir, number, name, size)
        shared = self.local / DICT_FILE
        if self._shared is None and shared.is_file():  # strategy 2: known after shard 0
            self._shared = self._pool.submit(self._put_shared, shared)

    def put(self, local_dir: Path, number: int, name: str, size: int) -> None:
        """Upload the finished shard ``local_dir`` (``size`` bytes), shard ``number`` of the
        dataset, as ``name`` (its number zero-padded to the width known so far; ``commit``
        renames it if the final count is wider), at once: the caller bounds what waits."""
        self.check()
        with self._lock:
            self._held += size
        self.names[number] = name
        future = self._pool.submit(self._upload, local_dir, name, size)
        self._futures.append((number, future))

    def _put_shared(self, path: Path) -> None:
        try:
            self.dest.put_file(DICT_FILE, path)
            with self._lock:
                self.objects.append(DICT_FILE)
        except BaseException as exc:
            with self._lock:
                if self._error is None:
                    self._error = exc
            raise

    def _upload(self, local_dir: Path, name: str, size: int) -> None:
        try:
            stored = upload_shard(self.dest, local_dir, name)
            with self._lock:
                self.objects += stored
            shutil.rmtree(local_dir, ignore_errors=True)
        except BaseException as exc:
            with self._lock:
                if self._error is None:
                    self._error = exc
            raise
        finally:
            with self._lock:
                self._held -= size
                self._lock.notify_all()
            if self.on_stored is not None:
                self.on_stored(size)

    def check(self) -> None:
        """Raise the first upload's error, if one failed."""
        with self._lock:
            error = self._error
        if error is not None:
            raise error

    def commit(self, fields: dict, dict_file: Path | None, root_files=None) -> None:
        """Wait for every shard, rename those stored under a name of another width, then put
        the shared dictionary (``dict_file``, strategy 2), the other files of the root
        (``root_files``: ``{name: bytes}``, e.g. the token index) and the root meta.json,
        last."""
        self.seal(fields, dict_file)
        for name, data in (root_files or {}).items():
            self.dest.put_bytes(name, data)
            with self._lock:
                self.objects.append(name)
        self.put_meta(fields)
        self.close()

    def seal(self, fields: dict, dict_file: Path | None = None, dict_bytes=None) -> None:
        """``commit`` but for the root meta.json: every shard stored under its final name,
        the shared dictionary (``dict_file`` or ``dict_bytes``) put."""
        for _number, future in self._futures:
            future.result()
        if self._shared is not None:
            self._shared.result()
            dict_file = None  # stored already
        self.check()
        final = shard_names(len(fields["shard_sizes"]))
        moves = [(old, final[n]) for n, old in sorted(self.names.items()) if old != final[n]]
        if moves:
            self._rename(moves)
        if dict_file is not None:
            dict_bytes = dict_file.read_bytes()
        if dict_bytes is not None:
            self.dest.put_bytes(DICT_FILE, dict_bytes)
            with self._lock:
                self.objects.append(DICT_FILE)

    def uploaded(self, count: int) -> list:
        """Wait for every shard, then the first ``count`` of them (in number order) as
        ``(name, [objects])``: what an append commits (``grow_remote``)."""
        for _number, future in self._futures:
            future.result()
        self.check()
        out = []
        for number in sorted(self.names)[:count]:
            prefix = f"{self.names[number]}/"
            out.append((self.names[number], [o for o in self.objects if o.startswith(prefix)]))
        return out

    def put_meta(self, fields: dict) -> None:
        """The root meta.json, the dataset's last object (after ``seal``)."""
        # No sweep unless an upload failed: every upload of this writer completed.
        _put_root(self.dest, fields, None, sweep=False)

    def _rename(self, moves: list) -> None:
        """Shards stored before the count reached a power of ten, copied within the store
        to their names of the final width (no data through here), then the old deleted."""
        renamed = []
        for old, new in moves:
            prefix = f"{old}/"
            for obj in [o for o in self.objects if o.startswith(prefix)]:
                renamed.append((obj, f"{new}/{obj[len(prefix) :]}"))
        with ThreadPoolExecutor(8) as pool:
            for future in [pool.submit(self.dest.copy, a, b) for a, b in renamed]:
                future.result()
        self.objects = [o for o in self.objects if o not in {a for a, _ in renamed}]
        self.objects += [b for _, b in renamed]
        remove_objects(self.dest, [a for a, _ in renamed])

    def abandon(self) -> list:
        """Stop without a dataset (see the class); the errors met, as messages."""
        problems = []
        for _number, future in self._futures:
            future.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        try:
            with self._lock:
                objects = list(self.objects)
            remove_objects(self.dest, objects)
        except Exception as exc:
            problems.append(f"deleting the objects uploaded: {type(exc).__name__}: {exc}")
        try:
            self.dest.abort_uploads()
        except Exception as exc:
            problems.append(f"aborting open multipart uploads: {type(exc).__name__}: {exc}")
        self.close()
        return problems

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        shutil.rmtree(self._top, ignore_errors=True)


def upload_dataset(local_root, dest: Destination, *, threads: int = UPLOAD_THREADS) -> None:
    """Upload the dataset finished at ``local_root`` (shards named as the format names them)
    to ``dest``: its shards, ``threads`` at once, then the root's files, meta.json last. A
    failure deletes what was uploaded, aborts open uploads and raises."""
    import json

    local_root = Path(local_root)
    fields = json.loads((local_root / META_FILE).read_text())
    names = shard_names(len(fields["shard_sizes"]))
    stored: list = []
    lock = threading.Lock()

    def one(name):
        done = upload_shard(dest, local_root / name, name)
        with lock:
            stored.extend(done)

    try:
        with ThreadPoolExecutor(threads, thread_name_prefix="atlas-fast-upload") as pool:
            futures = [pool.submit(one, name) for name in names]
            for future in futures:
                future.result()
        dict_file = local_root / DICT_FILE
        dest_dict = dict_file.read_bytes() if dict_file.is_file() else None
        if dest_dict is not None:
            dest.put_bytes(DICT_FILE, dest_dict)
        for index in sorted(local_root.glob("tokens*.idx")):  # token indexes (convert)
            dest.put_file(index.name, index)
            with lock:
                stored.append(index.name)
        dest.abort_uploads()
        dest.put_file(META_FILE, local_root / META_FILE)
    except BaseException:
        _clean_after_failure(dest, stored)
        raise


def _clean_after_failure(dest: Destination, objects: list) -> None:
    try:
        remove_objects(dest, objects)
        dest.abort_uploads()
    except Exception:
        pass  # the error raised is the upload's; a lifecycle rule sweeps what is left


def commit_uploaded(
    dest: Destination, stored: list, fields: dict, dict_bytes, *, discard: str
) -> None:
    """Turn shards uploaded by Ray Data's tasks into the dataset: ``stored`` lists, in
    dataset order, ``(name, [object names])``. A shard stored under its final name stays;
    any other is copied within the store to its final name (no data through here), in an
    order that copies a shard away before another is copied onto its name, then the objects
    left under no final name are deleted (and all under the folder ``discard``: what failed
    attempts left), then the root's files put, meta.json last."""
    final = shard_names(len(stored))
    kept = set()  # the objects under their final names, once the copies are done
    moves = []  # (shard's name, final name, [(object, its final name)])
    for (old, objects), new in zip(stored, final):
        pairs = [(obj, f"{new}/{obj[len(old) + 1 :]}") for obj in objects]
        kept.update(b for _, b in pairs)
        if old != new:
            moves.append((old, new, pairs))
    with ThreadPoolExecutor(8) as pool:
        while moves:
            sources = {old for old, _, _ in moves}
            ready = [m for m in moves if m[1] not in sources]
            if not ready:  # a cycle of names (never seen): one shard goes aside first
                old, new, pairs = moves[0]
                aside = f"{discard}/aside-{old}"
                sideways = [(a, f"{aside}/{a[len(old) + 1 :]}") for a, _ in pairs]
                _copy_all(pool, dest, sideways)
                moves[0] = (aside, new, [(c, b) for (c, _), (_, b) in zip(sideways, pairs)])
                continue
            _copy_all(pool, dest, [pair for _, _, pairs in ready for pair in pairs])
            moves = [m for m in moves if m not in ready]
    remove_objects(dest, [obj for _, objects in stored for obj in objects if obj not in kept])
    remove_objects(dest, dest.names(discard))
    _put_root(dest, fields, dict_bytes)


def _copy_all(pool, dest: Destination, pairs: list) -> None:
    """Copy each ``(object, new name)`` of ``pairs`` within the store, on ``pool``."""
    for future in [pool.submit(dest.copy, a, b) for a, b in pairs]:
        future.result()
