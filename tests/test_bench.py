"""The benchmarks on tiny corpora: the machinery, the JSON, the ratios, the labels.

``atlas-fast bench`` and the scripts in benchmarks/ (in --quick mode). No peer needs to be
installed: the runs hide them (ATLAS_FAST_BENCH_HIDE), so they must be reported as skipped.
The reference package is hidden the same way, or replaced by a stand-in (see
``reference_stub``), so that both outcomes are checked whatever this environment holds.
Nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import itertools
import json
import os
import pickle
import sys
from pathlib import Path
from statistics import median

import numpy as np
import pytest
from helpers import assert_same

from atlas_fast import cli
from atlas_fast.bench import corpus, readers, runner
from atlas_fast.bench.measure import PATTERNS

PEERS = ("mds", "litdata", "litdata-zstd", "hf", "zarr")
CONFIGS = ("s0b16", "s2b100")
HIDE_ALL = "streaming,litdata,datasets,zarr,torch_atlas_ds"
ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def reference_stub(tmp_path_factory):
    """A directory holding a stand-in ``torch_atlas_ds`` package, to put on sys.path.

    Why a stand-in: the real reference imports torch at import time and may not be installed;
    the column logic (a reference column when the package imports, every "x ref" divided by
    it, none without it) must be checked in every environment. The stand-in reads the same
    files for real (it is atlas_fast's pure-Python reader under the reference's name), so
    its figures are measured, not made up; its version "0+test-stub" shows in every label.
    """
    root = tmp_path_factory.mktemp("stub")
    pkg = root / "torch_atlas_ds"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        '"""Test stand-in for the reference package (see tests/test_bench.py)."""\n'
        '__version__ = "0+test-stub"\n'
        "from atlas_fast._python import AtlasDataset\n"
    )
    return root


@pytest.fixture
def with_stub(reference_stub, monkeypatch):
    """The stand-in importable here and in worker processes; peers hidden."""
    monkeypatch.delitem(sys.modules, "torch_atlas_ds", raising=False)
    monkeypatch.syspath_prepend(str(reference_stub))
    old = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(reference_stub) + (os.pathsep + old if old else ""))
    monkeypatch.setenv("ATLAS_FAST_BENCH_HIDE", "streaming,litdata,datasets,zarr")
    yield reference_stub
    sys.modules.pop("torch_atlas_ds", None)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One benchmark run on a tiny corpus, peers hidden; -> (exit status, report, stdout)."""
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "out.json"
    mp = pytest.MonkeyPatch()
    mp.setenv("ATLAS_FAST_BENCH_HIDE", HIDE_ALL)
    try:
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            status = cli.main(
                [
                    "bench",
                    "--cache-dir",
                    str(tmp / "cache"),
                    "--documents",
                    "60",
                    "--token-examples",
                    "12",
                    "--blobs",
                    "5",
                    "--reps",
                    "2",
                    "--budget",
                    "0.002",
                    "--configs",
                    ",".join(CONFIGS),
                    "--json",
                    str(out),
                    "--no-progress",
                ]
            )
    finally:
        mp.undo()
    report = json.loads(out.read_text()) if out.exists() else None
    return status, report, stdout.getvalue(), tmp / "cache"


def test_run_succeeds_and_reports_the_machine(tiny_run):
    status, report, _, _ = tiny_run
    assert status == 0
    assert report["schema"] == "atlas_fast.bench/1"
    machine = report["machine"]
    for key in ("cpu_model", "cores", "python", "platform"):
        assert machine[key]
    assert report["packages"]["numpy"] == np.__version__
    assert report["date"] and report["command"].startswith("atlas-fast bench")
    assert report["settings"]["reps"] == 2
    assert report["settings"]["configs"] == list(CONFIGS)
    assert report["atlas_fast"]["default_backend"] in ("python", "cython")
    assert report["errors"] == []
    # Every worker imported this atlas_fast (else its reader is skipped, saying so).
    assert report["readers"]["atlas_fast-python"]["status"] == "ok"
    assert report["readers"]["pickle-floor"]["status"] == "ok"


def test_absent_peers_are_skipped_with_the_reason(tiny_run):
    _, report, text, _ = tiny_run
    for name in PEERS:
        entry = report["readers"][name]
        assert entry["status"] == "skipped"
        assert "not installed" in entry["reason"], entry["reason"]
        assert not [r for r in report["results"] if r["reader"] == name]
    assert "Skipped:" in text and "mosaicml-streaming is not installed" in text


