"""The documentation: the site builds with warnings as errors, every ```python block of the
README and of the guides runs, and the performance tables are what the committed benchmark
runs give.

A renamed or removed public name breaks the site's build (the API reference and the guides'
cross-references resolve against the package); a renamed argument breaks the example that
passes it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

if not (ROOT / "mkdocs.yml").exists():
    # cibuildwheel runs this suite from a copy of tests/ beside no source tree.
    pytest.skip("the documentation sources are not beside these tests", allow_module_level=True)


def _guides() -> list:
    return [ROOT / "README.md", *sorted(p for p in DOCS.glob("*.md"))]


# -- the site -------------------------------------------------------------------------------


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.fail("mkdocs is not installed: pip install -e '.[docs]' (the test extra has it)")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    # A process of its own, started in the checkout: the API reference inspects the live
    # package, which must be this checkout's.
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    assert not [line for line in log.splitlines() if line.startswith("WARNING")], log
    # The readers are built at import time: the reference renders them from the live
    # classes, inherited core methods included.
    readers = (site / "api" / "atlas.html").read_text()
    for name in (
        "AtlasDataset",
        "AtlasDataset.cache_info",
        "AtlasDataset.__getitems__",
        "AtlasDatasetShard",
        "AtlasDatasetShard.read_block",
    ):
        assert f'id="atlas_fast.atlas.{name}"' in readers, name
    assert 'id="atlas_fast.convert.convert_parquet"' in (site / "api" / "convert.html").read_text()
    # Every guide is in the site, as page.html, and every link between pages names a file
    # (opened from disk, a link to a folder shows the folder).
    for guide in DOCS.glob("*.md"):
        assert (site / f"{guide.stem}.html").exists(), guide.stem
    pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")  # a server's
    for page in pages:
        for link in re.findall(r'href="([^"#?]*)(?:[#?][^"]*)?"', page.read_text()):
            if link and "://" not in link and not link.startswith(("mailto:", "data:")):
                target = (page.parent / link).resolve()
                assert target.is_file(), f"{page.relative_to(site)} links to {link}"
    # The API reference: the prose of docstrings has no reStructuredText "::" left (they
    # render as Markdown), and every exception class the package exports is documented.
    api = {p.stem: p.read_text() for p in (site / "api").glob("*.html")}
    for name, text in api.items():
        prose = re.sub(r"<(pre|code)\b.*?</\1>", "", text, flags=re.S)
        prose = re.sub(r"<[^>]+>", "", prose)
        assert "::" not in prose, f"api/{name}.html shows a literal '::'"
    import atlas_fast

    errors = [n for n in atlas_fast.__all__ if isinstance(getattr(atlas_fast, n), type)]
    errors = [n for n in errors if issubclass(getattr(atlas_fast, n), BaseException)]
    assert len(errors) >= 8
    for name in errors:
        assert f'id="atlas_fast.{name}"' in api["atlas_fast"], name


def test_the_readme_links_to_files_that_exist():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    local = [link for link in links if "://" not in link]
    assert "docs/reading.md" in local
    for link in local:
        assert (ROOT / link).exists(), link


# -- calls written in the prose ------------------------------------------------------------


def _check_calls():
    spec = importlib.util.spec_from_file_location("_docs_check_calls", DOCS / "_ext/check_calls.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_keywords_the_prose_names_exist():
    """The build checks the guides (docs/_ext/check_calls.py, an MkDocs hook); the README too."""
    check = _check_calls()
    callables = check.public_callables()
    for page in _guides():
        assert check.problems(page.read_text(), callables) == [], page


def test_a_renamed_keyword_is_a_problem():
    check = _check_calls()
    callables = check.public_callables()
    text = (
        "Open it with `AtlasDataset(root, cache_byte=N)`, then\n"
        "[`BlockShuffleSampler(ds, window_blocks=8,\nseeds=1)`][x]; `len(ds) == 3` and\n"
        "`AtlasDataset(root, cache_bytes=N)` are fine.\n\n"
        "```python\nAtlasDataset(root, not_checked_here=1)  # code blocks are run instead\n```\n"
    )
    assert check.problems(text, callables) == [
        "`AtlasDataset(root, cache_byte=N)`: AtlasDataset() has no parameter 'cache_byte'",
        "`BlockShuffleSampler(ds, window_blocks=8, seeds=1)`: BlockShuffleSampler() has no "
        "parameter 'seeds'",
    ]


# -- the code blocks ------------------------------------------------------------------------

_FENCE = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
# Optional packages a block may need; such a block (and those after it on the page, which
# may use what it made) is skipped only where the package is not installed.
_OPTIONAL = ("torch", "ray", "pyarrow")


def _blocks(path: Path) -> list:
    """``(line, code)`` of each ```python block of ``path``."""
    text = path.read_text()
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in _FENCE.finditer(text)]


def _missing(code: str) -> list:
    needed = {
        name
        for name in _OPTIONAL
        if re.search(rf"^\s*(import|from)\s+{name}\b", code, re.M)
        or re.search(rf"^\s*import .*\b{name}\b", code, re.M)
    }
    return sorted(n for n in needed if importlib.util.find_spec(n) is None)


def _runnable(page: Path) -> tuple:
    """The blocks of ``page`` to run, and why the rest are not run (or None)."""
    blocks = _blocks(page)
    for k, (line, code) in enumerate(blocks):
        missing = _missing(code)
        if missing:
            return blocks[:k], f"{page.name}:{line} and after need {', '.join(missing)}"
    return blocks, None


def _with_checkout_on_path(env: dict) -> dict:
    # Processes the examples start (Ray workers, spawned converters) import this checkout's
    # atlas_fast too, as the test process does.
    path = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}


# docs/remote.md's blocks need an S3 server: tests/remote/test_remote_guide.py runs them
# against moto's, with the dataset they name uploaded.
REMOTE_GUIDE = ROOT / "docs" / "remote.md"
_PAGES = [p for p in _guides() if _blocks(p) and p != REMOTE_GUIDE]

# Run in a process of its own, on the pure-Python backend: from stdin (JSON), each page's
# blocks in a directory and a namespace of the page's own.
_RUNNER = """
import json, os, sys
import atlas_fast
assert atlas_fast.BACKEND == "python", atlas_fast.BACKEND
for k, blocks in enumerate(json.load(sys.stdin)):
    os.mkdir(str(k))
    os.chdir(str(k))
    namespace = {"__name__": "__docs__"}
    for where, code in blocks:
        exec(compile(code, where, "exec"), namespace)
    os.chdir("..")
"""


@pytest.mark.parametrize("page", _PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_runs(page, tmp_path, monkeypatch):
    """The blocks of a page run in order in one namespace, in an empty working directory,
    on the default backend."""
    monkeypatch.chdir(tmp_path)
    for name, value in _with_checkout_on_path(dict(os.environ)).items():
        monkeypatch.setenv(name, value)
    blocks, why_not = _runnable(page)
    namespace = {"__name__": "__docs__"}
    for line, code in blocks:
        try:
            exec(compile(code, f"{page}:{line}", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"{page.relative_to(ROOT)}, the block at line {line}") from exc
    if why_not:
        pytest.skip(f"{why_not}, not installed")


def test_every_python_block_runs_on_the_python_backend(tmp_path):
    """The same blocks, page by page, in one process whose backend is the pure-Python one."""
    pages = [(page, *_runnable(page)) for page in _PAGES]
    env = _with_checkout_on_path(dict(os.environ))
    env["ATLAS_FAST_NO_EXTENSIONS"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", _RUNNER],
        input=json.dumps(
            [[[f"{page}:{line}", code] for line, code in blocks] for page, blocks, _ in pages]
        ),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    not_run = [why_not for _, _, why_not in pages if why_not]
    if not_run:
        pytest.skip(f"{'; '.join(not_run)}: not installed (the blocks before them ran)")


def test_every_guide_has_its_blocks_found():
    """The fence pattern finds the blocks (a page whose fences it missed would pass unrun)."""
    for page in _guides():
        fences = page.read_text().count("```python")
        assert fences == len(_blocks(page)), page


