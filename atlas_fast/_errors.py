"""Exceptions raised by atlas_fast (both backends raise the same ones).

Callers tell errors apart by type, never by message text: every problem with a dataset on disk
is an ``AtlasFormatError``; the subclasses below name the cases a caller handles on its own.
"""

import pickle

__all__ = [
    "AtlasFormatError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "MissingSharedDictionary",
    "UnsafePickleError",
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
