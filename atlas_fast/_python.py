"""The public reader classes over the pure-Python backend, whatever backend is selected.

For parity tests and side-by-side benchmarks; users want ``atlas_fast.AtlasDataset``.
"""

from ._compat import lazy_classes
from ._core import _reader_py
from .atlas import _reader_classes

__all__ = ["AtlasDataset", "AtlasDatasetShard"]  # noqa: F822 (made by __getattr__, below)


def _make_readers() -> dict:
    return _reader_classes(_reader_py, __name__)


# Made on first lookup, as atlas_fast.atlas's (importing this module does not import torch).
__getattr__, __dir__ = lazy_classes(
    globals(), {"AtlasDataset": _make_readers, "AtlasDatasetShard": _make_readers}
)
