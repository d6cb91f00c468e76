"""Turning a benchmark report (a dict, also the JSON) into a table and a bar chart."""

from __future__ import annotations

import json
from pathlib import Path

from .measure import PATTERNS

__all__ = ["format_table", "write_json", "plot", "PlotUnavailable"]

_PATTERN_TITLES = {
    "open": "open: constructor + first example (rate = opens/s, µs/ex = time per open)",
    "sequential": "sequential pass",
    "random": "uniformly random single access",
    "batch": "random batches of 256",
    "shuffled": "shuffled epoch, each system's own shuffling (rate after the first example)",
    "cached": "cached hits: 16 consecutive examples read again and again",
}
_READER_ORDER = (
    "torch_atlas_ds",
    "atlas_fast",
    "atlas_fast-python",
    "mds",
    "litdata",
    "litdata-zstd",
    "hf",
    "zarr",
    "pickle-floor",
    "zstd-floor",
)


def _si(x: float) -> str:
    if x is None:
        return "-"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            v = x / div
            return f"{v:.3g}{suffix}" if v < 100 else f"{v:.0f}{suffix}"
    return f"{x:.3g}"


def _ratio(x) -> str:
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:.0f}x"
    if x >= 10:
        return f"{x:.1f}x"
    return f"{x:.2f}x"


def _row_sort_key(row, configs):
    reader = row["reader"]
    kind_rank = {"reference": 0, "atlas": 0, "peer": 1, "floor": 2}[row["kind"]]
    cfg = configs.index(row["config"]) if row["config"] in configs else -1
    if row["kind"] in ("reference", "atlas"):
        return (kind_rank, cfg, _READER_ORDER.index(reader))
    return (kind_rank, _READER_ORDER.index(reader), cfg)


def _reader_label(row) -> str:
    return row["label"]


def _strategy_note(info) -> str:
    if info["stored_strategy"] != info["strategy"]:
        return f"s{info['stored_strategy']} (fell back from s{info['strategy']})"
    return f"s{info['stored_strategy']}"


def format_table(report: dict) -> str:
    """The whole report as plain text, one table per corpus and access pattern."""
    out = []
    settings = report["settings"]
    machine = report["machine"]
    af = report["atlas_fast"]
    out.append(
        f"atlas-fast bench  {report['date']}  {machine['cpu_model']}, {machine['cores']} cores, "
        f"Python {machine['python']}"
    )
    out.append(
        f"atlas_fast {af['version']}: default backend {af['default_backend']}"
        + (
            f" (compiled reader unavailable: {af['extension_error']})"
            if af["default_backend"] == "python" and af.get("extension_error")
            else ""
        )
    )
    out.append(
        f"{settings['reps']} repetitions, medians; each measurement bounded to "
        f"{settings['budget_seconds']} s; readers alternated; load average before/after "
        f"{report['load_average']['before']} / {report['load_average']['after']}"
    )
    ref = report["readers"].get(settings["reference"]["reader"], {})
    if ref.get("status") == "ok":
        xref = (
            f"xref: speed relative to the reference, {ref['label']}, on the same Atlas "
            f"configuration, or on {settings['reference']['config_for_peers']} for rows "
            "without one."
        )
    else:
        xref = (
            "xref: none: the reference package (torch_atlas_ds) did not run here "
            f"({ref.get('reason', 'not selected')}), and nothing else stands in for it."
        )
    out.append(
        "ex/s: examples per second. MB/s: pickled size of the examples read (the same bytes "
        f"for every reader). {xref} xpeer: relative to the fastest peer on the same pattern. "
        "Above 1 is faster. atlas_fast[python] is atlas_fast's own pure-Python backend. "
        "baseline rows are no format at all, for scale: neither a bound nor a peer."
    )
    out.append(
        "What is read: files the corpus build just wrote, so they are in the page cache and "
        "every figure is memory speed, not the disk's (dropping the page cache needs root). "
        "atlas_fast's readers are opened with a block cache of 1/8 of each corpus "
        "(cache_bytes; default 32 MiB), so that random reads decode blocks as on a dataset "
        "larger than its cache; 'cached hits' times the block just decoded."
    )
    skipped = [(n, r) for n, r in report["readers"].items() if r["status"] != "ok"]
    if skipped:
        out.append("Skipped:")
        for name, r in skipped:
            out.append(f"  {name}: {r['reason']}")
        missing = {n for n, r in skipped if "not installed" in r["reason"]}
        if missing:
            out.append("To compare with what was skipped:")
            if "torch_atlas_ds" in missing:
                out.append(
                    "  the reference: pip install torch, then pip install --no-deps "
                    "'git+https://github.com/EIDOSLAB/torch-atlas-ds' (not on PyPI)"
                )
            if missing - {"torch_atlas_ds"}:
                out.append(
                    "  the peers: pip install 'atlas-fast[bench]', in a virtual environment "
                    "of its own (mosaicml-streaming caps numpy below 2.2)"
                )
    for e in report.get("errors", []):
        where = e["corpus"] + (f" {e['config']}" if e["config"] else "")
        out.append(f"Error: {e['reader']} on {where}: {e['error']}")
    notes = [(n, r["notes"]) for n, r in report["readers"].items() if r.get("notes")]
    for name, n in notes:
        for k, v in n.items():
            out.append(f"Note: {name}: {k}: {v}")

    configs = settings["configs"]
    for corpus, c in report["corpora"].items():
        out.append("")
        out.append(
            f"=== {corpus}: {c['examples']:,} examples, {c['payload_bytes'] / 1e6:,.1f} MB "
            f"pickled; {c['description']}"
        )
        out.append(
            "    Atlas datasets:  config  stored strategy           shards   disk MB  pickled/disk"
        )
        for name, info in c["datasets"].items():
            ratio = c["payload_bytes"] / info["disk_bytes"] if info["disk_bytes"] else 0
            out.append(
                f"                     {name:<7} {_strategy_note(info):<26}{info['shards']:>5}"
                f"{info['disk_bytes'] / 1e6:>10.1f}  {ratio:>8.2f}x"
            )
        rows = [r for r in report["results"] if r["corpus"] == corpus]
        for pattern in PATTERNS:
            prow = [r for r in rows if r["pattern"] == pattern]
            if not prow:
                continue
            prow.sort(key=lambda r: _row_sort_key(r, configs))
            out.append("")
            out.append(f"--- {corpus} / {_PATTERN_TITLES[pattern]}")
            out.append(
                f"    {'reader':<40} {'config':<7} {'ex/s':>7} {'µs/ex':>8} {'MB/s':>7} "
                f"{'xref':>6} {'xpeer':>6}  how"
            )
            for r in prow:
                how = r["how"]
                if "setup_seconds" in r:
                    how = f"{how}; set-up {r['setup_seconds'] * 1e3:.0f} ms"
                out.append(
                    f"    {_reader_label(r)[:40]:<40} {r['config'] or '':<7} "
                    f"{_si(r['examples_per_s']):>7} {r['seconds_per_example'] * 1e6:>8.1f} "
                    f"{_si(r['mb_per_s']):>7} {_ratio(r['ratio_to_reference']):>6} "
                    f"{_ratio(r['ratio_to_best_peer']):>6}  {how}"
                )
    out.append("")
    return "\n".join(out)


