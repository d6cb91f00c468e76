"""``atlas-fast merge A B ... DST``: one dataset of the examples of A, then B, ..., at DST.

The shards are linked (copied across file systems; within the store, or uploaded, to a
URL) and renumbered, never decompressed: see ``atlas_fast.merge``. Exit status: 0 merged,
1 a source or the destination refused (the message names it; nothing written), 2 usage
error.
"""

from __future__ import annotations

import sys

from ._common import print_json, usage_error

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="the datasets to merge, in order, then DST (absent or an empty directory; a URL "
        "that holds no object)",
    )
    parser.add_argument("--json", action="store_true", help="print the merged metadata as JSON")


def run(args) -> int:
    from .._errors import AtlasFormatError, StorageError
    from .._merge import merge

    if len(args.paths) < 2:
        return usage_error("merge", "give at least one dataset and DST")
    *sources, dst = args.paths
    try:
        metadata = merge(sources, dst)
    except (AtlasFormatError, StorageError, FileExistsError, ValueError) as exc:
        message = exc.strerror if type(exc) is FileExistsError else exc
        print(f"atlas-fast merge: {message}", file=sys.stderr)
        return 1
    if args.json:
        print_json({"path": str(dst), **metadata._asdict()})
    else:
        sizes = metadata.shard_sizes
        print(
            f"{dst}: {len(sources)} dataset(s) merged: {len(sizes)} shard(s), "
            f"{sum(sizes)} example(s), compression_strategy {metadata.compression_strategy}"
        )
    return 0
