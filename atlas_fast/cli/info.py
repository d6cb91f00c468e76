"""``atlas-fast info PATH``: describe a dataset or one shard.

Shards, examples, strategy, block size, bytes on disk and the compression ratio (decoded
bytes / stored bytes of data.bin). The ratio is estimated from a sample of blocks spread over
the dataset (``--sample N``, default 64), or measured on every block with ``--exact``. Nothing
is unpickled. A malformed dataset is reported (exit 1); run ``atlas-fast verify`` for a full
check.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["add_arguments", "run", "info"]


def add_arguments(parser) -> None:
    parser.add_argument("path", metavar="PATH", help="a dataset root or a single shard directory")
    parser.add_argument("--json", action="store_true", help="print the description as JSON")
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--exact", action="store_true", help="decode every block for the compression ratio"
    )
    group.add_argument(
        "--sample",
        type=int,
        default=64,
        metavar="N",
        help="blocks decoded to estimate the compression ratio (default 64)",
    )


def _dir_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


def _spread(total: int, wanted: int) -> list:
    """``wanted`` indices spread evenly over ``range(total)`` (all of them if fewer)."""
    if wanted >= total:
        return list(range(total))
    return sorted({(k * total) // wanted for k in range(wanted)})


def info(path, *, exact=False, sample=64, readers=None) -> dict:
    """Describe the dataset or shard at ``path``; raises ``AtlasFormatError`` if malformed.

    ``readers`` is the module whose reader classes decode (default ``atlas_fast.atlas``).
    """
    if readers is None:
        from .. import atlas as readers
    from .._errors import AtlasFormatError
    from .._format import CompressionStrategy, block_count, load_offsets
    from .verify import open_target

    path = Path(path)
    problems: list = []
    target = open_target(path, problems)
    if problems:
        raise AtlasFormatError(problems[0]["message"])
    if target.kind == "dataset":
        dataset = readers.AtlasDataset(path)
        shards = dataset.shards
        strategy = dataset.metadata.compression_strategy
    else:
        shard = readers.AtlasDatasetShard(path, compression_dict_bytes=target.dict_bytes)
        shards = [shard]
        strategy = shard.metadata.compression_strategy

    rows = []
    blocks = []  # (shard, block, stored bytes) for the ratio
    for shard in shards:
        meta = shard.metadata
        n_blocks = block_count(meta.stored_examples, meta.block_size)
        offsets = load_offsets(shard.root, meta)
        stored = int(offsets[-1])
        rows.append(
            {
                "shard": str(shard.root),
                "examples": meta.stored_examples,
                "blocks": n_blocks,
                "block_size": meta.block_size,
                "compression_strategy": meta.compression_strategy,
                "compression_level": meta.compression_level,
                "data_bytes": stored,
                "disk_bytes": _dir_bytes(shard.root),
            }
        )
        blocks.extend((shard, b, int(offsets[b + 1] - offsets[b])) for b in range(n_blocks))

    chosen = blocks if exact else [blocks[k] for k in _spread(len(blocks), max(0, sample))]
    stored_sum = decoded_sum = 0
    for shard, b, size in chosen:
        stored_sum += size
        decoded_sum += len(shard._block_bytes(b))
    for shard in shards:
        shard.close()

    root_files = _dir_bytes(path) if target.kind == "dataset" else 0
    block_sizes = sorted({r["block_size"] for r in rows})
    return {
        "path": str(path),
        "kind": target.kind,
        "shards": len(rows),
        "examples": sum(r["examples"] for r in rows),
        "blocks": len(blocks),
        "compression_strategy": int(strategy),
        "compression_strategy_name": CompressionStrategy(strategy).name,
        "block_size": block_sizes[0] if len(block_sizes) == 1 else block_sizes,
        "data_bytes": sum(r["data_bytes"] for r in rows),
        "disk_bytes": root_files + sum(r["disk_bytes"] for r in rows),
        "compression_ratio": (decoded_sum / stored_sum) if stored_sum else None,
        "ratio_exact": len(chosen) == len(blocks),
        "ratio_blocks": len(chosen),
        "shard_details": rows,
    }


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def run(args) -> int:
    from .._errors import AtlasFormatError

    path = Path(args.path)
    if not path.is_dir():
        print(f"atlas-fast info: error: {path} is not a directory", file=sys.stderr)
        return 2
    if args.sample < 1:
        print("atlas-fast info: error: --sample must be at least 1", file=sys.stderr)
        return 2
    try:
        report = info(path, exact=args.exact, sample=args.sample)
    except AtlasFormatError as exc:
        print(f"atlas-fast info: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    ratio = report["compression_ratio"]
    how = "exact" if report["ratio_exact"] else f"sampled over {report['ratio_blocks']} blocks"
    print(f"{report['path']} ({report['kind']})")
    print(f"  shards:       {report['shards']}")
    print(f"  examples:     {report['examples']}")
    print(f"  blocks:       {report['blocks']} (block size {report['block_size']})")
    print(
        f"  strategy:     {report['compression_strategy']} ({report['compression_strategy_name']})"
    )
    print(f"  data.bin:     {_size(report['data_bytes'])}")
    print(f"  on disk:      {_size(report['disk_bytes'])}")
    print(
        "  compression:  "
        + (f"{ratio:.2f}x decoded/stored ({how})" if ratio is not None else "n/a (no blocks)")
    )
    return 0
