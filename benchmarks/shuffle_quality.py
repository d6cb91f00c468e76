"""How well ``BlockShuffleSampler`` shuffles, per window size, against a uniform shuffle.

    python benchmarks/shuffle_quality.py [--examples 100000] [--block 100] [--batch 256]

No data is read: the sampler needs only the block layout. For each ``window_blocks`` (and
``None``: a uniform shuffle of the whole epoch), averaged over 3 seeds:

- same-block neighbours: fraction of consecutive examples from the same block (uniform:
  about block/examples);
- lag-1 corr: correlation between consecutive examples' original positions (uniform: ~0);
- displacement: mean |epoch position - original position| / examples (uniform: ~1/3);
- blocks/batch: distinct blocks in a batch (the blocks a batch decodes without a cache);
- top block share: mean over batches of the largest fraction of a batch from one block.

A second table puts the default order of a dataset in object storage (extents of
``--extent-blocks`` blocks, about 4 MiB of 36 KB blocks; ``window_extents`` of them a window;
``window_blocks=8``) beside the local default (``window_blocks=8``), with one more measure:

- extents/batch: distinct extents in a batch (the distant parts of the dataset it mixes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atlas_fast import BlockShuffleSampler


class _Meta(NamedTuple):
    block_size: int


class _Layout:
    """Stands for a one-shard dataset: the sampler reads only its length and block size (and,
    with ``extent_blocks``, reads it in extents of that many blocks, as a remote dataset)."""

    def __init__(self, examples: int, block: int, extent_blocks: int = 0) -> None:
        self.metadata = _Meta(block)
        self._n = examples
        self._in_object_storage = bool(extent_blocks)
        self._extent = extent_blocks

    def __len__(self) -> int:
        return self._n

    def _plan_extents(self, extent_bytes: int) -> int:
        return self._extent


def measure(order: np.ndarray, block: int, batch: int, extent: int = 0) -> dict:
    n = len(order)
    blocks = order // block
    usable = n - n % batch
    per_batch = blocks[:usable].reshape(-1, batch)
    distinct = [len(np.unique(row)) for row in per_batch]
    top = [np.bincount(row).max() / batch for row in per_batch]
    out = {
        "same-block neighbours": float(np.mean(blocks[1:] == blocks[:-1])),
        "lag-1 corr": float(np.corrcoef(order[:-1], order[1:])[0, 1]),
        "displacement": float(np.mean(np.abs(order - np.arange(n))) / n),
        "blocks/batch": float(np.mean(distinct)),
        "top block share": float(np.mean(top)),
    }
    if extent:
        extents = (blocks[:usable] // extent).reshape(-1, batch)
        out["extents/batch"] = float(np.mean([len(np.unique(row)) for row in extents]))
    return out


def _table(rows: list) -> None:
    """``rows``: (name, mean measures); printed as a markdown table."""
    names = list(rows[0][1])
    print("| order | " + " | ".join(names) + " |")
    print("|" + "---|" * (len(names) + 1))
    for name, mean in rows:
        cells = [f"{mean[k]:.4f}" if mean[k] < 10 else f"{mean[k]:.1f}" for k in names]
        print(f"| {name} | " + " | ".join(cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=100_000)
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--extent-blocks", type=int, default=110)
    args = parser.parse_args()
    layout = _Layout(args.examples, args.block)
    windows = [1, 2, 4, 8, 16, 32, 64, 128, None]
    print(
        f"{args.examples} examples, blocks of {args.block}, batches of {args.batch}; "
        "mean of seeds 0-2\n"
    )
    header = None
    for window in windows:
        results = []
        for seed in range(3):
            sampler = BlockShuffleSampler(layout, window_blocks=window, seed=seed)
            results.append(measure(sampler.epoch_indices(), args.block, args.batch))
        mean = {k: np.mean([r[k] for r in results]) for k in results[0]}
        if header is None:
            header = "| window_blocks | " + " | ".join(mean) + " |"
            print(header)
            print("|" + "---|" * (len(mean) + 1))
        name = "uniform (None)" if window is None else str(window)
        cells = [f"{v:.4f}" if v < 10 else f"{v:.1f}" for v in mean.values()]
        print(f"| {name} | " + " | ".join(cells) + " |")

    k = args.extent_blocks
    print(f"\nIn object storage: extents of {k} blocks (extent_bytes ~ 4 MiB), window_blocks=8\n")
    rows = []
    configs = [("local default (blocks, window_blocks=8)", 0, {})]
    configs += [(f"extents, window_extents={e}", k, {"window_extents": e}) for e in (2, 4, 8)]
    for name, extent, kw in configs:
        layout = _Layout(args.examples, args.block, extent)
        results = []
        for seed in range(3):
            sampler = BlockShuffleSampler(layout, window_blocks=8, seed=seed, **kw)
            results.append(measure(sampler.epoch_indices(), args.block, args.batch, k))
        rows.append((name, {key: np.mean([r[key] for r in results]) for key in results[0]}))
    _table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
