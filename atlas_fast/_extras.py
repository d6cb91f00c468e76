"""Optional dependencies: imported lazily, and a missing one named with its extra."""

from __future__ import annotations

import importlib

__all__ = ["MissingExtraError", "require"]


class MissingExtraError(ImportError):
    """An optional feature was used without the extra that installs its dependency."""


def require(module: str, extra: str, feature: str):
    """Import ``module`` for ``feature``, or raise a one-line error naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{feature} needs {module.split('.')[0]}, which is not installed: "
            f"pip install 'atlas-fast[{extra}]' ({exc})"
        ) from None
