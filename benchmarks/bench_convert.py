"""``atlas-fast convert`` throughput per format, and ``--workers 2`` against ``--workers 1``.

Builds each source with that format's own writer from the same Dolma-like documents (the
stdlib corpus of ``atlas_fast.bench.corpus``, repeated with fresh ids until there are
``--docs`` of them, ~2.3 KB of text each):

- ``jsonl``: 8 plain JSON lines files;
- ``dolma``: ``documents/*.jsonl.gz`` (8 files, gzip level 6) and one attributes set,
  merged with ``attributes=["lengths"]``;
- ``parquet``: 8 files by ``pyarrow.parquet.write_table`` (its default row groups, snappy);
- ``hf``: ``datasets.Dataset.from_list(...).save_to_disk`` (its default sharding: one Arrow
  file here, which the converter cuts into parts of whole record batches).

Then converts each with the library (``atlas_fast.convert.convert``, default writer options:
shard 10,000, block 100, strategy 2) with ``workers=1`` and ``workers=2``, alternating,
``--repeats`` times, and prints medians of wall time as examples/s and the ratio, side by
side. ``workers`` is cores in total (as ``make -j``): 1 is a serial conversion on one thread
(the shard writers compress on the calling thread; until 2026-11-23 it compressed on a
thread per core, so one worker already used both cores and two gained 1.01-1.46x), 2 is two
processes compressing on one thread each. Wall time, since the point is the use of both
cores. "ceiling now" is what two processes gain on a fixed pure-Python CPU loop, measured
right after each format: 2.0 on two idle cores, less when neighbours use them, which caps
the convert ratio beside it. The CPU columns say what the ratio would be on two idle cores:
the CPU time of one worker, and of the two processes of two (the converting process, with
run 0 and the dictionary training, and the other one). Each side's time on idle cores is
bounded by the larger of its longest single thread (the calling thread) and half its CPU
time; the estimate is the ratio of those bounds. It is optimistic with strategy 2: the
dictionary (about 0.6 CPU-s, on run 0's thread, from the first 10,000 examples) comes before
any block can be compressed, by either process. CPU time is little affected by neighbours,
so it holds when wall-clock ratios cannot be measured.

    python benchmarks/bench_convert.py                  # 100k documents, 3 repetitions
    python benchmarks/bench_convert.py --docs 20000 --repeats 1 --formats jsonl,dolma
    python benchmarks/bench_convert.py --json out.json   # the figures, with each time, as JSON
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atlas_fast.bench.corpus import stdlib_documents
from atlas_fast.convert import convert

FILES = 8
ALL_FORMATS = ("jsonl", "dolma", "parquet", "hf")


def documents(n: int) -> list:
    """``n`` Dolma-style documents: the stdlib corpus, cycled with new ids."""
    base = list(stdlib_documents(n))
    docs = []
    while len(docs) < n:
        round_ = len(docs) // len(base)
        for doc in base[: n - len(docs)]:
            docs.append({**doc, "id": f"{doc['id']}~{round_}"} if round_ else doc)
    return docs


def _chunks(docs: list):
    step = -(-len(docs) // FILES)
    for k in range(FILES):
        yield k, docs[k * step : (k + 1) * step]


def build_jsonl(docs, root: Path) -> dict:
    root.mkdir()
    for k, chunk in _chunks(docs):
        with open(root / f"{k:02d}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(d) + "\n" for d in chunk)
    return {}


def build_dolma(docs, root: Path) -> dict:
    (root / "documents").mkdir(parents=True)
    (root / "attributes" / "lengths").mkdir(parents=True)
    for k, chunk in _chunks(docs):
        name = f"{k:02d}.jsonl.gz"
        with gzip.open(root / "documents" / name, "wt", encoding="utf-8") as f:
            f.writelines(json.dumps(d) + "\n" for d in chunk)
        with gzip.open(root / "attributes" / "lengths" / name, "wt", encoding="utf-8") as f:
            f.writelines(
                json.dumps({"id": d["id"], "attributes": {"chars": [[0, 1, len(d["text"])]]}})
                + "\n"
                for d in chunk
            )
    return {"attributes": ["lengths"]}


def build_parquet(docs, root: Path) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir()
    for k, chunk in _chunks(docs):
        pq.write_table(pa.Table.from_pylist(chunk), root / f"{k:02d}.parquet")
    return {}


def build_hf(docs, root: Path) -> dict:
    import datasets

    datasets.disable_progress_bars()
    datasets.Dataset.from_list(docs).save_to_disk(str(root))
    return {}


def _spin(_=None) -> float:
    """A fixed amount of pure-Python CPU work; returns its wall time."""
    started = time.perf_counter()
    total = 0
    for i in range(5_000_000):
        total += i
    return time.perf_counter() - started


def _cpu() -> tuple:
    """CPU seconds (user + system) of this process, of its ended child processes and of the
    calling thread."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (
        own.ru_utime + own.ru_stime,
        children.ru_utime + children.ru_stime,
        time.thread_time(),
    )


