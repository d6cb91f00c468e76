"""Build configuration: only which extension modules to build, and their directives.

Everything else lives in pyproject.toml. ``ATLAS_FAST_NO_EXTENSIONS=1`` builds the pure-Python
package (no compiler needed).
"""

import os

from setuptools import setup

ext_modules = []
if os.environ.get("ATLAS_FAST_NO_EXTENSIONS", "").strip().lower() in ("", "0", "false", "no"):
    pass  # the compiled reader (src/_reader.pyx) is added by the Cython core

setup(ext_modules=ext_modules)
