"""Loader patterns: the reference package beside atlas_fast's two backends, same files.

    python benchmarks/bench_loader.py               # full run (several minutes on 2 cores)
    python benchmarks/bench_loader.py --quick       # small corpora, 3 repetitions
    python benchmarks/bench_loader.py --json out.json

Columns: ``torch_atlas_ds`` (the reference, when importable), ``atlas_fast[cython]`` (when
built) and ``atlas_fast[python]``; every "x ref" divides by the reference's figure from this
run, and none is computed without it. Datasets from ``atlas_fast.bench.corpus`` (the generator
``atlas-fast bench`` uses): documents in zstd (strategy 2) blocks of 100, table rows in zstd
blocks of 64. Patterns (issue 11), every object at its DEFAULT settings:

- (a) an epoch of ``BlockShuffleSampler(ds)`` through ``torch.utils.data.DataLoader`` (batch
  size 256, ``num_workers`` 0 and 2), against the reference's uniform random reading through
  the same DataLoader (``shuffle=True``), and against a sequential pass (``shuffle=False``) of
  the same dataset; beside them, the same DataLoader over a plain in-memory list of the
  examples: what the loader itself allows (worker start-up, batch transport), a ceiling no
  reader can pass; with 2 workers also ``BlockShuffleSampler(ds, batch_size=256,
  num_workers=2)`` (windows dealt per worker: the one setting beyond the defaults);
- (b) ``AtlasDataset(path, cache_bytes=1 GiB)`` (at least the decoded dataset), uniform random
  ``ds[i]`` after one warm sequential pass, against the pickle-per-example floor
  (``pickle.loads`` of each example's own bytes, from memory); ``ds.cache_info()`` when the
  dataset has it (reported as unavailable otherwise);
- (f) memory: a DataLoader with 4 workers, ``shuffle=True``: each worker's PSS (from
  /proc/<pid>/smaps_rollup, read by the worker after its batches) and the bytes its dataset's
  cache holds (``cache_info()['currsize']``, when available);
- (m) mixtures: the documents written as N shards (N = 2, 8, 32), read as one
  ``AtlasDataset`` by a ``BlockShuffleSampler`` epoch, and as N sources (each shard on its
  own, ``AtlasDatasetShard``) by a ``MixtureSampler`` epoch of as many examples (weights the
  shards' sizes, global batch 256), through the same DataLoader, ``num_workers`` 0 and 2:
  examples/s (wall clock, and CPU time as in (a)), blocks decoded per example (cache misses,
  summed over the workers), each sampler's own cost per index (iterating it alone, no
  reading, by CPU time), and ``load_state_dict`` at position 10**9 of a 3-stage schedule.

Clocks: DataLoader patterns by the wall clock (workers run in other processes); (b), single-
threaded, by this process's CPU time (``time.process_time``), which neighbours' load on a
shared machine barely moves. DataLoaders use ``collate_fn=list`` (the examples as they are
read: no tensor conversion, whose cost is the same for every reader). Rates count examples
after the first batch, so that starting the workers is not counted; each DataLoader row is
given by CPU time as well (this process and its workers, start-up included), which a loaded
machine barely moves. Every DataLoader row starts after a full garbage collection (untimed),
so that none pays for the objects the rows before it kept. Needs torch (the reference and
DataLoader do).
"""

from __future__ import annotations

import gc
import os
import pickle
import random
import sys
import time
import warnings
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
    parser,
    ratio,
    start,
    timed,
)

BATCH = 256
CPU = time.process_time
MIX_SOURCES = (2, 8, 32)
CACHE_BYTES = 1 << 30
# (name, corpus, strategy, block size)
DATASETS = (("docs s2 b100", "documents", 2, 100), ("rows s2 b64", "rows", 2, 64))
SIZES = {
    "full": {
        "documents": None,
        "rows": 50_000,
        "random_batches": 12,
        "reads": 3000,
        "pss_batches": 6,
    },
    "quick": {"documents": 1500, "rows": 3000, "random_batches": 2, "reads": 300, "pss_batches": 1},
}


def collate(batch):
    return batch


