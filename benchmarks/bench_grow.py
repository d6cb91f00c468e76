"""Growing datasets: what an append and a merge cost, side by side with what they replace.

Builds a dataset of 100 shards (``--shard-examples`` examples of about 2 KB each: text and
an incompressible part, strategy 1), then times, interleaved in one process, medians of
``--repeats`` repetitions:

- ``shard alone``: that many more examples written as one shard (``AtlasDatasetShardWriter``,
  the same options): the work an append cannot avoid;
- ``append, widening``: the same examples appended to the 100-shard dataset (names 00-99
  become 000-100: every old shard renamed, as hard links);
- ``append``: the same appended to a 101-shard dataset (no widening);
- ``cp -r``: the two source datasets (100 shards each) copied with ``cp -r``, to the same file
  system and to another one (``--other-fs``, default /dev/shm);
- ``merge``: ``atlas_fast.merge`` of the two into one, on the same file system (hard links)
  and to the other one (copies).

An append's time is until ``close()`` returns (the grown dataset in place); ``old tree
removed`` adds the removal of the old tree's links, which runs on a thread after the
commit. Each repetition appends to a fresh hard-linked copy of the dataset (``cp -al``, untimed: an
append changes no file of the dataset, it replaces the root), and removes what it wrote.
Reports the ratios the growing guide quotes: append / shard alone (at most 1.5), merge's
speed over ``cp -r``'s (at least 0.5 copying, at least 20 linking).

    python benchmarks/bench_grow.py --json bench_grow.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

import atlas_fast
from atlas_fast._writing.grow import wait_for_removals
from atlas_fast.bench.system import describe, load_average


def examples(n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    words = [f"w{k}" for k in range(500)]
    out = []
    for i in range(n):
        text = " ".join(words[j] for j in rng.integers(0, 500, 250))
        out.append({"id": i, "text": text, "noise": rng.bytes(600)})
    return out


def write(path: Path, rows: list, shard_size: int) -> None:
    with atlas_fast.AtlasDatasetWriter(
        path, shard_size, 100, compression_strategy=1, workers=1
    ) as writer:
        for row in rows:
            writer.add_example(row)


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shard-examples", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--other-fs", default="/dev/shm")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    started = datetime.datetime.now(datetime.timezone.utc)
    n = args.shard_examples
    top = Path(tempfile.mkdtemp(prefix="atlas-bench-grow-"))
    other = Path(tempfile.mkdtemp(prefix="atlas-bench-grow-", dir=args.other_fs))
    try:
        rows = examples(n, 0)
        more = examples(n, 1)
        base = top / "base100"
        write(base, rows * 100, n)
        base101 = top / "base101"
        shutil.copytree(base, base101, copy_function=__import__("os").link)
        with atlas_fast.AtlasDatasetWriter(
            base101, n, 100, compression_strategy=1, append=True
        ) as w:
            for row in rows:
                w.add_example(row)
        second = top / "second"
        shutil.copytree(base, second)  # its own files: a merge's second source
        size = sum(p.stat().st_size for p in base.rglob("*") if p.is_file())
        times: dict = {}

        def add(name, seconds):
            times.setdefault(name, []).append(seconds)

        def shard_alone():
            with atlas_fast.AtlasDatasetShardWriter(
                top / "alone", 100, compression_strategy=1, workers=1
            ) as shard:
                for row in more:
                    shard.add_example(row)

        def appended(dataset):
            with atlas_fast.AtlasDatasetWriter(
                dataset, n, 100, compression_strategy=1, workers=1, append=True
            ) as w:
                for row in more:
                    w.add_example(row)

        for rep in range(args.repeats):
            for name, source in (("append, widening", base), ("append", base101)):
                work = top / "work"
                subprocess.run(["cp", "-al", str(source), str(work)], check=True)
                start = time.perf_counter()
                appended(work)
                add(name, time.perf_counter() - start)  # close() returned: committed
                wait_for_removals()  # the old tree's links removed on a thread
                add(f"{name}, old tree removed", time.perf_counter() - start)
                shutil.rmtree(work)
            add("shard alone", timed(shard_alone))
            shutil.rmtree(top / "alone")
            for where, label in ((top, "same file system"), (other, "another file system")):
                dst = where / "copy"
                dst.mkdir()
                add(
                    f"cp -r, {label}",
                    timed(
                        lambda d=dst: subprocess.run(
                            ["cp", "-r", str(base), str(second), str(d)], check=True
                        )
                    ),
                )
                shutil.rmtree(dst)
                add(f"merge, {label}", timed(lambda d=dst: atlas_fast.merge([base, second], d)))
                shutil.rmtree(dst)
            print(f"repetition {rep + 1}/{args.repeats} done", file=sys.stderr)
    finally:
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(other, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in times.items()}
    alone = medians["shard alone"]
    results = [
        {
            "case": name,
            "median_seconds": round(seconds, 5),
            "seconds": [round(v, 5) for v in times[name]],
        }
        for name, seconds in medians.items()
    ]
    ratios = {
        "append, widening / shard alone": medians["append, widening"] / alone,
        "append / shard alone": medians["append"] / alone,
        "append, widening, old tree removed / shard alone": medians[
            "append, widening, old tree removed"
        ]
        / alone,
        "merge speed / cp -r speed, same file system": medians["cp -r, same file system"]
        / medians["merge, same file system"],
        "merge speed / cp -r speed, another file system": medians["cp -r, another file system"]
        / medians["merge, another file system"],
    }
    run = {
        "title": "growing datasets: append and merge",
        "command": "python benchmarks/bench_grow.py"
        + (f" --json {args.json.name}" if args.json else ""),
        "date": started.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {**describe(), "load_average_after": load_average()},
        "settings": {
            "shards": 100,
            "shard_examples": n,
            "shard_bytes": size // 100,
            "repeats": args.repeats,
            "other_fs": args.other_fs,
        },
        "results": results,
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
    }
    for row in results:
        print(f"{row['case']:32} {row['median_seconds'] * 1000:9.1f} ms")
    for name, value in ratios.items():
        print(f"{name:48} {value:7.2f}")
    if args.json:
        args.json.write_text(json.dumps(run, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
