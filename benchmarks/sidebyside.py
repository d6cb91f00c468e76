"""Side by side in one process: what the scripts in benchmarks/ share.

The contenders are the reference package ``torch_atlas_ds`` (when importable), atlas_fast's
compiled backend ``atlas_fast[cython]`` (when built) and its pure-Python backend
``atlas_fast[python]``, each opening the same files. A measurement is a function returning
``(examples, seconds)``; ``interleaved`` runs every contender's function once per repetition,
in an order rotated from one repetition to the next, and keeps the median rate. A ``Table``
collects rows of rates with their ratios and the issues' targets, prints them and writes JSON.

Every "x ref" ratio divides by the reference's figure from the same run; without the reference
there is no such ratio (the table says why), and atlas_fast[python] never stands in for it.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from atlas_fast.bench import reference as reference_mod
from atlas_fast.bench.system import describe, load_average

__all__ = [
    "Contender",
    "Table",
    "contenders",
    "dataset",
    "finish",
    "interleaved",
    "open_fds",
    "parser",
    "ratio",
    "start",
    "timed",
]

REFERENCE = "reference"
CYTHON = "cython"
PYTHON = "python"
ORDER = (REFERENCE, CYTHON, PYTHON)


class Contender:
    """One reader: ``key`` ("reference", "cython", "python"), its label and dataset class."""

    def __init__(self, key: str, label: str, cls, atlas: bool) -> None:
        self.key = key
        self.label = label
        self.cls = cls
        self.atlas = atlas  # atlas_fast's (accepts cache_bytes=, has __getitems__, close())

    def open(self, path, **kwargs):
        return self.cls(str(path), **kwargs)

    def __repr__(self) -> str:
        return f"Contender({self.label})"


def contenders():
    """``(list of Contender, reference info)``: the reference first when importable.

    The info dict has ``available`` and either ``label``/``version``/``file`` or ``reason``.
    """
    import atlas_fast
    import atlas_fast._python
    import atlas_fast.atlas

    out = []
    module, why = reference_mod.load()
    if module is not None:
        info = dict(reference_mod.describe(module), available=True)
        out.append(Contender(REFERENCE, info["label"], module.AtlasDataset, atlas=False))
    else:
        info = {"available": False, "reason": why}
    if atlas_fast.BACKEND == "cython":
        out.append(Contender(CYTHON, "atlas_fast[cython]", atlas_fast.atlas.AtlasDataset, True))
    out.append(Contender(PYTHON, "atlas_fast[python]", atlas_fast._python.AtlasDataset, True))
    return out, info


def close(ds) -> None:
    """Release a dataset: ``close()`` where it has one; the reference closes when collected."""
    closer = getattr(ds, "close", None)
    if closer is not None:
        closer()


def timed(fn, clock=time.perf_counter):
    """``fn()`` with the garbage collector paused; -> seconds by ``clock`` (default: wall).

    No ``gc.collect()`` around it: with torch imported a full collection costs a quarter of a
    second, more than many measurements; readers are freed by reference counting."""
    gc.disable()
    try:
        t0 = clock()
        fn()
        return clock() - t0
    finally:
        gc.enable()


def interleaved(fns: dict, reps: int) -> dict:
    """Median rate (examples/s) of each ``fns[key]() -> (examples, seconds)`` over ``reps``
    rounds; each round runs them all, in an order rotated from round to round, so that a
    neighbour's load hits them alike. -> ``{key: {"rate", "rates"}}``."""
    keys = list(fns)
    rates: dict = {k: [] for k in keys}
    for rep in range(reps):
        shift = rep % len(keys) if keys else 0
        order = keys[shift:] + keys[:shift]
        for key in order:
            examples, seconds = fns[key]()
            rates[key].append(examples / seconds if seconds > 0 else float("inf"))
    return {k: {"rate": statistics.median(v), "rates": v} for k, v in rates.items()}


