"""Growing datasets: what an append and a merge cost, side by side with what they replace.

Builds a dataset of 100 shards (``--shard-examples`` examples of about 2 KB each: text and
an incompressible part, strategy 1), then times, interleaved in one process, medians of
``--repeats`` repetitions:

- ``shard alone``: that many more examples written as one shard (``AtlasDatasetShardWriter``,
  the same options): the work an append cannot avoid;
- ``append, widening``: the same examples appended to the 100-shard dataset (names 00-99
  become 000-100: every old shard renamed, as hard links);
- ``append``: the same appended to a 101-shard dataset (no widening: one shard is renamed
  into the root in place, no folder made per old shard);
- the three again on the other file system (``--other-fs``, a tmpfs by default): an
  append's cost beyond its shard is a ``mkdir`` and hard links per old shard, metadata
  operations whose price is the file system's (a journaling one's journal, shared with
  whatever else the machine writes);
- ``100 mkdir``: a hundred empty folders made on each file system, the floor of an append's
  cost beyond its shard on it (it makes a folder per old shard);
- ``cp -r``: the two source datasets (100 shards each) copied with ``cp -r``, to the same file
  system and to another one (``--other-fs``, default /dev/shm);
- ``merge``: ``atlas_fast.merge`` of the two into one, on the same file system (hard links)
  and to the other one (copies);
- ``folders and links``: what a linking merge cannot avoid, alone: a ``mkdir`` per shard and
  a hard link per file into it, in one loop, without checking or reading anything (the most
  a merge by links can gain over ``cp -r``).

An append's time is until ``close()`` returns (the grown dataset in place); ``old tree
removed`` adds the removal of the old tree's links, which runs on a thread after the
commit. Beside the wall-clock medians, the CPU time of the appending thread (``cpu``
ratios): on a machine shared with other work, the part of the cost that is the append's
own. Each repetition appends to a fresh hard-linked copy of the dataset (``cp -al``, untimed: an
append changes no file of the dataset, it replaces the root or adds to it; then ``sync``, so
that the append's one flush does not commit the copy's journal), and removes what it wrote.
Reports the ratios the growing guide quotes: append / shard alone (at most 1.5), merge's
speed over ``cp -r``'s (at least 0.5 copying, at least 20 linking).

``--linked``: the 100 old shards are hard links to the files of one shard, so that shards of
a realistic size (``--shard-examples 60000``: about 64 MB) fit on the disk and in the tmpfs.
An append reads each old shard's meta.json and index.npy and links its files, never reads
data.bin, so what it costs does not depend on whether the old shards share their files.
Merges are then timed on the same file system only (the second source is a linked copy of
the first; ``cp -r`` copies every link in full: 13 GB at 64 MB shards).

    python benchmarks/bench_grow.py --json bench_grow.json
    python benchmarks/bench_grow.py --linked --shard-examples 60000 --json bench_grow_large.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
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


def linked_dataset(path: Path, rows: list, n: int, shards: int) -> None:
    """A dataset of ``shards`` shards at ``path``, each a folder of hard links to the files
    of one shard of ``rows`` (written once)."""
    one = path.with_name(path.name + "-one")
    write(one, rows, n)
    path.mkdir()
    width = len(str(shards - 1))
    for number in range(shards):
        folder = path / str(number).zfill(width)
        folder.mkdir()
        for file in os.listdir(one / "0"):
            os.link(one / "0" / file, folder / file)
    meta = json.loads((one / "meta.json").read_text())
    meta["shard_sizes"] = [n] * shards
    (path / "meta.json").write_text(json.dumps(meta, indent=4))


def links_only(sources: list, dst: Path) -> None:
    """The shards of ``sources`` as folders of hard links in ``dst``, renumbered at one width:
    a linking merge's system calls, nothing checked or read."""
    shards = [
        os.path.join(source, name)
        for source in sources
        for name in sorted(n for n in os.listdir(source) if n.isdigit())
    ]
    width = len(str(len(shards) - 1))
    os.mkdir(dst)
    for number, shard in enumerate(shards):
        folder = os.path.join(dst, str(number).zfill(width))
        os.mkdir(folder)
        for file in os.listdir(shard):
            os.link(os.path.join(shard, file), os.path.join(folder, file))


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shard-examples", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--other-fs", default="/dev/shm")
    parser.add_argument("--linked", action="store_true", help="old shards hard-linked to one")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = load_average()
    n = args.shard_examples
    top = Path(tempfile.mkdtemp(prefix="atlas-bench-grow-"))
    other = Path(tempfile.mkdtemp(prefix="atlas-bench-grow-", dir=args.other_fs))
    try:
        rows = examples(n, 0)
        more = examples(n, 1)
        base = top / "base100"
        if args.linked:
            linked_dataset(base, rows, n, 100)
        else:
            write(base, rows * 100, n)
        base101 = top / "base101"
        shutil.copytree(base, base101, copy_function=os.link)
        with atlas_fast.AtlasDatasetWriter(
            base101, n, 100, compression_strategy=1, append=True
        ) as w:
            for row in rows:
                w.add_example(row)
        # The same two datasets on the other file system, for the appends there.
        other_base = {name: other / name for name in ("base100", "base101")}
        for name, path in other_base.items():  # cp -a keeps --linked's links linked
            subprocess.run(["cp", "-a", str(top / name), str(path)], check=True)
        second = top / "second"
        if args.linked:
            shutil.copytree(base, second, copy_function=os.link)
        else:
            shutil.copytree(base, second)  # its own files: a merge's second source
        size = sum(p.stat().st_size for p in base.rglob("*") if p.is_file())
        times: dict = {}
        cpu: dict = {}

        def add(name, seconds, cpu_seconds=None):
            times.setdefault(name, []).append(seconds)
            if cpu_seconds is not None:
                cpu.setdefault(name, []).append(cpu_seconds)

        def shard_alone(where):
            with atlas_fast.AtlasDatasetShardWriter(
                where / "alone", 100, compression_strategy=1, workers=1
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
            for where, fs in ((top, ""), (other, ", tmpfs")):
                for name, source in (("append, widening", "base100"), ("append", "base101")):
                    work = where / "work"
                    subprocess.run(["cp", "-al", str(where / source), str(work)], check=True)
                    # The copy's folders and links on disk before the clock starts, as a
                    # dataset that exists before its append is: otherwise the append's one
                    # flush commits the copy's pending journal too.
                    os.sync()
                    start, start_cpu = time.perf_counter(), time.thread_time()
                    appended(work)
                    # close() returned: committed
                    add(name + fs, time.perf_counter() - start, time.thread_time() - start_cpu)
                    wait_for_removals()  # the old tree's links removed on a thread
                    add(f"{name}{fs}, old tree removed", time.perf_counter() - start)
                    shutil.rmtree(work)
                # The design's floor: an append makes a folder per old shard.
                folders = where / "folders"
                folders.mkdir()
                add(
                    "100 mkdir" + fs,
                    timed(lambda f=folders: [os.mkdir(f / str(k)) for k in range(100)]),
                )
                shutil.rmtree(folders)
                os.sync()  # as before an append: nothing of the set-up pending
                start, start_cpu = time.perf_counter(), time.thread_time()
                shard_alone(where)
                add("shard alone" + fs, time.perf_counter() - start, time.thread_time() - start_cpu)
                shutil.rmtree(where / "alone")
            merges = ((top, "same file system"),)
            if not args.linked:
                merges += ((other, "another file system"),)
            for where, label in merges:
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
                os.sync()
                add(f"merge, {label}", timed(lambda d=dst: atlas_fast.merge([base, second], d)))
                shutil.rmtree(dst)
            os.sync()
            add(
                "folders and links, same file system",
                timed(lambda: links_only([base, second], top / "bare")),
            )
            shutil.rmtree(top / "bare")
            print(f"repetition {rep + 1}/{args.repeats} done", file=sys.stderr)
    finally:
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(other, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in times.items()}
    cpu_medians = {name: statistics.median(values) for name, values in cpu.items()}
    alone = medians["shard alone"]
    results = [
        {
            "case": name,
            "median_seconds": round(seconds, 5),
            "seconds": [round(v, 5) for v in times[name]],
            **({"median_cpu_seconds": round(cpu_medians[name], 5)} if name in cpu_medians else {}),
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
        "append, widening / shard alone, tmpfs": medians["append, widening, tmpfs"]
        / medians["shard alone, tmpfs"],
        "append / shard alone, tmpfs": medians["append, tmpfs"] / medians["shard alone, tmpfs"],
        "100 mkdir / shard alone": medians["100 mkdir"] / alone,
        "100 mkdir / shard alone, tmpfs": medians["100 mkdir, tmpfs"]
        / medians["shard alone, tmpfs"],
        "append, widening / shard alone, cpu": cpu_medians["append, widening"]
        / cpu_medians["shard alone"],
        "append, widening / shard alone, tmpfs, cpu": cpu_medians["append, widening, tmpfs"]
        / cpu_medians["shard alone, tmpfs"],
    }
    ratios["merge speed / cp -r speed, same file system"] = (
        medians["cp -r, same file system"] / medians["merge, same file system"]
    )
    ratios["folders and links speed / cp -r speed, same file system"] = (
        medians["cp -r, same file system"] / medians["folders and links, same file system"]
    )
    if not args.linked:
        ratios["merge speed / cp -r speed, another file system"] = (
            medians["cp -r, another file system"] / medians["merge, another file system"]
        )
    run = {
        "title": "growing datasets: append and merge",
        "command": " ".join(
            ["python benchmarks/bench_grow.py"]
            + (["--linked"] if args.linked else [])
            + ([f"--shard-examples {n}"] if n != 2000 else [])
            + ([f"--json {args.json.name}"] if args.json else [])
        ),
        "date": started.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            **describe(),
            "load_average_before": load_before,
            "load_average_after": load_average(),
        },
        "settings": {
            "shards": 100,
            "shard_examples": n,
            "shard_bytes": size // 100,
            "repeats": args.repeats,
            "linked": args.linked,
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
