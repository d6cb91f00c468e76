"""Optional integration with PyTorch, which atlas_fast never requires."""

from __future__ import annotations

import importlib.util
import os

__all__ = ["torch_dataset_bases", "torch_installed"]


def torch_installed() -> bool:
    """Whether torch can be imported (without importing it), and is wanted: not when
    ``ATLAS_FAST_NO_TORCH=1``, which worker processes that only write or compare examples
    (``atlas-fast convert --workers``) set to start without torch's second of import time."""
    if os.environ.get("ATLAS_FAST_NO_TORCH") == "1":
        return False
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # sys.modules["torch"] = None blocks it on purpose
        return False


def torch_dataset_bases() -> tuple:
    """``(torch.utils.data.Dataset,)`` when torch is installed, else ``()``.

    Readers subclass it so ``isinstance(ds, torch.utils.data.Dataset)`` holds, as it did with
    the reference. torch is imported only when it is installed (``torch_installed``).
    """
    if not torch_installed():
        return ()
    try:
        from torch.utils.data import Dataset
    except Exception:  # a broken torch install must not break reading
        return ()
    return (Dataset,)
