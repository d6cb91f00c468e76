"""The export tests read the source through the backend under test: ``exporting`` points
``atlas_fast.export._run.READER_MODULE`` (a private name: the one seam that picks the reader
a worker opens) at the ``atlas`` fixture's module."""

from __future__ import annotations

import pytest


@pytest.fixture
def exporting(atlas, monkeypatch):
    from atlas_fast.export import _run

    monkeypatch.setattr(_run, "READER_MODULE", atlas.__name__)
    return atlas
