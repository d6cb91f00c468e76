"""One suite, run against every available backend (the ``atlas`` fixture).

``atlas`` is a module holding ``AtlasDataset`` and ``AtlasDatasetShard`` over one backend:
``atlas_fast.atlas`` when the compiled backend is selected (param "cython"), and
``atlas_fast._python`` always (param "python"). Writers do not depend on the backend.
"""

from __future__ import annotations

import pytest
from helpers import FIXTURES, fixture_cases

import atlas_fast
import atlas_fast._python
import atlas_fast.atlas

BACKENDS = ["cython", "python"] if atlas_fast.BACKEND == "cython" else ["python"]
_MODULES = {"cython": atlas_fast.atlas, "python": atlas_fast._python}


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def atlas(backend):
    return _MODULES[backend]


@pytest.fixture(params=fixture_cases() or ["<no fixtures>"])
def reference_case(request) -> str:
    if request.param == "<no fixtures>":
        pytest.skip(f"reference fixtures not found at {FIXTURES} (set ATLAS_FAST_FIXTURES)")
    return request.param
