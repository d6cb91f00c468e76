"""The real reference package, ``torch_atlas_ds``, when it is importable.

Every "x the reference" figure of the benchmarks is a ratio to this package, timed in the same
run on the same files. When it cannot be imported, the benchmarks say why and compute no such
ratio: atlas_fast's pure-Python backend (``atlas_fast[python]``) is our own code, not the
reference, and never stands in for it.

``ATLAS_FAST_BENCH_HIDE=torch_atlas_ds`` makes it count as not installed (tests use it).
"""

from __future__ import annotations

import importlib
import importlib.util
import os

__all__ = ["NAME", "describe", "hidden", "load"]

NAME = "torch_atlas_ds"
DISTRIBUTION = "torch-atlas-ds"
# It is not on PyPI: from its public source. --no-deps: its metadata asks for numpy < 2 (it
# reads and writes with numpy 2); it imports torch, which must be installed.
INSTALL_HINT = (
    "it is not on PyPI; install it from its source with "
    "pip install --no-deps 'git+https://github.com/EIDOSLAB/torch-atlas-ds' (it needs torch, "
    "numpy and zstandard: pip install torch)"
)


def hidden(name: str) -> bool:
    """Whether ``ATLAS_FAST_BENCH_HIDE`` lists the top-level package ``name``."""
    names = os.environ.get("ATLAS_FAST_BENCH_HIDE", "")
    return name in {n.strip() for n in names.split(",")}


def load():
    """``(module, None)`` when the reference imports, else ``(None, reason)``."""
    if hidden(NAME):
        return None, f"{NAME} hidden by ATLAS_FAST_BENCH_HIDE"
    if importlib.util.find_spec(NAME) is None:
        return None, f"{NAME} (the reference) is not installed: {INSTALL_HINT}"
    try:
        module = importlib.import_module(NAME)
    except Exception as exc:
        return None, f"import {NAME} failed: {type(exc).__name__}: {exc}"
    return module, None


def describe(module) -> dict:
    """Version, label and where the module was imported from (so a stand-in shows)."""
    from importlib import metadata

    version = getattr(module, "__version__", None)
    if version is None:
        try:
            version = metadata.version(DISTRIBUTION)
        except metadata.PackageNotFoundError:
            version = "?"
    return {
        "version": version,
        "label": f"{NAME} {version} (reference)",
        "file": getattr(module, "__file__", None),
    }
