"""Single-example reads: the reference package beside atlas_fast's two backends, same files.

    python benchmarks/bench_backends.py             # full run (a few minutes on 2 cores)
    python benchmarks/bench_backends.py --quick     # small corpora, 3 repetitions
    python benchmarks/bench_backends.py --json out.json
    python benchmarks/bench_backends.py --random-only --datasets "docs s2 b16"  # (g) and uniform

Columns: ``torch_atlas_ds`` (the reference, when importable: ``pip install --no-deps`` its
wheel; it imports torch), ``atlas_fast[cython]`` (when built) and ``atlas_fast[python]``.
Every "x ref" ratio divides by the reference's figure from this run; without the reference
none is computed. The datasets come from ``atlas_fast.bench.corpus`` (the generator
``atlas-fast bench`` uses), written once into its cache directory. Patterns (issues 11 and 12):

- (g) uniform random with no block read twice: one random example of every block, blocks in
  random order (as on a dataset far larger than any cache), on a fresh dataset object; plain
  uniform random ``ds[i]`` beside it;
- (d) ``ds[i]`` in order and ``iter(ds)``, whole passes over a fresh dataset object;
- (c) cached hits: ``ds[i]`` over 16 consecutive examples of one decoded block, again and again
  (ns per hit);
- (e) a dataset of many shards (10,000 of 5 table rows, zstd; --quick: 200): open + ``len`` + first
  item, uniform random ``ds[i]`` over it, and the most file descriptors open during that pass.

Clocks: ``iter(ds)`` is timed by the wall clock (its read-ahead overlaps decompression with
unpickling on a second core: the point of it; on a loaded machine the wall clock also counts
the neighbours, so it is given by CPU time as well); ``ds[i]`` in order reads ahead too on the
compiled backend, so it is also given by the wall clock; every other pattern is timed by this
process's CPU time (``time.process_time``: user and system time of all its
threads, so any helper thread is counted), which neighbours' load on a shared machine barely
moves. Every pattern drops each example once read. Garbage collector paused, page cache warm;
every repetition runs every contender once, in a rotated order; figures are medians of --reps.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sidebyside import (
    CYTHON,
    PYTHON,
    REFERENCE,
    close,
    dataset,
    finish,
    interleaved,
    open_fds,
    parser,
    ratio,
    start,
    timed,
)

# (name, corpus, strategy, block size, issue 12's target for "no block read twice" x ref)
DATASETS = (
    ("docs s0 b16", "documents", 0, 16, 4.0),
    ("docs s2 b16", "documents", 2, 16, 2.0),
    ("docs s2 b100", "documents", 2, 100, 2.5),
    ("tokens s2 b64", "tokens", 2, 64, 2.0),
    ("rows s0 b32", "rows", 0, 32, 2.0),
    ("rows s2 b64", "rows", 2, 64, 2.0),
)
MAIN = "docs s2 b100"  # issue 11's targets for in-order, iter and cached hits are stated on it
SIZES = {
    "full": {"documents": None, "tokens": None, "rows": 50_000, "shards": 10_000, "reads": 3000},
    "quick": {"documents": 1500, "tokens": 600, "rows": 3000, "shards": 200, "reads": 300},
}
SHARD_EXAMPLES = 5
CACHED_RUN = 16
CACHED_HITS = 32 * CACHED_RUN * 40
CPU = time.process_time  # single-threaded patterns (see the module's docstring)


def block_starts(path: Path) -> list:
    """Global index of the first example of every block, from the shards' meta.json."""
    import json

    starts = []
    base = 0
    for shard in sorted(p for p in path.iterdir() if p.is_dir()):
        meta = json.loads((shard / "meta.json").read_text())
        n, bs = meta["stored_examples"], meta["block_size"]
        starts += [(base + b, min(bs, n - b)) for b in range(0, n, bs)]
        base += n
    return starts


