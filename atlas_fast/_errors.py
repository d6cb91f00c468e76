"""Exceptions raised by atlas_fast (both backends raise the same ones).

Callers tell errors apart by type, never by message text: every problem with a dataset on disk
is an ``AtlasFormatError``; the subclasses below name the cases a caller handles on its own.
"""

import pickle

__all__ = [
    "AtlasFormatError",
    "MissingSharedDictionary",
    "UnsafePickleError",
    "StorageError",
    "ObjectChangedError",
    "ObjectNotFoundError",
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


class UnsafePickleError(pickle.UnpicklingError):
    """A block of an untrusted dataset refers to a global that is not allowed.

    Raised by ``trusted=False`` readers before any code of that global runs.
    """


class StorageError(OSError):
    """An object of a dataset in object storage (or behind a URL) could not be read.

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
