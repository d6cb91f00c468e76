"""Picks the backend once, at import: the compiled ``_reader`` unless told otherwise.

``ATLAS_FAST_NO_EXTENSIONS=1`` forces the pure-Python backend. Without it, a missing or
unloadable extension is reported with one loud warning (a silent fallback hides a slow
install), and the pure-Python backend serves. Windows has no compiled reader (it is built on
POSIX only) and uses the pure-Python backend quietly.
"""

from __future__ import annotations

import importlib
import os
import warnings

__all__ = ["core", "compressor", "BACKEND", "extension_error"]

extension_error: str | None = None


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _select():
    global extension_error
    if _env_flag("ATLAS_FAST_NO_EXTENSIONS"):
        from ._core import _reader_py

        return _reader_py
    try:
        _reader = importlib.import_module(f"{__package__}._core._reader")
    except ImportError as exc:
        extension_error = f"{type(exc).__name__}: {exc}"
        if os.name == "nt":
            # The compiled reader is POSIX-only by design (mmap(2), dlopen(3)): Windows always
            # uses the pure-Python backend, so there is nothing to warn about.
            from ._core import _reader_py

            return _reader_py
    else:
        if _reader.zstd_available():
            return _reader
        extension_error = _reader.zstd_load_error()
    warnings.warn(
        "atlas_fast: the compiled reader is unavailable, using the much slower pure-Python "
        f"backend ({extension_error}). Set ATLAS_FAST_NO_EXTENSIONS=1 to choose it quietly.",
        RuntimeWarning,
        stacklevel=3,
    )
    from ._core import _reader_py

    return _reader_py


def _select_compressor():
    """The writer's block compressor that goes with ``core``: compiled with the compiled core."""
    if core.BACKEND == "cython":
        try:
            compiled = importlib.import_module(f"{__package__}._core._compress")
        except ImportError:
            pass  # the reading core is what matters; python-zstandard's frames are the same
        else:
            if compiled.zstd_available():
                return compiled
    from ._core import _compress_py

    return _compress_py


core = _select()
compressor = _select_compressor()
BACKEND: str = core.BACKEND
