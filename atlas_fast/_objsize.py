"""What a cached block takes in memory, as both cores' block caches count it.

A block held whole is charged what its examples take as Python objects. Measuring every block
would cost as much as a good part of decoding it, so a cache measures the objects of its first
``MEASURE_FIRST`` blocks and of one in ``MEASURE_EVERY`` after, and charges each block its
decoded pickle size times the ratio of objects to pickle bytes measured so far. Text and arrays
take about their pickle size (ratio near 1); rows of small ints, floats and dates several times
more (7-8 for the bench's table rows), which a budget in pickle bytes would not see.
"""

from __future__ import annotations

import sys

__all__ = ["MEASURE_FIRST", "MEASURE_EVERY", "objects_bytes"]

MEASURE_FIRST = 8
MEASURE_EVERY = 64

# A block's measurement looks at this many of its examples, evenly spaced, and scales the
# result by the share of examples measured (objects shared by them are counted once per
# measurement: the estimate errs on the large side).
_SAMPLE = 16

_CONTAINERS = (list, tuple, set, frozenset)
_ATOMS = frozenset((str, bytes, int, float, bool, complex, type(None)))


def objects_bytes(examples: list) -> int:
    """About the bytes of the objects reachable from ``examples`` (each counted once), as
    ``sys.getsizeof`` reports them: containers, their items, instance dicts; numpy arrays with
    the data they own (a view, with its base's). Types, modules and functions are not counted.
    At most ``_SAMPLE`` examples are looked at, the total scaled to all of them."""
    n = len(examples)
    if n == 0:
        return 0
    step = max(1, n // _SAMPLE)
    sample = examples[::step]
    getsizeof = sys.getsizeof
    seen = set()
    total = 0
    stack = list(sample)
    while stack:
        obj = stack.pop()
        key = id(obj)
        if key in seen:
            continue
        seen.add(key)
        t = type(obj)
        if t in _ATOMS:
            total += getsizeof(obj)
        elif t is dict or isinstance(obj, dict):
            total += getsizeof(obj)
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif t in _CONTAINERS or isinstance(obj, _CONTAINERS):
            total += getsizeof(obj)
            stack.extend(obj)
        elif not (isinstance(obj, type) or callable(obj)):
            total += getsizeof(obj)
            base = getattr(obj, "base", None)  # a numpy view: what holds its data
            if base is not None:
                stack.append(base)
            attrs = getattr(obj, "__dict__", None)
            if type(attrs) is dict:
                stack.append(attrs)
    return total * n // len(sample)
