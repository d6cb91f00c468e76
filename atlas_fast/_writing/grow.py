"""Growing a local dataset in place (append) or making one of others (merge), atomically.

Both readers see a dataset's root as it is when they list it, and the reference takes every
folder of the root for a shard: a new shard folder may not appear in the root before the
new dataset is whole. So the new dataset is built *aside*, in a sibling folder
``.<name>.atlas-grow-<id>`` of the root (same file system: no data copied), and swapped
with the root in one step:

- the old dataset's files are hard-linked into the aside tree (a shard under its final
  name, zero-padded to the new width: a widening renames nothing in the old tree), the new
  shards moved in, the root's other files carried over (``carry_root_files``), the new
  root meta.json written last;
- ``exchange`` swaps the two directories (``renameat2(RENAME_EXCHANGE)`` on Linux,
  ``renamex_np(RENAME_SWAP)`` on macOS): the path holds the old dataset, then the new one,
  never anything else. Elsewhere (``EXCHANGE_IS_ATOMIC`` false) two renames do it, the old
  tree set aside first as ``.<name>.atlas-grow-<id>.old``: between them the path is absent,
  and a kill there is undone by the next ``remove_leftovers`` (the old tree renamed back);
- the aside path then holds the old tree, which is removed (its files live on as links in
  the new one: nothing is copied, nothing the old dataset's readers hold is freed) on a
  thread of its own, ``atlas-fast-old-tree``, so that ``close()`` returns once the grown
  dataset is in place: ``wait_for_removals`` joins those threads, and so does the
  interpreter's exit (a kill before leaves the old tree to ``remove_leftovers``).

The appending process holds an ``flock`` on its aside folder while it builds it and an
``flock`` on the dataset's root folder for the whole append, so a second append to the same
dataset refuses at once, and ``remove_leftovers`` (the next append, ``atlas-fast verify
--repair``) removes only the aside folders whose process is gone. Where there is no
``flock`` (Windows) nothing is locked: one writer at a time.

Root files: ``meta.json`` is the commit, written anew; every other file or hidden folder of
the old root (the shared dictionary, and files other tools keep there, which must check
themselves against the shards they describe) is carried over unchanged.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import shutil
import stat
import sys
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .._errors import AtlasFormatError, DatasetBusyError, InvalidArgumentError
from .._format import (
    DICT_FILE,
    META_FILE,
    AtlasDatasetMetadata,
    CompressionStrategy,
    load_offsets,
    read_dataset_metadata,
    read_dict_file,
    read_shard_metadata,
    shard_dir_names,
)
from .commit import dump_meta_atomic

try:
    import fcntl
except ImportError:  # Windows: nothing is locked
    fcntl = None

__all__ = [
    "EXCHANGE_IS_ATOMIC",
    "GROW_MARK",
    "Aside",
    "ExistingDataset",
    "DatasetBusyError",
    "check_strategy",
    "exchange",
    "final_names",
    "leftovers",
    "link_tree",
    "lock_dataset",
    "open_existing",
    "remove_leftovers",
    "wait_for_removals",
]

# Folders next to a dataset ``<name>`` named ``.<name>` + GROW_MARK + ...`` are an append's
# or a merge's aside tree (or, after the exchange, the old tree being removed).
GROW_MARK = ".atlas-grow-"
_OLD_SUFFIX = ".old"  # the old tree set aside by the two-rename fallback
_UNDO = "undo"  # an in-place append's record of the root files it replaces (_commit_in_place)
_UNDO_RECORD = "record.json"


# -- the existing dataset -------------------------------------------------------------------


@dataclass
class ExistingDataset:
    """A local dataset that can be grown: checked as ``atlas-fast verify`` checks a dataset's
    structure (every file but the blocks' contents, which only a full read checks)."""

    root: Path
    metadata: AtlasDatasetMetadata
    names: list  # its shard folders, in order (shard k is names[k])
    shard_metadatas: list
    dict_bytes: bytes | None  # strategy 2: the shared dictionary
    width: int = field(init=False)

    def __post_init__(self) -> None:
        self.width = len(self.names[0]) if self.names else 1

    @property
    def strategy(self) -> int:
        return self.metadata.compression_strategy

    @property
    def count(self) -> int:
        return len(self.names)


def open_existing(root, who: str, *, check_files: bool = True) -> ExistingDataset:
    """The dataset at ``root``, checked whole: an ``AtlasFormatError`` naming ``root`` and the
    problem when it is not a dataset (or not all of it is here, or a file of it is damaged).
    ``check_files``: also each shard's index.npy (its offsets, the last one data.bin's size)
    and dictionary file (there, not empty), read as a reader reads them on a shard's first
    use; the blocks are not decoded (``atlas-fast verify`` does that).

    Paths are plain strings here: this runs once per shard before every append."""
    root = Path(root)
    prefix = f"{root}: {who} needs a whole, readable Atlas dataset here"
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a directory"
        raise AtlasFormatError(f"{prefix}, but the path {what}")
    try:
        metadata = read_dataset_metadata(root)
        names = shard_dir_names(root)
        count = len(metadata.shard_sizes)
        widths = {len(n) for n in names}
        numbers = [int(n) if n.isascii() and n.isdigit() else -1 for n in names]
        if numbers != list(range(count)) or len(widths) > 1:
            raise AtlasFormatError(
                f"{root}: its shard folders ({_listed(names)}) are not the {count} shards "
                f"its meta.json lists, numbered 0 to {count - 1} at one width"
            )
        dict_bytes = None
        if metadata.compression_strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
            if names or (root / DICT_FILE).exists():
                dict_bytes = read_dict_file(root / DICT_FILE)
        shard_metadatas = []
        top = os.fspath(root)
        for number, name in enumerate(names):
            shard_dir = os.path.join(top, name)
            shard = read_shard_metadata(shard_dir)
            if shard.stored_examples != metadata.shard_sizes[number]:
                raise AtlasFormatError(
                    f"{shard_dir}: stored_examples is {shard.stored_examples} but "
                    f"{root / META_FILE} lists {metadata.shard_sizes[number]} for shard {number}"
                )
            if (
                shard.compression_strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
                and dict_bytes is None
                and shard.stored_examples
            ):
                raise AtlasFormatError(
                    f"{shard_dir}: uses the shared dictionary (compression_strategy 2) but the "
                    f"dataset's compression_strategy is {metadata.compression_strategy}"
                )
            if check_files:
                load_offsets(shard_dir, shard)
                if shard.compression_strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
                    _check_dict_file(os.path.join(shard_dir, DICT_FILE))
            shard_metadatas.append(shard)
    except AtlasFormatError as exc:
        raise AtlasFormatError(f"{prefix}: {exc}") from exc
    return ExistingDataset(root, metadata, names, shard_metadatas, dict_bytes)


def _check_dict_file(path: str) -> None:
    """A shard's own dictionary: a regular file, not empty (its bytes are the readers' to
    check, as zstd loads them: reading every dictionary here would cost more than the
    append's links)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise AtlasFormatError(f"{path}: missing (the compression strategy needs it)") from None
    except OSError as exc:
        raise AtlasFormatError(f"{path}: cannot be read: {exc}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise AtlasFormatError(f"{path}: not a regular file")
    if not st.st_size:
        raise AtlasFormatError(f"{path}: empty dictionary")


def _listed(names: list) -> str:
    if not names:
        return "none"
    shown = ", ".join(names[:3])
    return shown + (f", ... {names[-1]}" if len(names) > 3 else "")


def check_strategy(asked, stored: int, where) -> int:
    """The strategy new shards of the dataset at ``where`` (stored with ``stored``) are
    written with, when the caller asked ``asked``: the dataset's own. Asking 2 of a dataset
    stored with 1 is the reference's fallback (a strategy-2 writer whose first shard was too
    small for a dictionary writes strategy 1): its new shards take 1. Anything else that
    differs raises ``InvalidArgumentError``: a dataset keeps one strategy."""
    asked = int(asked)
    if asked == stored:
        return stored
    if (
        asked == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
        and stored == CompressionStrategy.STANDARD_COMPRESSION
    ):
        return stored
    raise InvalidArgumentError(
        f"{where}: the dataset is stored with compression_strategy {stored} "
        f"({CompressionStrategy(stored).name}); appending with compression_strategy {asked} "
        f"({CompressionStrategy(asked).name}) would mix them: pass compression_strategy={stored}"
    )


def final_names(count: int, width: int = 1) -> list:
    """The folder names of ``count`` shards: zero-padded to one width, at least ``width``
    and enough for the last number."""
    width = max(width, len(str(count - 1)) if count else 1)
    return [str(k).zfill(width) for k in range(count)]


# -- locks ----------------------------------------------------------------------------------


def _lock_fd(path, *, wait: bool = False):
    """A descriptor of the directory ``path`` holding an exclusive ``flock`` on it, or None
    when another process holds it (or nothing can be locked here)."""
    if fcntl is None:
        return None
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


@contextlib.contextmanager
def lock_dataset(root, who: str):
    """Hold the dataset at ``root`` for one writer: its root folder ``flock``-ed (the folder
    the path names when the lock is taken: an exchange meanwhile is noticed and the lock
    taken again on the new one). Raises ``DatasetBusyError`` when another process holds it."""
    if fcntl is None:
        yield
        return
    root = Path(root)
    while True:
        fd = _lock_fd(root)
        if fd is None:
            raise DatasetBusyError(
                f"{root}: another process is appending to or merging into this dataset; "
                f"{who} waits for no one: try again once it has finished"
            )
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(root))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # exchanged meanwhile: lock the folder the path names now
    try:
        yield
    finally:
        os.close(fd)


# -- leftovers ------------------------------------------------------------------------------


def leftovers(root) -> list:
    """The aside folders of appends and merges to ``root`` found next to it, in name order."""
    root = Path(root)
    parent = root.parent
    start = f".{root.name}{GROW_MARK}"
    try:
        with os.scandir(parent) as entries:
            found = [parent / e.name for e in entries if e.name.startswith(start)]
    except FileNotFoundError:
        return []
    return sorted(found)


def remove_leftovers(root) -> list:
    """Remove what interrupted appends and merges to ``root`` left next to it; the paths
    removed. An aside folder still locked by its (live) process stays. When ``root`` is
    absent and an old tree set aside by the two-rename fallback is there, it is renamed back
    first: the dataset as it was before the interrupted append."""
    root = Path(root)
    found = leftovers(root)
    if not os.path.lexists(root):
        olds = [p for p in found if p.name.endswith(_OLD_SUFFIX)]
        if olds:
            os.rename(olds[-1], root)
            found.remove(olds[-1])
    removed = []
    for path in found:
        fd = None
        if path.is_dir() and not path.is_symlink():
            try:
                fd = _lock_fd(path)
            except OSError:
                fd = None
            if fd is None and fcntl is not None and path.exists():
                continue  # locked: its process is still building it
        try:
            if path.is_dir() and not path.is_symlink():
                _undo_in_place(root, path)
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path)
        except FileNotFoundError:
            pass  # another process removed it meanwhile
        finally:
            if fd is not None:
                os.close(fd)
    return removed


def _undo_in_place(root: Path, aside: Path) -> None:
    """An in-place append (``Aside._commit_in_place``) was stopped: before its commit, put
    the recorded root meta.json back; after it, move in the root files it had not yet."""
    undo = aside / _UNDO
    try:
        record = json.loads((undo / _UNDO_RECORD).read_text())
    except FileNotFoundError:
        return  # no record: the root was not touched
    if (aside / record["shard"]).exists():  # not committed
        os.replace(undo / META_FILE, root / META_FILE)
        return
    _move_in(aside, root, record["written"])


def _move_in(aside: Path, root: Path, names) -> None:
    """Replace the root files ``names`` by those of the aside folder still there."""
    for f in names:
        if os.path.lexists(aside / f):
            os.replace(aside / f, root / f)


# Threads removing old trees (see the module), joined by ``wait_for_removals`` and at exit.
_removals: list = []
_removals_lock = threading.Lock()


def _remove_later(path: Path, shards=()) -> None:
    """Remove the tree ``path`` on a thread of its own (see the module); ``shards``: its
    shard folders' ``(name, file names)`` (``Aside.link_old``), unlinked by name."""
    thread = threading.Thread(
        target=_remove_tree,
        args=(os.fspath(path), shards),
        name="atlas-fast-old-tree",
        daemon=True,
    )
    with _removals_lock:
        _removals[:] = [t for t in _removals if t.is_alive()]
        _removals.append(thread)
    thread.start()


