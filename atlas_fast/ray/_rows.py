"""Rows and examples, and the split of a dataset into read tasks: Ray-free helpers."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

__all__ = ["example_to_row", "row_to_example", "plan_read_tasks"]


def example_to_row(example, item_column: str = "item") -> dict:
    """The Ray Data row of an Atlas example (see the module docstring)."""
    if isinstance(example, Mapping) and example and all(isinstance(key, str) for key in example):
        return dict(example)
    return {item_column: example}


def row_to_example(row: Mapping, item_column: str | None = "item"):
    """The Atlas example of a Ray Data row: the inverse of ``example_to_row``."""
    if item_column is not None and len(row) == 1 and item_column in row:
        return row[item_column]
    return dict(row)


def plan_read_tasks(shard_sizes, block_sizes, parallelism: int) -> list:
    """Split a dataset's blocks into at most ``parallelism`` contiguous runs of whole blocks.

    ``shard_sizes[s]`` examples in shard ``s``, ``block_sizes[s]`` per block. Returns one list
    per read task of ``(shard, start, stop)`` example ranges, in dataset order, each range
    starting on a block boundary; the tasks' example counts are as even as whole blocks
    allow. There are ``min(parallelism, number of blocks)`` tasks (none for no blocks).
    """
    import numpy as np

    rows = []  # examples in each block, in dataset order
    owner = []  # (shard, first example) of each block
    for s, (n, bs) in enumerate(zip(shard_sizes, block_sizes)):
        for start in range(0, n, bs):
            rows.append(min(bs, n - start))
            owner.append((s, start))
    count = min(max(int(parallelism), 1), len(rows))
    if not count:
        return []
    ends = np.cumsum(rows)  # ends[b]: examples in blocks 0..b
    total = int(ends[-1])
    cuts = [0]
    for j in range(1, count):
        # The block boundary nearest to an even split, leaving each task at least one block.
        target = total * j / count
        b = int(np.searchsorted(ends, target))  # the first block ending at or past target
        cut = b if b and target - ends[b - 1] <= ends[b] - target else b + 1
        cut = min(max(cut, cuts[-1] + 1), len(rows) - (count - j))
        cuts.append(cut)
    cuts.append(len(rows))
    tasks = []
    for first, last in itertools.pairwise(cuts):
        ranges: list = []
        for b in range(first, last):
            s, start = owner[b]
            stop = start + rows[b]
            if ranges and ranges[-1][0] == s:
                ranges[-1] = (s, ranges[-1][1], stop)
            else:
                ranges.append((s, start, stop))
        tasks.append(ranges)
    return tasks
