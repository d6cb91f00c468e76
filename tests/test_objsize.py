"""What the block cache charges a block (atlas_fast._core._objsize, shared by both cores): about the
memory its examples take, never less than its pickle, whatever the examples are."""

from __future__ import annotations

import dataclasses
import functools
import pickle
import tracemalloc

import numpy as np
import pytest

from atlas_fast._core._objsize import (
    MEASURE_EVERY,
    MEASURE_FIRST,
    WINDOW,
    ChargeMeter,
    objects_bytes,
)


def taken(examples, protocol=pickle.HIGHEST_PROTOCOL) -> tuple:
    """(pickle bytes, what unpickling them allocates by tracemalloc, the unpickled list)."""
    data = pickle.dumps(examples, protocol=protocol)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        out = pickle.loads(data)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return len(data), used, out


def row(i):
    return {"id": i, "x": i * 0.25, "ok": i % 2 == 0, "name": f"n{i % 97}", "k": [i, i + 1]}


@dataclasses.dataclass
class Slotted:
    __slots__ = ("values",)
    values: list


CASES = {
    "rows": [row(i) for i in range(64)],
    "documents": [{"id": str(i), "text": "lorem ipsum " * (50 + i)} for i in range(16)],
    "arrays, protocol 5": [np.full(20_000, i, dtype=np.float64) for i in range(8)],
    "one big list": [list(range(300_000))],
    "a big dict": [{str(i): i for i in range(50_000)}],
    "slots": [Slotted(list(range(20_000)))],
    "object array": [np.array([str(i) for i in range(5_000)], dtype=object)],
}


def deep_size(root) -> int:
    """Every object reachable from ``root`` by sys.getsizeof, each once (no sampling)."""
    import sys

    seen, total, stack = set(), 0, [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.values())
            stack.extend(obj.keys())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    return total


@pytest.mark.parametrize("case", list(CASES))
def test_objects_bytes_is_about_what_unpickling_allocates(case):
    _, used, out = taken(CASES[case])
    # Small objects may come from free lists, which tracemalloc does not see: then the
    # builtin objects counted one by one are the larger figure.
    used = max(used, deep_size(out))
    assert 0.6 * used <= objects_bytes(out) <= 1.6 * used


def _meters():
    """ChargeMeter, and the compiled core's twin of it when built."""
    meters = [pytest.param(ChargeMeter, id="python")]
    try:
        from atlas_fast._core import _reader
    except ImportError:
        return meters
    return [*meters, pytest.param(_reader.ChargeMeter, id="cython")]


@pytest.fixture(params=_meters())
def meter_class(request):
    return request.param


def test_charge_is_never_below_the_pickle(meter_class):
    meter = meter_class()
    calls = [functools.partial(print, i) for i in range(16)]  # measure to almost nothing
    for _ in range(3):
        assert meter.charge(calls, 10_000) >= 10_000


class Hostile:
    """An example whose attributes and size hooks raise: measuring must not call them."""

    def __init__(self, i):
        self.i = i

    @property
    def base(self):
        raise ValueError("base")

    @property
    def nbytes(self):
        raise ValueError("nbytes")

    def __sizeof__(self):
        raise ValueError("sizeof")

    def __getattr__(self, name):  # a lookup that fails with KeyError, dunders aside
        if name.startswith("__"):
            raise AttributeError(name)
        raise KeyError(name)


def test_measuring_runs_no_code_of_the_examples(meter_class):
    examples = [Hostile(i) for i in range(20)]
    assert objects_bytes(examples) > 0
    meter = meter_class()
    assert all(meter.charge(examples, 500) >= 500 for _ in range(MEASURE_FIRST + 2))


def test_the_ratio_follows_the_examples(meter_class):
    """A dataset whose later shards hold other examples: the charge follows within WINDOW
    measurements."""
    docs = [{"text": "x" * 5000} for _ in range(16)]
    rows = [row(i) for i in range(64)]
    docs_size, rows_size = len(pickle.dumps(docs)), len(pickle.dumps(rows))
    meter = meter_class()
    for _ in range(50):
        assert meter.charge(docs, docs_size) < 1.5 * docs_size
    charges = [meter.charge(rows, rows_size) for _ in range(MEASURE_EVERY * (WINDOW + 1))]
    assert charges[-1] > 3 * rows_size


def test_both_meters_charge_alike():
    """The compiled core's meter charges what ChargeMeter does, put after put: the same
    schedule of measurements, window and ratio."""
    meters = [m.values[0]() for m in _meters()]
    docs = [{"text": "x" * 5000} for _ in range(16)]
    rows = [row(i) for i in range(64)]
    calls = [functools.partial(print, i) for i in range(16)]
    sequence = [(docs, 80_000)] * 300 + [(rows, 3_000), (calls, 0), (docs, 1)] * 400
    sequence += [([Hostile(i) for i in range(4)], 700)] * 600
    charges = [[m.charge(examples, nbytes) for examples, nbytes in sequence] for m in meters]
    assert all(c == charges[0] for c in charges)
    assert len(set(charges[0])) > 4  # the ratio moved


def test_hostile_examples_read_on_every_path(atlas, tmp_path):
    """Examples whose attribute hooks raise read through ds[i], batches, iteration and
    read_block, every block charged (measured or not)."""
    from atlas_fast import AtlasDatasetWriter

    n = 8 * (MEASURE_FIRST + 4)
    with AtlasDatasetWriter(tmp_path / "ds", n, 8, compression_strategy=1) as w:
        for i in range(n):
            w.add_example(Hostile(i))
    ds = atlas.AtlasDataset(tmp_path / "ds")
    assert [x.i for x in (ds[i] for i in range(n))] == list(range(n))
    assert [x.i for x in ds.__getitems__(list(range(n))[::-3])] == list(range(n))[::-3]
    assert [x.i for x in ds] == list(range(n))
    shard = ds.shards[0]
    assert [x.i for b in range(n // 8) for x in shard.read_block(b)] == list(range(n))
    assert ds.cache_info().currsize > 0
