"""Building and damaging datasets for the bad-input, fuzz and verify tests."""

from __future__ import annotations

import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import zstandard
from helpers import case_dataset

from atlas_fast import AtlasDatasetWriter
from atlas_fast._format import index_dtype

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi".split()


def make_examples(n: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(5, 40)))
        kind = i % 4
        if kind == 0:
            out.append({"id": i, "text": text, "score": i / 7})
        elif kind == 1:
            out.append(np.arange(i % 9 + 1, dtype=np.int32) * i)
        elif kind == 2:
            out.append((i, text.encode(), [1.5, None, True]))
        else:
            out.append(text)
    return out


def write_dataset(
    path: Path, strategy: int, n: int = 80, shard_size: int = 40, block_size: int = 4, **kw
) -> list:
    """Write ``n`` examples with our writer; returns them."""
    examples = make_examples(n, seed=strategy)
    with AtlasDatasetWriter(path, shard_size, block_size, compression_strategy=strategy, **kw) as w:
        for x in examples:
            w.add_example(x)
    return examples


def copy_case(case: str, dest: Path) -> Path:
    """A private copy of the reference fixture ``case``'s dataset."""
    shutil.copytree(case_dataset(case), dest)
    return dest


def read_blocks(shard_dir: Path) -> list:
    """The stored bytes of each block of a shard."""
    offsets = np.load(shard_dir / "index.npy").astype(np.int64)
    data = (shard_dir / "data.bin").read_bytes()
    return [data[offsets[b] : offsets[b + 1]] for b in range(len(offsets) - 1)]


def write_blocks(shard_dir: Path, blocks: list) -> None:
    """Replace a shard's data.bin and index.npy with ``blocks`` (a consistent index)."""
    offsets = [0]
    for block in blocks:
        offsets.append(offsets[-1] + len(block))
    (shard_dir / "data.bin").write_bytes(b"".join(blocks))
    np.save(shard_dir / "index.npy", np.array(offsets, dtype=index_dtype(offsets[-1])))


def compressor_for(shard_dir: Path, strategy: int):
    if strategy == 3:
        return zstandard.ZstdCompressor(
            dict_data=zstandard.ZstdCompressionDict((shard_dir / "zstd_dict.bin").read_bytes())
        )
    if strategy == 2:
        return zstandard.ZstdCompressor(
            dict_data=zstandard.ZstdCompressionDict(
                (shard_dir.parent / "zstd_dict.bin").read_bytes()
            )
        )
    return zstandard.ZstdCompressor()


def encode_block(shard_dir: Path, strategy: int, obj) -> bytes:
    """``obj`` pickled and compressed as the shard's strategy stores a block."""
    data = pickle.dumps(obj)
    return data if strategy == 0 else compressor_for(shard_dir, strategy).compress(data)


def frame_with_content_size(size: int, body: bytes = b"\x00" * 8) -> bytes:
    """A zstd frame header declaring ``size`` decoded bytes (single segment, 8-byte size)."""
    magic = (0xFD2FB528).to_bytes(4, "little")
    descriptor = bytes([0b11100000])  # 8-byte content size, single segment, no checksum
    return magic + descriptor + size.to_bytes(8, "little") + body


def write_silently_corrupted(root: Path) -> Path:
    """An uncompressed dataset with checksums whose shard 1, block 3, has one bit flipped
    inside a pickled string (it still unpickles: only the checksum sees it); its shard
    directory. Index and checksum files are left as written."""
    with AtlasDatasetWriter(root, 40, 4, compression_strategy=0, checksums=True) as w:
        for x in make_examples(80):
            w.add_example(x)
    shard_dir = root / "1"
    blocks = read_blocks(shard_dir)
    target = blocks[3]
    at = target.index(b"alpha") if b"alpha" in target else target.index(b"beta")
    data = bytearray((shard_dir / "data.bin").read_bytes())
    data[sum(len(b) for b in blocks[:3]) + at] ^= 0x01
    (shard_dir / "data.bin").write_bytes(bytes(data))
    return shard_dir


def read_all(ds) -> list:
    return [ds[i] for i in range(len(ds))]
