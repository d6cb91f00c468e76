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

MEASURE_FIRST = 2
MEASURE_EVERY = 256
WINDOW = 4

# Examples of a block looked at (evenly spaced, scaled to all): a block's examples are alike,
# and walking every one of a block of small rows costs ten times its unpickling.
_EXAMPLES = 16
# Items of any other container looked at, evenly spaced, beyond which its items are sampled.
_SAMPLE = 64
# A measurement stops after visiting this many objects (the rest is charged at the ratio of
# what was measured, through the floor of the pickle size).
_MAX_VISITS = 1 << 15

_ATOMS = frozenset((str, bytes, bytearray, int, float, complex, bool, type(None)))
_CONTAINERS = frozenset((list, tuple, dict, set, frozenset))
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
    atoms = _ATOMS
    seen = set()
    total = 0.0
    visits = 0
    # Chunks of objects to visit, each with the scale its objects are counted at.
    chunks = [_sampled(examples, 1.0, _EXAMPLES)]
    total += getsizeof(examples)
    seen.add(id(examples))
    while chunks and visits <= _MAX_VISITS:
        objs, weight = chunks.pop()
        for obj in objs:
            key = id(obj)
            if key in seen:
                continue
            seen.add(key)
            visits += 1
            t = type(obj)
            if t in atoms:
                total += weight * getsizeof(obj)
                continue
            if t in _CONTAINERS:
                total += weight * getsizeof(obj)
                if t is dict:
                    items = list(dict.values(obj))
                    items += dict.keys(obj)
                else:
                    items = obj if t is list or t is tuple else list(obj)
            elif t is ndarray:
                total += weight * (sizeof(obj) + obj.nbytes)
                if not obj.dtype.hasobject:
                    continue
                items = list(obj.ravel())
            elif issubclass(t, _NOT_DATA):
                continue
            else:
                # An instance: its builtin base's size (a dict subclass's table...) and what
                # its type's traversal reaches (instance dict, slots, items).
                base = next((b for b in t.__mro__ if b in _CONTAINERS or b in atoms), object)
                total += weight * (base.__sizeof__(obj) if base is not object else sizeof(obj))
                items = referents(obj)
            if items:
                chunks.append(_sampled(items, weight, _SAMPLE))
    return int(total)


def _sampled(items, weight: float, most: int) -> tuple:
    """``(items to visit, their scale)``: all of them, or ``most`` evenly spaced, scaled."""
    n = len(items)
    if n <= most:
        return items, weight
    step = n / most
    return [items[int(k * step)] for k in range(most)], weight * step


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
