"""One suite, run against every available backend (the ``atlas`` fixture).

``atlas`` is a module holding ``AtlasDataset`` and ``AtlasDatasetShard`` over one backend:
``atlas_fast.atlas`` when the compiled backend is selected (param "cython"), and
``atlas_fast._python`` always (param "python"). Writers do not depend on the backend.
"""

from __future__ import annotations

import logging

import pytest
from helpers import fixture_cases

import atlas_fast
import atlas_fast._python
import atlas_fast.atlas

BACKENDS = ["cython", "python"] if atlas_fast.BACKEND == "cython" else ["python"]
_MODULES = {"cython": atlas_fast.atlas, "python": atlas_fast._python}


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request) -> str:
    return request.param


def _applies(mark, params: dict) -> bool:
    """Whether a test's parameters are among those its ``only`` mark names: ``only(name=value
    or (values...))`` per parametrized fixture or argument, and/or ``only(predicate)`` over
    the parameters' dict."""
    for name, allowed in mark.kwargs.items():
        if name in params:
            allowed = allowed if isinstance(allowed, (tuple, list, set)) else (allowed,)
            if params[name] not in allowed:
                return False
    return all(predicate(params) for predicate in mark.args)


def pytest_collection_modifyitems(config, items):
    """A test about one backend (or some parameters) is marked ``only(backend="cython")``:
    its other parametrizations are not tests at all, so they are deselected at collection,
    not skipped (a skip is left for what a user can act on: a missing server or package)."""
    kept, dropped = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        applies = all(_applies(mark, params) for mark in item.iter_markers("only"))
        (kept if applies else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="session")
def atlas(backend):
    return _MODULES[backend]


@pytest.fixture(scope="session", autouse=True)
def read_ahead_never_backs_off():
    """The compiled read-ahead backs off while the cores are busy (its thread sharing the
    reading thread's core, or keeping it waiting): off for the suite, whose counts of blocks
    read ahead must not depend on the machine's load. test_readahead.py turns it on where it
    is the subject, and runs passes, threads and close() with a back-off in force."""
    if atlas_fast.BACKEND != "cython":
        yield
        return
    from atlas_fast._core import _reader

    old = _reader._readahead_backoff(None, None)
    yield
    _reader._readahead_backoff(*old)


@pytest.fixture(params=fixture_cases())
def reference_case(request) -> str:
    """A dataset written by the reference package: tests/golden's (ATLAS_FAST_FIXTURES adds
    more); ``helpers.case_dataset`` and ``helpers.load_expected`` give its files and examples."""
    return request.param


@pytest.fixture(scope="module")
def ray():
    """A local 2-CPU Ray cluster for one test module (skipped without the ray extra), with
    Ray Data keeping the dataset's order."""
    ray = pytest.importorskip("ray", reason="the atlas-fast[ray] extra is not installed")
    ray.init(
        num_cpus=2,
        object_store_memory=256 * 2**20,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
    )
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.execution_options.preserve_order = True  # read back in dataset order
    yield ray
    ray.shutdown()
