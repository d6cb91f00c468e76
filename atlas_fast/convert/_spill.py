"""Shards filled before the strategy-2 dictionary is known, spilled to disk for any run.

A spill file holds the shard's pickled blocks, as its writer pickles them, one after the
other, then their lengths (``Q`` each) and a footer (blocks, examples).
"""

from __future__ import annotations

import array
import os
import struct
from pathlib import Path

__all__ = ["SPILL_LIMIT", "SpilledShard", "compress_spilled"]

# A run > 0 spills at most this many bytes of pickled blocks while it waits for the
# strategy-2 dictionary; then it waits without reading on.
SPILL_LIMIT = 1 << 30
_FOOTER = struct.Struct("<QQ")  # blocks, examples


class SpilledShard:
    """A shard a run > 0 fills before the strategy-2 dictionary is published: its blocks,
    pickled as its writer pickles them, go to the spill file ``spill`` instead of waiting in
    this process's memory, so that whichever run is free once the dictionary is there
    compresses them into the shard ``shard`` (``compress_spilled``). ``number``: the shard's
    number in its run."""

    def __init__(self, spill: Path, shard: Path, number: int, block_size: int):
        self.spill, self.shard, self.number, self.block_size = spill, shard, number, block_size
        self.file = open(spill, "wb")
        self.lengths = array.array("Q")
        self.examples: list = []  # of the block being filled
        self.stored_examples = 0
        self.nbytes = 0

    def add_example(self, example) -> None:
        self.examples.append(example)
        self.stored_examples += 1
        if len(self.examples) == self.block_size:
            self._flush()

    def _flush(self) -> None:
        from ..writer import pickle_block

        block = pickle_block(self.examples, shard=self.shard, number=len(self.lengths))
        self.examples = []
        self._write(block)
        self.lengths.append(len(block))
        self.nbytes += len(block)

    def _write(self, data: bytes) -> None:
        try:
            self.file.write(data)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"{self.spill}: cannot spill the blocks read while the strategy-2 dictionary "
                f"is trained ({exc.strerror or exc}; TMPDIR chooses where they go)",
            ) from exc

    def close(self) -> None:
        if self.examples:
            self._flush()
        self._write(self.lengths.tobytes())
        self._write(_FOOTER.pack(len(self.lengths), self.stored_examples))
        self.file.close()


def compress_spilled(spill: Path, shard: Path, make_writer) -> None:
    """Write the shard a run spilled (``SpilledShard``) with ``make_writer(shard)``'s
    writer (the shared dictionary known), then remove the spill file."""
    with open(spill, "rb") as f:
        f.seek(-_FOOTER.size, os.SEEK_END)
        blocks, examples = _FOOTER.unpack(f.read(_FOOTER.size))
        lengths = array.array("Q")
        f.seek(-_FOOTER.size - 8 * blocks, os.SEEK_END)
        lengths.frombytes(f.read(8 * blocks))
        f.seek(0)
        w = make_writer(shard)
        try:
            left = examples
            for length in lengths:
                count = min(left, w.metadata.block_size)
                w.add_pickled_block(f.read(length), count)
                left -= count
            w.close()
        except BaseException:
            w.abort()
            raise
    spill.unlink()
