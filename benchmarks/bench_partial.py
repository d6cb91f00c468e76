"""Partial decoding, measured: one element of a block versus the whole block.

For each corpus and block size, side by side in one run (medians of --repeat runs, µs per
element read at random positions of fresh blocks):

- ``whole``: ``pickle.loads(block)[i]``, what a miss costs without partial decoding;
- ``cython``: the compiled scan of the block, element ``i``'s synthetic pickle, its loads;

``--projection`` times, on datasets written by this package, uniformly random ``ds[i]`` with
no block read twice (CPU time, gc paused, medians of runs interleaved): the reference package
(when installed), atlas_fast's readers (the compiled core decodes one example per miss), and a
*projection*: the same miss sketched in Python over the same files (mmap'd data.bin,
python-zstandard, the compiled scanner, the example's synthetic pickle), which keeps nothing
(atlas_fast's cache keeps each block's pickle and scan for a second read in the block).

Usage: ``python benchmarks/bench_partial.py [--quick] [--repeat 5] [--projection]``
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import pickle
import random
import statistics
import time

import numpy as np

from atlas_fast.bench import corpus

try:
    from atlas_fast._core import _pickle_scan, _reader
except ImportError:
    _pickle_scan = _reader = None


def typed_rows(n: int) -> list:
    """Rows with the types a table export carries: datetime, Decimal, numpy scalars."""
    return [
        {
            "row": i,
            "city": ("Paris", "Lima", "Oslo")[i % 3],
            "when": datetime.datetime(2024, 1, 1) + datetime.timedelta(hours=i),
            "price": decimal.Decimal(f"{i}.99"),
            "count": np.int64(i),
            "ratio": np.float32(i / 7),
        }
        for i in range(n)
    ]


def corpora(quick: bool) -> dict:
    docs = list(corpus.stdlib_documents(600 if quick else 2000))
    out = {
        "documents": docs,
        "tokens": list(corpus.token_arrays(iter(docs), 200 if quick else 600)),
        "blobs": list(corpus.blobs(100 if quick else 300)),
        "typed rows": typed_rows(400 if quick else 2000),
    }
    if hasattr(corpus, "rows"):
        out["rows"] = list(corpus.rows(400 if quick else 2000))
    return out


def per_read(fn, blocks, picks, repeat: int) -> float:
    """Median over ``repeat`` runs of the mean µs of ``fn(block, i)`` over the blocks."""
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        for block, i in zip(blocks, picks):
            fn(block, i)
        runs.append((time.perf_counter() - start) / len(blocks) * 1e6)
    return statistics.median(runs)


def partial(mod):
    def read(block, i):
        s = mod.scan(block)
        data = s.synthetic(i)
        return pickle.loads(data) if data is not None else pickle.loads(block)[i]

    return read


class _Projected:
    """A miss with partial decoding, sketched in Python over one shard of a dataset."""

    def __init__(self, root) -> None:
        import json
        import mmap
        from pathlib import Path

        import zstandard

        root = Path(root)
        (shard,) = sorted(p for p in root.iterdir() if p.is_dir())
        meta = json.loads((shard / "meta.json").read_text())
        self.block_size = meta["block_size"]
        self.index = [int(x) for x in np.load(shard / "index.npy")]
        with open(shard / "data.bin", "rb") as f:
            self.view = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        strategy = meta["compression_strategy"]
        if strategy == 0:
            self.dctx = None
        else:
            where = root if strategy == 2 else shard
            zdict = None
            if strategy in (2, 3):
                zdict = zstandard.ZstdCompressionDict((where / "zstd_dict.bin").read_bytes())
            self.dctx = zstandard.ZstdDecompressor(dict_data=zdict)

    def __getitem__(self, i):
        b, k = divmod(i, self.block_size)
        data = self.view[self.index[b] : self.index[b + 1]]
        if self.dctx is not None:
            data = self.dctx.decompress(data)
        s = _pickle_scan.scan(data)
        synthetic = s.synthetic(k)
        return pickle.loads(synthetic) if synthetic is not None else pickle.loads(data)[k]


def _cpu_per_read(makers: list, indices, repeat: int) -> list:
    """Median CPU µs per read of each reader ``make()`` makes, runs interleaved (one run of
    each in turn, ``repeat`` times) so that the machine's drift hits them alike."""
    import gc

    runs: list = [[] for _ in makers]
    for _ in range(repeat):
        for k, make in enumerate(makers):
            ds = make()  # a fresh reader: no block it read before
            gc.disable()
            try:
                start = time.process_time()
                for i in indices:
                    ds[i]
                runs[k].append((time.process_time() - start) / len(indices) * 1e6)
            finally:
                gc.enable()
    return [statistics.median(r) for r in runs]


