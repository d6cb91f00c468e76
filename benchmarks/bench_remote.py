"""Reading an Atlas dataset over HTTP from nginx, through the test tree's proxy adding 0, 20 and
50 ms per request, beside the same dataset on local disk.

Patterns, each in a fresh spawned process (cold clients and caches), medians of REPS:
- ``in order``: ``list(ds)``;
- ``random``: RANDOM uniformly random ``ds[i]`` (one request per block missed);
- ``sampler``: one epoch of ``BlockShuffleSampler`` through ``DataLoader(batch_size=64)``;
- ``in order, 2 workers``: ``DataLoader(batch_size=64, num_workers=2)`` (fork), a pass in order.

Reported per pattern and link: examples/s, the ratio to local disk and to 0 ms, and the
requests and bytes the proxy saw per run beside the bytes stored.

Writing (``write``): the same corpus written by ``AtlasDatasetWriter`` (strategy 2, blocks of
100, about three shards) to local disk and to moto's S3 server (its own process) through the
proxy at 0 and 50 ms, each rep in a fresh spawned process, the examples already in memory;
examples/s and the ratio to the local write (medians). Run under the bench lock:

    flock /work/bench.lock python benchmarks/bench_remote.py [--json out.json] [--only write]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "remote"))

from faultproxy import ProxyProcess
from servers import NginxServer

COUNT = 20_000  # documents of ~2 KB, strategy 2, blocks of 100
RANDOM = 150
REPS = 3
LATENCIES = (0.0, 0.02, 0.05)
PATTERNS = ("in order", "random", "sampler", "in order, 2 workers")
WRITE_LATENCIES = (0.0, 0.05)


def _measure(root: str, pattern: str, seed: int) -> tuple:
    """In a fresh process: (examples read, seconds)."""
    import atlas_fast
    from atlas_fast import BlockShuffleSampler

    start = time.perf_counter()
    ds = atlas_fast.AtlasDataset(root)
    n = len(ds)
    if pattern == "in order":
        count = sum(1 for _ in ds)
    elif pattern == "random":
        rng = random.Random(seed)
        count = 0
        for _ in range(RANDOM):
            ds[rng.randrange(n)]
            count += 1
    else:
        from torch.utils.data import DataLoader

        if pattern == "sampler":
            sampler = BlockShuffleSampler(ds, seed=seed)
            loader = DataLoader(ds, batch_size=64, sampler=sampler, collate_fn=list)
        else:
            loader = DataLoader(
                ds, batch_size=64, num_workers=2, multiprocessing_context="fork", collate_fn=list
            )
        count = sum(len(b) for b in loader)
    return count, time.perf_counter() - start


def _child(queue, root: str, pattern: str, seed: int) -> None:
    queue.put(_measure(root, pattern, seed))


def _run(root: str, pattern: str, seed: int) -> tuple:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, root, pattern, seed))  # may fork workers
    proc.start()
    out = queue.get(timeout=600)
    proc.join(60)
    return out


def _write(target: str, count: int, env: dict) -> tuple:
    """In a fresh process: (examples written, seconds) of writing the corpus to ``target``."""
    import os

    os.environ.update(env)
    from atlas_fast import AtlasDatasetWriter
    from atlas_fast.bench import corpus

    examples = corpus.examples("documents", count)
    start = time.perf_counter()
    with AtlasDatasetWriter(
        target, shard_size=corpus.shard_size(len(examples)), block_size=100
    ) as writer:
        for example in examples:
            writer.add_example(example)
    return len(examples), time.perf_counter() - start


def _write_child(queue, target: str, count: int, env: dict) -> None:
    queue.put(_write(target, count, env))


def _run_write(target: str, count: int, env: dict) -> tuple:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_write_child, args=(queue, target, count, env))
    proc.start()
    out = queue.get(timeout=600)
    proc.join(60)
    return out


def write_rows(reps: int, count: int) -> dict:
    """The write rows: local disk, then S3 (moto) at each of WRITE_LATENCIES."""
    from servers import S3_ENV, MotoProcess

    rows: dict = {}
    moto = MotoProcess()
    try:
        moto.client().create_bucket(Bucket="bench")
        links = [("local", None)] + [(f"{int(lat * 1000)} ms", lat) for lat in WRITE_LATENCIES]
        with tempfile.TemporaryDirectory() as tmp:
            for label, latency in links:
                proxy = None
                env = dict(S3_ENV)
                if latency is not None:
                    proxy = ProxyProcess("127.0.0.1", moto.port, latency=latency)
                    env["AWS_ENDPOINT_URL"] = proxy.url
                try:
                    rates, requests = [], []
                    for rep in range(reps):
                        if proxy is None:
                            target = f"{tmp}/write-{rep}"
                        else:
                            target = f"s3://bench/{int(latency * 1000)}ms-{rep}"
                            proxy.reset_stats()
                        n, seconds = _run_write(target, count, env)
                        rates.append(n / seconds)
                        if proxy is not None:
                            requests.append(proxy.stats()["requests"])
                    row = {"examples_per_s": statistics.median(rates), "rates": rates}
                    if requests:
                        row["requests"] = statistics.median(requests)
                    rows[label] = row
                    print(f"{label:6s} write                  {row}", flush=True)
                finally:
                    if proxy is not None:
                        proxy.close()
    finally:
        moto.close()
    base = rows["local"]["examples_per_s"]
    for row in rows.values():
        row["vs_local"] = row["examples_per_s"] / base
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json")
    parser.add_argument("--reps", type=int, default=REPS)
    parser.add_argument("--count", type=int, default=COUNT)
    parser.add_argument("--only", choices=("read", "write"))
    args = parser.parse_args()
    from atlas_fast.bench import corpus

    if args.only == "write":
        results = {"count": args.count, "runs": {"write": write_rows(args.reps, args.count)}}
        print(json.dumps(results["runs"], indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
        return

    with tempfile.TemporaryDirectory() as tmp:
        local = corpus.dataset(tmp, "documents", args.count, 2, 100)
        stored = sum(p.stat().st_size for p in local.rglob("*") if p.is_file())
        www = local.parent
        nginx = NginxServer(www)
        results = {"count": args.count, "stored_bytes": stored, "runs": {}}
        try:
            links = [("local", None)] + [(f"{int(lat * 1000)} ms", lat) for lat in LATENCIES]
            for label, latency in links:
                proxy = None
                root = str(local)
                if latency is not None:
                    proxy = ProxyProcess("127.0.0.1", nginx.port, latency=latency)
                    root = f"{proxy.url}/{local.name}"
                try:
                    for pattern in PATTERNS:
                        rates, requests, body = [], [], []
                        for rep in range(args.reps):
                            if proxy is not None:
                                proxy.reset_stats()
                            count, seconds = _run(root, pattern, rep)
                            rates.append(count / seconds)
                            if proxy is not None:
                                stats = proxy.stats()
                                requests.append(stats["requests"])
                                body.append(stats["body_bytes"])
                        row = {"examples_per_s": statistics.median(rates)}
                        if requests:
                            row["requests"] = statistics.median(requests)
                            row["body_bytes"] = statistics.median(body)
                        results["runs"].setdefault(pattern, {})[label] = row
                        print(f"{label:6s} {pattern:22s} {row}", flush=True)
                finally:
                    if proxy is not None:
                        proxy.close()
        finally:
            nginx.close()
    for rows in results["runs"].values():
        base = rows["local"]["examples_per_s"]
        zero = rows["0 ms"]["examples_per_s"]
        for row in rows.values():
            row["vs_local"] = row["examples_per_s"] / base
            row["vs_0ms"] = row["examples_per_s"] / zero
    if args.only is None:
        results["runs"]["write"] = write_rows(args.reps, args.count)
    print(json.dumps(results["runs"], indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
