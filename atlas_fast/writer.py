"""Writers of Atlas datasets: ``AtlasDatasetWriter`` and ``AtlasDatasetShardWriter``.

Same names, signatures, defaults and files as ``torch_atlas_ds.writer``: what these write,
the reference reads example for example, and the other way round. Bad arguments raise
``AssertionError`` as the reference does, so existing ``except AssertionError`` code keeps
working.
"""

from __future__ import annotations

import pickle
import shutil
import warnings
from pathlib import Path

import numpy as np
import zstandard

from ._format import (
    CHECKSUM_FILE,
    DATA_FILE,
    DICT_FILE,
    INDEX_FILE,
    META_FILE,
    VERSION,
    AtlasDatasetMetadata,
    AtlasDatasetShardMetadata,
    CompressionStrategy,
    block_checksum,
    dump_meta,
    index_dtype,
)

__all__ = ["AtlasDatasetWriter", "AtlasDatasetShardWriter"]

# zstd dictionary training needs at least this many samples (here: blocks).
MIN_BLOCKS_FOR_DICTIONARY = 7


class AtlasDatasetShardWriter:
    """Writes one shard: examples are grouped into blocks of ``block_size``, pickled,
    compressed per ``compression_strategy`` and appended to data.bin.

    With strategy 3 (the default) a dictionary is trained on the shard's blocks at ``close()``;
    a shard of fewer than 7 blocks falls back to strategy 1 and its meta.json says so.
    Strategy 2 compresses with ``compression_dict`` (a ``zstandard.ZstdCompressionDict``).

    ``checksums=True`` also writes ``checksums.npy``: one BLAKE2b-8 digest per stored block,
    which readers ignore and ``atlas-fast verify`` checks to find silent corruption.
    """

    VERSION = VERSION

    def __init__(
        self,
        path,
        block_size,
        compression_strategy=CompressionStrategy.DICTIONARY_COMPRESSION,
        compression_level=3,
        compression_dict=None,
        compression_dict_size=0.01,
        *,
        checksums=False,
    ):
        assert isinstance(block_size, int) and block_size > 0, (
            f"block_size must be a positive integer, not {block_size!r}"
        )
        assert 0 <= compression_dict_size <= 1, (
            f"compression_dict_size must be within [0, 1], not {compression_dict_size!r}"
        )
        strategy = CompressionStrategy(compression_strategy)
        if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
            assert compression_dict is not None, (
                "compression_strategy SHARED_DICTIONARY_COMPRESSION needs compression_dict"
            )
        self.path = Path(path)
        self.path.mkdir(parents=True)
        self.metadata = AtlasDatasetShardMetadata(
            VERSION, block_size, 0, int(strategy), compression_level, compression_dict_size
        )
        self.stored_examples = 0
        self._strategy = strategy
        self._compression_dict = compression_dict
        self._pending: list = []  # examples of the block being filled
        self._blocks: list = []  # strategy 3 only: pickled blocks awaiting the dictionary
        self._offsets: list = [0]
        self._data = None  # data.bin, opened with the first block
        self._compressor = None
        self._closed = False
        self.checksums = bool(checksums)
        self._checksums: list = []  # checksums=True: block_checksum of each stored block

    def __len__(self) -> int:
        return self.stored_examples

    def add_example(self, example) -> None:
        """Append one example (anything picklable)."""
        if self._closed:
            raise ValueError(f"{self.path}: the shard writer is closed")
        self._pending.append(example)
        self.stored_examples += 1
        if len(self._pending) == self.metadata.block_size:
            self._flush_block()

    def _flush_block(self) -> None:
        block = pickle.dumps(self._pending)
        self._pending = []
        if self._strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            self._blocks.append(block)
        else:
            self._append(self._encode(block))

    def _encode(self, block: bytes) -> bytes:
        if self._strategy == CompressionStrategy.NO_COMPRESSION:
            return block
        if self._compressor is None:
            level = self.metadata.compression_level
            if self._compression_dict is None:
                self._compressor = zstandard.ZstdCompressor(level=level)
            else:
                self._compressor = zstandard.ZstdCompressor(
                    level=level, dict_data=self._compression_dict
                )
        return self._compressor.compress(block)

    def _append(self, data: bytes) -> None:
        if self._data is None:
            self._data = open(self.path / DATA_FILE, "wb")
        self._data.write(data)
        self._offsets.append(self._offsets[-1] + len(data))
        if self.checksums:
            self._checksums.append(block_checksum(data))

    def _train_dictionary(self):
        """Train the shard's dictionary, or None (fall back to strategy 1) when it cannot be."""
        if len(self._blocks) < MIN_BLOCKS_FOR_DICTIONARY:
            return None
        total = sum(len(b) for b in self._blocks)
        size = max(int(self.metadata.compression_dict_size * total) + 1, 1024)
        try:
            return zstandard.train_dictionary(
                size, self._blocks, level=self.metadata.compression_level
            )
        except zstandard.ZstdError as exc:
            warnings.warn(
                f"{self.path}: zstd could not train a dictionary ({exc}); "
                "the shard falls back to STANDARD_COMPRESSION",
                RuntimeWarning,
                stacklevel=3,
            )
            return None

    def close(self) -> None:
        """Write the last block, the index, the dictionary (strategy 3) and meta.json."""
        if self._closed:
            return
        self._closed = True
        if self._pending:
            self._flush_block()
        if self._strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            zdict = self._train_dictionary()
            if zdict is None:
                self._strategy = CompressionStrategy.STANDARD_COMPRESSION
            else:
                (self.path / DICT_FILE).write_bytes(zdict.as_bytes())
                self._compression_dict = zdict
            blocks, self._blocks = self._blocks, []
            for block in blocks:
                self._append(self._encode(block))
        if self._data is None:
            # An empty shard still gets a (zero-byte) data.bin, so every reader can open it.
            self._data = open(self.path / DATA_FILE, "wb")
        self._data.close()
        total = self._offsets[-1]
        np.save(self.path / INDEX_FILE, np.array(self._offsets, dtype=index_dtype(total)))
        if self.checksums:
            np.save(self.path / CHECKSUM_FILE, np.array(self._checksums, dtype="<u8"))
        self.metadata = self.metadata._replace(
            stored_examples=self.stored_examples, compression_strategy=int(self._strategy)
        )
        dump_meta(self.path / META_FILE, self.metadata._asdict())

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


