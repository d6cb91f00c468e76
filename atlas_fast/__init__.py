"""atlas_fast: fast, safe reading and writing of Atlas datasets.

A drop-in replacement for ``torch_atlas_ds``:

    import atlas_fast as torch_atlas_ds

``BACKEND`` names the reader in use: ``"cython"`` (the compiled core) or ``"python"``
(forced with ``ATLAS_FAST_NO_EXTENSIONS=1``).

Importing atlas_fast does not import torch: the readers and samplers, which subclass torch's
``Dataset`` and ``Sampler`` when it is installed, are made on first lookup
(``atlas_fast.AtlasDataset``), and that lookup imports torch.
"""

from . import (
    _backend,
    sampler,  # noqa: F401 (users reach atlas_fast.sampler without importing it)
)
from ._backend import BACKEND
from ._contract import DEFAULT_CACHE_BYTES, CacheInfo
from ._errors import (
    AtlasFormatError,
    DatasetBusyError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    MissingSharedDictionary,
    NotTokensError,
    ObjectChangedError,
    ObjectNotFoundError,
    StorageError,
    TokenIndexError,
    UnpicklableExampleError,
    UnsafePickleError,
)
from ._merge import merge
from ._version import __version__
from .atlas import (
    AtlasDatasetMetadata,
    AtlasDatasetShardMetadata,
    CompressionStrategy,
)
from .mix import MixtureDataset
from .writer import AtlasDatasetShardWriter, AtlasDatasetWriter

__all__ = [
    "AtlasDataset",
    "AtlasDatasetShard",
    "CompressionStrategy",
    "AtlasDatasetMetadata",
    "AtlasDatasetShardMetadata",
    "AtlasDatasetWriter",
    "AtlasDatasetShardWriter",
    "BlockShuffleSampler",
    "MixtureDataset",
    "MixtureSampler",
    "TokenSequences",
    "TokenShuffleSampler",
    "merge",
    "AtlasFormatError",
    "DatasetBusyError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "MissingSharedDictionary",
    "UnsafePickleError",
    "NotTokensError",
    "TokenIndexError",
    "UnpicklableExampleError",
    "StorageError",
    "ObjectChangedError",
    "ObjectNotFoundError",
    "CacheInfo",
    "DEFAULT_CACHE_BYTES",
    "BACKEND",
    "zstd_library",
    "__version__",
]


def zstd_library() -> dict:
    """Which libzstd the backend in use decompresses with: its path, version and binding."""
    return _backend.core.zstd_library()


# The classes that subclass torch's, made (and torch imported) on first lookup: the module
# that makes each (see _compat.lazy_classes).
_LAZY = {
    "AtlasDataset": ".atlas",
    "AtlasDatasetShard": ".atlas",
    "BlockShuffleSampler": ".sampler",
    "MixtureSampler": ".mix",
    "TokenSequences": ".tokens",
    "TokenShuffleSampler": ".token_sampler",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted({*globals(), *_LAZY})
