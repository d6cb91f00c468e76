"""LitData's side of bench_remote.py, run by the MDS venv's python (beside
_peer_streaming.py; see benchmarks/remote_peers.py, which starts this script).

    python _peer_litdata.py write --examples docs.pickle --copies 10 --out DIR
        the documents, ``copies`` times over, in order, by ``litdata.optimize`` with its
        defaults (chunks of 64 MB, no compression; one worker so the order is kept), into DIR;
        prints {"examples": n, "shards": chunks}.
    python _peer_litdata.py read --remote s3://bucket/prefix [--workers 2] [--no-shuffle]
        one first epoch of litdata.StreamingDataset(remote, cache_dir=<a fresh temporary
        folder>) through StreamingDataLoader(batch_size=64): prints {"examples", "seconds",
        "first_s", "version"}. The endpoint is S3_ENDPOINT_URL (given to LitData as
        storage_options={"endpoint_url": ...}), the credentials the AWS_* variables.

Why no compression: LitData 0.2.76's zstd chunks cannot be read back from S3 here. With
compression_level="chunk" its obstore download splits the object into ranges sized by the
index's uncompressed chunk_bytes, past the end of the smaller compressed object (obstore
panics); the default compression_level="batch" writes these dicts of strings with an Arrow row
footer instead of zstd frames, which its reader then refuses ("missing LDFZ01 magic").

One client setting is added: obstore refuses a plain-HTTP endpoint unless allowed, and LitData
gives it fixed client options (real S3 is HTTPS), so ``allow_http`` is set in them.
"""

from __future__ import annotations

import os
import pickle
import shutil
import sys
import tempfile

from _peer_common import BATCH, first_epoch, main

_DOCS: list = []


def _item(i: int):
    return _DOCS[i % len(_DOCS)]


def write(examples: str, copies: int, out: str) -> dict:
    import litdata

    with open(examples, "rb") as f:
        _DOCS[:] = pickle.load(f)
    count = len(_DOCS) * copies
    litdata.optimize(
        fn=_item,
        inputs=list(range(count)),
        output_dir=out,
        chunk_bytes="64MB",
        num_workers=1,
        keep_data_ordered=True,
        reorder_files=False,
        verbose=False,
        start_method="fork",
    )
    chunks = [name for name in os.listdir(out) if name.startswith("chunk-")]
    return {"examples": count, "shards": len(chunks)}


def read(remote: str, workers: int, shuffle: bool, seed: int) -> dict:
    import litdata
    from litdata.streaming import downloader

    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True  # a plain-HTTP test endpoint
    cache = tempfile.mkdtemp(prefix="atlas-bench-litdata-")  # a cold local cache
    try:
        figures = first_epoch(
            lambda: litdata.StreamingDataLoader(
                litdata.StreamingDataset(
                    remote,
                    shuffle=shuffle,
                    seed=seed,
                    cache_dir=cache,
                    storage_options={"endpoint_url": os.environ["S3_ENDPOINT_URL"]},
                ),
                batch_size=BATCH,
                num_workers=workers,
                collate_fn=list,
            )
        )
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return {**figures, "version": getattr(litdata, "__version__", "?")}


if __name__ == "__main__":
    sys.exit(main(__doc__, write, read))
