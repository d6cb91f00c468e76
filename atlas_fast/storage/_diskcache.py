"""The optional local disk cache of fetched blocks (``cache_dir=``), shared by the processes of
one node (DataLoader workers, ranks) through file locks, under a hard byte limit.

Layout under the cache folder (nothing else in it is ever touched, let alone deleted)::

    index.sqlite     the index: entries (file, bytes, CRC-32, last use) and reservations
    blocks/          one file per cached block: <object key>-<start>-<end>, and the temporary
                     files being written, <owner>.<n>.tmp
    owners/          one file per live process using the cache, locked (flock) while it lives

Invariants
----------
- **The limit.** The bytes of the entries plus the bytes reserved never exceed the limit
  (checked in the same write transaction that reserves), and every file in ``blocks/`` is
  either an entry or covered by a reservation: space is reserved before a fetch, the fetched
  blocks written to temporary files, then published in one transaction (renamed into place
  and entered, the reservation dropped). Evicted files (least recently used first) are
  unlinked inside the transaction that makes the room, before it commits. So the bytes on disk
  never exceed the limit, whatever the processes do or whenever one is killed.
- **Write-then-rename.** A block file is complete when it appears under its name; a reader
  checks its length and CRC-32 against the index and treats a mismatch as a miss (and drops
  the entry), so a damaged file is never served.
- **Locks that die with their holder.** The index is SQLite (its locks are ``fcntl`` locks, its
  journal rolled back by the next user after a crash); each process holds an ``flock`` on its
  own file in ``owners/``. A reservation whose owner's lock can be taken belongs to a dead
  process: the next process short of room (or opening the cache) drops it with the owner's
  temporary files and any block file a crashed transaction renamed but never entered. No
  named shared memory: nothing outlives the processes but files in the cache folder.
- **Versions.** A block file is named by its object's URL, its version (ETag, or size when the
  store gives none) and its byte range. Before serving an object's blocks from the cache, a
  process pins the object (one 1-byte request, unless it has read from it already), so a
  replaced dataset is never served from the old version's blocks.
- **fork.** A forked child makes its own connection and owner file on first use (a SQLite
  connection must not cross a fork; the parent's objects are left untouched).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sqlite3
import threading
import time
import zlib

from .._fork import after_fork_in_child

try:
    import fcntl
except ImportError:  # Windows: no flock; the cache is refused there
    fcntl = None

__all__ = ["DiskCache", "window_bytes"]

_INDEX = "index.sqlite"
_BLOCKS = "blocks"
_OWNERS = "owners"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    name TEXT PRIMARY KEY, object TEXT NOT NULL, size INTEGER NOT NULL,
    crc INTEGER NOT NULL, used INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS entries_used ON entries(used);
CREATE INDEX IF NOT EXISTS entries_object ON entries(object);
CREATE TABLE IF NOT EXISTS reservations (
    id INTEGER PRIMARY KEY, owner TEXT NOT NULL, bytes INTEGER NOT NULL);
"""


def window_bytes(settings) -> int:
    """The least a disk cache must hold: one read-ahead window (``read_ahead_bytes``), and at
    least one request (``request_bytes``)."""
    return max(settings.read_ahead_bytes, settings.request_bytes)


