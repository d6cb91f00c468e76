"""LitData's side of bench_tokens.py, run by the MDS venv's python (benchmarks/remote_peers.py
finds it; bench_tokens.py starts this script).

    python _peer_litdata_tokens.py write --tokens FLAT --lengths LENGTHS.npy --block 2048 --out DIR
        the documents (the flat uint16 file cut at LENGTHS), in order, through
        ``litdata.optimize(item_loader=TokensLoader())`` (one worker, so the order is kept),
        chunks of 8,192 windows of ``block`` tokens, uncompressed, into DIR.
    python _peer_litdata_tokens.py read --input DIR --workers W --batches N --seed S
        ``StreamingDataset(DIR, item_loader=TokensLoader(block_size=2048), shuffle=True,
        drop_last=True, seed=S)`` through ``StreamingDataLoader(batch_size=32, num_workers=W)``
        for N batches: prints {"tokens_per_s", "cpu_ns_per_token", "tokens", "version"}, with
        the clocks of bench_tokens.py's run_loader (rates after the first batch; CPU of this
        process and its workers over the whole run).
"""

from __future__ import annotations

import argparse
import json
import sys

from _peer_common import token_batches

BATCH = 32

_DOCS: list = []


def _doc(i: int):
    import torch

    return torch.from_numpy(_DOCS[i])


def write(tokens: str, lengths: str, block: int, out: str) -> dict:
    import numpy as np
    from litdata import optimize
    from litdata.streaming.item_loader import TokensLoader

    flat = np.fromfile(tokens, dtype=np.uint16)
    ends = np.cumsum(np.load(lengths))
    _DOCS[:] = [d for d in np.split(flat, ends[:-1]) if len(d)]
    optimize(
        fn=_doc,
        inputs=list(range(len(_DOCS))),
        output_dir=out,
        chunk_size=block * 8192,
        item_loader=TokensLoader(),
        num_workers=1,
        keep_data_ordered=True,
        reorder_files=False,
        verbose=False,
        start_method="fork",
    )
    return {"documents": len(_DOCS), "tokens": int(ends[-1])}


def read(input_dir: str, workers: int, batches: int, seed: int) -> dict:
    import litdata
    from litdata.streaming.item_loader import TokensLoader

    def make():
        dataset = litdata.StreamingDataset(
            input_dir,
            item_loader=TokensLoader(block_size=2048),
            shuffle=True,
            drop_last=True,
            seed=seed,
        )
        return litdata.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=workers)

    out = token_batches(make, batches, lambda batch: int(batch.numel()))
    return {**out, "version": getattr(litdata, "__version__", "?")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("--tokens", required=True)
    w.add_argument("--lengths", required=True)
    w.add_argument("--block", type=int, default=2048)
    w.add_argument("--out", required=True)
    r = sub.add_parser("read")
    r.add_argument("--input", required=True)
    r.add_argument("--workers", type=int, default=0)
    r.add_argument("--batches", type=int, default=200)
    r.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "write":
        out = write(args.tokens, args.lengths, args.block, args.out)
    else:
        out = read(args.input, args.workers, args.batches, args.seed)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
