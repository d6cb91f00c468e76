"""The documentation's performance tables and plots, generated from benchmarks/results/.

Each JSON file there is the output of one benchmark run (``--json``), its machine paths
removed. This script renders them into docs/performance.md, docs/mixtures.md and the README's one
table, each
between marker comments (``<!-- tables:NAME -->`` ... ``<!-- /tables:NAME -->``), and into
the plots under docs/images/ (SVG, one per benchmark family on the performance page, the
first of them in the README too), so that no figure in the documentation is typed by hand:

    python benchmarks/tables.py              # rewrite the tables and plots from the runs
    python benchmarks/tables.py --check      # exit 1 if a committed table or plot is stale
    python benchmarks/tables.py import RUN.json NAME   # a new run -> results/NAME.json

``import`` replaces every absolute path in the run (the ``--json`` target, the Python
executable, the corpus cache) by its last component, so results name no machine's layout.
Drawing needs matplotlib (the ``bench`` or ``docs`` extra); ``--check`` does not: each plot
records, in its SVG metadata, a digest of the figures it shows and of the code that draws
it, and the check compares that digest (pixels differ between matplotlib releases, the
digest does not). tests/test_docs.py checks that the committed tables and plots are what
this script renders.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import inspect
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PERFORMANCE = ROOT / "docs" / "performance.md"
MIXTURES = ROOT / "docs" / "mixtures.md"
README = ROOT / "README.md"
IMAGES = ROOT / "docs" / "images"

# An absolute POSIX path inside a string (not a URL's path: no ":" right before it).
_ABSOLUTE_PATH = re.compile(r"(?<![\w:.~/-])/(?:[\w.+@~-]+/)*[\w.+@~-]+")


# -- results ------------------------------------------------------------------------------


def strip_paths(value):
    """``value`` (parsed JSON) with each absolute path replaced by its last component."""
    if isinstance(value, str):
        return _ABSOLUTE_PATH.sub(lambda m: m.group(0).rstrip("/").rsplit("/", 1)[-1], value)
    if isinstance(value, list):
        return [strip_paths(v) for v in value]
    if isinstance(value, dict):
        return {k: strip_paths(v) for k, v in value.items()}
    return value


def absolute_paths(value) -> list:
    """The absolute paths left in ``value`` (parsed JSON): none, in a committed run."""
    if isinstance(value, str):
        return _ABSOLUTE_PATH.findall(value)
    if isinstance(value, list):
        return [p for v in value for p in absolute_paths(v)]
    if isinstance(value, dict):
        return [p for v in value.values() for p in absolute_paths(v)]
    return []


def load(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def import_run(source: Path, name: str) -> Path:
    """Copy a run's JSON into results/NAME.json, machine paths removed."""
    run = strip_paths(json.loads(Path(source).read_text()))
    target = RESULTS / f"{name}.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(run, indent=1) + "\n")
    return target


# -- formatting ---------------------------------------------------------------------------