def stored_strategy(path: Path) -> int:
    import json

    return json.loads((path / "meta.json").read_text())["compression_strategy"]


def read_pass(c, path, indices, clock=CPU):
    """A measurement: ``ds[i]`` for ``i`` in ``indices`` on a fresh dataset object, each
    example dropped once read (as ``iter_pass`` drops them, and a training loop does): a list
    of them all would time their deallocation for a reader that holds none of them after the
    pass, and not for one whose cache still does, until ``close``."""

    def read():
        ds = c.open(path)

        def run_all():
            for i in indices:
                ds[i]

        secs = timed(run_all, clock)
        close(ds)
        return len(indices), secs

    return read


def iter_pass(c, path, clock=time.perf_counter):
    def run():
        ds = c.open(path)
        n = len(ds)
        secs = timed(lambda: [None for _ in ds], clock)
        close(ds)
        return n, secs

    return run


def cached_hits(c, path, start, run_length):
    indices = list(range(start, start + run_length)) * (CACHED_HITS // run_length)

    def run():
        ds = c.open(path)
        ds[start]  # the block is decoded before timing starts
        secs = timed(lambda: [ds[i] for i in indices], CPU)
        close(ds)
        return len(indices), secs

    return run


def x_ref(values, key, target=None, name=None):
    """``values[key] / values[reference]`` (rates), or None without the reference."""
    ref = values.get(REFERENCE)
    v = values.get(key)
    value = v / ref if (ref and v) else None
    return ratio(name or f"{key} x ref", value, target)


def compare(table, cons, reps, section, case, make, targets=(None, None), **kw):
    """Time ``make(contender)`` for every contender; one row with x ref for cython, python."""
    res = interleaved({c.key: make(c) for c in cons}, reps)
    values = {k: v["rate"] for k, v in res.items()}
    ratios = [x_ref(values, CYTHON, targets[0]), x_ref(values, PYTHON, targets[1])]
    return table.add(section, case, values, ratios=ratios, **kw)


def bench_dataset(table, cons, name, path, strategy_target, reps, rng, random_only=False) -> None:
    starts = block_starts(path)
    n = sum(k for _, k in starts)
    once = [s + rng.randrange(k) for s, k in starts]
    rng.shuffle(once)
    uniform = [rng.randrange(n) for _ in range(len(once))]
    table.section(
        f"{name}: {n:,} examples, {len(starts):,} blocks, stored strategy "
        f"{stored_strategy(path)} ({path})"
    )
    main = name == MAIN
    rows = (
        ("(g) random, no block read twice", lambda c: read_pass(c, path, once), strategy_target),
        ("plain uniform random ds[i]", lambda c: read_pass(c, path, uniform), None),
        # Issue 11's target for a pass in order is by the wall clock (the read-ahead's gain is
        # the second core's), as for iter(ds); the CPU row shows what it costs.
        ("(d) ds[i] in order", lambda c: read_pass(c, path, range(n)), None),
        (
            "(d) ds[i] in order, wall clock",
            lambda c: read_pass(c, path, range(n), time.perf_counter),
            1.5 if main else None,
        ),
        ("(d) iter(ds), wall clock", lambda c: iter_pass(c, path), 2.0 if main else None),
    )
    for case, make, target in rows[:2] if random_only else rows:
        compare(table, cons, reps, name, case, make, ((">=", target) if target else None, None))
    if random_only:
        return
    compare(
        table,
        cons,
        reps,
        name,
        "(d) iter(ds), CPU time of all threads",
        lambda c: iter_pass(c, path, CPU),
        note="what the read-ahead costs in CPU, not its wall-clock gain",
    )
    start, size = starts[len(starts) // 2]
    run_length = min(CACHED_RUN, size)
    res = interleaved({c.key: cached_hits(c, path, start, run_length) for c in cons}, reps)
    rates = {k: v["rate"] for k, v in res.items()}
    table.add(
        name,
        f"(c) cached hit, {run_length} examples of a block",
        {k: 1e9 / v for k, v in rates.items()},
        unit="ns",
        ratios=[
            x_ref(rates, CYTHON, (">=", 7.0) if main else None),
            x_ref(rates, PYTHON),
        ],
        note="ns per hit; issue 11: about 60 ns, 7x the reference, today" if main else "",
    )


def bench_many_shards(table, cons, path, reads, reps, rng, fd0) -> None:
    starts = block_starts(path)
    n = sum(k for _, k in starts)
    shards = sum(1 for p in path.iterdir() if p.is_dir())
    table.section(f"(e) {shards:,} shards of {SHARD_EXAMPLES} examples, {n:,} examples ({path})")

    def opening(c):
        def run():
            holder = {}

            def go():
                ds = holder["ds"] = c.open(path)
                len(ds)
                ds[0]

            secs = timed(go, CPU)
            close(holder.pop("ds"))
            return 1, secs

        return run

    res = interleaved({c.key: opening(c) for c in cons}, reps)
    rates = {k: v["rate"] for k, v in res.items()}
    table.add(
        "many shards",
        "open + len + first item",
        {k: 1 / v for k, v in rates.items()},
        unit="s",
        ratios=[x_ref(rates, CYTHON, (">=", 8.0)), x_ref(rates, PYTHON)],
        note="time per open",
    )
    draws = [rng.randrange(n) for _ in range(reads)]
    compare(
        table,
        cons,
        reps,
        "many shards",
        f"uniform random ds[i], {reads:,} reads",
        lambda c: read_pass(c, path, draws),
        ((">=", 3.0), None),
    )
    fds = {c.key: most_fds(c, path, draws) for c in cons} if fd0 is not None else {}
    table.add(
        "many shards",
        "most descriptors open in the process, that pass",
        fds,
        unit="fds",
        note=f"the process had {fd0} before opening any dataset; bounded is the target"
        if fds
        else "no /proc/self/fd here",
    )


def most_fds(c, path, draws) -> int:
    """The most descriptors this process holds while a fresh dataset reads ``draws`` (not
    timed). Counted whole, not as a difference: a core may keep descriptors across dataset
    objects (a process-wide ring), which a difference would hide."""
    ds = c.open(path)
    most = open_fds()
    for k, i in enumerate(draws):
        ds[i]
        if k % 50 == 0:
            most = max(most, open_fds())
    most = max(most, open_fds())
    close(ds)
    return most


def main(argv=None) -> int:
    arg_parser = parser(__doc__)
    arg_parser.add_argument(
        "--datasets",
        help="comma-separated subset of: " + ", ".join(d[0] for d in DATASETS) + ", shards",
    )
    arg_parser.add_argument(
        "--random-only",
        action="store_true",
        help="only the random patterns: (g) no block read twice, and plain uniform random",
    )
    title = "benchmarks/bench_backends.py: single-example reads, side by side"
    args, cons, table = start(arg_parser, title, "benchmarks/bench_backends.py", argv)
    fd0 = open_fds()
    sizes = SIZES["quick" if args.quick else "full"]
    reps = args.reps or (3 if args.quick else 5)
    wanted = None if not args.datasets else {x.strip() for x in args.datasets.split(",")}
    rng = random.Random(12)
    for name, corp, strategy, block, target in DATASETS:
        if wanted is None or name in wanted:
            path = dataset(args, corp, sizes[corp], strategy, block)
            bench_dataset(table, cons, name, path, target, reps, rng, args.random_only)
    if wanted is None or "shards" in wanted:
        count = sizes["shards"] * SHARD_EXAMPLES
        path = dataset(args, "rows", count, 1, SHARD_EXAMPLES, SHARD_EXAMPLES)
        bench_many_shards(table, cons, path, sizes["reads"], reps, rng, fd0)
    return finish(table, args)


if __name__ == "__main__":
    sys.exit(main())
