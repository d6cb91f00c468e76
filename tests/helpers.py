"""Test helpers shared by the suite (imported as ``helpers``; tests/ is on sys.path)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np

_DEFAULT_FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "reference"
FIXTURES = Path(os.environ.get("ATLAS_FAST_FIXTURES", _DEFAULT_FIXTURES))


def fixture_cases() -> list:
    """Names of the reference-written datasets under FIXTURES (empty if it is absent)."""
    if not FIXTURES.is_dir():
        return []
    return sorted(p.name for p in FIXTURES.iterdir() if (p / "dataset").is_dir())


def load_expected(case: str) -> list:
    with open(FIXTURES / case / "expected.pkl", "rb") as f:
        return pickle.load(f)


def same(a, b) -> bool:
    """Deep equality that also compares types, and numpy arrays by dtype, shape and values."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


def assert_same(a, b, where="") -> None:
    assert same(a, b), f"{where}: {a!r:.200} != {b!r:.200}"


def open_fd_count() -> int:
    """Open file descriptors of this process (Linux /proc; macOS /dev/fd)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        if os.path.isdir(folder):
            return len(os.listdir(folder))
    raise RuntimeError("cannot count open file descriptors on this platform")