def _remove_tree(path: str, shards) -> None:
    """Remove the tree ``path``: the shard folders whose files are known by name first (an
    unlink per file and an ``rmdir``: ``shutil.rmtree`` would list and stat each again),
    then whatever is left."""
    join = os.path.join
    for name, files in shards:
        folder = join(path, name)
        try:
            if files is None:
                continue  # not all plain files: left to rmtree
            for file in files:
                os.unlink(join(folder, file))
            os.rmdir(folder)
        except OSError:
            pass  # something else in it: left to rmtree
    shutil.rmtree(path, ignore_errors=True)


def wait_for_removals() -> None:
    """Wait until the old trees of this process's appends are removed."""
    with _removals_lock:
        threads = list(_removals)
    for thread in threads:
        thread.join()


atexit.register(wait_for_removals)


# -- linking --------------------------------------------------------------------------------


def _link_or_copy(src: str, dst: str) -> bool:
    """Hard-link ``src`` as ``dst``; where the file system has no hard links, copy it.
    Whether it was linked."""
    try:
        os.link(src, dst, follow_symlinks=False)
        return True
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK, errno.ENOSYS):
            raise
    shutil.copy2(src, dst, follow_symlinks=False)
    return False


def link_folder(src: str, dst: str, skip=()) -> tuple:
    """Make ``dst`` a folder of hard links to the files of the folder ``src`` (but those
    named in ``skip``; a folder inside as a tree of links; a file copied where no link can
    be made): ``(files copied, the names linked)``, the names None when ``src`` held more
    than plain files. Plain strings and ``os.listdir``, no ``DirEntry`` objects: appends
    and merges run this once per shard."""
    src, dst = src + os.sep, dst + os.sep
    os.mkdir(dst)
    copied = 0
    entries = os.listdir(src)
    if skip:
        entries = [e for e in entries if e not in skip]
    names = entries
    for entry in entries:
        try:
            os.link(src + entry, dst + entry, follow_symlinks=False)
        except OSError:  # a folder, or no hard links here
            names = None
            if os.path.isdir(src + entry) and not os.path.islink(src + entry):
                copied += link_tree(src + entry, dst + entry)
            elif not _link_or_copy(src + entry, dst + entry):
                copied += 1
    return copied, names