def children_cpu() -> float:
    """CPU seconds of this process's children that have exited (DataLoader workers)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def loader_pass(c, path, num_workers, cpu, sampler=None, shuffle=False, max_batches=None):
    """A measurement: batches of a DataLoader over a fresh dataset.

    Returns examples after the first batch and the wall-clock seconds since it arrived (so
    that starting the workers is not counted). Appends to ``cpu`` the rate by CPU time: all
    examples over the CPU seconds of this process and of its workers (counted once they have
    exited), start-up included, which the neighbours' load on a shared machine barely moves.
    """
    from torch.utils.data import DataLoader

    def run():
        # A full collection first (untimed), as before every DataLoader row: CPython runs one
        # once the objects that survived since the last outnumber a quarter of the heap
        # (~0.1 s with torch imported, longer than an epoch here), so without it a row would
        # pay for what the rows before it kept. The single-threaded patterns pause the
        # collector instead (sidebyside.timed).
        gc.collect()
        ds = c.open(path)
        s = sampler(ds) if sampler else None
        cpu0 = time.process_time() + children_cpu()
        loader = DataLoader(
            ds,
            batch_size=BATCH,
            sampler=s,
            shuffle=shuffle if s is None else None,
            num_workers=num_workers,
            collate_fn=collate,
        )
        it = iter(loader)
        first = len(next(it))
        count = 0
        batches = 1
        t0 = time.perf_counter()
        for batch in it:
            count += len(batch)
            batches += 1
            if max_batches and batches >= max_batches:
                break
        secs = time.perf_counter() - t0
        del it  # its workers are joined (and reaped) here, so that their CPU time counts
        cpu.append((first + count) / (time.process_time() + children_cpu() - cpu0))
        close(ds)
        return count, secs

    return run


def memory_pass(examples, num_workers):
    """A measurement: the same DataLoader over a plain list of the examples, in order: what
    the loader itself (workers, batch transport, collation) allows, with no reading at all."""
    from torch.utils.data import DataLoader

    def run():
        gc.collect()  # as in loader_pass
        loader = DataLoader(examples, batch_size=BATCH, num_workers=num_workers, collate_fn=collate)
        it = iter(loader)
        next(it)
        count = 0
        t0 = time.perf_counter()
        for batch in it:
            count += len(batch)
        secs = time.perf_counter() - t0
        del it
        return count, secs

    return run


def block_shuffle(ds):
    from atlas_fast import BlockShuffleSampler

    return BlockShuffleSampler(ds)


def dealt_shuffle(num_workers):
    """The sampler told the DataLoader's batch size and workers: windows dealt per worker."""

    def make(ds):
        from atlas_fast import BlockShuffleSampler

        return BlockShuffleSampler(ds, batch_size=BATCH, num_workers=num_workers)

    return make


def x(values, key, base_values, base_key, name, target=None):
    a, b = values.get(key), base_values.get(base_key)
    return ratio(name, a / b if (a and b) else None, target)


def bench_epochs(table, cons, name, path, sizes, reps, main) -> None:
    import statistics

    from atlas_fast import BlockShuffleSampler  # noqa: F401  (fails early without torch)

    examples = list(cons[-1].open(path))
    n = len(examples)
    table.section(f"(a) {name}: {n:,} examples, DataLoader(batch_size={BATCH}) ({path})")
    atlas = [c for c in cons if c.atlas]
    kinds = ("sampler", "dealt", "random", "sequential")
    for nw in (0, 2):
        fns = {("ceiling", "memory"): memory_pass(examples, nw)}
        cpu = {}
        for c in atlas:
            cpu[("sampler", c.key)] = []
            fns[("sampler", c.key)] = loader_pass(
                c, path, nw, cpu[("sampler", c.key)], sampler=block_shuffle
            )
            cpu[("sequential", c.key)] = []
            fns[("sequential", c.key)] = loader_pass(c, path, nw, cpu[("sequential", c.key)])
            if nw > 1:
                cpu[("dealt", c.key)] = []
                fns[("dealt", c.key)] = loader_pass(
                    c, path, nw, cpu[("dealt", c.key)], sampler=dealt_shuffle(nw)
                )
        for c in cons:
            cpu[("random", c.key)] = []
            fns[("random", c.key)] = loader_pass(
                c,
                path,
                nw,
                cpu[("random", c.key)],
                shuffle=True,
                max_batches=sizes["random_batches"] + 1,
            )
        res = interleaved(fns, reps)
        ceiling = res.pop(("ceiling", "memory"))["rate"]
        for clock in ("wall", "CPU"):
            if clock == "wall":
                got = {k: v["rate"] for k, v in res.items()}
            else:
                got = {k: statistics.median(v) for k, v in cpu.items()}
            rates = {kind: {k: got[(kd, k)] for (kd, k) in got if kd == kind} for kind in kinds}
            first = clock == "wall"  # the targets go on the wall-clock rows
            epoch_ratios = [
                x(
                    rates["sampler"],
                    CYTHON,
                    rates["random"],
                    REFERENCE,
                    "cython x ref random",
                    (">=", 30.0) if main and first else None,
                ),
                x(rates["sampler"], PYTHON, rates["random"], REFERENCE, "python x ref random"),
                x(
                    rates["sequential"],
                    CYTHON,
                    rates["sampler"],
                    CYTHON,
                    "cython sequential / epoch",
                    ("<=", 1.5) if main and first else None,
                ),
            ]
            label = f"workers={nw}, {clock}"
            table.add(
                name,
                f"BlockShuffleSampler(ds) epoch, {label}",
                rates["sampler"],
                ratios=epoch_ratios,
            )
            if rates["dealt"]:
                table.add(
                    name,
                    f"BlockShuffleSampler dealt per worker, {label}",
                    rates["dealt"],
                    ratios=[
                        x(
                            rates["dealt"],
                            CYTHON,
                            rates["random"],
                            REFERENCE,
                            "cython x ref random",
                        ),
                        x(
                            rates["dealt"],
                            PYTHON,
                            rates["random"],
                            REFERENCE,
                            "python x ref random",
                        ),
                    ],
                )
            table.add(
                name,
                f"uniform random (shuffle=True), {label}",
                rates["random"],
                ratios=[x(rates["random"], CYTHON, rates["random"], REFERENCE, "cython x ref")],
            )
            table.add(name, f"sequential pass (shuffle=False), {label}", rates["sequential"])
            if clock == "wall":
                ref = rates["random"].get(REFERENCE)
                table.add(
                    name,
                    f"in-memory list of the examples, in order, {label}",
                    {},
                    ratios=[ratio("ceiling x ref random", ceiling / ref if ref else None)],
                    note=f"{ceiling / 1e3:,.1f}k/s: the loader's own ceiling (no reading)",
                )


