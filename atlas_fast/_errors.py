"""Exceptions raised by atlas_fast (both backends raise the same ones)."""

import pickle

__all__ = ["AtlasFormatError", "UnsafePickleError"]


class AtlasFormatError(ValueError):
    """A dataset on disk is malformed: the message names the file and the problem."""


class UnsafePickleError(pickle.UnpicklingError):
    """A block of an untrusted dataset refers to a global that is not allowed.

    Raised by ``trusted=False`` readers before any code of that global runs.
    """