def test_every_reader_corpus_config_and_pattern_is_measured(tiny_run):
    _, report, _, _ = tiny_run
    rows = {(r["reader"], r["corpus"], r["config"], r["pattern"]) for r in report["results"]}
    ref = "atlas_fast-python"
    for c in corpus.DEFAULT_CORPORA:
        for pattern in PATTERNS:
            assert ("pickle-floor", c, None, pattern) in rows
            for config in CONFIGS:
                assert (ref, c, config, pattern) in rows
        assert ("zstd-floor", c, "s2b100", "sequential") in rows
        assert ("zstd-floor", c, "s0b16", "sequential") not in rows  # nothing to decompress
    if report["atlas_fast"]["default_backend"] == "python":
        assert report["readers"]["atlas_fast"]["status"] == "skipped"
        assert "pure-Python" in report["readers"]["atlas_fast"]["reason"]
    else:
        assert ("atlas_fast", "documents", "s2b100", "random") in rows


def test_figures_are_medians_of_the_repetitions(tiny_run):
    _, report, _, _ = tiny_run
    for r in report["results"]:
        assert len(r["reps"]) == 2
        rates = [x["examples"] / x["seconds"] for x in r["reps"]]
        assert r["examples_per_s"] == pytest.approx(median(rates))
        mbs = [x["bytes"] / x["seconds"] / 1e6 for x in r["reps"]]
        assert r["mb_per_s"] == pytest.approx(median(mbs))
        assert all(x["examples"] > 0 and x["bytes"] > 0 for x in r["reps"])


def test_without_the_reference_no_ratio_to_it_is_computed(tiny_run):
    _, report, text, _ = tiny_run
    assert report["readers"]["torch_atlas_ds"]["status"] == "skipped"
    assert "hidden" in report["readers"]["torch_atlas_ds"]["reason"]
    assert report["results"]
    for r in report["results"]:
        assert r["reader"] != "torch_atlas_ds"
        assert r["reference"] is None and r["ratio_to_reference"] is None
        assert r["best_peer"] is None and r["ratio_to_best_peer"] is None  # no peer ran
    assert "the reference package (torch_atlas_ds) did not run here" in text


def test_the_reference_is_its_own_column_and_every_xref_divides_by_it(with_stub, tmp_path):
    out = tmp_path / "ref.json"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = cli.main(
            [
                "bench",
                *("--cache-dir", str(tmp_path / "cache"), "--documents", "40"),
                *("--reps", "1", "--budget", "0.002", "--configs", "s0b16,s2b16"),
                *("--corpus", "documents", "--readers", "atlas,floors"),
                *("--reference-config", "s2b16"),
                *("--patterns", "open,random,shuffled", "--json", str(out), "--no-progress"),
            ]
        )
    assert status == 0
    report = json.loads(out.read_text())
    entry = report["readers"]["torch_atlas_ds"]
    assert entry["status"] == "ok", entry
    assert entry["label"] == "torch_atlas_ds 0+test-stub (reference)"
    assert str(with_stub) in entry["notes"]["imported from"]
    rows = report["results"]
    by_key = {(r["reader"], r["config"], r["pattern"]): r for r in rows}
    for r in rows:
        ref = by_key[("torch_atlas_ds", r["config"] or "s2b16", r["pattern"])]
        assert r["reference"] == {"reader": "torch_atlas_ds", "config": ref["config"]}
        assert r["ratio_to_reference"] == pytest.approx(r["examples_per_s"] / ref["examples_per_s"])
    for config in ("s0b16", "s2b16"):
        assert by_key[("torch_atlas_ds", config, "random")]["ratio_to_reference"] == 1.0
        assert "atlas_fast[python]" == by_key[("atlas_fast-python", config, "random")]["label"]
    shuffled = by_key[("torch_atlas_ds", "s0b16", "shuffled")]["how"]
    assert shuffled.startswith("uniform permutation")
    assert "torch_atlas_ds 0+test-stub (reference)" in stdout.getvalue()


def test_the_cached_datasets_hold_the_corpus(tiny_run, atlas):
    _, report, _, cache = tiny_run
    root = cache / report["settings"]["scale"]
    manifest = json.loads((root / "manifest.json").read_text())
    for name in corpus.DEFAULT_CORPORA:
        entry = manifest["corpora"][name]
        offsets = np.load(entry["floor_offsets"]).tolist()
        data = open(entry["floor"], "rb").read()
        expected = [pickle.loads(data[a:b]) for a, b in itertools.pairwise(offsets)]
        assert len(expected) == entry["examples"] == report["corpora"][name]["examples"]
        for config in CONFIGS:
            with atlas.AtlasDataset(entry["datasets"][config]["path"]) as ds:
                assert_same([ds[i] for i in range(len(ds))], expected)
    # Tiny shards have fewer than 7 blocks: strategy 2 fell back to 1, and the report says so.
    info = report["corpora"]["documents"]["datasets"]["s2b100"]
    assert info["strategy"] == 2 and info["stored_strategy"] == 1