def open_fds() -> int | None:
    """This process's open file descriptors (Linux: /proc/self/fd), else None."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def ratio(name: str, value, target=None) -> dict:
    """A ratio and its target: ``target`` is ``(">=", x)`` or ``("<=", x)`` or None."""
    met = None
    if value is not None and target is not None:
        op, bound = target
        met = value >= bound if op == ">=" else value <= bound
    return {
        "name": name,
        "value": value,
        "target": None if target is None else f"{target[0]} {target[1]:g}",
        "met": met,
    }


def _fmt_value(v, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "ns":
        return f"{v:,.0f} ns"
    if unit == "MB":
        return f"{v / 1e6:,.1f} MB"
    if unit == "fds":
        return f"{v:,.0f}"
    if unit == "blocks":
        return f"{v:.4f}"
    if unit == "s":
        return f"{v * 1e3:,.1f} ms"
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g}{suffix}/s"
    return f"{v:.3g}/s"


class Table:
    """Rows of figures per contender with their ratios and targets; text and JSON."""

    def __init__(self, title: str, cons, ref_info: dict, argv) -> None:
        self.title = title
        self.contenders = cons
        self.reference = ref_info
        self.argv = list(argv)
        self.rows: list = []
        self.notes: list = []
        self.started = time.time()

    def have(self, key: str) -> bool:
        return any(c.key == key for c in self.contenders)

    def add(self, section: str, case: str, values: dict, unit: str = "ex/s", ratios=(), note=""):
        """``values``: {contender key: figure or None}; ``ratios``: dicts from ``ratio``."""
        row = {
            "section": section,
            "case": case,
            "unit": unit,
            "values": {k: values.get(k) for k in ORDER if self.have(k)},
            "ratios": list(ratios),
            "note": note,
        }
        self.rows.append(row)
        self._print_row(row)
        return row

    def header(self) -> str:
        import atlas_fast

        try:
            zstd = atlas_fast.zstd_library()
            zstd = f"libzstd {zstd.get('version')} ({zstd.get('path')})"
        except Exception as exc:  # a diagnostic must not end the run
            zstd = f"libzstd: {type(exc).__name__}: {exc}"
        lines = [
            f"# {self.title}",
            f"# {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {_cpu()}, {os.cpu_count()} cores; "
            f"Python {platform.python_version()}; atlas_fast {atlas_fast.__version__} "
            f"(default backend {atlas_fast.BACKEND}); {zstd}",
            f"# command: {' '.join(self.argv)}",
            f"# load average before: {load_average()}",
        ]
        if self.reference["available"]:
            lines.append(
                f"# reference: {self.reference['label']} from {self.reference['file']}; "
                "every 'x ref' divides by its figure from this run"
            )
        else:
            lines.append(
                f"# reference: NOT AVAILABLE ({self.reference['reason']}): no 'x ref' figure "
                "is computed; atlas_fast[python] is atlas_fast's own backend, not the reference"
            )
        lines.append("# columns: " + ", ".join(c.label for c in self.contenders))
        return "\n".join(lines)

    def section(self, text: str) -> None:
        print(f"\n== {text}", flush=True)
        cols = "".join(f"{_short(c.label):>16}" for c in self.contenders)
        print(f"{'case':<56}{cols}  ratios (target)", flush=True)

    def _print_row(self, row) -> None:
        cells = "".join(
            f"{_fmt_value(row['values'].get(c.key), row['unit']):>16}" for c in self.contenders
        )
        parts = []
        for r in row["ratios"]:
            v = "-" if r["value"] is None else f"{r['value']:.2f}x"
            t = ""
            if r["target"]:
                t = f" (target {r['target']}: " + (
                    "n/a" if r["met"] is None else ("met" if r["met"] else "MISSED")
                )
                t += ")"
            parts.append(f"{r['name']} {v}{t}")
        line = f"{row['case'][:56]:<56}{cells}  " + "; ".join(parts)
        if row["note"]:
            line += f"  [{row['note']}]"
        print(line, flush=True)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"# {text}", flush=True)

    def report(self) -> dict:
        import atlas_fast

        return {
            "schema": "sidebyside/1",
            "title": self.title,
            "command": " ".join(self.argv),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started)),
            "duration_seconds": round(time.time() - self.started, 1),
            "machine": {
                "cpu_model": _cpu(),
                "cores": os.cpu_count(),
                "python": platform.python_version(),
                "platform": platform.platform(),
                "load_average_after": load_average(),
            },
            "atlas_fast": {"version": atlas_fast.__version__, "backend": atlas_fast.BACKEND},
            "reference": self.reference,
            "contenders": {c.key: c.label for c in self.contenders},
            "rows": self.rows,
            "notes": self.notes,
        }

    def summary(self) -> str:
        missed = [
            f"{row['section']} / {row['case']}: {r['name']} {r['value']:.2f}x, target {r['target']}"
            for row in self.rows
            for r in row["ratios"]
            if r["met"] is False
        ]
        unknown = sum(
            1 for row in self.rows for r in row["ratios"] if r["target"] and r["met"] is None
        )
        lines = []
        if missed:
            lines.append(f"targets missed ({len(missed)}):")
            lines += ["  " + m for m in missed]
        else:
            lines.append("no target missed among those measured")
        if unknown:
            lines.append(f"targets not measurable in this run: {unknown} (see '-' above)")
        return "\n".join(lines)

    def write_json(self, path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.report(), indent=1, default=str) + "\n")


def _short(label: str) -> str:
    if label.startswith(reference_mod.NAME):
        return "reference"
    return label.replace("atlas_fast", "af")


def warm(path) -> None:
    """Read every file of a dataset once: the page cache is warm for every contender alike."""
    for p in Path(path).rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(1 << 22):
                    pass


def parser(description: str):
    """The command line both scripts share; ``description`` is the script's docstring."""
    import argparse

    p = argparse.ArgumentParser(description=description.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small corpora, 3 repetitions")
    p.add_argument("--reps", type=int, help="repetitions (default 5; --quick 3)")
    p.add_argument("--json", metavar="PATH", help="write every figure here")
    p.add_argument(
        "--cache-dir",
        type=Path,
        help="where the datasets are written once (default: atlas-fast bench's cache directory)",
    )
    return p


def start(arg_parser, title: str, script_path: str, argv):
    """Parse the arguments, find the contenders, print the header: ``(args, cons, table)``."""
    args = arg_parser.parse_args(argv)
    cons, ref_info = contenders()
    shown = sys.argv[1:] if argv is None else list(argv)
    table = Table(title, cons, ref_info, ["python", script_path, *shown])
    print(table.header(), flush=True)
    return args, cons, table


def finish(table, args) -> int:
    """Print the missed targets, write the JSON when asked; the script's exit status."""
    print()
    print(table.summary())
    if args.json:
        table.write_json(args.json)
        print(f"JSON written to {args.json}")
    return 0


def dataset(args, corpus_name: str, count, strategy: int, block: int, shard=None) -> Path:
    """``corpus.dataset`` in the scripts' cache directory, its files read once (page cache)."""
    from atlas_fast.bench import corpus

    root = Path(args.cache_dir) if args.cache_dir else corpus.default_cache_dir()
    path = corpus.dataset(root, corpus_name, count, strategy, block, shard, progress=progress)
    warm(path)
    return path


def progress(text: str) -> None:
    print(f"# {text}", file=sys.stderr, flush=True)


def _cpu() -> str:
    return describe()["cpu_model"]
