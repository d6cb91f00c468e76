"""What a target format holds exactly: the types an example may be made of, and the error
naming an example that holds something else.

"Exactly" means that converting the exported data back gives an example of the same types
at every depth, equal to the original (a NaN equal to itself): a tuple that would come back
as a list, an int as a float, a numpy array as a list, are not held.
"""

from __future__ import annotations

import math
from datetime import date, datetime, time, timedelta
from decimal import Decimal

__all__ = [
    "ARROW_SCALARS",
    "ExportError",
    "JSON_SCALARS",
    "cannot_hold",
    "exact",
    "finite_json",
    "foreign",
    "found_text",
    "int64",
    "type_name",
]

NoneType = type(None)
JSON_SCALARS = frozenset({NoneType, bool, int, float, str})
ARROW_SCALARS = frozenset(
    {NoneType, bool, int, float, str, bytes, datetime, date, time, timedelta, Decimal}
)
INT64 = (-(1 << 63), (1 << 63) - 1)


class ExportError(ValueError):
    """An example the target format cannot hold (its message names the example: its index in
    the dataset, its shard and the type in the way), or exported data that would not read back
    as the dataset (two consecutive webdataset samples of one key, ...)."""


def type_name(value) -> str:
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def finite_json(value) -> bool:
    """JSON's numbers: no NaN or infinity (``json`` writes them, other readers refuse them);
    ints of any size."""
    return type(value) is not float or math.isfinite(value)


def int64(value) -> bool:
    """Arrow's integers: int64."""
    return type(value) is not int or INT64[0] <= value <= INT64[1]


def foreign(value, scalars: frozenset, check=None):
    """None if ``value`` is made of ``scalars`` (each passing ``check``), lists and dicts with
    string keys only; else ``(path, what)``: where the first other thing is (a tuple of keys
    and list positions) and what it is."""
    t = type(value)
    if t in scalars:
        return None if check is None or check(value) else ((), _describe(value))
    if t is list:
        for i, item in enumerate(value):
            found = foreign(item, scalars, check)
            if found is not None:
                return (i, *found[0]), found[1]
        return None
    if t is dict:
        for key, item in value.items():
            if type(key) is not str:
                return (), f"a dict with a key of type {type_name(key)} ({key!r:.40})"
            found = foreign(item, scalars, check)
            if found is not None:
                return (key, *found[0]), found[1]
        return None
    return (), type_name(value)


def _describe(value) -> str:
    if type(value) is float:
        return f"float {value!r}"
    if type(value) is int:
        return f"int {value} (beyond int64)"
    return type_name(value)


def cannot_hold(target: str, where: str, what: str) -> ExportError:
    """The error for the example ``where`` names, which ``target`` cannot hold (``what``)."""
    return ExportError(
        f"{where}: {target} cannot hold it exactly: {what}; pass pickle=True (--pickle) to "
        "store such examples pickled (read back with convert's unpickle=True)"
    )


def found_text(found) -> str:
    """``foreign``'s answer as a phrase."""
    path, what = found
    return (
        f"its value at {''.join(f'[{p!r}]' for p in path)} is {what}" if path else (f"it is {what}")
    )


def exact(a, b) -> bool:
    """Same types at every depth and equal values (NaN equal to NaN): what a round trip must
    give back."""
    if type(a) is not type(b):
        return False
    if type(a) is list:
        return len(a) == len(b) and all(exact(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(exact(a[k], b[k]) for k in a)
    if type(a) is float and a != a:
        return b != b
    return a == b
