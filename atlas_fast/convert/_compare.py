"""Deep equality of examples, for ``--verify``: numpy arrays, bytes, nested dicts and lists."""

from __future__ import annotations

import math

__all__ = ["difference"]


def difference(a, b, where: str = "") -> str | None:
    """Where ``a`` and ``b`` first differ (``""`` for the values themselves, ``"['k'][2]"``
    below), or None when equal: same types, same keys, same items, arrays of one dtype and
    shape with equal elements; NaN equals NaN."""
    if type(a) is not type(b):
        return f"{where or 'the example'}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, dict):
        if a.keys() != b.keys():
            keys = f"{sorted(map(repr, a))} != {sorted(map(repr, b))}"
            return f"{where or 'the example'}: keys {keys}"
        for key in a:
            found = difference(a[key], b[key], f"{where}[{key!r}]")
            if found is not None:
                return found
        return None
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{where or 'the example'}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            found = difference(x, y, f"{where}[{i}]")
            if found is not None:
                return found
        return None
    if type(a).__module__ == "numpy":
        return _numpy_difference(a, b, where)
    if isinstance(a, float):
        if a == b or (math.isnan(a) and math.isnan(b)):
            return None
    elif a == b:
        return None
    return f"{where or 'the example'}: {_short(a)} != {_short(b)}"


def _numpy_difference(a, b, where: str) -> str | None:
    import numpy as np

    label = where or "the example"
    if getattr(a, "dtype", None) != getattr(b, "dtype", None):
        return f"{label}: dtype {a.dtype} != {b.dtype}"
    if np.shape(a) != np.shape(b):
        return f"{label}: shape {np.shape(a)} != {np.shape(b)}"
    if a.dtype.kind == "O":
        return difference(np.asarray(a).tolist(), np.asarray(b).tolist(), where)
    if np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"):
        return None
    return f"{label}: {_short(a)} != {_short(b)}"


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