def floor_pass(payloads, draws):
    def run():
        view = memoryview(payloads[0])
        offsets = payloads[1]
        loads = pickle.loads
        secs = timed(lambda: [loads(view[offsets[i] : offsets[i + 1]]) for i in draws], CPU)
        return len(draws), secs

    return run


def bench_cache(table, cons, name, path, sizes, reps, main) -> None:
    rng = random.Random(5)
    atlas = [c for c in cons if c.atlas]
    n = len(atlas[0].open(path))
    draws = [rng.randrange(n) for _ in range(sizes["reads"])]
    ds = atlas[-1].open(path)
    parts = [pickle.dumps(ds[i], protocol=pickle.HIGHEST_PROTOCOL) for i in range(n)]
    close(ds)
    offsets = [0]
    for p in parts:
        offsets.append(offsets[-1] + len(p))
    payloads = (b"".join(parts), offsets)
    table.section(
        f"(b) {name}: cache_bytes={CACHE_BYTES:,} (pickled dataset {offsets[-1] / 1e6:,.1f} MB), "
        "uniform random after one warm pass"
    )
    infos = {}

    def cached(c):
        def run():
            ds = c.open(path, cache_bytes=CACHE_BYTES)
            for i in range(len(ds)):  # the warm pass
                ds[i]
            secs = timed(lambda: [ds[i] for i in draws], CPU)
            info = getattr(ds, "cache_info", None)
            infos[c.key] = info() if callable(info) else None
            close(ds)
            return len(draws), secs

        return run

    def plain(c):
        def run():
            ds = c.open(path)
            secs = timed(lambda: [ds[i] for i in draws], CPU)
            close(ds)
            return len(draws), secs

        return run

    fns = {("cached", c.key): cached(c) for c in atlas}
    fns.update({("plain", c.key): plain(c) for c in cons})
    fns["floor"] = floor_pass(payloads, draws)
    res = interleaved(fns, reps)
    floor = res["floor"]["rate"]
    cached_rates = {k: res[("cached", k)]["rate"] for c in atlas for k in [c.key]}
    plain_rates = {c.key: res[("plain", c.key)]["rate"] for c in cons}
    table.add(
        name,
        "warm, cache_bytes=1 GiB: uniform random ds[i]",
        cached_rates,
        ratios=[
            ratio(
                "floor / cython",
                floor / cached_rates[CYTHON] if CYTHON in cached_rates else None,
                ("<=", 1.5) if main else None,
            ),
            ratio("floor / python", floor / cached_rates[PYTHON]),
            x(cached_rates, CYTHON, plain_rates, REFERENCE, "cython x ref (no cache)"),
        ],
    )
    table.add(
        name,
        "default settings: uniform random ds[i]",
        plain_rates,
        ratios=[x(plain_rates, CYTHON, plain_rates, REFERENCE, "cython x ref")],
    )
    table.note(f"{name}: floor, pickle.loads of each example's own bytes: {floor:,.0f} ex/s")
    for key, info in infos.items():
        if info is None:
            table.note(f"{name}: atlas_fast[{key}] has no cache_info(): unavailable")
        else:
            table.note(f"{name}: atlas_fast[{key}] cache_info() after the run: {info}")