def _rate(value) -> str:
    """Examples per second, short: 1.2k, 253.0k, 11.6M."""
    if value is None:
        return "-"
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.1f}{suffix}"
    return f"{value:.0f}"


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _date(text: str) -> str:
    when = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S%z")
    return when.astimezone(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _machine(machine: dict) -> str:
    python = machine.get("python", "")
    implementation = machine.get("python_implementation", "CPython")
    platform = machine.get("platform", "")
    system = platform.split("-", 1)[0] if platform else ""
    arch = "x86_64" if "x86_64" in platform else machine.get("machine", "")
    return (
        f"{machine.get('cpu_model', 'unknown CPU')}, {machine.get('cores')} cores, "
        f"{implementation} {python}, {system} {arch}".strip()
    )


def run_line(run: dict, extra: str = "") -> str:
    """The sentence naming a run: command, date, machine."""
    return (
        f"Measured by `{run['command']}` on {_date(run['date'])}: "
        f"{_machine(run['machine'])}{extra}."
    )


def _table(header: list, rows: list, align: list | None = None) -> str:
    align = align or ["---"] + ["---:"] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# -- the side-by-side runs (bench_backends.py, bench_loader.py) --------------------------------

_CORPUS = {"docs": "documents", "tokens": "token arrays", "rows": "table rows"}


def _dataset(section: str) -> str:
    """``"docs s2 b100"`` -> ``"documents, zstd + shared dictionary, 100 per block"``."""
    match = re.fullmatch(r"(\w+) s(\d) b(\d+)", section)
    if not match:
        return section
    corpus, strategy, block = match.groups()
    stored = {
        "0": "uncompressed",
        "1": "zstd",
        "2": "zstd + shared dictionary",
        "3": "zstd + dictionary per shard",
    }[strategy]
    return f"{_CORPUS.get(corpus, corpus)}, {stored}, {block} per block"


def _ratio_of(row: dict, name: str):
    for ratio in row["ratios"]:
        if ratio["name"] == name:
            return ratio["value"]
    return None


def _rows_by_section(run: dict) -> dict:
    sections: dict = {}
    for row in run["rows"]:
        sections.setdefault(row["section"], {})[row["case"]] = row
    return sections


# bench_backends.py cases, in the order of the table's columns.
BACKEND_COLUMNS = [
    ("random, no block read twice", "(g) random, no block read twice"),
    ("uniform random", "plain uniform random ds[i]"),
    ("`ds[i]` in order", "(d) ds[i] in order, wall clock"),
    ("`iter(ds)`", "(d) iter(ds), wall clock"),
    ("cached hit", "(c) cached hit, 16 examples of a block"),
]


def backends_table(run: dict, both: bool = True) -> str:
    """Each backend's speed in times the reference's, per dataset and access pattern."""
    rows = []
    for section, cases in _rows_by_section(run).items():
        if section == "many shards":
            continue
        cells = [_dataset(section)]
        for _, case in BACKEND_COLUMNS:
            row = cases.get(case)
            if row is None:
                cells.append("-")
                continue
            cython = _ratio(_ratio_of(row, "cython x ref"))
            cells.append(f"{cython} / {_ratio(_ratio_of(row, 'python x ref'))}" if both else cython)
        rows.append(cells)
    return _table(["data"] + [title for title, _ in BACKEND_COLUMNS], rows)


def cached_hit_line(run: dict) -> str:
    hits = [
        row["values"]["cython"]
        for row in run["rows"]
        if row["case"].startswith("(c) cached hit") and row["values"].get("cython")
    ]
    if not hits:
        return ""
    return f"{min(hits):.0f}-{max(hits):.0f} ns"


def many_shards_table(run: dict) -> str:
    cases = _rows_by_section(run).get("many shards", {})
    rows = []
    for case, row in cases.items():
        values = row["values"]
        unit = row["unit"]
        if unit == "s":
            cells = [f"{values[k] * 1e3:.1f} ms" for k in ("cython", "python", "reference")]
        elif unit == "fds":
            cells = [f"{values[k]:,}" for k in ("cython", "python", "reference")]
        else:
            cells = [f"{_rate(values[k])}/s" for k in ("cython", "python", "reference")]
        ratios = [_ratio(_ratio_of(row, f"{k} x ref")) for k in ("cython", "python")]
        ratio = " / ".join(ratios) if unit != "fds" else "-"
        rows.append([case, *cells, ratio])
    return _table(
        [
            "10,000 shards of 5 table rows",
            "atlas_fast[cython]",
            "atlas_fast[python]",
            "reference",
            "x reference",
        ],
        rows,
    )


def _pick_ratio(row: dict, prefix: str):
    for ratio in row["ratios"]:
        if ratio["name"].startswith(prefix):
            return ratio["value"]
    return None


def loader_table(run: dict) -> str:
    """bench_loader.py: each pattern through a DataLoader, per corpus."""
    rows = []
    for section, cases in _rows_by_section(run).items():
        for case, row in cases.items():
            if case.endswith(", CPU") or row["unit"] != "ex/s":
                continue
            values = row["values"]
            if case.startswith("in-memory list"):
                ceiling = _pick_ratio(row, "ceiling x ref random")
                rows.append(
                    [_dataset(section), case, "-", "-", "-", f"{_ratio(ceiling)} (ceiling)"]
                )
                continue
            vs_ref = _pick_ratio(row, "cython x ref")
            rows.append(
                [
                    _dataset(section),
                    case,
                    f"{_rate(values.get('cython'))}/s",
                    f"{_rate(values.get('python'))}/s",
                    f"{_rate(values.get('reference'))}/s" if values.get("reference") else "-",
                    _ratio(vs_ref),
                ]
            )
    return _table(
        [
            "data",
            "pattern",
            "atlas_fast[cython]",
            "atlas_fast[python]",
            "reference",
            "cython x reference",
        ],
        rows,
        ["---", "---", "---:", "---:", "---:", "---:"],
    )


def memory_table(run: dict) -> str:
    rows = []
    for section, cases in _rows_by_section(run).items():
        for case, row in cases.items():
            if row["unit"] != "MB":
                continue
            values = row["values"]
            cells = [
                "-" if values.get(k) is None else f"{values[k] / 1e6:.1f} MB"
                for k in ("cython", "python", "reference")
            ]
            rows.append([_dataset(section), case, *cells])
    return _table(
        ["data", "per DataLoader worker", "atlas_fast[cython]", "atlas_fast[python]", "reference"],
        rows,
        ["---", "---", "---:", "---:", "---:"],
    )


# -- mixtures (bench_loader.py --patterns a,m) -------------------------------------------------


def _mix_sections(run: dict) -> list:
    """``(sources, cases)`` of each (m) section, by number of sources."""
    out = []
    for section, cases in _rows_by_section(run).items():
        match = re.fullmatch(r"mix(\d+)", section)
        if match:
            out.append((int(match.group(1)), cases))
    return sorted(out, key=lambda item: item[0])


def mixtures_clock(run: dict) -> str:
    """The clock of the mixture rows: CPU time when the run has it (runs before it had the
    wall clock alone, their rows unsuffixed)."""
    cases = {row["case"] for row in run["rows"]}
    return "CPU" if "BlockShuffleSampler(AtlasDataset) epoch, workers=0, CPU" in cases else ""


def mixtures_table(run: dict) -> str:
    """A mixture's epoch against one dataset's, per number of sources and workers."""
    clock = mixtures_clock(run)
    suffix = f", {clock}" if clock else ""
    rows = []
    for n, cases in _mix_sections(run):
        for nw in (0, 2):
            one = cases.get(f"BlockShuffleSampler(AtlasDataset) epoch, workers={nw}{suffix}")
            mix = cases.get(f"MixtureSampler({n} sources) epoch, workers={nw}{suffix}")
            blocks_one = cases.get(f"blocks decoded per example: one dataset, workers={nw}")
            blocks_mix = cases.get(f"blocks decoded per example: mixture, workers={nw}")
            if not (one and mix and blocks_one and blocks_mix):
                continue
            rows.append(
                [
                    str(n),
                    str(nw),
                    f"{_rate(one['values'].get('cython'))}/s",
                    f"{_rate(mix['values'].get('cython'))}/s",
                    _ratio(_ratio_of(mix, "cython x one dataset")),
                    f"{blocks_one['values']['cython']:.4f} / {blocks_mix['values']['cython']:.4f}",
                    _ratio(_ratio_of(blocks_mix, "cython / one dataset")),
                ]
            )
    return _table(
        [
            "sources",
            "workers",
            "one dataset (BlockShuffleSampler)",
            "mixture (MixtureSampler)",
            "mixture x one",
            "blocks decoded per example (one / mixture)",
            "ratio",
        ],
        rows,
    )


def mixture_sampler_table(run: dict) -> str:
    """Each sampler's own cost, and a resume far into training."""
    rows = []
    for n, cases in _mix_sections(run):
        cost = cases.get("sampler cost per index (iterating it alone)")
        resume = cases.get("load_state_dict at position 10**9 (3 stages)")
        if not (cost and resume):
            continue
        single = re.search(r"BlockShuffleSampler: ([\d,.]+) ns", cost.get("note", ""))
        first = re.search(r"first global batch: ([\d.]+) ms", resume.get("note", ""))
        rows.append(
            [
                str(n),
                f"{single.group(1)} ns" if single else "-",
                f"{cost['values']['cython']:,.0f} ns",
                f"{resume['values']['cython'] * 1e3:.2f} ms",
                f"{first.group(1)} ms" if first else "-",
            ]
        )
    return _table(
        [
            "sources",
            "BlockShuffleSampler per index",
            "MixtureSampler per index",
            "load_state_dict at position 10<sup>9</sup>",
            "then its first global batch",
        ],
        rows,
    )


def in_order_table(run: dict) -> str:
    """BlockShuffleSampler's epoch with 0 workers against a pass in order, per corpus."""
    rows = []
    for section, cases in _rows_by_section(run).items():
        epoch = cases.get("BlockShuffleSampler(ds) epoch, workers=0, CPU")
        in_order = cases.get("sequential pass (shuffle=False), workers=0, CPU")
        if not (epoch and in_order):
            continue
        rows.append(
            [
                _dataset(section),
                f"{_rate(epoch['values'].get('cython'))}/s",
                f"{_rate(in_order['values'].get('cython'))}/s",
                _ratio(_pick_ratio(epoch, "cython sequential / epoch")),
            ]
        )
    return _table(
        ["data", "BlockShuffleSampler epoch", "pass in order", "pass in order / epoch"], rows
    )


def mixtures_blocks() -> dict:
    run = load("bench_mixtures")
    return {
        "mixtures-run": run_line(
            run,
            "; compiled backend; epochs by "
            + ("CPU time" if mixtures_clock(run) else "the wall clock"),
        ),
        "mixtures": mixtures_table(run),
        "mixtures-sampler": mixture_sampler_table(run),
        "mixtures-in-order": in_order_table(run),
    }


# -- atlas-fast bench ---------------------------------------------------------------------

_PATTERNS = ["open", "sequential", "random", "batch", "shuffled", "cached"]


def bench_table(run: dict, corpus: str) -> str:
    """``atlas-fast bench``: examples/s per reader and pattern over one corpus."""
    cells: dict = {}
    for result in run["results"]:
        if result["corpus"] != corpus:
            continue
        label = result["label"] + (f" {result['config']}" if result.get("config") else "")
        cells.setdefault(label, {})[result["pattern"]] = result["examples_per_s"]
    patterns = [p for p in _PATTERNS if any(p in row for row in cells.values())]
    rows = [[f"{label}", *[_rate(row.get(p)) for p in patterns]] for label, row in cells.items()]
    return _table(["reader", *patterns], rows)


def bench_corpora(run: dict) -> str:
    parts = []
    for name, corpus in run["corpora"].items():
        parts.append(
            f"{name}: {corpus['examples']:,} examples ({corpus['payload_bytes'] / 1e6:.1f} MB)"
        )
    return "; ".join(parts)


# -- bench_tokens.py ----------------------------------------------------------------------

_TOKEN_RIVALS = {
    "memmap": "a numpy.memmap gather of the same windows",
    "floor": "decompress each block touched once, then copy (ratio: our time over its)",
    "litdata": "LitData TokensLoader (ours: compact=True)",
    "by hand": "AtlasDataset.__getitem__, concatenated by hand",
    "plain pass": "a plain pass (for x in dataset)",
}


def _ratios_sentence(rows: dict, key: str, lead: str) -> str:
    """A paragraph under a table: ``lead``, then each case's ratio ``key`` (empty if none)."""
    found = [f"{case}: {row[key]:.2f}x" for case, row in rows.items() if key in row]
    return f"\n\n{lead}: " + "; ".join(found) + "." if found else ""


def tokens_table(run: dict) -> str:
    """bench_tokens.py's rows: atlas_fast against each rival, tokens/s, CPU ns/token and
    the ratio (median of paired runs) with its target."""
    rows = []
    sections = [run.get("rows", {}), run.get("litdata", {}).get("rows", {}), run.get("index", {})]
    for section in sections:
        for case, row in section.items():
            mine = row.get("atlas_fast") or row.get("index build")
            for name, compared in row.get("compared", {}).items():
                rival = row["plain pass" if name == "index build" else name]
                met = "met" if compared["met"] else "**missed**"
                rows.append(
                    [
                        case,
                        _TOKEN_RIVALS["plain pass" if name == "index build" else name],
                        _rate(mine["tokens_per_s"]),
                        _rate(rival["tokens_per_s"]),
                        f"{mine['cpu_ns_per_token']:.2f} / {rival['cpu_ns_per_token']:.2f}",
                        _ratio(compared["ratio"]),
                        f"{compared['target']} ({met})",
                    ]
                )
    header = [
        "case",
        "against",
        "atlas_fast tokens/s",
        "theirs",
        "CPU ns/token (ours / theirs)",
        "ratio",
        "target",
    ]
    table = _table(header, rows, ["---", "---"] + ["---:"] * 5)
    lit = run.get("litdata", {})
    table += _ratios_sentence(
        run.get("rows", {}),
        "memmap_over_by_hand",
        "The `numpy.memmap` gather itself against reading by hand, in the same runs (no "
        "loader's ratio over reading by hand exceeds it)",
    )
    table += _ratios_sentence(
        lit.get("rows", {}),
        "rows_over_litdata",
        "The same loader handing over int64 rows (`inputs`, `targets`, `positions`; "
        "no `compact`) against LitData, in the same runs",
    )
    if not lit.get("available", True):
        table += f"\n\nLitData rows skipped: {lit.get('reason')}"
    opened = run.get("open")
    if opened:
        table += (
            f"\n\nOpening the zstd dataset ({opened['how']}): files opened "
            + ", ".join(f"`{f}` ({opened['bytes'].get(f, 0):,} bytes)" for f in opened["files"])
            + "; no shard file."
        )
    return table


def tokens_run(run: dict) -> str:
    settings = run["settings"]
    load = run["machine"].get("load_average_before")
    extra = (
        f"; {settings['reps']} repetitions of {settings['batches']} batches "
        f"({settings['worker_batches']} with workers); "
        f"{settings['tokens']:,} tokens in {settings['documents']:,} documents"
    )
    if load:
        after = run["machine"]["load_average_after"]
        extra += f"; load average {load[0]:.1f} before, {after[0]:.1f} after"
    return run_line(run, extra)


# -- growing datasets (bench_grow.py) ---------------------------------------------------------


def grow_table(run: dict) -> str:
    """Median seconds per case, and the ratios the growing guide quotes."""
    rows = [[r["case"], f"{r['median_seconds'] * 1000:,.0f} ms"] for r in run["results"]]
    rows += [[name, f"{value:.2f}"] for name, value in run["ratios"].items()]
    return _table(["case", "median"], rows)


def grow_blocks() -> dict:
    """The run with a hundred small shards, and the run with realistically large ones."""
    blocks = {}
    for key, name in (("grow", "bench_grow"), ("grow-large", "bench_grow_large")):
        grow = load(name)
        settings = grow["settings"]
        linked = ", hard links to one shard's files" if settings.get("linked") else ""
        extra = (
            f"; {settings['shards']} shards of {settings['shard_examples']:,} examples "
            f"({settings['shard_bytes'] / 1e6:.1f} MB each{linked}); "
            f"{settings['repeats']} repetitions"
        )
        blocks[f"{key}-run"] = run_line(grow, extra)
        blocks[key] = grow_table(grow)
    return blocks


# -- bench_export.py --------------------------------------------------------------------------


def export_table(run: dict) -> str:
    """Export to Parquet against convert from Parquet, per worker count."""
    rows = [
        (
            row["workers"],
            _rate(row["convert_examples_per_s"]),
            _rate(row["export_examples_per_s"]),
            _ratio(row["export_over_convert"]),
        )
        for row in run["rows"]
    ]
    table = _table(
        ["workers", "convert from Parquet", "export to Parquet", "export / convert"], rows
    )
    scaling = run["scaling"]
    return (
        f"{table}\n\nTwo workers against one: export {_ratio(scaling['export'])}, convert "
        f"{_ratio(scaling['convert'])}; two processes on a plain CPU loop right after: "
        f"{_ratio(run['ceiling'])} (the machine's ceiling then)."
    )


# -- plots ---------------------------------------------------------------------------------
#
# Each plot is a function of one run returning its figures as plain data ("panels"), drawn
# by _draw: horizontal bars per item, one bar per core (compiled, Python), on a log scale,
# with a line at 1.0x. The digest of that data and of this section's code goes in the SVG.

_CORES = (("cython", "atlas_fast[cython]", "#1f5fa8"), ("python", "atlas_fast[python]", "#e8871e"))


def backends_panels(run: dict) -> list:
    """bench_backends: each core's speed in times the reference's, per pattern and dataset."""
    sections = _rows_by_section(run)
    panels = []
    for title, case in BACKEND_COLUMNS:
        items = []
        for section, cases in sections.items():
            row = cases.get(case)
            if section == "many shards" or row is None:
                continue
            items.append(
                (_dataset(section), {k: _ratio_of(row, f"{k} x ref") for k, _, _ in _CORES})
            )
        panels.append((title.replace("`", ""), items))
    return panels


def loader_panels(run: dict) -> list:
    """bench_loader: each core through a DataLoader, in times the reference's uniform random
    reading through the same loader (as the loader table's "x reference"), wall clock."""
    panels = []
    for section, cases in _rows_by_section(run).items():
        items = []
        for case, row in cases.items():
            values = row["values"]
            ratio = _pick_ratio(row, "cython x ref")
            if not (case.endswith(", wall") or case.startswith("default")) or ratio is None:
                continue
            if not values.get("cython"):
                continue
            per_core = {
                k: (ratio * values[k] / values["cython"] if values.get(k) else None)
                for k, _, _ in _CORES
            }
            items.append((case.replace(", wall", ""), per_core))
        if items:
            panels.append((_dataset(section), items))
    return panels


def formats_panels(run: dict) -> list:
    """atlas-fast bench: each core, in its fastest Atlas configuration for the pattern, in
    times the fastest peer format on that pattern, per corpus."""
    panels = []
    for corpus in run["corpora"]:
        best: dict = {}
        for result in run["results"]:
            if result["corpus"] != corpus or result["kind"] != "atlas":
                continue
            ratio = result.get("ratio_to_best_peer")
            core = "cython" if "cython" in result["label"] else "python"
            key = (result["pattern"], core)
            if ratio is not None and ratio > best.get(key, 0):
                best[key] = ratio
        patterns = [p for p in _PATTERNS if any((p, k) in best for k, _, _ in _CORES)]
        items = [(p, {k: best.get((p, k)) for k, _, _ in _CORES}) for p in patterns]
        if items:  # a corpus no peer read has nothing to show
            panels.append((corpus, items))
    return panels


_TOKEN_PLOT_RIVALS = {
    "memmap": "numpy.memmap gather",
    "by hand": "by hand (__getitem__)",
    "floor": "decompress-once floor (zstd)",
    "litdata": "LitData TokensLoader",
}


def tokens_panels(run: dict) -> list:
    """bench_tokens: TokenSequences in times each rival's tokens/s, per worker count (the
    zstd floor's ratio, a time over a time, turned into speed), and the index build in
    times a plain pass, per core."""
    by_workers: dict = {}
    for section in (run.get("rows", {}), run.get("litdata", {}).get("rows", {})):
        for case, row in section.items():
            workers = case.rpartition(", ")[2]
            for name, compared in row.get("compared", {}).items():
                ratio = compared["ratio"]
                if name == "floor":
                    ratio = 1 / ratio if ratio else None
                items = by_workers.setdefault(workers, [])
                items.append((_TOKEN_PLOT_RIVALS[name], {"cython": ratio, "python": None}))
    panels = list(by_workers.items())
    index = {}
    for case, row in run.get("index", {}).items():
        core = "python" if "[python]" in case else "cython"
        index[core] = row["compared"]["index build"]["ratio"]
    if index:
        panels.append(("index build", [("a plain pass", index)]))
    return panels


PLOTS = {
    # file under docs/images -> (results name, panels, title, x-axis label)
    "backends.svg": (
        "bench_backends",
        backends_panels,
        "atlas_fast against the reference (torch_atlas_ds), same files",
        "x the reference (above 1: faster)",
    ),
    "loader.svg": (
        "bench_loader",
        loader_panels,
        "Through a DataLoader (batch_size=256), wall clock",
        "x the reference's uniform random reading (above 1: faster)",
    ),
    "formats.svg": (
        "atlas_fast_bench",
        formats_panels,
        "Against the formats users come from (atlas-fast bench)",
        "x the fastest peer format on the pattern (above 1: faster)",
    ),
    "tokens.svg": (
        "bench_tokens",
        tokens_panels,
        "Token sequences (seq_len 2048, batches of 32) through a DataLoader",
        "x the rival's tokens/s (above 1: faster)",
    ),
}


def _plot_label(text: str) -> str:
    """A dataset's name (``_dataset``) on two lines, for a plot's narrow axis."""
    corpus, _, rest = text.partition(", ")
    stored, _, block = rest.rpartition(", ")
    return f"{corpus}, {block}\n{stored}" if block else text


def _plot_data(name: str) -> tuple:
    results, panels, title, xlabel = PLOTS[name]
    run = load(results)
    machine = run["machine"]
    when = _date(run["date"])
    source = run["command"].split(" --", 1)[0]
    subtitle = f"`{source}`, {when}, {machine.get('cpu_model')}, {machine.get('cores')} cores"
    return panels(run), f"{title}\n{subtitle}", xlabel


def _plot_digest(name: str) -> str:
    """What a plot shows and the code that draws it, hashed: recorded in its SVG."""
    panels, title, xlabel = _plot_data(name)
    code = "".join(
        inspect.getsource(f)
        for f in (
            backends_panels,
            loader_panels,
            formats_panels,
            tokens_panels,
            _plot_label,
            _draw,
        )
    )
    text = json.dumps([name, panels, title, xlabel, code], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


_DIGEST = re.compile(r"atlas_fast plot data sha256 ([0-9a-f]{64})")


def recorded_digest(path: Path):
    """The digest a committed plot records, or None (missing, or not one of ours)."""
    try:
        match = _DIGEST.search(path.read_text())
    except OSError:
        return None
    return match and match.group(1)


def _draw(name: str, path: Path) -> None:
    """Draw plot ``name`` into ``path``: its panels side by side, bars per core on a log
    scale, a line at 1.0x (SVG: text as text, fixed ids, no date)."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(
            "drawing the plots needs matplotlib: pip install 'atlas-fast[docs]'"
        ) from None
    matplotlib.use("svg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    panels, title, xlabel = _plot_data(name)
    first = [label for label, _ in panels[0][1]]
    same_rows = all([label for label, _ in items] == first for _, items in panels)
    rows = max(len(items) for _, items in panels)
    with matplotlib.rc_context(
        {"svg.hashsalt": "atlas_fast", "svg.fonttype": "none", "font.size": 8}
    ):
        fig, axes = plt.subplots(
            1,
            len(panels),
            figsize=(2.3 * len(panels) + 2.2, 0.5 * rows + 1.5),
            sharey=same_rows,
            squeeze=False,
        )
        values = [v for _, items in panels for _, per in items for v in per.values() if v]
        low = min([0.5, *values]) / 1.4
        high = max([2.0, *values]) * 2.2
        for col, (ax, (panel_title, items)) in enumerate(zip(axes[0], panels)):
            for k, (key, core_label, color) in enumerate(_CORES):
                ys = [i + (k - 0.5) * 0.4 for i in range(len(items))]
                xs = [per.get(key) or 0 for _, per in items]
                bars = ax.barh(ys, xs, height=0.38, color=color, label=core_label)
                for bar, x in zip(bars, xs):
                    if x:
                        ax.text(
                            x * 1.06,
                            bar.get_y() + bar.get_height() / 2,
                            f"{x:.2f}x",
                            va="center",
                            fontsize=6.5,
                        )
            ax.axvline(1.0, color="#333333", linewidth=1, linestyle="--")
            ax.set_xscale("log")
            ax.set_xlim(low, high)
            ax.xaxis.set_major_locator(
                LogLocator(base=10, subs=(1.0, 3.0) if high / low < 300 else (1.0,))
            )
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}x"))
            ax.xaxis.set_minor_formatter(NullFormatter())
            if col == 0 or not same_rows:
                ax.set_yticks(range(len(items)), [_plot_label(lb) for lb, _ in items])
            ax.set_ylim(len(items) - 0.5, -0.5)
            ax.set_title(_plot_label(panel_title), fontsize=8.5, fontweight="bold")
            ax.grid(axis="x", which="major", color="#dddddd", linewidth=0.6)
            ax.set_axisbelow(True)
        fig.supxlabel(xlabel, fontsize=8)
        handles, labels = axes[0, 0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="upper right", ncol=2, fontsize=8, frameon=False)
        fig.suptitle(title, x=0.01, ha="left", fontsize=8.5)
        fig.tight_layout(rect=(0, 0, 1, 0.97))
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(
            path,
            format="svg",
            metadata={
                "Date": None,
                "Creator": None,
                "Description": f"atlas_fast plot data sha256 {_plot_digest(name)}",
            },
        )
        plt.close(fig)


# -- tokenize (bench_tokenize.py) ------------------------------------------------------------


def tokenize_run_line(run: dict) -> str:
    corpus = run["corpus"]
    load = run["load_average"]
    return run_line(
        run,
        f"; tokenizers {run['tokenizers']}; {corpus['documents']:,} documents, "
        f"{corpus['tokens']:,} tokens, a {corpus['vocab']:,}-id BPE; medians of "
        f"{run['repeats']} repetitions; load average {load['before'][0]} before, "
        f"{load['after'][0]} after; two processes on a CPU loop meanwhile "
        f"{_ratio(run['parallel_ceiling'])} one",
    )


def tokenize_table(run: dict) -> str:
    rows = [
        [
            row["side"],
            _rate(row["tokens_per_s"]),
            _ratio(row["ratio_to_workers_1"]),
            f"{row['cpu_s_per_mtoken']:.2f}",
            _rate(row["idle_tokens_per_s"]),
            _ratio(row["idle_ratio_to_workers_1"]),
        ]
        for row in run["rows"]
    ]
    header = [
        "",
        "tokens/s",
        "vs workers=1",
        "CPU s per M tokens",
        "idle cores (est.) tokens/s",
        "vs workers=1",
    ]
    return _table(header, rows)


# -- the documents --------------------------------------------------------------------------


def performance_blocks() -> dict:
    """Name -> generated text of each block of docs/performance.md."""
    backends = load("bench_backends")
    loader = load("bench_loader")
    bench = load("atlas_fast_bench")
    export = load("bench_export")
    tokenized = load("bench_tokenize")
    return {
        "backends-run": run_line(backends),
        "backends": backends_table(backends),
        "many-shards": many_shards_table(backends),
        "loader-run": run_line(loader),
        "loader": loader_table(loader),
        "loader-memory": memory_table(loader),
        "bench-run": run_line(
            bench, f"; {bench['settings']['reps']} repetitions; {bench_corpora(bench)}"
        ),
        "bench-documents": bench_table(bench, "documents"),
        "bench-tokens": bench_table(bench, "tokens"),
        "bench-blobs": bench_table(bench, "blobs"),
        **_tokens_blocks(),
        **grow_blocks(),
        "export-run": run_line(
            export, f"; {export['documents']:,} documents, medians of {export['repeats']}"
        ),
        "export": export_table(export),
        "tokenize-run": tokenize_run_line(tokenized),
        "tokenize": tokenize_table(tokenized),
    }


def _tokens_blocks() -> dict:
    if not (RESULTS / "bench_tokens.json").is_file():
        return {}
    tokens = load("bench_tokens")
    return {"tokens-run": tokens_run(tokens), "tokens": tokens_table(tokens)}


def readme_blocks() -> dict:
    backends = load("bench_backends")
    return {
        "readme-run": run_line(backends),
        "readme": backends_table(backends, both=False),
    }


def _marker(name: str) -> re.Pattern:
    return re.compile(
        rf"(<!-- tables:{re.escape(name)} -->\n)(.*?)(\n?<!-- /tables:{re.escape(name)} -->)",
        re.S,
    )


def fill(text: str, blocks: dict, where: str) -> str:
    """``text`` with each marked block replaced by its generated content."""
    for name, content in blocks.items():
        pattern = _marker(name)
        if not pattern.search(text):
            raise ValueError(f"{where}: no <!-- tables:{name} --> block")
        text = pattern.sub(
            lambda m, c=content: m.group(1) + c + "\n" + m.group(3).lstrip("\n"), text
        )
    return text


def rendered() -> dict:
    """Path -> the text that path should have."""
    return {
        PERFORMANCE: fill(PERFORMANCE.read_text(), performance_blocks(), str(PERFORMANCE)),
        MIXTURES: fill(MIXTURES.read_text(), mixtures_blocks(), str(MIXTURES)),
        README: fill(README.read_text(), readme_blocks(), str(README)),
    }


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a table is stale")
    sub = parser.add_subparsers(dest="command")
    imp = sub.add_parser("import", help="copy a run's JSON into benchmarks/results/")
    imp.add_argument("source", type=Path)
    imp.add_argument("name")
    args = parser.parse_args(argv)
    if args.command == "import":
        print(import_run(args.source, args.name))
        return 0
    stale = []
    for path, text in rendered().items():
        if path.read_text() != text:
            stale.append(path)
            if not args.check:
                path.write_text(text)
    for name in PLOTS:
        path = IMAGES / name
        if recorded_digest(path) != _plot_digest(name):
            stale.append(path)
            if not args.check:
                _draw(name, path)
    if args.check and stale:
        for path in stale:
            print(f"{_shown(path)}: out of date; run python benchmarks/tables.py")
        return 1
    for path in stale:
        print(f"rewrote {_shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
