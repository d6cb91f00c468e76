"""The public reader classes over the pure-Python backend, whatever backend is selected.

For parity tests and side-by-side benchmarks; users want ``atlas_fast.AtlasDataset``.
"""

from ._core import _reader_py
from .atlas import _reader_classes

__all__ = ["AtlasDataset", "AtlasDatasetShard"]

AtlasDataset, AtlasDatasetShard = _reader_classes(_reader_py, __name__)