def _pss_collate(batch):
    """Runs in the worker: its PSS/RSS now, and the bytes its dataset's cache holds."""
    from torch.utils.data import get_worker_info

    pss = rss = None
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
                elif line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
    except OSError:
        pass
    held = None
    worker = get_worker_info()
    info = getattr(worker.dataset, "cache_info", None) if worker else None
    if callable(info):
        got = info()
        held = got.get("currsize") if isinstance(got, dict) else getattr(got, "currsize", None)
    return {"pid": os.getpid(), "pss": pss, "rss": rss, "cache": held, "n": len(batch)}


def bench_memory(table, cons, name, path, sizes) -> None:
    import statistics

    from torch.utils.data import DataLoader

    workers = 4
    table.section(
        f"(f) {name}: PSS per DataLoader worker, {workers} workers, shuffle=True, "
        f"{sizes['pss_batches']} batches of {BATCH} each"
    )
    pss, rss, held = {}, {}, {}
    for c in cons:
        ds = c.open(path)
        with warnings.catch_warnings():  # "4 workers on 2 cores": chosen, as in the issue
            warnings.simplefilter("ignore", UserWarning)
            loader = DataLoader(
                ds, batch_size=BATCH, shuffle=True, num_workers=workers, collate_fn=_pss_collate
            )
            it = iter(loader)
        last = {}
        for k, report in enumerate(it):
            last[report["pid"]] = report
            if k + 1 >= workers * sizes["pss_batches"]:
                break
        del it
        close(ds)
        reports = list(last.values())
        if reports and reports[0]["pss"] is not None:
            pss[c.key] = statistics.median(r["pss"] for r in reports)
            rss[c.key] = statistics.median(r["rss"] for r in reports)
        caches = [r["cache"] for r in reports if r["cache"] is not None]
        held[c.key] = statistics.median(caches) if caches else None
    ref = pss.get(REFERENCE)
    mine = pss.get(CYTHON)
    allowed = None
    if ref is not None and held.get(CYTHON) is not None:
        allowed = ref + held[CYTHON]
    table.add(
        name,
        "PSS per worker (median)",
        pss,
        unit="MB",
        ratios=[
            ratio("cython / ref", mine / ref if mine and ref else None),
            ratio(
                "cython / (ref + its cache bytes)",
                mine / allowed if mine and allowed else None,
                ("<=", 1.0),
            ),
        ],
        note="" if allowed else "no reference or no cache_info(): the target is not measurable",
    )
    table.add(name, "RSS per worker (median)", rss, unit="MB")
    table.add(
        name,
        "bytes the worker's cache holds",
        {k: v for k, v in held.items() if v is not None},
        unit="MB",
        note="cache_info()['currsize']; '-' where unavailable",
    )


def _misses(dataset) -> int:
    """Blocks a dataset (or each source of a mixture) has decoded: its cache's misses."""
    sources = getattr(dataset, "sources", None)
    readers = sources.values() if sources is not None else [dataset]
    return sum(r.cache_info().misses for r in readers)


def _counting_collate(batch):
    """Runs where the batch was read: its size, the process, and the blocks decoded there."""
    from torch.utils.data import get_worker_info

    worker = get_worker_info()
    return len(batch), os.getpid(), _misses(worker.dataset) if worker else None