class AtlasDatasetWriter:
    """Writes a dataset as shards ``0, 1, 2, ...`` of ``shard_size`` examples each.

    With strategy 2 (the default) the first shard trains the dictionary that every shard then
    shares (stored once, in the root); if the first shard has fewer than 7 blocks the whole
    dataset falls back to strategy 1. ``close()`` writes the root meta.json and pads the shard
    folder names with zeros to one width. ``checksums=True`` gives every shard a
    ``checksums.npy`` (see ``AtlasDatasetShardWriter``).
    """

    VERSION = VERSION

    def __init__(
        self,
        path,
        shard_size,
        block_size,
        compression_strategy=CompressionStrategy.SHARED_DICTIONARY_COMPRESSION,
        compression_level=3,
        compression_dict_size=0.01,
        *,
        checksums=False,
    ):
        assert isinstance(shard_size, int) and shard_size > 0, (
            f"shard_size must be a positive integer, not {shard_size!r}"
        )
        assert isinstance(block_size, int) and block_size > 0, (
            f"block_size must be a positive integer, not {block_size!r}"
        )
        assert 0 <= compression_dict_size <= 1, (
            f"compression_dict_size must be within [0, 1], not {compression_dict_size!r}"
        )
        self.path = Path(path)
        self.shard_size = shard_size
        self.block_size = block_size
        self.compression_strategy = CompressionStrategy(compression_strategy)
        self.compression_level = compression_level
        self.compression_dict_size = compression_dict_size
        self.checksums = bool(checksums)
        self.path.mkdir(parents=True)
        self._shard_sizes: list = []
        self._shard = None
        self._strategy = self.compression_strategy  # may fall back to 1 after shard 0
        self._shared_dict = None
        self._closed = False

    def __len__(self) -> int:
        return sum(self._shard_sizes) + (self._shard.stored_examples if self._shard else 0)

    def add_example(self, example) -> None:
        """Append one example (anything picklable)."""
        if self._closed:
            raise ValueError(f"{self.path}: the dataset writer is closed")
        if self._shard is None:
            self._shard = self._open_shard(len(self._shard_sizes))
        self._shard.add_example(example)
        if self._shard.stored_examples == self.shard_size:
            self._close_shard()

    def _open_shard(self, number: int) -> AtlasDatasetShardWriter:
        strategy = self._strategy
        if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION and number == 0:
            strategy = CompressionStrategy.DICTIONARY_COMPRESSION
        return AtlasDatasetShardWriter(
            self.path / str(number),
            self.block_size,
            compression_strategy=strategy,
            compression_level=self.compression_level,
            compression_dict=self._shared_dict,
            compression_dict_size=self.compression_dict_size,
            checksums=self.checksums,
        )

    def _close_shard(self) -> None:
        shard, self._shard = self._shard, None
        shard.close()
        self._shard_sizes.append(shard.stored_examples)
        if (
            self._strategy != CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
            or self._shared_dict is not None
        ):
            return
        # Shard 0 of a strategy-2 dataset: its dictionary becomes the dataset's.
        if shard.metadata.compression_strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            shutil.move(shard.path / DICT_FILE, self.path / DICT_FILE)
            shard.metadata = shard.metadata._replace(
                compression_strategy=int(CompressionStrategy.SHARED_DICTIONARY_COMPRESSION)
            )
            dump_meta(shard.path / META_FILE, shard.metadata._asdict())
            self._shared_dict = zstandard.ZstdCompressionDict((self.path / DICT_FILE).read_bytes())
        else:
            self._strategy = CompressionStrategy.STANDARD_COMPRESSION

    def close(self) -> None:
        """Finish the last shard, write the root meta.json and pad the shard folder names."""
        if self._closed:
            return
        self._closed = True
        if self._shard is not None:
            self._close_shard()
        if (
            self._strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
            and not self._shard_sizes
        ):
            # No first shard trained a dictionary: the fallback rule of a small first shard.
            self._strategy = CompressionStrategy.STANDARD_COMPRESSION
        metadata = AtlasDatasetMetadata(VERSION, list(self._shard_sizes), int(self._strategy))
        dump_meta(self.path / META_FILE, metadata._asdict())
        width = len(str(len(self._shard_sizes) - 1)) if self._shard_sizes else 1
        for number in range(len(self._shard_sizes)):
            name = str(number)
            if len(name) < width:
                (self.path / name).rename(self.path / name.zfill(width))

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
