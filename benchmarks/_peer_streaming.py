"""MosaicML streaming's side of bench_remote.py, run by the MDS venv's python (not the main
environment's: mosaicml-streaming caps numpy below 2.2 and imports torchvision; see
benchmarks/remote_peers.py, which starts this script).

    python _peer_streaming.py write --examples docs.pickle --copies 10 --out DIR
        the documents, ``copies`` times over, as MDS shards (zstd, 64 MiB before compression:
        MDSWriter's default size_limit), into DIR; prints {"examples": n, "shards": k}.
    python _peer_streaming.py read --remote s3://bucket/prefix [--workers 2] [--no-shuffle]
        one first epoch of StreamingDataset(remote, local=<a fresh temporary folder>) through
        DataLoader(batch_size=64): prints {"examples", "seconds", "first_s", "version"}.
        S3_ENDPOINT_URL and the AWS_* credentials come from the environment.

Only the standard library, mosaicml-streaming and torch are imported: atlas_fast need not be
installed in that venv.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pickle
import shutil
import sys
import tempfile
import time

# Documents {id, text, source, added, metadata} as MDS columns (atlas_fast.bench's MDS peer's).
COLUMNS = {"id": "str", "text": "str", "source": "str", "added": "str", "metadata": "json"}
SIZE_LIMIT = 1 << 26  # MDSWriter's default: 64 MiB of uncompressed samples per shard
BATCH = 64


def write(examples: str, copies: int, out: str) -> dict:
    from streaming import MDSWriter

    with open(examples, "rb") as f:
        docs = pickle.load(f)
    count = 0
    with MDSWriter(out=out, columns=COLUMNS, compression="zstd", size_limit=SIZE_LIMIT) as w:
        for _ in range(copies):
            for doc in docs:
                w.write(doc)
                count += 1
    shards = len(glob.glob(os.path.join(out, "shard.*.mds.zstd")))
    return {"examples": count, "shards": shards}


def _lock_files() -> set:
    tmp = tempfile.gettempdir()
    return {
        path
        for pattern in ("*_barrier_filelock", "*_cache_filelock")
        for path in glob.glob(os.path.join(tmp, pattern))
    }


def read(remote: str, workers: int, shuffle: bool, seed: int, context: str = "fork") -> dict:
    import streaming
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    locks = _lock_files()
    clean_stale_shared_memory()
    local = tempfile.mkdtemp(prefix="atlas-bench-mds-")  # a cold local cache
    try:
        start = time.perf_counter()
        ds = streaming.StreamingDataset(
            remote=remote, local=local, shuffle=shuffle, shuffle_seed=seed, batch_size=BATCH
        )
        kwargs = {"multiprocessing_context": context} if workers else {}
        loader = DataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=list, **kwargs)
        count, first = 0, None
        for batch in loader:
            if not count:
                first = time.perf_counter() - start
            count += len(batch)
        seconds = time.perf_counter() - start
        del loader, ds
    finally:
        clean_stale_shared_memory()  # the segments StreamingDataset leaves in /dev/shm
        for path in _lock_files() - locks:  # and its lock files in the temporary folder
            try:
                os.unlink(path)
            except OSError:
                pass
        shutil.rmtree(local, ignore_errors=True)
    return {
        "examples": count,
        "seconds": seconds,
        "first_s": first,
        "version": getattr(streaming, "__version__", "?"),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("--examples", required=True, help="a pickled list of documents")
    w.add_argument("--copies", type=int, required=True)
    w.add_argument("--out", required=True)
    r = sub.add_parser("read")
    r.add_argument("--remote", required=True)
    r.add_argument("--workers", type=int, default=0)
    r.add_argument("--no-shuffle", action="store_true")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--context", default="fork", help="the DataLoader workers' start method")
    args = parser.parse_args(argv)
    if args.command == "write":
        out = write(args.examples, args.copies, args.out)
    else:
        out = read(args.remote, args.workers, not args.no_shuffle, args.seed, args.context)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