def test_the_table_names_patterns_and_readers(tiny_run):
    text = tiny_run[2]
    for pattern in ("sequential pass", "uniformly random", "random batches of 256", "cached"):
        assert pattern in text
    assert "baseline: pickle.loads per example" in text
    assert "floor" not in text  # no row is a bound it is not
    assert "block permutation" in text or "BlockShuffleSampler" in text


def test_a_second_run_reuses_the_cache(tiny_run, tmp_path, monkeypatch):
    _, report, _, cache = tiny_run
    root = cache / report["settings"]["scale"]
    before = (root / "manifest.json").stat().st_mtime_ns
    monkeypatch.setenv("ATLAS_FAST_BENCH_HIDE", HIDE_ALL)
    out = tmp_path / "again.json"
    status = cli.main(
        [
            "bench",
            "--cache-dir",
            str(cache),
            "--documents",
            "60",
            "--token-examples",
            "12",
            "--blobs",
            "5",
            "--reps",
            "1",
            "--budget",
            "0.001",
            "--configs",
            "s0b16",
            "--corpus",
            "documents",
            "--readers",
            "atlas,floors",
            "--patterns",
            "open,random",
            "--json",
            str(out),
            "--no-progress",
        ]
    )
    assert status == 0
    assert (root / "manifest.json").stat().st_mtime_ns == before
    again = json.loads(out.read_text())
    assert {r["pattern"] for r in again["results"]} == {"open", "random"}
    assert again["readers"]["hf"]["reason"] == "not selected (--readers)"


def test_documents_are_dolma_style_and_deterministic():
    docs = list(corpus.stdlib_documents(limit=40))
    assert docs == list(corpus.stdlib_documents(limit=40))
    assert len(docs) == 40
    assert len({d["id"] for d in docs}) == 40
    for d in docs:
        assert set(d) == {"id", "text", "source", "added", "metadata"}
        assert d["text"].strip()
        assert d["metadata"]["bytes"] == len(d["text"].encode())
    tokens = list(corpus.token_arrays(iter(docs), limit=2))
    assert [t.dtype for t in tokens] == [np.uint16, np.uint16]
    assert [t.shape for t in tokens] == [(2048,), (2048,)]