def write_json(report: dict, path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, sort_keys=False) + "\n")


class PlotUnavailable(RuntimeError):
    pass


def plot(report: dict, path) -> None:
    """A PNG of examples/s (log scale) per access pattern and reader, one panel per corpus."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable(
            "--plot needs matplotlib: pip install matplotlib (or 'atlas-fast[bench]')"
        ) from exc

    configs = report["settings"]["configs"]
    corpora = [c for c in report["corpora"] if any(r["corpus"] == c for r in report["results"])]
    if not corpora:
        raise PlotUnavailable("nothing was measured: no plot")
    fig, axes = plt.subplots(len(corpora), 1, figsize=(16, 5.2 * len(corpora)), squeeze=False)
    cmap_atlas = plt.get_cmap("Blues")
    cmap_ref = plt.get_cmap("Oranges")
    peer_colors = {
        "mds": "#2ca02c",
        "litdata": "#9467bd",
        "litdata-zstd": "#c5b0d5",
        "hf": "#d62728",
        "zarr": "#8c564b",
    }
    for ax, corpus in zip(axes[:, 0], corpora):
        rows = [r for r in report["results"] if r["corpus"] == corpus]
        series = []
        for r in sorted(rows, key=lambda r: _row_sort_key(r, configs)):
            key = (r["reader"], r["config"])
            if key not in series:
                series.append(key)
        patterns = [p for p in PATTERNS if any(r["pattern"] == p for r in rows)]
        width = 0.85 / max(len(series), 1)
        for k, (reader, config) in enumerate(series):
            values = []
            label = None
            for p in patterns:
                match = [
                    r
                    for r in rows
                    if r["reader"] == reader and r["config"] == config and r["pattern"] == p
                ]
                values.append(match[0]["examples_per_s"] if match else 0)
                if match and label is None:
                    label = _reader_label(match[0]) + (f" {config}" if config else "")
            xs = [i - 0.425 + width * (k + 0.5) for i in range(len(patterns))]
            frac = (configs.index(config) + 1) / (len(configs) + 1) if config in configs else 0.5
            if reader == "atlas_fast":
                color, hatch = cmap_atlas(0.35 + 0.6 * frac), None
            elif reader == "torch_atlas_ds":
                color, hatch = plt.get_cmap("Greys")(0.3 + 0.6 * frac), "xx"
            elif reader == "atlas_fast-python":
                color, hatch = cmap_ref(0.3 + 0.6 * frac), None
            elif reader in peer_colors:
                color, hatch = peer_colors[reader], None
            else:
                color, hatch = "#bbbbbb" if reader == "zstd-floor" else "#555555", "//"
            ax.bar(
                xs,
                [v if v > 0 else float("nan") for v in values],
                width,
                label=label,
                color=color,
                hatch=hatch,
                edgecolor="white",
                linewidth=0.3,
            )
        ax.set_yscale("log")
        ax.set_xticks(range(len(patterns)))
        ax.set_xticklabels(patterns)
        ax.set_ylabel("examples/s (log)")
        c = report["corpora"][corpus]
        ax.set_title(
            f"{corpus}: {c['examples']:,} examples, {c['payload_bytes'] / 1e6:,.1f} MB pickled",
            loc="left",
        )
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=1, loc="upper left", bbox_to_anchor=(1.005, 1.0))
    machine = report["machine"]
    fig.suptitle(
        f"atlas-fast bench, {report['date'][:10]}: {machine['cpu_model']}, {machine['cores']} "
        f"cores, Python {machine['python']}; medians of {report['settings']['reps']} "
        "repetitions",
        fontsize=10,
    )
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
