"""What an installed build must provide, checked in fresh interpreters.

The wheel builds (cibuildwheel's test-command, tools/check_wheel.sh) set
``ATLAS_FAST_EXPECT_BACKEND`` to the backend that platform's wheel must select by default:
``cython`` where the compiled core is built and binds a libzstd, ``python`` on Windows, where
the compiled core is not built (and the facade selects the Python backend without a warning).
``ATLAS_FAST_EXPECT_INSTALLED=1`` says the package under test must be the installed one, not a
source tree. Without them only the checks that hold for every build run.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

EXPECT_BACKEND = os.environ.get("ATLAS_FAST_EXPECT_BACKEND", "").strip()
EXPECT_INSTALLED = os.environ.get("ATLAS_FAST_EXPECT_INSTALLED", "").strip() == "1"
NOT_INSTALLED = (
    "ATLAS_FAST_EXPECT_INSTALLED=1 is not set: a check of an installed wheel (set by "
    "tools/check_wheel.sh and cibuildwheel), not of a checkout"
)

_PROBE = textwrap.dedent(
    """
    import json, warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import atlas_fast
    import atlas_fast._backend
    print(json.dumps({
        "backend": atlas_fast.BACKEND,
        "file": atlas_fast.__file__,
        "warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],
        "extension_error": atlas_fast._backend.extension_error,
        "zstd": atlas_fast.zstd_library(),
    }))
    """
)


def _probe(**env_overrides: str | None) -> dict:
    """Import atlas_fast in a fresh interpreter; what it selected and what it warned."""
    env = dict(os.environ)
    env.pop("ATLAS_FAST_NO_EXTENSIONS", None)
    for key, value in env_overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, check=False
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_no_extensions_env_selects_python_quietly():
    seen = _probe(ATLAS_FAST_NO_EXTENSIONS="1")
    assert seen["backend"] == "python"
    assert seen["warnings"] == []
    assert seen["zstd"]["backend"] == "python"


@pytest.mark.skipif(
    not EXPECT_BACKEND,
    reason="ATLAS_FAST_EXPECT_BACKEND is not set: set it to the backend this build must select "
    "by default (tools/test.sh, CI and the wheel builds do)",
)
def test_default_backend_is_the_one_this_platform_ships():
    assert EXPECT_BACKEND in ("cython", "python"), EXPECT_BACKEND
    seen = _probe()
    assert seen["backend"] == EXPECT_BACKEND, seen
    if EXPECT_BACKEND == "cython":
        # The compiled core is in use, silently, and reports the libzstd it bound.
        assert seen["warnings"] == [], seen
        assert seen["extension_error"] is None, seen
        assert seen["zstd"]["backend"] == "cython", seen
        assert seen["zstd"]["path"], seen
    else:
        # No compiled core in this build: the pure-Python backend serves. On Windows that is by
        # design (the core is POSIX-only) and quiet; elsewhere it is announced, once, loudly.
        assert seen["extension_error"], seen
        if os.name == "nt":
            assert seen["warnings"] == [], seen
        else:
            assert len(seen["warnings"]) == 1, seen
            assert "pure-Python backend" in seen["warnings"][0], seen


@pytest.mark.skipif(not EXPECT_INSTALLED, reason=NOT_INSTALLED)
def test_package_under_test_is_the_installed_one():
    package = Path(_probe()["file"]).resolve().parent
    site = {Path(sysconfig.get_path(key)).resolve() for key in ("purelib", "platlib")}
    assert package.parent in site, f"atlas_fast imported from {package}, not from {site}"


@pytest.mark.skipif(not EXPECT_INSTALLED, reason=NOT_INSTALLED)
def test_installed_metadata_carries_the_package_version():
    import atlas_fast

    assert importlib.metadata.version("atlas-fast") == atlas_fast.__version__


_SOURCE_TREE = Path(__file__).resolve().parents[1]


_NEEDS_SOURCE_TREE = pytest.mark.skipif(
    not (_SOURCE_TREE / "setup.py").is_file() or not (_SOURCE_TREE / "atlas_fast").is_dir(),
    reason="no source tree beside the tests (the suite copied out of an sdist)",
)


def _copy_of_the_source_tree(into: Path) -> Path:
    """What a build reads of the checkout (no tests, docs or build leftovers), in ``into``."""
    import shutil

    source = into / "tree"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "CHANGELOG.md",
                 "LICENSE"):  # fmt: skip
        if (_SOURCE_TREE / name).exists():
            shutil.copy2(_SOURCE_TREE / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.c", "*.pyd", "*.html")
    shutil.copytree(_SOURCE_TREE / "atlas_fast", source / "atlas_fast", ignore=ignore)
    shutil.copytree(_SOURCE_TREE / "src", source / "src", ignore=ignore)
    return source


@_NEEDS_SOURCE_TREE
def test_a_built_wheel_carries_every_module_of_the_source_tree(tmp_path):
    """The wheel a user installs holds every module of atlas_fast/, subpackages included.

    The editable install the suite runs against imports from the source tree, so a package
    left out of the build configuration would pass every other test and break every install.
    The wheel is built without the compiled core (its modules are checked by the wheel builds).
    """
    import zipfile

    source = _copy_of_the_source_tree(tmp_path)
    modules = {
        path.relative_to(source).as_posix() for path in (source / "atlas_fast").rglob("*.py")
    }
    env = dict(os.environ, ATLAS_FAST_NO_EXTENSIONS="1")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(tmp_path / "out"), str(source)],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp_path / "out").glob("atlas_fast-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    missing = modules - names
    assert not missing, f"{wheel.name} lacks {sorted(missing)}"
    assert "atlas_fast/py.typed" in names


@_NEEDS_SOURCE_TREE
def test_the_sdist_carries_the_compiled_sources_in_src(tmp_path):
    """Wheels are built from the sdist: every .pyx/.pxi/.pxd of src/ must be in it, and no
    generated C (each build cythonizes again). Wheels are tested with the sdist's tests/, so
    it carries tests/golden's datasets too."""
    import shutil
    import tarfile

    source = _copy_of_the_source_tree(tmp_path)
    shutil.copytree(_SOURCE_TREE / "tests" / "golden", source / "tests" / "golden")
    golden = {p.relative_to(source) for p in source.joinpath("tests").rglob("*") if p.is_file()}
    compiled = {p.name for p in source.joinpath("src").iterdir() if p.suffix != ".c"}
    assert {"_reader.pyx", "_pickle_scan.pyx", "_compress.pyx", "zstd.pxd"} <= compiled
    build = subprocess.run(
        [sys.executable, "-c",
         "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])",
         str(tmp_path / "out")],
        capture_output=True, text=True, cwd=source,
        env=dict(os.environ, ATLAS_FAST_NO_EXTENSIONS="1"), check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    (sdist,) = (tmp_path / "out").glob("atlas_fast-*.tar.gz")
    with tarfile.open(sdist) as archive:
        shipped = {Path(name).relative_to(Path(name).parts[0]) for name in archive.getnames()}
    in_src = {p.name for p in shipped if p.parent == Path("src")}
    assert compiled <= in_src, f"{sdist.name} lacks {sorted(compiled - in_src)} of src/"
    assert not {n for n in in_src if n.endswith(".c")}
    assert golden <= shipped, f"{sdist.name} lacks {sorted(map(str, golden - shipped))[:5]}"
