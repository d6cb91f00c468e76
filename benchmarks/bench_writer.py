"""Writing speed: the reference writer and atlas_fast's, side by side, strategies 0-3.

Writes the documents corpus (this Python's stdlib sources cut into ~2 KB Dolma-style
documents, ``atlas_fast.bench.corpus.stdlib_documents``) as an Atlas dataset with:

- ``reference``: ``torch_atlas_ds.AtlasDatasetWriter`` (when importable; install the wheel
  with ``pip install --no-deps``);
- ``workers=1``, ``workers=2``, ...: ``atlas_fast.AtlasDatasetWriter(..., workers=N)``.

Every contestant writes every strategy once per repetition, interleaved in one process, into a
fresh directory (removed afterwards); the table gives the median examples/s of the repetitions
(wall time of the whole ``with`` block, ``close()`` included) and each one's ratio to the
reference. On a shared machine wall time also measures the neighbours, so the CPU time of the
process and of the calling thread are reported too (``--cpu``): with ``workers=N`` the calling
thread's CPU time is the part that cannot run in parallel. ``--profile`` prints instead where
one single-threaded write's time goes.

    python benchmarks/bench_writer.py                       # all strategies, medians of 5
    python benchmarks/bench_writer.py --strategies 2 --workers 1,2 --repeats 3
    python benchmarks/bench_writer.py --profile
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import json
import os
import platform
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import atlas_fast
from atlas_fast.bench.corpus import stdlib_documents

REFERENCE = "reference"


def reference_writer():
    try:
        import torch_atlas_ds
    except ImportError:
        return None
    return torch_atlas_ds.AtlasDatasetWriter


def writers(workers: list) -> dict:
    out = {}
    ref = reference_writer()
    if ref is not None:
        out[REFERENCE] = lambda path, *args: ref(path, *args)
    for n in workers:
        out[f"workers={n}"] = lambda path, *args, n=n: atlas_fast.AtlasDatasetWriter(
            path, *args, workers=n
        )
    return out


def time_write(make, path: Path, docs: list, shard: int, block: int, strategy: int) -> tuple:
    """(wall, process CPU, calling thread's CPU) seconds of one write."""
    start = time.perf_counter(), time.process_time(), time.thread_time()
    with make(path, shard, block, strategy) as w:
        for doc in docs:
            w.add_example(doc)
    end = time.perf_counter(), time.process_time(), time.thread_time()
    shutil.rmtree(path)
    return tuple(b - a for a, b in zip(start, end))


def headroom(docs: list) -> tuple:
    """How much faster two threads do the same work than one, right now: (zstd, sha256).

    zstd: python-zstandard compressing the corpus's text (it releases the GIL; each call
    allocates its output, so page faults are part of it). sha256: hashing the same bytes
    (GIL released, no allocation): the CPU alone. 2.0 means two free cores; on a busy
    machine it tells what any parallel writer can gain."""
    import hashlib
    import threading

    import zstandard

    data = "".join(d["text"] for d in docs[:2000]).encode()

    def ratio(work):
        start = time.perf_counter()
        work()
        work()
        serial = time.perf_counter() - start
        threads = [threading.Thread(target=work) for _ in range(2)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return serial / (time.perf_counter() - start)

    return (
        ratio(lambda: zstandard.ZstdCompressor(level=3).compress(data)),
        ratio(lambda: hashlib.sha256(data).digest()),
    )


def profile(docs, shard, block, strategies, base: Path) -> None:
    for strategy in strategies:
        prof = cProfile.Profile()
        prof.enable()
        time_write(
            lambda p, *a: atlas_fast.AtlasDatasetWriter(p, *a, workers=1),
            base / "profile",
            docs,
            shard,
            block,
            strategy,
        )
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(6)
        print(f"## strategy {strategy}, workers=1")
        print("\n".join(out.getvalue().splitlines()[4:14]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", default="0,1,2,3", help="comma-separated")
    parser.add_argument("--workers", default="1,2", help="atlas_fast workers= values")
    parser.add_argument("--shard-size", type=int, default=1000, help="examples per shard")
    parser.add_argument("--block-size", type=int, default=100, help="examples per block")
    parser.add_argument("--documents", type=int, help="limit the corpus (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", type=Path, help="where to write (default: a temp directory)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--profile", action="store_true", help="profile workers=1 instead")
    parser.add_argument("--cpu", action="store_true", help="also a table of CPU seconds")
    args = parser.parse_args(argv)
    strategies = [int(s) for s in args.strategies.split(",")]
    docs = list(stdlib_documents(args.documents))
    base = Path(tempfile.mkdtemp(prefix="bench_writer_", dir=args.dir))
    try:
        if args.profile:
            profile(docs, args.shard_size, args.block_size, strategies, base)
            return 0
        contestants = writers([int(n) for n in args.workers.split(",")])
        times = {(s, name): [] for s in strategies for name in contestants}
        room = []
        for rep in range(args.repeats):
            room.append(headroom(docs))
            for strategy in strategies:
                # a different contestant goes first in each repetition
                order = list(contestants.items())
                order = order[rep % len(order) :] + order[: rep % len(order)]
                for name, make in order:
                    t = time_write(
                        make, base / f"{rep}-{strategy}-{name}", docs,
                        args.shard_size, args.block_size, strategy,
                    )  # fmt: skip
                    times[strategy, name].append(t)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    mb = sum(len(d["text"]) for d in docs) / 1e6
    print(
        f"# bench_writer {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC: "
        f"{len(docs)} documents ({mb:.0f} MB of text), shard_size={args.shard_size}, "
        f"block_size={args.block_size}, medians of {args.repeats}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"atlas_fast {atlas_fast.__version__}; two-thread headroom: zstd "
        f"{statistics.median(z for z, _ in room):.2f}x (min {min(z for z, _ in room):.2f}, "
        f"max {max(z for z, _ in room):.2f}), sha256 {statistics.median(h for _, h in room):.2f}x "
        f"(min {min(h for _, h in room):.2f}, max {max(h for _, h in room):.2f})"
    )
    names = list(contestants)
    header = ["strategy"] + [f"{n} ex/s" for n in names]
    if REFERENCE in names:
        header += [f"{n} / ref" for n in names if n != REFERENCE]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    results = []
    for strategy in strategies:
        rate = {n: len(docs) / statistics.median(t[0] for t in times[strategy, n]) for n in names}
        row = [str(strategy)] + [f"{rate[n]:,.0f}" for n in names]
        if REFERENCE in names:
            row += [f"{rate[n] / rate[REFERENCE]:.2f}x" for n in names if n != REFERENCE]
        print("| " + " | ".join(row) + " |")
        results.append({"strategy": strategy, "examples_per_s": rate, "times": {
            n: times[strategy, n] for n in names}})  # fmt: skip
    if args.cpu:
        print("\nCPU seconds (medians): process / calling thread")
        print("| strategy | " + " | ".join(names) + " |")
        print("|---|" + "---|" * len(names))
        for strategy in strategies:
            cells = []
            for n in names:
                proc = statistics.median(t[1] for t in times[strategy, n])
                thread = statistics.median(t[2] for t in times[strategy, n])
                cells.append(f"{proc:.2f} / {thread:.2f}")
            print(f"| {strategy} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