def parallel_ceiling(repeats: int) -> float:
    """How much faster two processes do two units of CPU work than one process does them,
    now, on this machine (2.0 on two idle cores; less when neighbours use them)."""
    import multiprocessing

    ratios = []
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.map(_spin, [0, 1])  # started and warm
        for _ in range(repeats):
            one = _spin() + _spin()
            started = time.perf_counter()
            pool.map(_spin, [0, 1])
            ratios.append(one / (time.perf_counter() - started))
    return statistics.median(ratios)


BUILDERS = {
    "jsonl": build_jsonl,
    "dolma": build_dolma,
    "parquet": build_parquet,
    "hf": build_hf,
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--formats", default=",".join(ALL_FORMATS))
    parser.add_argument("--strategy", type=int, default=2, choices=(0, 1, 2, 3))
    parser.add_argument("--dir", help="work directory (default: a temporary one, removed)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures here")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    formats = [f for f in args.formats.split(",") if f]

    docs = documents(args.docs)
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-convert-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    figures: list = []
    try:
        for fmt in formats:
            src = work / f"src-{fmt}"
            if src.exists():
                shutil.rmtree(src)
            options = BUILDERS[fmt](docs, src)
            times: dict = {1: [], 2: []}
            cpu: dict = {1: [], 2: []}  # (this process, its workers, calling thread) CPU s
            summary = None
            for _ in range(args.repeats):
                for workers in (1, 2):
                    dst = work / f"out-{fmt}-{workers}"
                    shutil.rmtree(dst, ignore_errors=True)
                    cpu_before = _cpu()
                    started = time.perf_counter()
                    summary = convert(
                        src,
                        dst,
                        fmt,
                        workers=workers,
                        compression_strategy=args.strategy,
                        **options,
                    )
                    elapsed = time.perf_counter() - started
                    cpu_after = _cpu()
                    times[workers].append(elapsed)
                    cpu[workers].append(tuple(a - b for a, b in zip(cpu_after, cpu_before)))
                    assert summary.examples == len(docs)
                    shutil.rmtree(dst)
            one, two = statistics.median(times[1]), statistics.median(times[2])
            ceiling = parallel_ceiling(args.repeats)
            serial_cpu = statistics.median(c[0] + c[1] for c in cpu[1])
            serial_thread = statistics.median(c[2] for c in cpu[1])
            parent_cpu = statistics.median(c[0] for c in cpu[2])
            worker_cpu = statistics.median(c[1] for c in cpu[2])
            parent_thread = statistics.median(c[2] for c in cpu[2])
            # On two idle cores a run takes at least its longest thread's CPU time and at
            # least half its CPU time (the worker processes share the parts out as they go;
            # the calling thread trains the strategy-2 dictionary): the estimate is the ratio
            # of those bounds.
            serial_bound = max(serial_thread, serial_cpu / 2)
            bound = max(parent_thread, (parent_cpu + worker_cpu) / 2)
            estimate = serial_bound / bound
            figures.append(
                {
                    "format": fmt,
                    "source_bytes": summary.bytes_in,
                    "examples_per_s": {"1": len(docs) / one, "2": len(docs) / two},
                    "ratio": one / two,
                    "ceiling": ceiling,
                    "idle_estimate": estimate,
                    "times": {"1": times[1], "2": times[2]},
                    "cpu": {"1": cpu[1], "2": cpu[2]},
                }
            )
            rows.append(
                (
                    fmt,
                    summary.bytes_in,
                    len(docs) / one,
                    len(docs) / two,
                    one / two,
                    ceiling,
                    f"{serial_cpu:.1f} ({serial_thread:.1f}) / {parent_cpu:.1f} "
                    f"({parent_thread:.1f}) + {worker_cpu:.1f}",
                    estimate,
                )
            )
            print(
                f"{fmt}: {len(docs) / one:,.0f} ex/s (1 worker), {len(docs) / two:,.0f} "
                f"ex/s (2 workers), x{one / two:.2f}; times 1: "
                f"{', '.join(f'{t:.2f}' for t in times[1])} s, 2: "
                f"{', '.join(f'{t:.2f}' for t in times[2])} s; ceiling x{ceiling:.2f}",
                file=sys.stderr,
            )
            shutil.rmtree(src)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)

    print(
        f"\n{len(docs):,} documents, strategy {args.strategy}, medians of {args.repeats} "
        "(wall time)\n"
    )
    print(
        "| format | source | 1 worker ex/s | 2 workers ex/s | 2 / 1 | ceiling now "
        "| CPU s (calling thread): 1 worker / 2 workers (main + other) "
        "| 2 / 1 on idle cores (from CPU) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for fmt, size, one, two, ratio, ceiling, cpu_text, estimate in rows:
        print(
            f"| {fmt} | {size / 1e6:,.0f} MB | {one:,.0f} | {two:,.0f} | {ratio:.2f}x "
            f"| {ceiling:.2f}x | {cpu_text} | {estimate:.2f}x |"
        )
    if args.json:
        run = {
            "title": "benchmarks/bench_convert.py: convert with --workers 1 and 2",
            "command": " ".join(["python", *sys.argv]),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S%z"),
            "documents": len(docs),
            "strategy": args.strategy,
            "repeats": args.repeats,
            "load_average": {"before": load_before, "after": os.getloadavg()},
            "rows": figures,
        }
        args.json.write_text(json.dumps(run, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
