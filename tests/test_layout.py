"""The package's layout: imports run one way (no module imports one that imports it back).

Every import counts, at module level or inside a function (a lazy import is still an arrow:
the Ray integration once had a circle made of one). Read from the sources, nothing imported.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import atlas_fast

PACKAGE = Path(atlas_fast.__file__).parent
# The compiled sources: each src/NAME.pyx builds the module atlas_fast._core.NAME (setup.py)
SOURCES = PACKAGE.parent / "src"

pytestmark = pytest.mark.skipif(
    not (PACKAGE.parent / "setup.py").is_file(),
    reason="atlas_fast is imported from an install, not a source tree: no layout to read",
)
# A Python import statement in Cython source (a ``cimport`` is C-level, not an import)
_PYTHON_IMPORT = re.compile(
    r"^[ \t]*(?:from[ \t]+[\w.]+[ \t]+import[ \t]+(?:\([^)]*\)|[^\n]*)|import[ \t]+[^\n]*)$",
    re.MULTILINE,
)


def _modules() -> dict:
    """``{dotted module name: source path}`` of every .py under the package and .pyx in src/."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    for path in sorted(SOURCES.glob("*.pyx")):
        found[f"atlas_fast._core.{path.stem}"] = path
    return found


def _is_package(name: str, modules: dict) -> bool:
    return modules[name].name == "__init__.py"


def _imports(name: str, path: Path, modules: dict) -> set:
    """The package's own modules that module ``name`` imports."""
    source = path.read_text()
    if path.suffix == ".pyx":  # Cython: its Python imports, and those of the units it includes
        units = [source, *(u.read_text() for u in sorted(path.parent.glob("*.pxi")))]
        source = "\n".join(
            match.group(0).strip() for unit in units for match in _PYTHON_IMPORT.finditer(unit)
        )
    tree = ast.parse(source)
    here = name if _is_package(name, modules) else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            # ``from pkg import sub`` imports the module pkg.sub when there is one
            targets = [
                f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin
                for alias in node.names
            ]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def _graph() -> dict:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycle(graph: dict):
    """One circle of imports as a list of module names, or None."""
    state: dict = {}
    stack: list = []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_walk_sees_the_package():
    graph = _graph()
    assert {"atlas_fast", "atlas_fast.atlas", "atlas_fast._core._reader"} <= set(graph)
    assert "atlas_fast._core._reader_py" in graph["atlas_fast._backend"]
    assert "atlas_fast._core._pool" in graph["atlas_fast._core._reader"]  # from the .pyx
    assert "atlas_fast.ray._rows" in graph["atlas_fast.ray._data"]


def test_no_import_cycle():
    assert _cycle(_graph()) is None


def test_the_walk_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize(
    "lower, upper",
    [
        ("atlas_fast._core", "atlas_fast.atlas"),
        ("atlas_fast._core", "atlas_fast.writer"),
        ("atlas_fast._format", "atlas_fast._core"),
        ("atlas_fast._errors", "atlas_fast._format"),
        ("atlas_fast._writing", "atlas_fast.writer"),
        ("atlas_fast.storage", "atlas_fast.atlas"),
        ("atlas_fast.storage", "atlas_fast._core"),
        ("atlas_fast.storage", "atlas_fast.cli"),
        ("atlas_fast._format", "atlas_fast.storage"),
        ("atlas_fast.storage._object", "atlas_fast._format"),
        ("atlas_fast.storage._blocks", "atlas_fast._format"),
    ],
)
def test_imports_run_downward(lower, upper):
    """Cores never import the facade; shared format code never imports a core; storage sits
    below the readers and the cores, and only its ``_dataset`` knows the format."""
    graph = _graph()
    for name, imported in graph.items():
        if name == lower or name.startswith(lower + "."):
            above = {m for m in imported if m == upper or m.startswith(upper + ".")}
            assert not above, f"{name} imports {sorted(above)}"


def test_the_compiled_sources_live_in_src_beside_no_twin():
    """The layout the design card names: .pyx/.pxi/.pxd under src/, each compiled module's
    pure-Python twin in the package under the module's name with ``_py`` (when it has one)."""
    in_package = sorted(
        p.relative_to(PACKAGE.parent).as_posix()
        for suffix in ("*.pyx", "*.pxi", "*.pxd")
        for p in PACKAGE.rglob(suffix)
    )
    assert not in_package, f"compiled sources outside src/: {in_package}"
    compiled = {p.stem for p in SOURCES.glob("*.pyx")}
    assert compiled == {"_reader", "_pickle_scan", "_compress"}
    for twin in ("_reader", "_compress"):
        assert (PACKAGE / "_core" / f"{twin}_py.py").is_file()
    setup = (PACKAGE.parent / "setup.py").read_text()
    for name in compiled:
        assert f'"atlas_fast._core.{name}"' in setup, f"setup.py builds no module from {name}.pyx"
