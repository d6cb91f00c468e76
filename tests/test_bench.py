"""``atlas-fast bench`` on a tiny corpus: the machinery, the JSON, the ratios, skipped peers.

No peer needs to be installed: the run hides them (ATLAS_FAST_BENCH_HIDE), so they must be
reported as skipped. Nothing here asserts a timing.
"""

from __future__ import annotations

import itertools
import json
import pickle
from statistics import median

import numpy as np
import pytest
from helpers import assert_same

from atlas_fast import cli
from atlas_fast.bench import corpus, readers, runner
from atlas_fast.bench.measure import PATTERNS

PEERS = ("mds", "litdata", "litdata-zstd", "hf", "zarr")
CONFIGS = ("s0b16", "s2b100")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One benchmark run on a tiny corpus, peers hidden; -> (exit status, report, stdout)."""
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "out.json"
    mp = pytest.MonkeyPatch()
    mp.setenv("ATLAS_FAST_BENCH_HIDE", "streaming,litdata,datasets,zarr")
    try:
        import contextlib
        import io

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
    for c in corpus.CORPORA:
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


def test_ratios_come_from_figures_of_the_same_run(tiny_run):
    _, report, _, _ = tiny_run
    rows = report["results"]
    by_key = {(r["corpus"], r["reader"], r["config"], r["pattern"]): r for r in rows}
    ref_config = report["settings"]["reference"]["config_for_peers"]
    for r in rows:
        ref = by_key[(r["corpus"], "atlas_fast-python", r["config"] or ref_config, r["pattern"])]
        assert r["reference"] == {"reader": "atlas_fast-python", "config": ref["config"]}
        assert r["ratio_to_reference"] == pytest.approx(r["examples_per_s"] / ref["examples_per_s"])
        if r["reader"] == "atlas_fast-python":
            assert r["ratio_to_reference"] == 1.0
        assert r["best_peer"] is None and r["ratio_to_best_peer"] is None  # no peer ran


def test_the_cached_datasets_hold_the_corpus(tiny_run, atlas):
    _, report, _, cache = tiny_run
    root = cache / report["settings"]["scale"]
    manifest = json.loads((root / "manifest.json").read_text())
    for name in corpus.CORPORA:
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
    assert "floor: pickle.loads from mmap" in text
    assert "block permutation" in text or "BlockShuffleSampler" in text


def test_a_second_run_reuses_the_cache(tiny_run, tmp_path, monkeypatch):
    _, report, _, cache = tiny_run
    root = cache / report["settings"]["scale"]
    before = (root / "manifest.json").stat().st_mtime_ns
    monkeypatch.setenv("ATLAS_FAST_BENCH_HIDE", "streaming,litdata,datasets,zarr")
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
            row("atlas_fast-python", "atlas", "s2b100", 100.0),
            row("atlas_fast-python", "atlas", "s0b16", 400.0),
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
        monkeypatch.delattr(atlas_fast, "BlockShuffleSampler", raising=False)
        it, how = reader.shuffled(ds, seed=5)
        assert sorted(int(x["id"]) for x in it) == list(range(50))
        assert "block permutation computed by the benchmark" in how

        monkeypatch.setattr(atlas_fast, "BlockShuffleSampler", FakeSampler, raising=False)
        it, how = reader.shuffled(ds, seed=7)
        assert [int(x["id"]) for x in it] == list(range(49, -1, -1))
        assert seen["seed"] == 7
        assert how.startswith("atlas_fast.BlockShuffleSampler")
