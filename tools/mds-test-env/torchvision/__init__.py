"""Placeholder torchvision for the MDS converter tests only (see ../README.md)."""

from . import datasets, transforms

__all__ = ["datasets", "transforms"]
__version__ = "0+atlas-fast-test-placeholder"