def test_block_permutation_visits_every_example_once_block_by_block(tmp_path, atlas):
    from atlas_fast.writer import AtlasDatasetWriter

    with AtlasDatasetWriter(tmp_path / "ds", shard_size=23, block_size=5) as w:
        for i in range(61):
            w.add_example(i)
    with atlas.AtlasDataset(tmp_path / "ds") as ds:
        order = readers.block_permutation(ds, seed=3)
        assert sorted(order) == list(range(61))
        assert order != list(range(61))
        # Consecutive runs stay inside one block: each block is decoded once.
        starts = [0, 23, 46, 61]

        def block_of(i):
            s = max(k for k in range(3) if starts[k] <= i)
            return (s, (i - starts[s]) // 5)

        seen = []
        for i in order:
            b = block_of(i)
            if not seen or seen[-1] != b:
                assert b not in seen
                seen.append(b)


def test_compute_ratios_against_reference_and_best_peer():
    def row(reader, kind, config, rate, pattern="random"):
        return {
            "corpus": "documents",
            "reader": reader,
            "kind": kind,
            "config": config,
            "pattern": pattern,
            "examples_per_s": rate,
        }

    report = {
        "settings": {"reference": {"config_for_peers": "s2b100"}},
        "results": [
            row("torch_atlas_ds", "reference", "s2b100", 100.0),
            row("torch_atlas_ds", "reference", "s0b16", 400.0),
            row("atlas_fast-python", "atlas", "s0b16", 800.0),
            row("atlas_fast", "atlas", "s0b16", 1200.0),
            row("mds", "peer", None, 50.0),
            row("hf", "peer", None, 200.0),
            row("pickle-floor", "floor", None, 1000.0),
        ],
    }
    runner.compute_ratios(report)
    r = {(x["reader"], x["config"]): x for x in report["results"]}
    assert r[("atlas_fast", "s0b16")]["ratio_to_reference"] == pytest.approx(3.0)
    assert r[("atlas_fast", "s0b16")]["ratio_to_best_peer"] == pytest.approx(6.0)
    assert r[("mds", None)]["ratio_to_reference"] == pytest.approx(0.5)  # vs s2b100
    assert r[("mds", None)]["best_peer"] == "hf"
    assert r[("hf", None)]["ratio_to_best_peer"] == pytest.approx(1.0)
    assert r[("pickle-floor", None)]["ratio_to_reference"] == pytest.approx(10.0)
    assert r[("atlas_fast-python", "s0b16")]["ratio_to_reference"] == pytest.approx(2.0)
    # Without the reference's rows, no ratio to it at all: nothing stands in for it.
    report["results"] = [x for x in report["results"] if x["reader"] != "torch_atlas_ds"]
    runner.compute_ratios(report)
    assert all(x["ratio_to_reference"] is None for x in report["results"])


@pytest.mark.parametrize(
    "argv",
    [
        ["--configs", "s9b16"],
        ["--readers", "nosuchreader"],
        ["--patterns", "sideways"],
        ["--reps", "0"],
    ],
)
def test_bad_arguments_are_usage_errors(argv, tmp_path, capsys):
    assert cli.main(["bench", "--cache-dir", str(tmp_path), *argv]) == 2
    assert "atlas-fast bench:" in capsys.readouterr().err


def test_plot_needs_matplotlib_or_draws_a_png(tiny_run, tmp_path, capsys):
    from atlas_fast.bench import report as report_mod

    _, report, _, _ = tiny_run
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        with pytest.raises(report_mod.PlotUnavailable, match="matplotlib"):
            report_mod.plot(report, tmp_path / "b.png")
        assert cli.main(["bench", "--plot", str(tmp_path / "b.png")]) == 2
        assert "needs matplotlib" in capsys.readouterr().err
    else:
        report_mod.plot(report, tmp_path / "b.png")
        assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_shuffled_epoch_uses_block_shuffle_sampler_when_present(tmp_path, monkeypatch, atlas):
    import atlas_fast
    from atlas_fast.writer import AtlasDatasetWriter

    with AtlasDatasetWriter(tmp_path / "ds", shard_size=30, block_size=4) as w:
        for i in range(50):
            w.add_example({"id": str(i)})
    reader = readers.AtlasReader("atlas_fast-python", atlas.__name__)
    reader.module = atlas
    seen = {}

    class FakeSampler:
        window_blocks = 3

        def __init__(self, dataset, *, seed=0):
            seen["seed"] = seed
            self.n = len(dataset)

        def __iter__(self):
            return iter(range(self.n - 1, -1, -1))

    with atlas.AtlasDataset(tmp_path / "ds") as ds:
        monkeypatch.setattr(atlas_fast, "BlockShuffleSampler", None)  # as if absent
        it, how = reader.shuffled(ds, seed=5)
        assert sorted(int(x["id"]) for x in it) == list(range(50))
        assert "block permutation computed by the benchmark" in how

        monkeypatch.setattr(atlas_fast, "BlockShuffleSampler", FakeSampler, raising=False)
        it, how = reader.shuffled(ds, seed=7)
        assert [int(x["id"]) for x in it] == list(range(49, -1, -1))
        assert seen["seed"] == 7
        assert how.startswith("atlas_fast.BlockShuffleSampler")


# -- labels ---------------------------------------------------------------------------------------

LABEL_FILES = [
    "README.md",
    "docs/performance.md",
    "atlas_fast/cli/bench.py",
    "atlas_fast/bench/readers.py",
    "atlas_fast/bench/report.py",
    "atlas_fast/bench/runner.py",
    "benchmarks/sidebyside.py",
    "benchmarks/bench_backends.py",
    "benchmarks/bench_loader.py",
    "benchmarks/bench_tokens.py",
]


def test_the_python_backend_is_never_called_the_reference(tiny_run):
    """atlas_fast[python] is our own code: no output or doc calls it "the reference"."""
    text = tiny_run[2]
    assert "atlas_fast[python]" in text
    for line in text.splitlines():
        if "atlas_fast[python]" in line:
            assert "reference" not in line.replace("the reference package", ""), line
    files = [ROOT / f for f in LABEL_FILES if (ROOT / f).exists()]
    if not files:
        pytest.skip("the source tree (README, docs, benchmarks/) is not beside these tests")
    for path in files:
        content = path.read_text()
        for bad in ("reference algorithm", "[python] (reference)", "[python]` the reference"):
            assert bad not in content.replace("reference algorithm (our re-implementation)", ""), (
                f"{path}: {bad!r}"
            )


# -- the scripts in benchmarks/ -------------------------------------------------------------------


def _script(name):
    path = SCRIPTS / f"{name}.py"
    if not path.exists():
        pytest.skip(f"{path} is not beside these tests (an installed-wheel test run)")
    if str(SCRIPTS) not in sys.path:  # as when run as a script: its folder's modules import
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(f"_bench_script_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def script_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("script-cache")


def _run_script(name, argv, script_cache, tmp_path):
    out = tmp_path / f"{name}.json"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = _script(name).main(
            ["--quick", "--reps", "1", "--cache-dir", str(script_cache), "--json", str(out), *argv]
        )
    assert status == 0
    return json.loads(out.read_text()), stdout.getvalue()


def _check_x_ref(report, with_reference):
    assert report["reference"]["available"] is with_reference
    keys = set(report["contenders"])
    assert ("reference" in keys) is with_reference
    assert report["contenders"]["python"] == "atlas_fast[python]"
    seen = 0
    for row in report["rows"]:
        assert set(row["values"]) <= keys
        for r in row["ratios"]:
            if " x ref" not in r["name"]:
                continue
            seen += 1
            if not with_reference:
                assert r["value"] is None and r["met"] is None, (row["case"], r)
            else:
                key = r["name"].split()[0]
                mine, ref = row["values"].get(key), row["values"].get("reference")
                if r["name"] == f"{key} x ref" and mine and ref and row["unit"] != "ns":
                    if row["unit"] == "s":
                        assert r["value"] == pytest.approx(ref / mine)
                    else:
                        assert r["value"] == pytest.approx(mine / ref)
                    assert r["value"] is not None
    assert seen


BACKENDS_ARGS = ["--datasets", "docs s2 b100,rows s0 b32,shards"]


def test_bench_backends_quick_without_the_reference(script_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("ATLAS_FAST_BENCH_HIDE", "torch_atlas_ds")
    report, text = _run_script("bench_backends", BACKENDS_ARGS, script_cache, tmp_path)
    _check_x_ref(report, with_reference=False)
    assert "reference: NOT AVAILABLE" in text
    cases = {(r["section"], r["case"]) for r in report["rows"]}
    for section in ("docs s2 b100", "rows s0 b32"):
        for case in ("(g) random, no block read twice", "(d) ds[i] in order"):
            assert (section, case) in cases
    assert ("many shards", "open + len + first item") in cases
    fds = [r for r in report["rows"] if r["unit"] == "fds"]
    assert fds and all(v >= 0 for v in fds[0]["values"].values())


def test_bench_backends_quick_with_a_reference(with_stub, script_cache, tmp_path):
    report, text = _run_script("bench_backends", BACKENDS_ARGS, script_cache, tmp_path)
    _check_x_ref(report, with_reference=True)
    assert report["reference"]["label"] == "torch_atlas_ds 0+test-stub (reference)"
    assert "every 'x ref' divides by its figure from this run" in text
    g = [r for r in report["rows"] if r["case"] == "(g) random, no block read twice"]
    assert g and all(r["values"]["reference"] > 0 for r in g)


def test_bench_backends_random_only(with_stub, script_cache, tmp_path):
    argv = ["--random-only", "--datasets", "rows s0 b32"]
    report, _ = _run_script("bench_backends", argv, script_cache, tmp_path)
    cases = [r["case"] for r in report["rows"]]
    assert cases == ["(g) random, no block read twice", "plain uniform random ds[i]"]


def test_bench_loader_quick(with_stub, script_cache, tmp_path):
    pytest.importorskip("torch", reason="the DataLoader patterns need torch")
    report, _ = _run_script("bench_loader", [], script_cache, tmp_path)
    _check_x_ref(report, with_reference=True)
    cases = {r["case"] for r in report["rows"]}
    for nw in (0, 2):
        for clock in ("wall", "CPU"):
            assert f"BlockShuffleSampler(ds) epoch, workers={nw}, {clock}" in cases
    assert "warm, cache_bytes=1 GiB: uniform random ds[i]" in cases
    for n in (2, 8, 32):
        rows = [r for r in report["rows"] if r["section"] == f"mix{n}"]
        for nw in (0, 2):
            for clock in ("wall", "CPU"):
                case = f"MixtureSampler({n} sources) epoch, workers={nw}, {clock}"
                epoch = [r for r in rows if r["case"] == case]
                assert epoch and epoch[0]["values"]["python"] > 0
            decoded = [
                r for r in rows if r["case"] == f"blocks decoded per example: mixture, workers={nw}"
            ]
            assert 0 < decoded[0]["values"]["python"] < 1
        cost = [r for r in rows if r["case"] == "sampler cost per index (iterating it alone)"]
        assert cost and cost[0]["unit"] == "ns"
    pss = [r for r in report["rows"] if r["case"] == "PSS per worker (median)"]
    if Path("/proc/self/smaps_rollup").exists():
        assert pss[0]["values"]["reference"] > 0 and pss[0]["values"]["python"] > 0


@pytest.mark.parametrize("linked", [False, True], ids=["copies", "linked"])
def test_bench_grow_tiny(tmp_path, linked):
    """bench_grow.py on a tiny dataset: every case timed, every ratio the guide quotes."""
    module = _script("bench_grow")
    out = tmp_path / "grow.json"
    argv = ["--shard-examples", "30", "--repeats", "1", "--other-fs", str(tmp_path)]
    with contextlib.redirect_stdout(io.StringIO()):
        assert module.main([*argv, "--json", str(out), *(["--linked"] if linked else [])]) == 0
    run = json.loads(out.read_text())
    cases = {r["case"]: r for r in run["results"]}
    for case in (
        "shard alone",
        "append",
        "append, widening",
        "cp -r, same file system",
        "merge, same file system",
        "folders and links, same file system",
    ):
        assert cases[case]["median_seconds"] > 0, case
    assert ("merge, another file system" in cases) is not linked
    assert run["settings"]["linked"] is linked
    assert "merge speed / cp -r speed, same file system" in run["ratios"]
    assert "folders and links speed / cp -r speed, same file system" in run["ratios"]
    assert all(value > 0 for value in run["ratios"].values())


def test_bench_grow_floor_makes_the_folders_a_merge_makes(tmp_path):
    """The merge's floor in bench_grow.py (a bare loop of mkdir and link) makes the shard
    folders and files a linking merge makes, so their times compare like for like (no
    reading: one test for both backends)."""
    import atlas_fast

    module = _script("bench_grow")
    sources = []
    for name, count in (("a", 47), ("b", 30)):
        with atlas_fast.AtlasDatasetWriter(tmp_path / name, 7, 3, compression_strategy=1) as w:
            for i in range(count):
                w.add_example({"name": name, "i": i})
        sources.append(tmp_path / name)
    atlas_fast.merge(sources, tmp_path / "merged")
    module.links_only(sources, tmp_path / "bare")

    def shard_files(root):
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.parent != root)

    assert len(shard_files(tmp_path / "bare")) == 3 * (7 + 5)
    assert shard_files(tmp_path / "bare") == shard_files(tmp_path / "merged")


TOKENS_ARGS = ["--documents", "400", "--batches", "4", "--worker-batches", "4"]


@pytest.fixture(scope="module")
def tokens_run(script_cache, tmp_path_factory):
    """bench_tokens.py --quick on the corpus's first 400 documents, LitData's venv absent."""
    pytest.importorskip("torch", reason="bench_tokens.py reads through a DataLoader")
    tmp = tmp_path_factory.mktemp("tokens")
    mp = pytest.MonkeyPatch()
    mp.setenv("ATLAS_FAST_MDS_VENV", str(tmp / "no-venv"))
    try:
        yield _run_script("bench_tokens", TOKENS_ARGS, script_cache, tmp)
    finally:
        mp.undo()


def test_bench_tokens_quick(tokens_run):
    report, text = tokens_run
    rows = report["rows"]
    for workers in (0, 2):
        assert set(rows[f"uncompressed, {workers} workers"]["compared"]) == {"memmap", "by hand"}
        assert set(rows[f"zstd, {workers} workers"]["compared"]) == {"floor"}
    for row in rows.values():
        for name, c in row["compared"].items():
            mine, theirs = row["atlas_fast"]["runs"][0], row[name]["runs"][0]
            if name == "floor":  # a ratio of times: the floor's rate over ours
                assert c["target"] == "<= 1.25"
                assert c["ratio"] == pytest.approx(theirs["tokens_per_s"] / mine["tokens_per_s"])
            else:
                assert c["ratio"] == pytest.approx(mine["tokens_per_s"] / theirs["tokens_per_s"])
            op, bound = c["target"].split()
            assert c["met"] is (
                c["ratio"] <= float(bound) if op == "<=" else c["ratio"] >= float(bound)
            )
    assert report["litdata"]["available"] is False
    assert "no-venv" in report["litdata"]["reason"] and "litdata rows skipped" in text
    assert report["open"]["met"] and set(report["open"]["files"]) <= {"meta.json", "tokens.idx"}
    index = report["index"]
    assert "index build, atlas_fast[python]" in index
    for row in index.values():
        assert row["index build"]["tokens_per_s"] > 0 and row["passes_per_measurement"] >= 1
    tokens = report["settings"]["tokens"]
    assert report["settings"]["documents"] == 400 and tokens > 10 * 32 * 2048


def test_bench_tokens_contenders_read_the_same_windows(tokens_run, script_cache, atlas):
    """The memmap gather, the zstd floor and reading by hand give the rows' targets that
    TokenSequences gives (their inputs differ at a document's start, where they take the
    token before it and TokenSequences the start_input)."""
    import numpy as np

    from atlas_fast.tokens import TokenSequences

    bench = _script("bench_tokens")
    (root,) = script_cache.glob("tokens-bench-*-first400")
    lengths = np.load(root / "lengths.npy")
    ts = TokenSequences(atlas.AtlasDataset(str(root / "s0")), 2048)
    contenders = [
        bench.FlatTokens(root / "flat.u16"),
        bench.FlatTokens(root / "flat.u16", bench.zstd_blocks(root / "s1")),
        bench.ByHand(root / "s0", lengths),
    ]
    for keys in bench.keys_of(ts, 0, 3, 3):
        want = ts.__getitems__(keys)
        for contender in contenders:
            got = contender.__getitems__(keys)
            np.testing.assert_array_equal(got["targets"], want["targets"])
            inside = want["positions"] > 0  # not a document's first token
            np.testing.assert_array_equal(got["inputs"][inside], want["inputs"][inside])


def test_rows_corpus_is_typed_and_deterministic():
    import datetime

    rows = corpus.examples("rows", 50)
    assert rows == corpus.examples("rows", 50)
    assert [r["id"] for r in rows] == list(range(50))
    for r in rows:
        assert isinstance(r["user"], str) and isinstance(r["score"], float)
        assert isinstance(r["active"], bool) and isinstance(r["day"], datetime.date)


def test_datasets_for_the_scripts_are_written_once(tmp_path, atlas):
    path = corpus.dataset(tmp_path, "rows", 40, 0, 8, shard_size=16)
    stamp = (path / "meta.json").stat().st_mtime_ns
    assert corpus.dataset(tmp_path, "rows", 40, 0, 8, shard_size=16) == path
    assert (path / "meta.json").stat().st_mtime_ns == stamp
    with atlas.AtlasDataset(path) as ds:
        assert_same([ds[i] for i in range(len(ds))], corpus.examples("rows", 40))
        assert len(ds.shards) == 3


# -- bench_remote.py's peer rows (benchmarks/remote_peers.py) -----------------------------------


def test_remote_peers_arguments():
    peers = _script("remote_peers")
    parser = argparse.ArgumentParser()
    peers.add_arguments(parser)
    args = parser.parse_args([])
    assert peers.parse_peers(args.peers) == ["streaming", "litdata"]
    assert peers.parse_patterns(args.peer_patterns) == ["epoch"]
    args = parser.parse_args(["--peers", "none", "--peer-patterns", "epoch, 2 workers"])
    assert peers.parse_peers(args.peers) == []
    assert peers.parse_patterns(args.peer_patterns) == ["epoch, 2 workers"]
    assert peers.parse_peers(" streaming , ") == ["streaming"]
    with pytest.raises(ValueError, match="unknown peer 'hf'"):
        peers.parse_peers("streaming,hf")
    with pytest.raises(ValueError, match="unknown pattern 'shuffle'"):
        peers.parse_patterns("epoch;shuffle")


def test_remote_peers_skipped_without_the_mds_venv(tmp_path, monkeypatch, capsys):
    """No venv: every peer's rows are skipped with the reason and how to make the venv (and
    put LitData in it), and nothing is measured, built or served."""
    peers = _script("remote_peers")
    missing = tmp_path / "no-venv"
    monkeypatch.setenv("ATLAS_FAST_MDS_VENV", str(missing))
    assert peers.venv_dir() == missing
    parser = argparse.ArgumentParser()
    peers.add_arguments(parser)
    args = parser.parse_args(["--peer-cache", str(tmp_path / "cache")])
    args.copies = 1
    www = tmp_path / "www"
    www.mkdir()
    got = peers.run(args, www, proxies={}, reps=1)
    assert set(got) == {"streaming", "litdata"}
    printed = capsys.readouterr().out
    for name, peer in got.items():
        assert peer["available"] is False
        reason = peer["reason"]
        assert str(missing) in reason and "tools/test.sh" in reason
        assert ("litdata==" in reason) is (name == "litdata")
        assert f"peer rows skipped: {name}: {reason}" in printed
    assert not any(www.iterdir()) and not (tmp_path / "cache").exists()
    assert peers.run(parser.parse_args(["--peers", "none"]), www, {}, 1) == {}
    summary = peers.summarize(got, {"sampler": {"0 ms": {"examples_per_s": 10.0}}})
    assert summary == {**got, "compared": {}}


def test_remote_peers_venv_that_cannot_import_streaming(tmp_path, monkeypatch):
    """A venv whose python cannot import streaming (here: this one's python, if it lacks it,
    or a python that fails) is skipped with the import error, not a crash."""
    peers = _script("remote_peers")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "python"
    fake.write_text("#!/bin/sh\necho 'ModuleNotFoundError: no streaming here' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("ATLAS_FAST_MDS_VENV", str(venv))
    for name in ("streaming", "litdata"):
        python, version, reason = peers.find_peer(name)
        assert python is None and version is None
        assert f"cannot import {name} and torch" in reason and "no streaming here" in reason
        assert "tools/test.sh" in reason


def test_remote_peers_summary_ratios():
    peers = _script("remote_peers")
    rows = {"0 ms": {"examples_per_s": 1000.0}, "50 ms": {"examples_per_s": 500.0}}
    measured = {"streaming": {"available": True, "rows": {"epoch": rows}}}
    runs = {
        "sampler": {"local": {"examples_per_s": 9e9}, "0 ms": {"examples_per_s": 4000.0}},
        "in order": {"0 ms": {"examples_per_s": 2000.0}, "50 ms": {"examples_per_s": 1000.0}},
    }
    compared = peers.summarize(measured, runs)["compared"]
    assert set(compared) == {
        "atlas_fast sampler / streaming epoch",
        "atlas_fast in order / streaming epoch",
    }
    sampler = compared["atlas_fast sampler / streaming epoch"]
    assert set(sampler) == {"0 ms"}  # no 50 ms sampler row measured; local is not a peer link
    assert sampler["0 ms"]["ratio"] == 4.0 and sampler["0 ms"]["met"] is True
    in_order = compared["atlas_fast in order / streaming epoch"]
    assert in_order["50 ms"] == {
        "atlas_fast": 1000.0,
        "streaming": 500.0,
        "ratio": 2.0,
        "paired": False,
        "target": 3.0,
        "met": False,
    }


def test_remote_peers_summary_of_paired_runs():
    """atlas_fast run beside each peer run: the ratio is the median of the paired ratios
    (here 2, 4 and 10: 4), not the ratio of the medians, and the bench's own rows are unused."""
    peers = _script("remote_peers")
    row = {"examples_per_s": 100.0, "rates": [100.0, 50.0, 10.0]}
    row["atlas_fast_paired_rates"] = {"sampler": [200.0, 200.0, 100.0]}
    measured = {"streaming": {"available": True, "rows": {"epoch": {"20 ms": row}}}}
    runs = {"sampler": {"20 ms": {"examples_per_s": 1.0}}}
    compared = peers.summarize(measured, runs)["compared"]
    assert list(compared) == ["atlas_fast sampler / streaming epoch"]  # nothing paired in order
    got = compared["atlas_fast sampler / streaming epoch"]["20 ms"]
    assert got["ratio"] == 4.0 and got["paired"] is True and got["met"] is True
    assert got["atlas_fast"] == 200.0 and got["streaming"] == 100.0


def test_remote_peers_a_failed_read_is_recorded_not_raised(tmp_path):
    """A peer's read that fails or hangs becomes PeerRunFailed (the row records it and the
    benchmark goes on); a failed conversion stays an error."""
    peers = _script("remote_peers")
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nsleep \"${SLEEP:-0}\"\necho 'zstd.Error: corrupt' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(peers.PeerRunFailed, match=r"read failed \(3\): zstd.Error: corrupt"):
        peers._call(fake, "streaming", ["read", "--remote", "s3://peer/mds"])
    with pytest.raises(peers.PeerRunFailed, match=r"no answer in 0\.2 s"):
        peers._call(fake, "litdata", ["read"], {"SLEEP": "5"}, timeout=0.2)
    with pytest.raises(RuntimeError, match="write failed") as info:
        peers._call(fake, "litdata", ["write"])
    assert not isinstance(info.value, peers.PeerRunFailed)


def test_the_corpus_cache_follows_xdg_cache_home(tmp_path, monkeypatch):
    """ATLAS_FAST_CACHE, else $XDG_CACHE_HOME/atlas_fast (an absolute one: the XDG spec
    ignores a relative value), else ~/.cache/atlas_fast."""
    from atlas_fast import __version__
    from atlas_fast.bench.corpus import default_cache_dir

    leaf = f"bench-{__version__}"
    monkeypatch.delenv("ATLAS_FAST_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "atlas_fast" / leaf
    for ignored in ("", "relative/cache"):
        monkeypatch.setenv("XDG_CACHE_HOME", ignored)
        assert default_cache_dir() == tmp_path / "home" / ".cache" / "atlas_fast" / leaf
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "atlas_fast" / leaf
    monkeypatch.setenv("ATLAS_FAST_CACHE", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine" / leaf


def test_atlas_fast_reads_with_a_cache_smaller_than_the_corpus(tiny_run):
    """Random reads decode blocks: the readers' cache holds 1/8 of the corpus at most (and
    no more than the default), as on a dataset larger than its cache; the report says so."""
    from atlas_fast import DEFAULT_CACHE_BYTES
    from atlas_fast.bench.runner import atlas_cache_bytes

    _, report, text, _ = tiny_run
    for entry in report["corpora"].values():
        size = entry["payload_bytes"]
        assert entry["atlas_cache_bytes"] == atlas_cache_bytes(size) <= max(1, size // 8)
    assert atlas_cache_bytes(10**12) == DEFAULT_CACHE_BYTES
    assert "block cache of 1/8 of each corpus" in text and "page cache" in text


def test_how_to_add_the_reference_and_the_peers(monkeypatch):
    """Not installed: the reason says how to get it (the reference is not on PyPI)."""
    from atlas_fast.bench import reference

    monkeypatch.setattr(reference.importlib.util, "find_spec", lambda name: None)
    monkeypatch.delenv("ATLAS_FAST_BENCH_HIDE", raising=False)
    module, why = reference.load()
    assert module is None
    assert "not on PyPI" in why and "git+https://github.com/EIDOSLAB/torch-atlas-ds" in why
