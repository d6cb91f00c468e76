"""Build configuration: only which extension modules to build, and their directives.

Everything else lives in pyproject.toml. ``ATLAS_FAST_NO_EXTENSIONS=1`` builds the pure-Python
package (no compiler needed). ``ATLAS_FAST_DEBUG_BUILD=1`` compiles the reader with bounds
checks, -O0 and -g (for debuggers and sanitizer runs).

The compiled reader is POSIX-only (mmap(2), dlopen(3)); on Windows the package installs the
pure-Python backend, which is correct there. On CPython a failed compile is a failed
install, never a silent fallback.
"""

import glob
import os
import platform
import sys

from setuptools import Extension, setup
from setuptools.dist import Distribution

# The compiled sources: src/NAME.pyx builds atlas_fast._core.NAME, whose pure-Python twin (if
# any) is atlas_fast/_core/NAME_py.py. The scanner's C API is src/atlas_fast._core._pickle_scan.pxd:
# Cython looks a cimported module's .pxd up by its dotted name in the include path.
_SRC = "src"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _extensions() -> list:
    if _env_flag("ATLAS_FAST_NO_EXTENSIONS") or os.name != "posix":
        return []
    from Cython.Build import cythonize

    debug = _env_flag("ATLAS_FAST_DEBUG_BUILD")
    directives = {
        "language_level": 3,
        "boundscheck": debug,
        "wraparound": False,
        "initializedcheck": debug,
        "cdivision": True,
        "embedsignature": True,
    }
    reader = Extension(
        "atlas_fast._core._reader",
        [f"{_SRC}/_reader.pyx"],
        # Its units, included textually (see _reader.pyx): a change to one rebuilds it.
        depends=[
            *sorted(glob.glob(f"{_SRC}/*.pxi")),
            f"{_SRC}/zstd.pxd",
            f"{_SRC}/atlas_fast._core._pickle_scan.pxd",
        ],
        libraries=["dl"] if sys.platform.startswith("linux") else [],
        extra_compile_args=["-O0", "-g"] if debug else [],
        extra_link_args=["-g"] if debug else [],
        # Elsewhere than CPython the pure-Python backend is a fine fallback.
        optional=platform.python_implementation() != "CPython",
    )
    # The pickle scanner: its own module, whose C API (_pickle_scan.pxd) the reader cimports.
    scanner = Extension(
        "atlas_fast._core._pickle_scan",
        [f"{_SRC}/_pickle_scan.pyx"],
        extra_compile_args=reader.extra_compile_args,
        extra_link_args=reader.extra_link_args,
        optional=reader.optional,
    )
    # The writer's block compressor: its own module (it shares nothing with reading but libzstd,
    # which it binds for itself from the same library).
    compressor = Extension(
        "atlas_fast._core._compress",
        [f"{_SRC}/_compress.pyx"],
        depends=[f"{_SRC}/_libzstd.pxi", f"{_SRC}/zstd.pxd"],
        libraries=reader.libraries,
        extra_compile_args=reader.extra_compile_args,
        extra_link_args=reader.extra_link_args,
        optional=reader.optional,
    )
    return cythonize(
        [reader, scanner, compressor], compiler_directives=directives, include_path=[_SRC]
    )


class _PlatformWheel(Distribution):
    """Tags the wheel for this interpreter and platform although it carries no compiled module.

    Used where the compiled reader is not built (Windows): a pure ``py3-none-any`` wheel would
    be chosen by pip on every platform without a wheel of its own, in place of compiling the
    sdist, and cibuildwheel rejects pure wheels.
    """

    def has_ext_modules(self):
        return True


_options = {}
if os.name != "posix" and not _env_flag("ATLAS_FAST_NO_EXTENSIONS"):
    _options["distclass"] = _PlatformWheel

setup(ext_modules=_extensions(), **_options)
