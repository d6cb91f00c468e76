"""What a cached block takes in memory, as both cores' block caches count it (``ChargeMeter``).

A block held whole is charged what its examples take as Python objects. Measuring every block
would cost more than decoding it, so a cache measures the objects of its first
``MEASURE_FIRST`` blocks and of one in ``MEASURE_EVERY`` after, and charges each block its
decoded pickle size times the ratio of objects to pickle bytes over the last ``WINDOW``
measurements (a dataset whose shards hold other kinds of examples moves the ratio within a few
measurements), and never less than the pickle's size. Text and arrays take about their pickle
size (ratio near 1); rows of small ints, floats and dates several times more (7-8 for the
bench's table rows), which a budget in pickle bytes would not see.

The measurement (``objects_bytes``) runs no code of the examples' classes: it follows
references with ``gc.get_referents`` (the types' C traversal), sizes builtin objects with
``sys.getsizeof`` and others with ``object.__sizeof__``, and takes a numpy array's
``nbytes``. A block's examples, and any container's items beyond ``_SAMPLE``, are sampled
(evenly spaced, scaled); each object is counted once, at the scale of the first sampled
example that reaches it, so an object many examples share (a vocabulary) is counted as many
times as the scale: the estimate errs on the large side, never below the pickle's size.
"""

from __future__ import annotations

import gc
import sys
import types
from collections import deque

__all__ = ["MEASURE_FIRST", "MEASURE_EVERY", "WINDOW", "ChargeMeter", "objects_bytes"]

MEASURE_FIRST = 8
MEASURE_EVERY = 64
WINDOW = 8

# Examples of a block looked at (evenly spaced, scaled to all): a block's examples are alike,
# and walking every one of a block of small rows costs ten times its unpickling.
_EXAMPLES = 16
# Items of any other container looked at, evenly spaced, beyond which its items are sampled.
_SAMPLE = 64
# A measurement stops after visiting this many objects (the rest is charged at the ratio of
# what was measured, through the floor of the pickle size).
_MAX_VISITS = 1 << 15

_BUILTIN = frozenset(
    (str, bytes, bytearray, int, float, complex, bool, type(None), list, tuple, dict, set)
)
_BUILTIN |= {frozenset}
_SEQUENCES = frozenset((list, tuple))
_NOT_DATA = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)


def _ndarray_type():
    numpy = sys.modules.get("numpy")
    return getattr(numpy, "ndarray", None)


def objects_bytes(examples: list) -> int:
    """About the bytes the objects reachable from ``examples`` take (see the module's doc);
    types, modules and functions are not counted. Runs no code of the objects' classes."""
    getsizeof = sys.getsizeof
    sizeof = object.__sizeof__
    referents = gc.get_referents
    ndarray = _ndarray_type()
    seen = set()
    total = 0.0
    visits = 0
    n = len(examples)
    if n > _EXAMPLES:
        step = n / _EXAMPLES
        stack = [(examples[int(k * step)], step) for k in range(_EXAMPLES)]
        total = getsizeof(examples)
    else:
        stack = [(examples, 1.0)]
    while stack:
        obj, weight = stack.pop()
        key = id(obj)
        if key in seen:
            continue
        seen.add(key)
        visits += 1
        if visits > _MAX_VISITS:
            break
        t = type(obj)
        if t in _BUILTIN:
            total += weight * getsizeof(obj)
            if t in _SEQUENCES or t is set or t is frozenset:
                items = obj if t in _SEQUENCES else list(obj)
            elif t is dict:
                items = list(dict.values(obj))
                items += dict.keys(obj)
            else:
                continue
        elif t is ndarray:
            total += weight * (sizeof(obj) + obj.nbytes)
            if obj.dtype.hasobject:
                items = referents(obj) or list(obj.ravel())
            else:
                continue
        elif issubclass(t, _NOT_DATA):
            continue
        else:
            # An instance: its builtin base's size (a dict subclass's table...) and what its
            # type's traversal reaches (instance dict, slots, items; types are skipped above).
            base = next((b for b in t.__mro__ if b in _BUILTIN), object)
            total += weight * (base.__sizeof__(obj) if base is not object else sizeof(obj))
            items = referents(obj)
        n = len(items)
        if n > _SAMPLE:
            step = n / _SAMPLE
            scaled = weight * step
            stack.extend((items[int(k * step)], scaled) for k in range(_SAMPLE))
        else:
            stack.extend((x, weight) for x in items)
    return int(total)


class ChargeMeter:
    """What each block put in a cache is charged (see the module's doc). ``charge`` is called
    by a cache's put before it takes its lock or changes anything; it never raises for the
    examples' sake (a measurement that fails is skipped), and its counters tolerate racing
    threads (a lost update only shifts which puts are measured)."""

    def __init__(self) -> None:
        self._puts = 0
        self._window: deque = deque(maxlen=WINDOW)  # (objects, pickle) bytes measured
        self._ratio = 1.0

    def charge(self, examples: list, nbytes: int) -> int:
        n = self._puts
        self._puts = n + 1
        if n < MEASURE_FIRST or n % MEASURE_EVERY == 0:
            try:
                measured = objects_bytes(examples)
            except Exception:  # an object that cannot be measured: keep the ratio
                measured = None
            if measured is not None and nbytes > 0:
                self._window.append((measured, nbytes))
                window = list(self._window)
                self._ratio = sum(m for m, _ in window) / sum(p for _, p in window)
        return max(nbytes, int(nbytes * self._ratio))
