"""Loader throughput: block-aware shuffling, batches and read-ahead against plain ``ds[i]``.

    python benchmarks/bench_loader.py [--docs 50000] [--reps 5] [--data DIR]

Builds (once, cached under --data) a dataset of text documents cut from the stdlib's sources,
~2 KB each, in 100-example blocks with a shared zstd dictionary (strategy 2), then times, in
one process, side by side (medians of --reps interleaved rounds, warm page cache):

- the reference algorithm (``atlas_fast._python.AtlasDataset``, last block cached) reading
  sequentially and uniformly at random (``ds[i]``);
- an epoch in ``BlockShuffleSampler`` order (window 8) read in batches of 256 through
  ``__getitems__`` with ``cache_blocks=16``, and read one ``ds[i]`` at a time (same cache);
- random batches of 256: ``__getitems__`` against a loop of ``ds[i]``;
- ``iter(ds)`` against the sequential ``ds[i]`` loop.

Each figure is given for the pure-Python backend and for the backend in use
(``atlas_fast.BACKEND``); they are the same run when no compiled backend is built.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import atlas_fast  # noqa: E402
import atlas_fast._python  # noqa: E402
import atlas_fast.atlas  # noqa: E402
from atlas_fast import AtlasDatasetWriter, BlockShuffleSampler, CompressionStrategy  # noqa: E402

BLOCK = 100
BATCH = 256
WINDOW = 8


def documents(count: int):
    """~2 KB text documents from the stdlib's .py files, in a fixed order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    made = 0
    while True:
        for path in sorted(stdlib.rglob("*.py")):
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            rel = str(path.relative_to(stdlib))
            for k in range(0, len(text), 2048):
                yield {"id": f"{rel}:{k}:{made}", "text": text[k : k + 2048], "source": "stdlib"}
                made += 1
                if made == count:
                    return


def build(data: Path, count: int) -> Path:
    root = data / f"stdlib_docs_{count}_b{BLOCK}_s2"
    if (root / "meta.json").exists():
        return root
    data.mkdir(parents=True, exist_ok=True)
    tmp = root.with_name(root.name + ".tmp")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    strategy = CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
    with AtlasDatasetWriter(tmp, count // 4 + 1, BLOCK, compression_strategy=strategy) as w:
        for doc in documents(count):
            w.add_example(doc)
    tmp.rename(root)
    return root


def warm(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            path.read_bytes()


def interleaved(fns: dict, reps: int) -> dict:
    """Median seconds of each ``fns[k]()`` over ``reps`` rounds, each round running them all
    one after the other (so load from other processes hits them alike)."""
    times: dict = {k: [] for k in fns}
    for _ in range(reps):
        for key, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=50_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--random-reads", type=int, default=4000)
    parser.add_argument("--data", type=Path, default=Path("/tmp/atlas_fast_bench_loader"))
    args = parser.parse_args()

    root = build(args.data, args.docs)
    warm(root)
    rng = random.Random(0)
    n = len(atlas_fast._python.AtlasDataset(root))
    uniform = [rng.randrange(n) for _ in range(args.random_reads)]
    batches = [[rng.randrange(n) for _ in range(BATCH)] for _ in range(12)]
    print(
        f"dataset: {n} docs, blocks of {BLOCK}, strategy 2, {root}\n"
        f"cpus: {os.cpu_count()}, pool threads: {atlas_fast._batch.pool_size()}, "
        f"backend in use: {atlas_fast.BACKEND}, reps: {args.reps} (median)\n"
    )

    backends = {"python": atlas_fast._python}
    if atlas_fast.BACKEND != "python":
        backends[atlas_fast.BACKEND] = atlas_fast.atlas

    def row(name, examples, seconds):
        print(f"  {name:<58} {examples / seconds:>12,.0f} ex/s", flush=True)

    for label, module in backends.items():
        print(f"[{label}]")

        def seq(module=module):
            ds = module.AtlasDataset(root)
            for i in range(n):
                ds[i]

        def rand(module=module):
            ds = module.AtlasDataset(root)
            for i in uniform:
                ds[i]

        def iterate(module=module):
            for _ in module.AtlasDataset(root):
                pass

        def shuffled_batches(module=module):
            ds = module.AtlasDataset(root, cache_blocks=2 * WINDOW)
            sampler = BlockShuffleSampler(ds, window_blocks=WINDOW, seed=1)
            order = sampler.epoch_indices().tolist()
            for k in range(0, n, BATCH):
                ds.__getitems__(order[k : k + BATCH])

        def shuffled_single(module=module):
            ds = module.AtlasDataset(root, cache_blocks=2 * WINDOW)
            for i in BlockShuffleSampler(ds, window_blocks=WINDOW, seed=1):
                ds[i]

        def random_getitems(module=module):
            ds = module.AtlasDataset(root)
            for batch in batches:
                ds.__getitems__(batch)

        def random_loop(module=module):
            ds = module.AtlasDataset(root)
            for batch in batches:
                [ds[i] for i in batch]

        variants = {
            "seq": (seq, n, "sequential ds[i] (cache 1 block)"),
            "iter": (iterate, n, "iter(ds), read-ahead"),
            "rand": (rand, len(uniform), "uniform random ds[i] (cache 1 block)"),
            "sb": (shuffled_batches, n, f"BlockShuffleSampler w{WINDOW}: __getitems__ x{BATCH}"),
            "ss": (shuffled_single, n, f"BlockShuffleSampler w{WINDOW}: ds[i] one by one"),
            "rg": (random_getitems, BATCH * len(batches), f"random x{BATCH}: __getitems__"),
            "rl": (random_loop, BATCH * len(batches), f"random x{BATCH}: loop of ds[i]"),
        }
        times = interleaved({k: v[0] for k, v in variants.items()}, args.reps)
        for key, (_, count, name) in variants.items():
            row(name, count, times[key])
        t_seq, t_iter, t_rand, t_sb = times["seq"], times["iter"], times["rand"], times["sb"]
        t_rg, t_rl = times["rg"], times["rl"]
        print(
            f"  ratios: sampler batches / uniform random = "
            f"{(n / t_sb) / (len(uniform) / t_rand):.1f}x (target >= 30x); "
            f"sequential / sampler batches = {t_sb / t_seq:.2f} (target <= 2); "
            f"random __getitems__ / loop = {t_rl / t_rg:.2f}x (target >= 1.3x); "
            f"iter / sequential ds[i] = {t_seq / t_iter:.2f}x (target >= 1.3x)\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