# -- the performance tables -----------------------------------------------------------------


def _tables():
    spec = importlib.util.spec_from_file_location("_docs_tables", ROOT / "benchmarks/tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tables_are_those_the_committed_runs_give():
    tables = _tables()
    for path, text in tables.rendered().items():
        assert path.read_text() == text, (
            f"{path.relative_to(ROOT)}: its tables are not those of benchmarks/results/; "
            "run python benchmarks/tables.py"
        )


def test_the_committed_runs_name_no_machine_paths():
    tables = _tables()
    runs = sorted(tables.RESULTS.glob("*.json"))
    assert runs
    for run in runs:
        assert tables.absolute_paths(json.loads(run.read_text())) == [], run.name


def test_import_strips_machine_paths(tmp_path, monkeypatch):
    tables = _tables()
    monkeypatch.setattr(tables, "RESULTS", tmp_path / "results")
    source = tmp_path / "run.json"
    source.write_text(
        '{"command": "python benchmarks/bench_backends.py --json /tmp/x/out.json",'
        ' "machine": {"python_executable": "/home/me/venv/bin/python3"},'
        ' "url": "https://example.org/a/b", "ratio": "1 / 2", "rate": "ex/s"}'
    )
    target = tables.import_run(source, "bench_x")
    run = json.loads(target.read_text())
    assert run == {
        "command": "python benchmarks/bench_backends.py --json out.json",
        "machine": {"python_executable": "python3"},
        "url": "https://example.org/a/b",
        "ratio": "1 / 2",
        "rate": "ex/s",
    }
    assert tables.absolute_paths(run) == []


def test_a_stale_table_is_rewritten(tmp_path, monkeypatch):
    tables = _tables()
    page = tmp_path / "performance.md"
    stale = re.sub(
        r"(<!-- tables:backends -->\n).*?(<!-- /tables:backends -->)",
        r"\1| a table typed by hand |\n\2",
        tables.PERFORMANCE.read_text(),
        flags=re.S,
    )
    assert "typed by hand" in stale
    page.write_text(stale)
    monkeypatch.setattr(tables, "PERFORMANCE", page)
    assert tables.main(["--check"]) == 1
    assert page.read_text() == stale  # --check changes nothing
    assert tables.main([]) == 0
    assert page.read_text() == tables.rendered()[page]
    assert tables.main(["--check"]) == 0


def test_a_plot_of_changed_results_is_stale(tmp_path, monkeypatch, capsys):
    """Each plot records a digest of what it shows: results changed and the plot not drawn
    again fail the check (which needs no matplotlib), naming the plot."""
    tables = _tables()
    for name in tables.PLOTS:
        assert tables.recorded_digest(tables.IMAGES / name) == tables._plot_digest(name), name
    results = tmp_path / "results"
    results.mkdir()
    for run in tables.RESULTS.glob("*.json"):
        (results / run.name).write_text(run.read_text())
    run = json.loads((results / "bench_backends.json").read_text())
    run["rows"][0]["ratios"][1]["value"] *= 2  # the Python core's first ratio
    (results / "bench_backends.json").write_text(json.dumps(run))
    monkeypatch.setattr(tables, "RESULTS", results)
    assert tables.recorded_digest(tables.IMAGES / "backends.svg") != tables._plot_digest(
        "backends.svg"
    )
    assert tables.recorded_digest(tables.IMAGES / "loader.svg") == tables._plot_digest("loader.svg")
    assert tables.main(["--check"]) == 1
    assert "docs/images/backends.svg: out of date" in capsys.readouterr().out
