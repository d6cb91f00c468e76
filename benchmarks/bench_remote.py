"""Reading an Atlas dataset over HTTP from nginx, through the test tree's proxy adding 0, 20 and
50 ms per request, beside the same dataset on local disk.

The dataset: the ``documents`` corpus (every document of the standard library's sources)
written COPIES times over (strategy 2, blocks of 100, three shards), so that an epoch is long
enough for a rate to mean something (the first batch's round trips are reported apart).

Patterns, each in a fresh spawned process (cold clients and caches), medians of REPS:
- ``in order``: ``list(ds)``;
- ``random``: RANDOM uniformly random ``ds[i]`` (one request per block missed);
- ``sampler``: one epoch of ``BlockShuffleSampler`` (its default order: extents for a remote
  dataset, blocks for a local one) through ``DataLoader(batch_size=64)``;
- ``in order, 2 workers``: ``DataLoader(batch_size=64, num_workers=2)`` (fork), a pass in order;
- ``sampler, 2 workers``: the sampler told the DataLoader's ``batch_size`` and ``num_workers``
  (its windows dealt to the workers), 2 workers (fork).

Reported per pattern and link: examples/s, the ratio to local disk and to 0 ms, the time to
the first example, and the requests (all, and of data.bin) and body bytes the proxy saw per
run, beside the bytes stored. Beside them (``--peers``, benchmarks/remote_peers.py): MosaicML
streaming's and LitData's StreamingDataset, a first epoch from a conversion of the same
examples on the same nginx through the same proxies, cold cache, each run paired with
atlas_fast's sampler epoch and pass in order, from the MDS venv (skipped, saying why, without
it). ``--many-shards`` also opens a 10,000-shard dataset through the
proxy and counts its requests.

Writing (``write``): the same corpus written by ``AtlasDatasetWriter`` (strategy 2, blocks of
100, about three shards) to local disk and to moto's S3 server (its own process) through the
proxy at 0 and 50 ms, each rep in a fresh spawned process, the examples already in memory;
examples/s and the ratio to the local write (medians). Run under the bench lock:

    flock /work/bench.lock python benchmarks/bench_remote.py [--json out.json] [--only write]
        [--reps 3] [--copies 10] [--many-shards] [--peers streaming,litdata|none]
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
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's atlas_fast

import remote_peers
from faultproxy import ProxyProcess
from servers import NginxServer

COPIES = 10  # the documents corpus written this many times over
RANDOM = 150
REPS = 3
LATENCIES = (0.0, 0.02, 0.05)
PATTERNS = ("in order", "random", "sampler", "in order, 2 workers", "sampler, 2 workers")
MANY_SHARDS = 10_000
COUNT = 20_000  # documents written by the write rows (at most the whole corpus)
WRITE_LATENCIES = (0.0, 0.05)


def _measure(root: str, pattern: str, seed: int) -> tuple:
    """In a fresh process: (examples read, seconds, seconds to the first example)."""
    import atlas_fast
    from atlas_fast import BlockShuffleSampler

    start = time.perf_counter()
    first = None
    ds = atlas_fast.AtlasDataset(root)
    n = len(ds)
    if pattern == "in order":
        count = 0
        for _ in ds:
            if not count:
                first = time.perf_counter() - start
            count += 1
    elif pattern == "random":
        rng = random.Random(seed)
        count = 0
        for _ in range(RANDOM):
            ds[rng.randrange(n)]
            if not count:
                first = time.perf_counter() - start
            count += 1
    else:
        from torch.utils.data import DataLoader

        workers = 2 if pattern.endswith("2 workers") else 0
        kwargs = {"multiprocessing_context": "fork"} if workers else {}
        if pattern.startswith("sampler"):
            dealt = {"batch_size": 64, "num_workers": workers} if workers else {}
            kwargs["sampler"] = BlockShuffleSampler(ds, seed=seed, **dealt)
        loader = DataLoader(ds, batch_size=64, num_workers=workers, collate_fn=list, **kwargs)
        count = 0
        for batch in loader:
            if not count:
                first = time.perf_counter() - start
            count += len(batch)
    return count, time.perf_counter() - start, first


def _child(queue, root: str, pattern: str, seed: int) -> None:
    queue.put(_measure(root, pattern, seed))


def _run(root: str, pattern: str, seed: int) -> tuple:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, root, pattern, seed))  # may fork workers
    proc.start()
    out = queue.get(timeout=900)
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


def _open_many(root: str, queue) -> None:
    import atlas_fast

    ds = atlas_fast.AtlasDataset(root)
    queue.put(len(ds.shards))


def _many_shards(tmp: str, nginx_root: Path, nginx_port: int) -> dict:
    """Open a MANY_SHARDS-shard dataset through the proxy: the requests it costs."""
    import atlas_fast
    from atlas_fast import CompressionStrategy

    root = nginx_root / "many"
    with atlas_fast.AtlasDatasetWriter(root, 1, 1, CompressionStrategy.NO_COMPRESSION) as w:
        for i in range(MANY_SHARDS):
            w.add_example(i)
    with ProxyProcess("127.0.0.1", nginx_port, latency=0.05) as proxy:
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=_open_many, args=(f"{proxy.url}/many", queue))
        proc.start()
        shards = queue.get(timeout=300)
        proc.join(60)
        stats = proxy.stats()
    objects = sorted(path.lstrip("/") for path in stats["paths"])
    return {"shards": shards, "requests": stats["requests"], "objects": objects}


def _make_dataset(tmp: str, copies: int) -> Path:
    """The documents corpus, ``copies`` times over, as a strategy-2 dataset of 3 shards."""
    import atlas_fast
    from atlas_fast import CompressionStrategy
    from atlas_fast.bench import corpus

    docs = corpus.examples("documents")
    root = Path(tmp) / "www" / "docs"
    total = len(docs) * copies
    shard = -(-total // 3)
    strategy = CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
    with atlas_fast.AtlasDatasetWriter(root, shard, 100, compression_strategy=strategy) as w:
        for _ in range(copies):
            for doc in docs:
                w.add_example(doc)
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json")
    parser.add_argument("--reps", type=int, default=REPS)
    parser.add_argument("--count", type=int, default=COUNT, help="documents written (write)")
    parser.add_argument("--only", choices=("read", "write"))
    parser.add_argument("--copies", type=int, default=COPIES)
    parser.add_argument("--patterns", default=";".join(PATTERNS), help="separated by ;")
    parser.add_argument("--many-shards", action="store_true")
    remote_peers.add_arguments(parser)
    args = parser.parse_args()
    patterns = [p.strip() for p in args.patterns.split(";") if p.strip()]  # "": peers only
    try:
        remote_peers.parse_peers(args.peers)
        remote_peers.parse_patterns(args.peer_patterns)
    except ValueError as exc:
        parser.error(str(exc))

    if args.only == "write":
        results = {"count": args.count, "runs": {"write": write_rows(args.reps, args.count)}}
        print(json.dumps(results["runs"], indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
        return

    with tempfile.TemporaryDirectory() as tmp:
        local = _make_dataset(tmp, args.copies)
        stored = sum(p.stat().st_size for p in local.rglob("*") if p.is_file())
        data_bytes = sum(p.stat().st_size for p in local.rglob("data.bin"))
        nginx = NginxServer(local.parent)
        results = {
            "copies": args.copies,
            "stored_bytes": stored,
            "data_bytes": data_bytes,
            "shards": sum(1 for p in local.iterdir() if p.is_dir()),
            "runs": {},
        }
        proxies = {}
        try:
            links = [("local", None)] + [(f"{int(lat * 1000)} ms", lat) for lat in LATENCIES]
            for label, latency in links:
                if latency is not None:
                    proxies[label] = ProxyProcess("127.0.0.1", nginx.port, latency=latency)
            # Repetition by repetition, every link in turn: a change in the machine's load
            # falls on all links alike, not on the ones measured last.
            samples: dict = {}
            for pattern in patterns:
                for rep in range(args.reps):
                    for label, _ in links:
                        proxy = proxies.get(label)
                        root = str(local) if proxy is None else f"{proxy.url}/{local.name}"
                        if proxy is not None:
                            proxy.reset_stats()
                        count, seconds, first = _run(root, pattern, rep)
                        got = samples.setdefault((pattern, label), {"count": count})
                        got.setdefault("rates", []).append(count / seconds)
                        got.setdefault("firsts", []).append(first)
                        if proxy is not None:
                            stats = proxy.stats()
                            got.setdefault("requests", []).append(stats["requests"])
                            data = sum(
                                v for k, v in stats["paths"].items() if k.endswith("data.bin")
                            )
                            got.setdefault("data", []).append(data)
                            got.setdefault("body", []).append(stats["body_bytes"])
                for label, _ in links:
                    got = samples[(pattern, label)]
                    row = {
                        "examples": got["count"],
                        "examples_per_s": statistics.median(got["rates"]),
                        "first_example_s": statistics.median(got["firsts"]),
                    }
                    if "requests" in got:
                        row["requests"] = statistics.median(got["requests"])
                        row["data_requests"] = statistics.median(got["data"])
                        row["body_bytes"] = statistics.median(got["body"])
                    results["runs"].setdefault(pattern, {})[label] = row
                    print(f"{label:6s} {pattern:22s} {row}", flush=True)
            peers = remote_peers.run(
                args,
                local.parent,
                proxies,
                args.reps,
                atlas=lambda label, pattern, rep: _run(
                    f"{proxies[label].url}/{local.name}", pattern, rep
                ),
            )
            if args.many_shards:
                results["many_shards_open"] = _many_shards(tmp, local.parent, nginx.port)
                print("many shards:", results["many_shards_open"]["requests"], "requests")
        finally:
            for proxy in proxies.values():
                proxy.close()
            nginx.close()
    for rows in results["runs"].values():
        base = rows["local"]["examples_per_s"]
        zero = rows["0 ms"]["examples_per_s"]
        for row in rows.values():
            row["vs_local"] = row["examples_per_s"] / base
            row["vs_0ms"] = row["examples_per_s"] / zero
    results["peers"] = remote_peers.summarize(peers, results["runs"])
    if args.only is None:
        results["runs"]["write"] = write_rows(args.reps, args.count)
    print(json.dumps(results["runs"], indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
