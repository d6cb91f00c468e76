"""Which engine fetches exact byte ranges of many blocks faster: obstore or fsspec/s3fs?

One object of BLOCKS blocks of BLOCK bytes is put in a bucket of moto's S3 server and in a
folder nginx serves (path-style S3 GETs map onto it); each engine then fetches, against each
server, directly and through the test tree's proxy with 0 and 50 ms of added latency:

- ``single``: RANDOM random blocks, one exact range each (uniform random access);
- ``merged``: the whole object as ranges of MERGED bytes (neighbouring blocks merged: a pass in
  order).

Each engine gets the same concurrency (CONCURRENCY requests in flight). Reported: medians over
REPS repetitions (alternating engines) of the wall time and of this process's CPU time, and
the ratio fsspec / obstore (above 1: obstore faster). The servers and the proxy run in
processes of their own, so the CPU time is the client's alone. Run under ``flock /work/bench.lock``:

    flock /work/bench.lock python benchmarks/bench_storage_engines.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "remote"))

from faultproxy import ProxyProcess
from servers import S3_ENV, MotoProcess, NginxServer

BLOCK = 100_000
BLOCKS = 320  # 32 MB: moto copies the whole object per ranged GET, keep it modest
RANDOM = 64
MERGED = 8 << 20
CONCURRENCY = 16
LINKS = (("direct", None), ("proxy 0 ms", 0.0), ("proxy 50 ms", 0.05))
REPS = 5
BUCKET = "bench"
KEY = "ds/0/data.bin"


def _ranges(pattern: str, seed: int) -> list:
    if pattern == "single":
        blocks = random.Random(seed).sample(range(BLOCKS), RANDOM)
        return [(b * BLOCK, (b + 1) * BLOCK) for b in blocks]
    size = BLOCK * BLOCKS
    return [(s, min(s + MERGED, size)) for s in range(0, size, MERGED)]


class Obstore:
    name = "obstore"

    def __init__(self, endpoint: str) -> None:
        from obstore.store import S3Store

        self.store = S3Store(
            BUCKET,
            endpoint=endpoint,
            client_options={"allow_http": True, "pool_max_idle_per_host": "64"},
            retry_config={"max_retries": 0},
        )
        self.pool = ThreadPoolExecutor(CONCURRENCY)

    def fetch(self, ranges: list) -> int:
        import obstore

        def one(r):
            return len(obstore.get_range(self.store, KEY, start=r[0], end=r[1]))

        return sum(self.pool.map(one, ranges))

    def close(self) -> None:
        self.pool.shutdown()


class Fsspec:
    name = "fsspec"

    def __init__(self, endpoint: str) -> None:
        import s3fs

        self.fs = s3fs.S3FileSystem(
            key=S3_ENV["AWS_ACCESS_KEY_ID"],
            secret=S3_ENV["AWS_SECRET_ACCESS_KEY"],
            endpoint_url=endpoint,
            client_kwargs={"region_name": "us-east-1"},
            config_kwargs={
                "s3": {"addressing_style": "path"},
                "max_pool_connections": 64,
                "retries": {"max_attempts": 1},
            },
            skip_instance_cache=True,
        )

    def fetch(self, ranges: list) -> int:
        path = f"{BUCKET}/{KEY}"
        out = self.fs.cat_ranges(
            [path] * len(ranges),
            [r[0] for r in ranges],
            [r[1] for r in ranges],
            batch_size=CONCURRENCY,
        )
        return sum(len(b) for b in out)

    def close(self) -> None:
        pass


def _time(engine, ranges: list) -> tuple:
    wall = time.perf_counter()
    cpu = time.process_time()
    got = engine.fetch(ranges)
    cpu = time.process_time() - cpu
    wall = time.perf_counter() - wall
    expected = sum(e - s for s, e in ranges)
    if got != expected:
        raise RuntimeError(f"{engine.name}: {got} bytes, expected {expected}")
    return wall, cpu


def _bench(endpoint: str, reps: int) -> dict:
    engines = [Obstore(endpoint), Fsspec(endpoint)]
    out = {}
    try:
        for pattern in ("single", "merged"):
            results = {e.name: {"wall": [], "cpu": []} for e in engines}
            for e in engines:  # warm connections and clients
                _time(e, _ranges(pattern, 0)[:4])
            for rep in range(reps):
                ranges = _ranges(pattern, rep + 1)
                order = engines if rep % 2 == 0 else engines[::-1]
                for e in order:
                    wall, cpu = _time(e, ranges)
                    results[e.name]["wall"].append(wall)
                    results[e.name]["cpu"].append(cpu)
            row = {}
            for name, r in results.items():
                row[name] = {
                    "wall_s": statistics.median(r["wall"]),
                    "cpu_s": statistics.median(r["cpu"]),
                    "requests": len(_ranges(pattern, 1)),
                }
            row["fsspec/obstore wall"] = row["fsspec"]["wall_s"] / row["obstore"]["wall_s"]
            row["fsspec/obstore cpu"] = row["fsspec"]["cpu_s"] / row["obstore"]["cpu_s"]
            out[pattern] = row
    finally:
        for e in engines:
            e.close()
    return out


def _line(pattern: str, r: dict) -> str:
    return (
        f"{pattern}: obstore {r['obstore']['wall_s'] * 1e3:7.1f} ms"
        f" fsspec {r['fsspec']['wall_s'] * 1e3:7.1f} ms"
        f" ratio {r['fsspec/obstore wall']:.2f} (cpu {r['fsspec/obstore cpu']:.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--reps", type=int, default=REPS)
    args = parser.parse_args()
    for name, value in S3_ENV.items():
        os.environ[name] = value
    payload = random.Random(0).randbytes(BLOCK * BLOCKS)
    results = {"block": BLOCK, "blocks": BLOCKS, "concurrency": CONCURRENCY, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        www = Path(tmp) / "www"
        (www / BUCKET / os.path.dirname(KEY)).mkdir(parents=True)
        (www / BUCKET / KEY).write_bytes(payload)
        moto = MotoProcess()
        moto.client().create_bucket(Bucket=BUCKET)
        moto.client().put_object(Bucket=BUCKET, Key=KEY, Body=payload)
        nginx = NginxServer(www)
        try:
            for server_name, port in (("nginx", nginx.port), ("moto", moto.port)):
                for label, latency in LINKS:
                    if server_name == "moto" and label == "direct":
                        continue
                    if latency is None:
                        endpoint = f"http://127.0.0.1:{port}"
                        row = _bench(endpoint, args.reps)
                    else:
                        with ProxyProcess("127.0.0.1", port, latency=latency) as proxy:
                            row = _bench(proxy.url, args.reps)
                    key = f"{server_name} {label}"
                    results["runs"][key] = row
                    print(f"{key:20s}", " | ".join(_line(p, row[p]) for p in row), flush=True)
        finally:
            nginx.close()
            moto.close()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