def _key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class _Process:
    """This process's side of one cache folder: its connection, its owner file (locked while
    it lives) and the lock serialising its threads' use of the connection."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.blocks = os.path.join(root, _BLOCKS)
        self.owners = os.path.join(root, _OWNERS)
        self.lock = threading.Lock()
        self.pins: dict = {}  # object key -> the lock of its pinning (see DiskCache.read)
        self.owner = f"{os.getpid()}-{secrets.token_hex(6)}"
        self.seq = 0
        # The owner file is locked under a temporary name, then renamed: another process
        # never sees it unlocked (and so never takes this live process for a dead one).
        pending = os.path.join(self.owners, f".{self.owner}.new")
        self.owner_fd = os.open(pending, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(self.owner_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.replace(pending, os.path.join(self.owners, self.owner))
        self.db = sqlite3.connect(
            os.path.join(root, _INDEX), timeout=120, isolation_level=None, check_same_thread=False
        )
        self.db.execute("PRAGMA synchronous=OFF")  # a cache: a crash loses nothing needed
        with self.lock:
            self._begin()
            try:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        self.db.execute(statement)
                self._reclaim_dead()
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise

    def pinning(self, object_key: str) -> threading.Lock:
        """The lock held while an object's version is pinned in this process."""
        with self.lock:
            return self.pins.setdefault(object_key, threading.Lock())

    def _begin(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")  # the write lock now: no upgrade deadlock later

    # -- dead owners -----------------------------------------------------------------------

    def _alive(self, owner: str) -> bool:
        """Whether ``owner``'s process lives (its owner file is locked). A dead owner's file
        is removed (its lock taken first, so it is never a live one's)."""
        if owner == self.owner:
            return True
        path = os.path.join(self.owners, owner)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return True
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        os.close(fd)
        return False

    def _reclaim_dead(self) -> None:
        """(In a write transaction.) Drop the reservations of dead owners, their temporary
        files, and block files that no entry names (renamed by a transaction that never
        committed). Only names this cache makes are ever removed."""
        owners = {row[0] for row in self.db.execute("SELECT DISTINCT owner FROM reservations")}
        dead = {o for o in owners if not self._alive(o)}
        for owner in dead:
            self.db.execute("DELETE FROM reservations WHERE owner = ?", (owner,))
        try:
            names = os.listdir(self.blocks)
        except FileNotFoundError:
            return
        temps = [n for n in names if n.endswith(".tmp") and n.count(".") == 2]
        lost_owners = {n.split(".", 1)[0] for n in temps} - owners - {self.owner}
        dead |= {o for o in lost_owners if not self._alive(o)}
        for name in temps:
            if name.split(".", 1)[0] in dead:
                _unlink(os.path.join(self.blocks, name))
        if dead:  # a dead owner may have renamed files whose entries its crash rolled back
            entered = {row[0] for row in self.db.execute("SELECT name FROM entries")}
            for name in names:
                if _is_block_name(name) and name not in entered:
                    _unlink(os.path.join(self.blocks, name))
        # Owner files of dead processes that held no reservation, and those of processes
        # killed while making theirs (unlocked, and old: never one being made now)
        for owner in os.listdir(self.owners):
            if not owner.startswith("."):
                if owner not in owners and owner != self.owner:
                    self._alive(owner)
            elif owner.endswith(".new") and owner != f".{self.owner}.new":
                path = os.path.join(self.owners, owner)
                try:
                    if time.time() - os.stat(path).st_mtime > 300:
                        self._alive(owner)
                except FileNotFoundError:
                    pass

    # -- reservations ----------------------------------------------------------------------

    def reserve(self, n: int, limit: int):
        """Reserve ``n`` bytes, evicting least recently used entries if needed; the
        reservation's id, or None when the room cannot be made (the rest is reserved)."""
        if n > limit:
            return None
        with self.lock:
            self._begin()
            try:
                token = self._reserve_in_transaction(n, limit)
                self.db.execute("COMMIT")
                return token
            except BaseException:
                self.db.execute("ROLLBACK")
                raise

    def _totals(self) -> tuple:
        used = self.db.execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()[0]
        held = self.db.execute("SELECT COALESCE(SUM(bytes), 0) FROM reservations").fetchone()[0]
        return used, held

    def _reserve_in_transaction(self, n: int, limit: int):
        used, held = self._totals()
        if used + held + n > limit and held + n > limit:
            self._reclaim_dead()  # only a dead owner's reservation can free that
            used, held = self._totals()
        excess = used + held + n - limit
        if excess > 0:
            if held + n > limit:
                return None
            victims = []
            freed = 0
            rows = self.db.execute("SELECT name, size FROM entries ORDER BY used").fetchmany
            while freed < excess:
                page = rows(256)
                if not page:
                    break
                for name, size in page:
                    victims.append(name)
                    freed += size
                    if freed >= excess:
                        break
            for name in victims:  # unlinked before the commit: never more on disk than counted
                _unlink(os.path.join(self.blocks, name))
                self.db.execute("DELETE FROM entries WHERE name = ?", (name,))
        cursor = self.db.execute(
            "INSERT INTO reservations (owner, bytes) VALUES (?, ?)", (self.owner, n)
        )
        return cursor.lastrowid

    def release(self, token) -> None:
        with self.lock:
            self.db.execute("DELETE FROM reservations WHERE id = ?", (token,))

    def publish(self, token, items: list, object_key: str) -> None:
        """Write ``items`` (``(name, bytes)``) as block files within reservation ``token``,
        then enter them and drop the reservation in one transaction."""
        temps = []
        try:
            for _name, data in items:
                with self.lock:
                    self.seq += 1
                    temp = os.path.join(self.blocks, f"{self.owner}.{self.seq}.tmp")
                temps.append(temp)
                with open(temp, "wb") as f:
                    f.write(data)
        except OSError:  # a full or failing disk: nothing is cached, nothing left behind
            for temp in temps:
                _unlink(temp)
            self.release(token)
            return
        now = time.time_ns()
        renamed = []  # files this transaction put in place: removed again if it fails
        with self.lock:
            self._begin()
            try:
                for (name, data), temp in zip(items, temps):
                    row = self.db.execute("SELECT 1 FROM entries WHERE name = ?", (name,))
                    if row.fetchone() is not None:
                        _unlink(temp)
                        continue
                    final = os.path.join(self.blocks, name)
                    os.replace(temp, final)
                    renamed.append(final)
                    self.db.execute(
                        "INSERT INTO entries (name, object, size, crc, used) "
                        "VALUES (?, ?, ?, ?, ?)",
                        (name, object_key, len(data), zlib.crc32(data), now),
                    )
                self.db.execute("DELETE FROM reservations WHERE id = ?", (token,))
                self.db.execute("COMMIT")
            except BaseException:
                for path in [*renamed, *temps]:
                    _unlink(path)
                self.db.execute("ROLLBACK")
                raise

    # -- lookups ---------------------------------------------------------------------------

    def has_object(self, object_key: str) -> bool:
        with self.lock:
            row = self.db.execute(
                "SELECT 1 FROM entries WHERE object = ? LIMIT 1", (object_key,)
            ).fetchone()
        return row is not None

    def lookup(self, names: list) -> dict:
        """``{name: bytes}`` of the entries among ``names`` whose files read whole and intact;
        their last use is now. A damaged or vanished file is a miss (a damaged one's entry
        is dropped)."""
        with self.lock:
            rows = []
            for k in range(0, len(names), 500):
                part = names[k : k + 500]
                marks = ",".join("?" * len(part))
                rows += self.db.execute(
                    f"SELECT name, size, crc FROM entries WHERE name IN ({marks})", part
                ).fetchall()
        found = {}
        damaged = []
        for name, size, crc in rows:
            try:
                with open(os.path.join(self.blocks, name), "rb") as f:
                    data = f.read(size + 1)
            except OSError:  # evicted since the lookup (or unreadable): a miss
                continue
            if len(data) != size or zlib.crc32(data) != crc:
                damaged.append((name, crc))
                continue
            found[name] = data
        if found or damaged:
            now = time.time_ns()
            with self.lock:
                self._begin()
                try:
                    self.db.executemany(
                        "UPDATE entries SET used = ? WHERE name = ?", [(now, n) for n in found]
                    )
                    for name, crc in damaged:
                        gone = self.db.execute(
                            "DELETE FROM entries WHERE name = ? AND crc = ?", (name, crc)
                        )
                        if gone.rowcount:
                            _unlink(os.path.join(self.blocks, name))
                    self.db.execute("COMMIT")
                except BaseException:
                    self.db.execute("ROLLBACK")
                    raise
        return found

    def usage(self) -> tuple:
        """``(bytes in entries, bytes reserved, entries)``."""
        with self.lock:
            used, held = self._totals()
            count = self.db.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
        return used, held, count


def _is_block_name(name: str) -> bool:
    key, sep, rest = name.partition("-")
    start, sep2, end = rest.partition("-")
    return (
        len(key) == 32
        and bool(sep and sep2)
        and all(c in "0123456789abcdef" for c in key)
        and start.isdigit()
        and end.isdigit()
    )


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# -- the per-process registry -----------------------------------------------------------------

_processes: dict = {}
_registry_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _registry_lock
    _registry_lock = threading.Lock()
    for state in _processes.values():
        try:
            os.close(state.owner_fd)  # the parent's lock stays the parent's
        except OSError:
            pass
        _abandoned.append(state)  # its connection must not be used nor closed here
    _processes.clear()


_abandoned: list = []
after_fork_in_child(_after_fork_in_child)


def _before_fork() -> None:
    """Hold every connection's lock across ``fork``: no thread of this process is inside
    SQLite when the child is made (its library state is then consistent in the child)."""
    _registry_lock.acquire()
    for state in list(_processes.values()):
        state.lock.acquire()


def _after_fork_in_parent() -> None:
    for state in list(_processes.values()):
        state.lock.release()
    _registry_lock.release()


if hasattr(os, "register_at_fork"):
    # The child side is _after_fork_in_child above (the package's one registry, which runs
    # after this module's before-hook): the child drops these states, locks and all.
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent)