def projection(quick: bool, repeat: int) -> None:
    import tempfile

    import atlas_fast

    try:
        import torch_atlas_ds as reference
    except ImportError:
        reference = None
    docs = list(corpus.stdlib_documents(3000 if quick else 8000))
    tokens = list(corpus.token_arrays(iter(docs), 640 if quick else 1600))
    rows = list(corpus.rows(6400 if quick else 16000)) if hasattr(corpus, "rows") else None
    rows = rows or typed_rows(6400 if quick else 16000)
    cases = [
        ("documents", docs, 0, 16),
        ("documents", docs, 1, 16),
        ("documents", docs, 1, 100),
        ("tokens", tokens, 1, 64),
        ("rows", rows, 0, 32),
        ("rows", rows, 1, 64),
    ]
    print(
        f"{'data':10s} {'strategy':>8s} {'block':>5s} {'reference':>10s} {'atlas_fast':>10s} "
        f"{'projected':>10s}  (µs per read, CPU) atlas_fast and projected vs reference"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name, examples, strategy, size in cases:
            root = f"{tmp}/{name}-s{strategy}b{size}"
            with atlas_fast.AtlasDatasetWriter(
                root, len(examples), size, compression_strategy=strategy
            ) as writer:
                for x in examples:
                    writer.add_example(x)
            blocks = list(range(len(examples) // size))
            random.Random(size).shuffle(blocks)
            rng = random.Random(strategy)
            indices = [b * size + rng.randrange(size) for b in blocks]
            makers = [lambda r=root: atlas_fast.AtlasDataset(r), lambda r=root: _Projected(r)]
            if reference is not None:
                makers.append(lambda r=root: reference.AtlasDataset(r))
            ours, proj, *ref = _cpu_per_read(makers, indices, repeat)
            ref = ref[0] if ref else float("nan")
            print(
                f"{name:10s} {strategy:8d} {size:5d} {ref:10.1f} {ours:10.1f} {proj:10.1f}  "
                f"{ref / ours:5.2f}x {ref / proj:5.2f}x",
                flush=True,
            )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--projection", action="store_true", help="datasets, see above")
    args = parser.parse_args(argv)
    if args.projection:
        projection(args.quick, args.repeat)
        return 0
    rng = random.Random(0)
    print(f"{'corpus':11s} {'block':>5s} {'KB':>7s} {'whole':>8s} {'cython':>8s} {'ratio':>6s}")
    for name, examples in corpora(args.quick).items():
        for size in (16, 64, 100):
            blocks = [
                pickle.dumps(examples[k : k + size])
                for k in range(0, len(examples) - size + 1, size)
            ][:40]
            picks = [rng.randrange(size) for _ in blocks]
            whole = per_read(lambda b, i: pickle.loads(b)[i], blocks, picks, args.repeat)
            cy = per_read(partial(_pickle_scan), blocks, picks, args.repeat) if _pickle_scan else 0
            kb = statistics.mean(len(b) for b in blocks) / 1e3
            line = (
                f"{name:11s} {size:5d} {kb:7.1f} {whole:8.1f} {cy:8.1f} "
                f"{whole / cy if cy else 0:5.2f}x"
            )
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