def mixture_pass(open_data, make_sampler, num_workers, decoded, cpu):
    """A measurement: an epoch of ``make_sampler(dataset)`` over ``open_data()`` through a
    DataLoader; appends the blocks decoded per example (all processes) to ``decoded``, and
    the rate by CPU time (this process's threads and its workers', as in ``loader_pass``)
    to ``cpu``."""
    from torch.utils.data import DataLoader

    def run():
        gc.collect()  # as in loader_pass
        ds = open_data()
        cpu0 = time.process_time() + children_cpu()
        loader = DataLoader(
            ds,
            batch_size=BATCH,
            sampler=make_sampler(ds),
            num_workers=num_workers,
            collate_fn=_counting_collate,
        )
        it = iter(loader)
        first, pid, misses = next(it)
        per_process = {pid: misses}
        count = 0
        t0 = time.perf_counter()
        for size, pid, misses in it:
            count += size
            per_process[pid] = misses
        secs = time.perf_counter() - t0
        del it  # its workers are joined (and reaped) here, so that their CPU time counts
        cpu.append((first + count) / (time.process_time() + children_cpu() - cpu0))
        total = _misses(ds) if num_workers == 0 else sum(per_process.values())
        decoded.append(total / (first + count))
        close(ds)
        return count, secs

    return run


def sampler_cost(make_sampler, open_data, epochs=4):
    """A measurement: iterating the sampler alone (no reading), ``epochs`` epochs (each with
    ``set_epoch``, as training does): indices per CPU second (single-threaded: the
    neighbours' load on a shared machine barely moves it)."""

    def run():
        ds = open_data()
        sampler = make_sampler(ds)
        n = 0
        t0 = CPU()
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for _ in sampler:
                n += 1
        secs = CPU() - t0
        close(ds)
        return n, secs

    return run


