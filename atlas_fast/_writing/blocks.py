"""Blocks of one shard: pickled, trained on (strategy 3), compressed and stored in order.

``pickle_block`` and ``train_dictionary`` are what the shard writer does to a block and to a
strategy-3 shard's blocks (public through ``atlas_fast.writer``: converters do the same
elsewhere). ``BlockStore`` is a shard's data.bin: the backend's block compressor
(``_contract.BlockCompressorProtocol``; ``workers > 1`` compress on its threads, in block
order) and the offsets (and checksums) of what is stored, written as index.npy and
checksums.npy at the end.
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import zstandard

from .. import _backend
from .._format import CHECKSUM_FILE, DATA_FILE, INDEX_FILE, block_checksum, index_dtype
from .context import add_context, name_file, note, writing

__all__ = [
    "DIRECT_WRITE_MIN",
    "MIN_BLOCKS_FOR_DICTIONARY",
    "BlockStore",
    "pickle_block",
    "pickle_examples",
    "train_dictionary",
]

# zstd dictionary training needs at least this many samples (here: blocks).
MIN_BLOCKS_FOR_DICTIONARY = 7

# A shard whose first stored block is at least this big has data.bin written by its block
# compressor (unbuffered, on its threads); smaller blocks go through data.bin's buffer, where
# a write per block (and a thread hand-off per block, uncompressed) would cost more than it saves.
DIRECT_WRITE_MIN = 64 << 10


def pickle_block(examples, *, shard=None, number=None) -> bytes:
    """The bytes the shard writers store for a block of ``examples`` (before compression).

    ``examples`` is the block's examples in order (a list; another iterable is made one).
    A converter that pickles blocks ahead of time, in another thread or process, gives
    these bytes to ``AtlasDatasetShardWriter.add_pickled_block`` later: the shard is byte
    for byte the one ``add_example`` would have written. ``shard`` (the directory the block
    is for) and ``number`` (its block number there) name the block in a note of the error
    raised when an example does not pickle (the error itself is pickle's, of its type).
    """
    if type(examples) is not list:
        examples = list(examples)
    return pickle_examples(examples, shard, number)


def pickle_examples(examples: list, shard, number) -> bytes:
    """``pickle_block`` of a list, on the writers' hot path."""
    try:
        return pickle.dumps(examples)
    except Exception as exc:
        what = "pickling a block" if number is None else f"pickling block {number}"
        if shard is None:
            note(exc, f"atlas_fast: {what}")
        else:
            add_context(exc, f"{shard}: {what}", shard)
        raise


def train_dictionary(
    blocks, *, compression_dict_size=0.01, compression_level=3, shard=None
) -> zstandard.ZstdCompressionDict | None:
    """The dictionary a strategy-3 shard writer trains on its pickled ``blocks``, or None.

    zstd's trainer, given the blocks (``pickle_block`` bytes) as samples, makes a dictionary
    of ``compression_dict_size`` times their total size (at least 1 KiB), tuned for
    ``compression_level``. None means the shard falls back to STANDARD_COMPRESSION: fewer
    than 7 blocks (as in the reference), or zstd could not train one (a ``RuntimeWarning``
    naming ``shard`` says why). The same blocks give the same dictionary.
    """
    if len(blocks) < MIN_BLOCKS_FOR_DICTIONARY:
        return None
    total = sum(len(b) for b in blocks)
    size = max(int(compression_dict_size * total) + 1, 1024)
    try:
        return zstandard.train_dictionary(size, blocks, level=compression_level)
    except zstandard.ZstdError as exc:
        warnings.warn(
            f"{'' if shard is None else f'{shard}: '}zstd could not train a dictionary ({exc}); "
            "the shard falls back to STANDARD_COMPRESSION",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


class BlockStore:
    """The data.bin of the shard in ``path``: blocks stored in the order given.

    Uncompressed until ``compress_with`` gives a level (and a dictionary). The backend's
    block compressor is made with the first block when there is something to compress, or
    when the blocks are DIRECT_WRITE_MIN bytes or more and no checksums are asked for: it
    then writes data.bin itself (off the calling thread with ``workers > 1``; uncompressed,
    ``level=None``, it only writes), and hands back sizes; otherwise it hands back the stored
    bytes, written here through data.bin's buffer. A block lost to an error (``_fail``)
    means the shard can no longer be finished: storing or finishing raises again.

    Used by one thread at a time (the one adding to or closing the shard).
    """

    def __init__(self, path, *, checksums: bool, workers: int) -> None:
        self.path = path
        self.checksums = checksums
        self.workers = workers
        self.level = None  # None: stored as they are
        self.zdict = None  # the ZstdCompressionDict compressed with, if any
        self.offsets: list = [0]
        self.digests: list = []  # checksums=True: block_checksum of each stored block
        self.submitted = 0  # blocks given to store() so far
        self._data = None  # data.bin, opened with the first block
        self._zc = None  # the backend's block compressor, made with the first block
        self._failed = None  # the error that lost a block (see _fail)

    def compress_with(self, level, zdict) -> None:
        """Compress the blocks stored from now on at ``level`` (None: not at all), with the
        ``zstandard.ZstdCompressionDict`` ``zdict`` (or none)."""
        self.level = level
        self.zdict = zdict

    def store(self, block: bytes) -> None:
        """Compress (if asked) and append a pickled block, in the order given."""
        self.check_not_failed()
        self.submitted += 1
        if self._data is None:
            self._start(len(block))
        if self._zc is None:  # uncompressed, through data.bin's buffer
            self._stored_bytes(block)
            return
        try:
            stored = self._zc.submit(block)
        except Exception as exc:
            self._lost(exc)
            raise
        self._stored(stored)

    def _start(self, first: int) -> None:
        """Open data.bin and make the block compressor if one is needed (``first``: the
        first block's size; see the class)."""
        self._open_data()
        direct = not self.checksums and first >= DIRECT_WRITE_MIN
        if self.level is None and not direct:
            return
        options = {"checksum": self.checksums}
        if direct:
            options["out"] = self._data.fileno()
        zdict = None if self.zdict is None else self.zdict.as_bytes()
        self._zc = _backend.compressor.block_compressor(self.level, zdict, self.workers, **options)

    def drain(self) -> None:
        """Write every block still being compressed."""
        if self._zc is not None:
            try:
                stored = self._zc.finish()
            except Exception as exc:
                self._lost(exc)
                raise
            self._stored(stored)

    def _lost(self, exc: BaseException, compressing: bool = True) -> None:
        """Remember ``exc``: a block is lost, so the shard can no longer be finished (storing
        or finishing raises again). A failed write of data.bin is made to name it; any other
        error of the compressor is noted as the next block's to be stored."""
        if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
            name_file(exc, self.path / DATA_FILE)
        elif compressing:
            # Frames come back in block order: the failing one is the next to be written.
            number = len(self.offsets) - 1
            add_context(exc, f"{self.path}: compressing block {number}", self.path)
        if self._failed is None:
            self._failed = exc

    def check_not_failed(self) -> None:
        if self._failed is not None:
            error = self._failed
            raise ValueError(
                f"{self.path}: an earlier block was lost ({type(error).__name__}: {error}); "
                "the shard cannot be finished"
            ) from error

    def _open_data(self) -> None:
        with writing(self.path / DATA_FILE):
            self._data = open(self.path / DATA_FILE, "wb")

    def _stored(self, stored: list) -> None:
        """Record blocks the compressor finished, in order: their sizes (it wrote them) or
        their stored bytes, written here."""
        offsets = self.offsets
        for frame in stored:
            if type(frame) is int:
                offsets.append(offsets[-1] + frame)
            else:
                self._stored_bytes(frame)

    def _stored_bytes(self, frame: bytes) -> None:
        """Write a stored block to data.bin (its buffer) and record it."""
        try:
            self._data.write(frame)
        except OSError as exc:
            self._lost(exc, compressing=False)
            raise
        self.offsets.append(self.offsets[-1] + len(frame))
        if self.checksums:
            self.digests.append(block_checksum(frame))

    def finish(self) -> None:
        """Write what is still being compressed, close data.bin (an empty shard gets a
        zero-byte one, so every reader can open it), then write index.npy (and
        checksums.npy)."""
        self.check_not_failed()
        self.drain()
        if self._data is None:
            self._open_data()
        self.release()
        total = self.offsets[-1]
        with writing(self.path / INDEX_FILE):
            np.save(self.path / INDEX_FILE, np.array(self.offsets, dtype=index_dtype(total)))
        if self.checksums:
            with writing(self.path / CHECKSUM_FILE):
                np.save(self.path / CHECKSUM_FILE, np.array(self.digests, dtype="<u8"))

    def release(self) -> None:
        """Stop the compression threads (queued blocks are dropped) and close data.bin."""
        if self._zc is not None:
            zc, self._zc = self._zc, None
            zc.close()
        if self._data is not None:
            data, self._data = self._data, None
            with writing(self.path / DATA_FILE):
                data.close()