class DiskCache:
    """A cache folder and its byte limit (what pickles); the process's connection is made on
    first use, in each process."""

    def __init__(self, path, limit: int) -> None:
        if fcntl is None:
            raise ValueError("cache_dir needs flock, which this platform lacks")
        self.path = os.path.abspath(os.fspath(path))
        self.limit = int(limit)
        for sub in ("", _BLOCKS, _OWNERS):
            os.makedirs(os.path.join(self.path, sub), exist_ok=True)
        try:
            self._process()  # now: a folder that cannot be a cache is an error at open
        except sqlite3.Error as exc:
            raise ValueError(
                f"{os.path.join(self.path, _INDEX)}: not a usable disk cache index ({exc}): "
                "remove it or choose another cache_dir"
            ) from exc

    def __reduce__(self):
        return (DiskCache, (self.path, self.limit))

    def __repr__(self) -> str:
        return f"DiskCache({self.path!r}, limit={self.limit})"

    def _process(self) -> _Process:
        state = _processes.get(self.path)
        if state is None:
            with _registry_lock:
                state = _processes.get(self.path)
                if state is None:
                    state = _processes[self.path] = _Process(self.path)
        return state

    def usage(self) -> tuple:
        """``(bytes in entries, bytes reserved, entries)`` across every process."""
        return self._process().usage()

    # -- the hook ---------------------------------------------------------------------------

    def read(self, obj, offsets, blocks: list, shard=None) -> bytes:
        """The stored bytes of ``blocks`` (consecutive) of ``obj``: those cached from disk,
        the others fetched (consecutive ones in one request) and cached when room can be
        reserved for them. The cache failing (a full disk, an index locked for minutes) makes
        a read uncached, never a failed one."""
        state = self._process()
        object_key = _key(obj.url)
        parts = {}
        if obj.size is not None or _safely(state.has_object, object_key, default=False):
            if obj.size is None:
                with state.pinning(object_key):  # one request, however many threads ask
                    if obj.size is None:  # pin the version before trusting the disk
                        obj.read_range(0, 1, shard=shard)
            names = self._names(obj, offsets, blocks)
            hits = _safely(state.lookup, list(names.values()), default={})
            parts = {b: hits[names[b]] for b in blocks if names[b] in hits}
        runs = []
        for b in blocks:
            if b in parts:
                continue
            if runs and runs[-1][-1] == b - 1:
                runs[-1].append(b)
            else:
                runs.append([b])
        if runs:
            wanted = sum(offsets[r[-1] + 1] - offsets[r[0]] for r in runs)
            token = _safely(state.reserve, wanted, self.limit, default=None)
            try:
                fetched = []
                for run in runs:
                    start = offsets[run[0]]
                    data = memoryview(
                        obj.read_range(start, offsets[run[-1] + 1], shard=shard, block=run[0])
                    )
                    for b in run:
                        parts[b] = piece = bytes(data[offsets[b] - start : offsets[b + 1] - start])
                        fetched.append((b, piece))
            except BaseException:
                if token is not None:
                    _safely(state.release, token, default=None)
                raise
            if token is not None:
                names = self._names(obj, offsets, [b for b, _ in fetched])
                items = [(names[b], d) for b, d in fetched]
                if _safely(state.publish, token, items, object_key, default=False) is False:
                    _safely(state.release, token, default=None)
        if len(blocks) == 1:
            return parts[blocks[0]]
        return b"".join(parts[b] for b in blocks)

    @staticmethod
    def _names(obj, offsets, blocks) -> dict:
        """Block -> its file's name: the object's URL and pinned version, and its range."""
        version = _key(f"{obj.url}\0{obj.etag or ''}\0{obj.size}")
        return {b: f"{version}-{offsets[b]}-{offsets[b + 1]}" for b in blocks}


def _safely(fn, *args, default):
    """``fn(*args)``, or ``default`` when the cache itself fails (its index or its folder)."""
    try:
        return fn(*args)
    except (sqlite3.Error, OSError):
        return default
