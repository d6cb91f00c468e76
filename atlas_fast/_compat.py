"""Optional integration with PyTorch, which atlas_fast never requires."""

from __future__ import annotations

import importlib.util

__all__ = ["torch_dataset_bases"]


def torch_dataset_bases() -> tuple:
    """``(torch.utils.data.Dataset,)`` when torch is installed, else ``()``.

    Readers subclass it so ``isinstance(ds, torch.utils.data.Dataset)`` holds, as it did with
    the reference. torch is imported only when it is installed.
    """
    try:
        if importlib.util.find_spec("torch") is None:
            return ()
    except (ImportError, ValueError):  # sys.modules["torch"] = None blocks it on purpose
        return ()
    try:
        from torch.utils.data import Dataset
    except Exception:  # a broken torch install must not break reading
        return ()
    return (Dataset,)
