"""Exceptions raised by atlas_fast (both backends raise the same ones).

Callers tell errors apart by type, never by message text: every problem with a dataset on disk
is an ``AtlasFormatError``; the subclasses below name the cases a caller handles on its own.
"""

import errno
import pickle
from pathlib import Path

__all__ = [
    "AtlasFormatError",
    "DatasetBusyError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "MissingSharedDictionary",
    "NotTokensError",
    "ObjectChangedError",
    "ObjectNotFoundError",
    "StorageError",
    "TokenIndexError",
    "UnpicklableExampleError",
    "UnsafePickleError",
    "destination_exists",
]


class AtlasFormatError(ValueError):
    """A dataset on disk is malformed: the message names the file and the problem."""


class MissingSharedDictionary(AtlasFormatError):
    """A shard compressed with a dataset's shared dictionary (strategy 2) was opened without it.

    ``shard_root`` is the shard's directory. ``AtlasDataset`` raises a plain
    ``AtlasFormatError`` about its own meta.json instead when one of its shards says so.
    """

    def __init__(self, message: str, shard_root) -> None:
        super().__init__(message)
        self.shard_root = shard_root


class NotTokensError(AtlasFormatError):
    """An example read as a token sequence (``TokenSequences``, a token index) is not one: not
    a 1-D integer array or list of ints, or a mapping without the field asked for. The message
    names the shard, the example and what was found."""


class TokenIndexError(AtlasFormatError):
    """A token index does not match its dataset (a shard rewritten, its sizes changed) or is
    malformed: the message names the file, the shard and what differs."""


class DatasetBusyError(AtlasFormatError):
    """Another process is appending to (or merging into) this dataset right now: raised at
    once, nothing written (``AtlasDatasetWriter(..., append=True)``, ``write_atlas(...,
    mode="append")``)."""


class UnsafePickleError(pickle.UnpicklingError):
    """A block of an untrusted dataset refers to a global that is not allowed.

    Raised by ``trusted=False`` readers before any code of that global runs.
    """


class InvalidArgumentError(ValueError, AssertionError):
    """An argument's value is refused (a size of 0, a fraction above 1): the message names it.

    A ``ValueError``; also an ``AssertionError``, which the reference's writer raised for a
    bad ``block_size`` or ``compression_dict_size`` (with ``assert``), so that code catching
    that keeps working. Raised explicitly: ``python -O`` changes nothing.
    """


class InvalidArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument is of the wrong type (a float where an integer is needed, a bool).

    A ``TypeError`` too, as the sampler and the readers' cache arguments raised before.
    """


class UnpicklableExampleError(InvalidArgumentError, pickle.PicklingError):
    """An example given to a writer (``add_example``) does not pickle.

    The message names the directory being written and the example (``index``: its number in
    the order added, from 0; ``path``: the directory); pickle's own error is its
    ``__cause__``. The writer is closed, and the directory it had begun is removed (nothing
    half-written is left). An ``InvalidArgumentError`` and a ``pickle.PicklingError``.
    """

    def __init__(self, message="", path=None, index=None) -> None:
        super().__init__(message)
        self.path = path
        self.index = index

    def __reduce__(self):
        return (type(self), (str(self), self.path, self.index))


def destination_exists(
    path, who: str, *, empty_dir_ok: bool = False, what: str = "dataset", state: str | None = None
):
    """The ``FileExistsError`` for a destination in the way of ``who``, which writes a new
    ``what`` at ``path``: one sentence naming the path, what is there and what to do.

    ``empty_dir_ok``: ``who`` accepts an empty directory (``convert``, ``write_atlas``); the
    writers, as the reference's, create the directory themselves and refuse any existing path.
    The error keeps the type and ``errno`` (EEXIST) the reference's ``Path.mkdir`` raises.
    ``state``: what is there, said after "already exists" (a URL's: the caller looked);
    None: looked up on the local file system.
    """
    if state is None:
        path = Path(path)
        state = _what_is_at(path)
    need = (
        f"writes a new {what} into an absent or empty directory"
        if empty_dir_ok
        else f"creates the directory of a new {what} itself"
    )
    return FileExistsError(
        errno.EEXIST,
        f"{path}: already exists{state}; {who} {need}: remove it or choose another path",
    )


def _what_is_at(path: Path) -> str:
    if path.is_dir():
        try:
            return " and is not empty" if any(path.iterdir()) else " (an empty directory)"
        except OSError:
            return ""
    if path.exists() or path.is_symlink():
        return " and is not a directory"
    return ""


class StorageError(OSError):
    """An object of a dataset in object storage (or behind a URL) could not be read or written.

    Raised after retries when the failure is transient (connection errors, timeouts, 5xx,
    throttling, short bodies) and at once when it is not (access denied, a bucket that does
    not exist). The message and the attributes name what was being read: ``url`` (the object),
    ``shard`` and ``block`` (None when not a block of a shard), ``attempts`` (requests made).
    Constructible from a message alone, as exceptions crossing DataLoader workers must be.
    """

    def __init__(self, message="", url=None, shard=None, block=None, attempts=None) -> None:
        super().__init__(message)
        self.url = url
        self.shard = shard
        self.block = block
        self.attempts = attempts

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __reduce__(self):
        return (type(self), (str(self), self.url, self.shard, self.block, self.attempts))


class ObjectChangedError(StorageError):
    """An object changed after this process first read it (its ETag, or its size, is not the
    one it was pinned to): the dataset was replaced while being read. Never retried: reading
    on would mix two versions of the dataset."""


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """An object a dataset needs does not exist (or the bucket holding it does not)."""
