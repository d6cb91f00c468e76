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

import glob
import os
import pickle
import shutil
import sys
import tempfile

from _peer_common import BATCH, first_epoch, main

# Documents {id, text, source, added, metadata} as MDS columns (atlas_fast.bench's MDS peer's).
COLUMNS = {"id": "str", "text": "str", "source": "str", "added": "str", "metadata": "json"}
SIZE_LIMIT = 1 << 26  # MDSWriter's default: 64 MiB of uncompressed samples per shard


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
    kwargs = {"multiprocessing_context": context} if workers else {}
    try:
        figures = first_epoch(
            lambda: DataLoader(
                streaming.StreamingDataset(
                    remote=remote, local=local, shuffle=shuffle, shuffle_seed=seed, batch_size=BATCH
                ),
                batch_size=BATCH,
                num_workers=workers,
                collate_fn=list,
                **kwargs,
            )
        )
    finally:
        clean_stale_shared_memory()  # the segments StreamingDataset leaves in /dev/shm
        for path in _lock_files() - locks:  # and its lock files in the temporary folder
            try:
                os.unlink(path)
            except OSError:
                pass
        shutil.rmtree(local, ignore_errors=True)
    return {**figures, "version": getattr(streaming, "__version__", "?")}


# read's own flag (remote_peers.py gives --context spawn to runs with workers)
READ_OPTIONS = {"--context": {"default": "fork", "help": "the DataLoader workers' start method"}}

if __name__ == "__main__":
    sys.exit(main(__doc__, write, read, read_options=READ_OPTIONS))