def link_tree(src, dst, skip=()) -> int:
    """Make ``dst`` a tree of hard links to the files of the tree ``src`` (but the entries
    of ``src`` named in ``skip``); the files copied (where no hard link could be made)."""
    os.mkdir(dst)
    return _link_entries(src, dst, skip)


def _link_entries(src, dst, skip) -> int:
    """Hard-link the entries of ``src`` but those named in ``skip`` into the existing folder
    ``dst`` (folders as trees of links); the files copied."""
    copied = 0
    with os.scandir(src) as entries:
        for entry in entries:
            if entry.name in skip:
                continue
            target = os.path.join(dst, entry.name)
            if entry.is_dir(follow_symlinks=False):
                copied += link_tree(entry.path, target)
            elif not _link_or_copy(entry.path, target):
                copied += 1
    return copied


# -- the exchange ---------------------------------------------------------------------------


def _native_exchange():
    """The platform's atomic exchange of two paths, as a function of two ``bytes`` paths
    raising ``OSError``, or None."""
    if sys.platform.startswith("linux"):
        name, flag, at = "renameat2", 2, True  # RENAME_EXCHANGE
    elif sys.platform == "darwin":
        name, flag, at = "renamex_np", 2, False  # RENAME_SWAP
    else:
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        function = getattr(libc, name)
    except (OSError, AttributeError):
        return None
    at_fdcwd = -100

    def swap(a: bytes, b: bytes) -> None:
        if at:
            result = function(at_fdcwd, a, at_fdcwd, b, ctypes.c_uint(flag))
        else:
            result = function(a, b, ctypes.c_uint(flag))
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), os.fsdecode(a), None, os.fsdecode(b))

    return swap


