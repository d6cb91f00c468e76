"""atlas_fast: fast, safe reading and writing of Atlas datasets.

A drop-in replacement for ``torch_atlas_ds``::

    import atlas_fast as torch_atlas_ds

``BACKEND`` names the reader in use: ``"cython"`` (the compiled core) or ``"python"``
(forced with ``ATLAS_FAST_NO_EXTENSIONS=1``).
"""

from . import _backend
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
    UnsafePickleError,
)
from ._merge import merge
from ._version import __version__
from .atlas import (
    AtlasDataset,
    AtlasDatasetMetadata,
    AtlasDatasetShard,
    AtlasDatasetShardMetadata,
    CompressionStrategy,
)
from .mix import MixtureDataset, MixtureSampler
from .sampler import BlockShuffleSampler
from .token_sampler import TokenShuffleSampler
from .tokens import TokenSequences
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