def resume_far(make_sampler, open_data, reps):
    """Medians of ``(load_state_dict at position 10**9, the first global batch after it)``,
    seconds, for a sampler whose schedule has three stages before that position."""
    import statistics

    from atlas_fast import MixtureSampler

    ds = open_data()
    sizes = make_sampler(ds).schedule[0][1]
    names = list(sizes)
    schedule = [
        (0, sizes),
        (1_000_000, dict.fromkeys(names[: max(1, len(names) // 2)], 1)),
        (3_000_000, {name: k + 1 for k, name in enumerate(names)}),
    ]
    sampler = MixtureSampler(
        ds, schedule=schedule, global_batch_size=BATCH, epoch_length=BATCH * 10**7
    )
    loads, firsts = [], []
    for rep in range(reps):
        t0 = time.perf_counter()
        sampler.load_state_dict({"epoch": 0, "yielded": 10**9 + rep})
        t1 = time.perf_counter()
        it = iter(sampler)
        for _ in range(BATCH):
            next(it)
        firsts.append(time.perf_counter() - t1)
        loads.append(t1 - t0)
    close(ds)
    return statistics.median(loads), statistics.median(firsts)


def opener(c, path, shard_dirs, zdict, whole):
    """Opens the documents of ``path`` with contender ``c``: one AtlasDataset (``whole``), or a
    MixtureDataset of its shards, each an AtlasDatasetShard with a cache of its own."""
    from atlas_fast import MixtureDataset

    module = sys.modules[c.cls.__module__]

    def open_data():
        if whole:
            return c.open(path)
        return MixtureDataset(
            {
                f"s{d.name}": module.AtlasDatasetShard(d, compression_dict_bytes=zdict)
                for d in shard_dirs
            }
        )

    return open_data


def bench_mixtures(table, cons, args, reps) -> None:
    """(m): a mixture of N sources against one dataset of the same files."""
    import statistics

    from atlas_fast import BlockShuffleSampler, MixtureSampler
    from atlas_fast.bench import corpus

    atlas = [c for c in cons if c.atlas]
    count = SIZES["quick" if args.quick else "full"]["documents"]
    n_examples = len(corpus.examples("documents", count))
    for n in MIX_SOURCES:
        shard = -(-n_examples // n)
        path = dataset(args, "documents", count, 2, 100, shard)
        shard_dirs = sorted((p for p in path.iterdir() if p.is_dir()), key=lambda p: int(p.name))
        dict_file = path / "zstd_dict.bin"
        zdict = dict_file.read_bytes() if dict_file.exists() else None
        table.section(
            f"(m) a mixture of {n} sources: the documents as {len(shard_dirs)} shards of "
            f"{shard} ({path}); BlockShuffleSampler(AtlasDataset) against MixtureSampler("
            f"MixtureDataset of the {len(shard_dirs)} shards), global batch {BATCH}"
        )

        def single(ds):
            return BlockShuffleSampler(ds)

        def mixed(mix):
            sizes = {name: len(src) for name, src in mix.sources.items()}
            length = sum(sizes.values()) // BATCH * BATCH
            return MixtureSampler(mix, sizes, global_batch_size=BATCH, epoch_length=length)

        for nw in (0, 2):
            fns, decoded, cpu = {}, {}, {}
            for c in atlas:
                for kind, whole, make in (("one", True, single), ("mix", False, mixed)):
                    decoded[(kind, c.key)] = []
                    cpu[(kind, c.key)] = []
                    fns[(kind, c.key)] = mixture_pass(
                        opener(c, path, shard_dirs, zdict, whole),
                        make,
                        nw,
                        decoded[(kind, c.key)],
                        cpu[(kind, c.key)],
                    )
            res = interleaved(fns, reps)
            blocks = {
                kind: {c.key: statistics.median(decoded[(kind, c.key)]) for c in atlas}
                for kind in ("one", "mix")
            }
            label = f"workers={nw}"
            # The target is read by CPU time (all threads and workers): on a shared machine
            # the wall clock of an epoch this short moves with the neighbours' load.
            for clock in ("wall", "CPU"):
                if clock == "wall":
                    got = {k: v["rate"] for k, v in res.items()}
                else:
                    got = {k: statistics.median(v) for k, v in cpu.items()}
                rates = {
                    kind: {c.key: got[(kind, c.key)] for c in atlas} for kind in ("one", "mix")
                }
                table.add(
                    f"mix{n}",
                    f"BlockShuffleSampler(AtlasDataset) epoch, {label}, {clock}",
                    rates["one"],
                )
                table.add(
                    f"mix{n}",
                    f"MixtureSampler({n} sources) epoch, {label}, {clock}",
                    rates["mix"],
                    ratios=[
                        x(
                            rates["mix"],
                            c.key,
                            rates["one"],
                            c.key,
                            f"{c.key} x one dataset",
                            (">=", 0.9) if c.key == CYTHON and clock == "CPU" else None,
                        )
                        for c in atlas
                    ],
                )
            table.add(
                f"mix{n}",
                f"blocks decoded per example: one dataset, {label}",
                blocks["one"],
                unit="blocks",
            )
            table.add(
                f"mix{n}",
                f"blocks decoded per example: mixture, {label}",
                blocks["mix"],
                unit="blocks",
                ratios=[
                    x(
                        blocks["mix"],
                        c.key,
                        blocks["one"],
                        c.key,
                        f"{c.key} / one dataset",
                        ("<=", 1.15) if c.key == CYTHON else None,
                    )
                    for c in atlas
                ],
            )
        c = atlas[0]
        costs = interleaved(
            {
                "one": sampler_cost(single, opener(c, path, shard_dirs, zdict, True)),
                "mix": sampler_cost(mixed, opener(c, path, shard_dirs, zdict, False)),
            },
            reps,
        )
        resume = resume_far(mixed, opener(c, path, shard_dirs, zdict, False), reps)
        table.add(
            f"mix{n}",
            "load_state_dict at position 10**9 (3 stages)",
            {c.key: resume[0]},
            unit="s",
            ratios=[ratio("seconds", resume[0], ("<=", 0.1))],
            note=f"then its first global batch: {resume[1] * 1e3:.1f} ms",
        )
        table.add(
            f"mix{n}",
            "sampler cost per index (iterating it alone)",
            {c.key: 1e9 / costs["mix"]["rate"]},
            unit="ns",
            ratios=[ratio("mixture ns per index", 1e9 / costs["mix"]["rate"], ("<=", 1000.0))],
            note=f"BlockShuffleSampler: {1e9 / costs['one']['rate']:.0f} ns per index",
        )


def main(argv=None) -> int:
    arg_parser = parser(__doc__)
    arg_parser.add_argument("--patterns", default="a,b,f,m", help="which of a,b,f,m to run")
    title = "benchmarks/bench_loader.py: loader patterns, side by side"
    args, cons, table = start(arg_parser, title, "benchmarks/bench_loader.py", argv)
    sizes = SIZES["quick" if args.quick else "full"]
    reps = args.reps or (3 if args.quick else 5)
    patterns = {p.strip() for p in args.patterns.split(",")}
    for k, (name, corp, strategy, block) in enumerate(DATASETS):
        path = dataset(args, corp, sizes[corp], strategy, block)
        main_ds = k == 0
        if "a" in patterns:
            bench_epochs(table, cons, name, path, sizes, reps, main_ds)
        if "b" in patterns:
            bench_cache(table, cons, name, path, sizes, reps, main_ds)
        if "f" in patterns and main_ds:
            bench_memory(table, cons, name, path, sizes)
    if "m" in patterns:
        bench_mixtures(table, cons, args, reps)
    return finish(table, args)


if __name__ == "__main__":
    sys.exit(main())