_swap = _native_exchange()
# Whether ``exchange`` swaps in one step here (else: two renames, see the module).
EXCHANGE_IS_ATOMIC = _swap is not None


def exchange(new: Path, root: Path) -> None:
    """Swap the directories ``new`` and ``root``: ``root`` then holds what was built at
    ``new``, and ``new`` the old tree (see the module for the fallback's two renames)."""
    if _swap is not None:
        try:
            _swap(os.fsencode(new), os.fsencode(root))
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
                raise
            # This file system cannot exchange: the fallback.
    old = new.with_name(new.name + _OLD_SUFFIX)
    os.rename(root, old)
    os.rename(new, root)
    os.rename(old, new)


# -- the aside tree -------------------------------------------------------------------------


def carry_root_files(old_root: Path, new_root: Path, skip=()) -> int:
    """Carry every entry of ``old_root`` that is not a shard folder, nor ``meta.json`` nor
    in ``skip``, over to ``new_root`` unchanged (hard-linked); the files copied."""
    return _link_entries(old_root, new_root, {META_FILE, *shard_dir_names(old_root), *skip})


class Aside:
    """The folder a new dataset of ``root`` is built in, next to it, locked while it lives.

    ``dir`` is where the new shards are written (any names but the final ones' of the old
    shards: see ``commit_append``). ``commit_append`` or ``commit_new`` ends it; ``abandon``
    removes it.
    """

    def __init__(self, root) -> None:
        self.root = Path(root)
        self.dir = self.root.parent / f".{self.root.name}{GROW_MARK}{uuid.uuid4().hex[:16]}"
        self.dir.mkdir()
        self.copied = 0  # files copied where a hard link could not be made
        try:
            self._fd = _lock_fd(self.dir)
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def _unlock(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def abandon(self) -> None:
        """Remove the aside folder and what was built in it."""
        self._unlock()
        shutil.rmtree(self.dir, ignore_errors=True)

    def link_old(self, existing: ExistingDataset, names: list) -> list:
        """Hard-link each shard folder of ``existing`` into the aside folder under ``names``
        (its final names; ``link_folder``). The old tree is not touched. Returns each
        shard's file names, in order: what the removal of the old tree unlinks by name
        (``_remove_tree``).

        The append's cost beyond writing its shards is this loop: a ``mkdir``, a listing
        and a link per file, per old shard."""
        top, aside = os.fspath(existing.root) + os.sep, os.fspath(self.dir) + os.sep
        files = []
        for name, target in zip(existing.names, names):
            copied, entries = link_folder(top + name, aside + target)
            self.copied += copied
            files.append(entries)
        return files

    def commit_append(
        self, existing: ExistingDataset, new_dirs: list, fields: dict, written=()
    ) -> None:
        """The dataset at ``root``, grown: ``existing``'s shards, then the shard folders
        ``new_dirs`` (inside ``dir``, in order), under one width; the root's other files
        carried over, but those named in ``written`` (written anew in ``dir`` by the
        caller: the grown token index); ``fields`` the new root meta.json. Then exchanged
        with the old root, and the old tree removed."""
        names = final_names(existing.count + len(new_dirs), existing.width)
        old, new = names[: existing.count], names[existing.count :]
        if len(new_dirs) == 1 and old == existing.names:
            self._commit_in_place(Path(new_dirs[0]), new[0], fields, written)
            return
        # New shards first: their temporary names are numbers >= the old count, never the
        # final name of another shard (a number's zero-padded names are its own).
        moves = [(Path(d), self.dir / n) for d, n in zip(new_dirs, new)]
        for source, target in moves:
            if source != target:
                if target.exists():
                    raise FileExistsError(f"{target}: in the way of shard {source}")
                os.rename(source, target)
        files = self.link_old(existing, old)
        self.copied += carry_root_files(existing.root, self.dir, skip=written)
        self._seal(fields)
        exchange(self.dir, self.root)
        self._unlock()
        # The old tree: its files live on in root. Removed on a thread (see the module).
        _remove_later(self.dir, list(zip(existing.names, files)))

    def _commit_in_place(self, source: Path, name: str, fields: dict, written) -> None:
        """One new shard and no widening: the root is changed in place, not exchanged (the
        cost does not grow with the old shards).

        The root meta.json is recorded in the aside folder (``_UNDO``: a link to it, and
        what this commit does), then replaced by one that lists the new shard: both readers
        still read the old dataset, whole (to atlas_fast a shard listed but absent is a
        node's partial copy; the reference lists folders). Renaming the shard folder in is
        the commit. Then the ``written`` root files (the grown token index) replace the
        old ones: until then the index lacks the new shard's entry, which a reader builds
        (an index is never trusted past its entries). Killed before the commit,
        ``remove_leftovers`` puts the old meta.json back; after it, it moves the written
        files in."""
        root = self.root
        target = root / name
        if os.path.lexists(target):
            raise FileExistsError(f"{target}: in the way of the new shard {source}")
        building = self.dir / (_UNDO + ".part")
        building.mkdir()
        _link_or_copy(os.fspath(root / META_FILE), os.fspath(building / META_FILE))
        record = {"shard": source.name, "written": list(written)}
        (building / _UNDO_RECORD).write_text(json.dumps(record))
        os.rename(building, self.dir / _UNDO)  # the record is whole, or absent
        dump_meta_atomic(self.dir / META_FILE, fields)  # flushed: the commit's marker
        os.replace(self.dir / META_FILE, root / META_FILE)
        os.rename(source, target)  # the commit
        _move_in(self.dir, root, written)
        self._unlock()
        shutil.rmtree(self.dir, ignore_errors=True)

    def commit_new(self, fields: dict) -> None:
        """The aside folder (shards placed, root files written) becomes the new dataset at
        ``root``, which must be absent (or an empty folder): renamed into place."""
        self._seal(fields)
        try:
            os.rename(self.dir, self.root)
        except OSError as exc:
            self.abandon()
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise FileExistsError(
                    errno.EEXIST,
                    f"{self.root}: appeared while the dataset was being built aside; "
                    "nothing was written there",
                ) from None
            raise
        self._unlock()

    def _seal(self, fields: dict) -> None:
        # The one flush of the commit, as a first write flushes its root meta.json: the
        # commit marker on disk before the step that publishes it (the exchange, or the
        # rename). Every other file and folder of the tree was made before it, and a
        # journaling file system commits metadata in order: after a power cut, a tree
        # whose exchange survived is whole. The exchange itself reaches the disk with the
        # file system's next commit (a power cut before that: the old dataset).
        dump_meta_atomic(self.dir / META_FILE, fields)


class LocalAppend:
    """One append to the local dataset at ``root`` by ``who``: the dataset locked, the
    leftovers of interrupted appends removed, the dataset checked, its strategy kept (asked
    ``strategy``: see ``check_strategy``), the new shards written into ``shard_dir(number)``
    (numbers from ``first``), then ``commit`` or ``abandon``."""

    def __init__(self, root, who: str, strategy) -> None:
        root = Path(root)
        if root.is_symlink():  # the folder it names is grown (the link keeps naming it)
            root = Path(os.path.realpath(root))
        if not os.path.lexists(root):
            remove_leftovers(root)  # a fallback exchange interrupted: the old tree comes back
        if root.is_dir():
            self._lock = lock_dataset(root, who)
            self._lock.__enter__()
        else:
            self._lock = None  # open_existing says what is wrong with the path
        try:
            self.removed = remove_leftovers(root)
            self.existing = open_existing(root, who)
            self.strategy = check_strategy(strategy, self.existing.strategy, root)
            self.aside = Aside(root)
        except BaseException:
            self._release()
            raise
        self.first = self.existing.count

    def release(self) -> None:
        """Let the dataset go (its lock), leaving the aside folder: a leftover."""
        self._release()

    def _release(self) -> None:
        if self._lock is not None:
            lock, self._lock = self._lock, None
            lock.__exit__(None, None, None)

    def shard_dir(self, number: int) -> Path:
        return self.aside.dir / str(number)

    def commit(self, sizes: list, strategy: int | None = None, written=()) -> AtlasDatasetMetadata:
        """Commit the new shards ``first ..`` (their ``sizes``, in order) and the dataset's
        ``strategy`` (default: as it was): the grown dataset's metadata. ``written``: root
        files the caller wrote into the aside folder, which replace the old root's. No
        shard: nothing changes."""
        old = self.existing.metadata
        strategy = self.strategy if strategy is None else strategy
        metadata = AtlasDatasetMetadata(old.version, [*old.shard_sizes, *sizes], strategy)
        try:
            if sizes:
                new = [self.shard_dir(self.first + k) for k in range(len(sizes))]
                self.aside.commit_append(self.existing, new, metadata._asdict(), written)
            else:
                self.aside.abandon()
                metadata = old
        except BaseException:
            self.aside.abandon()
            raise
        finally:
            self._release()
        return metadata

    def abandon(self) -> None:
        try:
            self.aside.abandon()
        finally:
            self._release()
