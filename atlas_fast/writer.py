"""Writers of Atlas datasets: ``AtlasDatasetWriter`` and ``AtlasDatasetShardWriter``.

Same names, signatures, defaults and files as ``torch_atlas_ds.writer``: what these write,
the reference reads example for example, and the other way round. Bad arguments raise
``AssertionError`` as the reference does, so existing ``except AssertionError`` code keeps
working.

The dataset writer talks to its shard writers the way the reference's does, so code that
patches ``atlas_fast.writer.AtlasDatasetShardWriter`` (a test double) sees the same calls:
each shard writer is created through that module attribute, looked up at call time, with
keyword arguments only (``path``, ``block_size``, ``compression_strategy``,
``compression_level``, ``compression_dict_size``, and ``compression_dict`` from the second
shard on); our own options (``checksums=``, ``workers=``) are passed only when they are set.
The only other things the dataset writer uses are ``add_example``, ``len()``, ``close()``
and, under strategy 2, the files the first shard leaves on disk.

Unlike the reference, a dataset whose ``with`` block raised is not finished: no root
meta.json is written (it is always the last file to appear, under a temporary name then
renamed), so the directory never reads as a complete dataset; shards queued on other threads
are not started, those running are waited for, and a warning says which shard directories
were finished and which were left unfinished.

Errors name the shard directory (and the block, or the file) they happened in; whether one
raised on another thread already does is told by its type and attributes, never its message:
our writers mark the errors they give context to (``_with_context``), and an ``OSError``
names its file.
"""

from __future__ import annotations

import operator
import os
import pickle
import warnings
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import zstandard

from . import _backend
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
    read_shard_metadata,
)
from ._writing.commit import dump_meta_atomic

__all__ = [
    "AtlasDatasetWriter",
    "AtlasDatasetShardWriter",
    "default_workers",
    "pickle_block",
    "train_dictionary",
]

# zstd dictionary training needs at least this many samples (here: blocks).
MIN_BLOCKS_FOR_DICTIONARY = 7

# workers=None: the cores this process may run on, at most this many.
MAX_DEFAULT_WORKERS = 8

# A shard whose first stored block is at least this big has data.bin written by its block
# compressor (unbuffered, on its threads); smaller blocks go through data.bin's buffer, where
# a write per block (and a thread hand-off per block, uncompressed) would cost more than it saves.
DIRECT_WRITE_MIN = 64 << 10

# Strategy 2 with workers > 1: the most pickled blocks (in bytes; one block more may be held)
# the dataset writer reads ahead while the first shard trains the shared dictionary.
READ_AHEAD_BYTES = 64 << 20


def default_workers() -> int:
    """The compression threads ``workers=None`` means: the usable cores, at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_DEFAULT_WORKERS))


def _resolve_workers(workers) -> int:
    if workers is None:
        return default_workers()
    try:
        number = operator.index(workers)
    except TypeError:
        number = 0
    if number < 1 or isinstance(workers, bool):
        raise ValueError(f"workers must be a positive integer or None, not {workers!r}")
    return number


# The attribute by which an error our writers gave context to (``_with_context``) says which
# directory its message names, so that it is not given that context twice.
_WHERE = "_atlas_fast_where"


def _with_context(exc: BaseException, context: str, where) -> BaseException:
    """``exc`` again, of the same type when it can be (an ``OSError`` keeps its errno and
    file names), its message prefixed with ``context``, which names the directory ``where``."""
    try:
        if isinstance(exc, OSError) and exc.errno is not None and exc.strerror is not None:
            files = () if exc.filename is None else (exc.filename,)
            if exc.filename2 is not None:
                files = (exc.filename, None, exc.filename2)
            error = type(exc)(exc.errno, f"{context}: {exc.strerror}", *files)
        else:
            error = type(exc)(f"{context}: {exc}")
    except Exception:
        error = RuntimeError(f"{context}: {type(exc).__name__}: {exc}")
    setattr(error, _WHERE, where)
    return error


def _names(exc: BaseException, directory) -> bool:
    """Whether ``exc`` names ``directory`` or a file in it already: as ``_with_context``
    marked it, or as the file of an ``OSError``. The message text is not looked at."""
    places = [getattr(exc, _WHERE, None)]
    if isinstance(exc, OSError):
        places += [exc.filename, exc.filename2]
    top = os.path.abspath(directory)
    for place in places:
        if isinstance(place, (str, bytes, os.PathLike)):
            place = os.path.abspath(os.fsdecode(place))
            if place == top or place.startswith(top.rstrip(os.sep) + os.sep):
                return True
    return False


def _naming(exc: OSError, path) -> OSError:
    """``exc``, or the same error naming the file ``path`` (same type and errno) when it
    names no file, as a failed write or flush does."""
    if exc.filename is None and exc.errno is not None:
        try:
            return type(exc)(exc.errno, exc.strerror, os.fspath(path))
        except Exception:
            pass
    return exc


def _raise_naming(exc: OSError, path):
    """Raise ``exc`` as ``_naming`` gives it (chained to it when it is another error)."""
    error = _naming(exc, path)
    if error is exc:
        raise exc
    raise error from exc


@contextmanager
def _writing(path):
    """An ``OSError`` raised within names the file ``path`` (``_raise_naming``)."""
    try:
        yield
    except OSError as exc:
        _raise_naming(exc, path)


def _note(exc: BaseException, text: str) -> None:
    """Add ``text`` to what the traceback of ``exc`` shows (Python 3.11+; a no-op before)."""
    add_note = getattr(exc, "add_note", None)
    if add_note is not None:
        add_note(text)


def pickle_block(examples, *, shard=None, number=None) -> bytes:
    """The bytes the shard writers store for a block of ``examples`` (before compression).

    ``examples`` is the block's examples in order (a list; another iterable is made one).
    A converter that pickles blocks ahead of time, in another thread or process, gives
    these bytes to ``AtlasDatasetShardWriter.add_pickled_block`` later: the shard is byte
    for byte the one ``add_example`` would have written. ``shard`` (the directory the block
    is for) and ``number`` (its block number there) only name the block in the error raised
    when an example does not pickle.
    """
    if type(examples) is not list:
        examples = list(examples)
    try:
        return pickle.dumps(examples)
    except Exception as exc:
        where = "a block" if number is None else f"block {number}"
        raise _with_context(exc, f"{shard}: pickling {where}", shard) from exc


def _pickle_block(examples: list, shard_path, number: int) -> bytes:
    """``pickle_block`` on the writers' hot path (a list, always)."""
    try:
        return pickle.dumps(examples)
    except Exception as exc:
        raise _with_context(exc, f"{shard_path}: pickling block {number}", shard_path) from exc


def train_dictionary(
    blocks, *, compression_dict_size=0.01, compression_level=3, shard=None
) -> zstandard.ZstdCompressionDict | None:
    """The dictionary a strategy-3 shard writer trains on its pickled ``blocks``, or None.

    zstd's trainer, given the blocks (``pickle_block`` bytes) as samples, makes a dictionary
    of ``compression_dict_size`` times their total size (at least 1 KiB), tuned for
    ``compression_level``. None means the shard falls back to STANDARD_COMPRESSION: fewer
    than 7 blocks (as in the reference), or zstd could not train one (a ``RuntimeWarning``
    naming ``shard`` says why). Deterministic: the same blocks give the same dictionary.
    """
    if len(blocks) < MIN_BLOCKS_FOR_DICTIONARY:
        return None
    total = sum(len(b) for b in blocks)
    size = max(int(compression_dict_size * total) + 1, 1024)
    try:
        return zstandard.train_dictionary(size, blocks, level=compression_level)
    except zstandard.ZstdError as exc:
        warnings.warn(
            f"{shard}: zstd could not train a dictionary ({exc}); "
            "the shard falls back to STANDARD_COMPRESSION",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def _positive_int(value, name: str) -> int:
    """``value`` as an int (numpy integers too); AssertionError, as the reference, otherwise."""
    try:
        number = operator.index(value)
    except TypeError:
        number = None
    assert number is not None and number > 0, f"{name} must be a positive integer, not {value!r}"
    return number


def _check_dict_size(value) -> None:
    assert 0 <= value <= 1, f"compression_dict_size must be within [0, 1], not {value!r}"


class _AfterShortBlock(list):
    """The pending examples of a shard whose last block was added short
    (``add_pickled_block``): adding one more raises, at no cost to ``add_example``."""

    __slots__ = ("path",)

    def __init__(self, path) -> None:
        super().__init__()
        self.path = path

    def append(self, example) -> None:
        raise ValueError(
            f"{self.path}: the shard ended with a short block (add_pickled_block of fewer "
            "than block_size examples): nothing can follow it"
        )


class _FinishedOnlyOnSuccess:
    """The context manager of both writers: ``close()`` when the ``with`` block succeeds;
    when it raises, the writer is abandoned (as ``abort()`` does) and a warning names the
    directory and what is left in it. The ``with`` block's exception stays the one raised:
    errors met while abandoning are added to it as notes (Python 3.11+) and to the warning."""

    _kind = ""  # "shard" or "dataset", for the warning

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        elif not self._closed:
            self._closed = True
            try:
                problems = self._abandon()
                self._say_incomplete(f"the with block raised {exc_type.__name__}", problems, exc)
            except Exception as error:  # a bug of ours must not hide the with block's error
                _note(exc, f"atlas_fast: abandoning {self.path} failed: {error!r}")

    def _abandon(self) -> list:
        """Stop without finishing; the errors met meanwhile, as messages, raising none."""
        raise NotImplementedError

    def _left_behind(self) -> str:
        """What the directory holds now, in a sentence for the warning."""
        raise NotImplementedError

    def _say_incomplete(self, why: str, problems: list, exc: BaseException) -> None:
        """Warn that the writer ended unfinished (``why``), naming its directory and what is
        left in it; ``problems`` (met while abandoning it) are added to ``exc`` as notes."""
        message = (
            f"{self.path}: the {self._kind} is incomplete and has no meta.json: {why}. "
            f"{self._left_behind()}; remove the directory before writing there again."
        )
        for problem in problems:
            _note(exc, f"atlas_fast: abandoning {self.path}: {problem}")
        if problems:
            message += " Abandoning it also failed: " + "; ".join(problems)
        try:
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        except Warning:
            # Warnings are errors here: ``exc`` stays the one raised, the warning its note.
            _note(exc, f"atlas_fast: {message}")


class AtlasDatasetShardWriter(_FinishedOnlyOnSuccess):
    """Writes one shard: examples are grouped into blocks of ``block_size``, pickled,
    compressed per ``compression_strategy`` and appended to data.bin.

    With strategy 3 (the default) a dictionary is trained on the shard's blocks at ``close()``;
    a shard of fewer than 7 blocks falls back to strategy 1 and its meta.json says so.
    Strategy 2 compresses with ``compression_dict`` (a ``zstandard.ZstdCompressionDict``).

    ``dictionary_source`` (strategy 3 only) replaces that training: a callable given the
    shard's pickled blocks (a list of bytes, in order) at ``close()``, on the thread closing
    the shard, returning the ``zstandard.ZstdCompressionDict`` to compress them with (stored
    as the shard's zstd_dict.bin), or None to fall back to strategy 1. For a dictionary
    trained elsewhere (a converter's other process), or training that also hands the
    dictionary on: ``train_dictionary`` is what the shard writer calls without it.

    ``compressor`` is the ``zstandard.ZstdCompressor`` the blocks are compressed with: None
    when uncompressed, and under strategy 3 until the dictionary is trained at ``close()``.

    ``checksums=True`` also writes ``checksums.npy``: one BLAKE2b-8 digest per stored block,
    which readers ignore and ``atlas-fast verify`` checks to find silent corruption; and
    compressed blocks carry zstd's checksum of their content, which every read checks (so a
    damaged block or dictionary is an error, never a different example; the frames stay
    readable by any zstd reader, the reference package included).

    ``workers`` (default: the usable cores, at most 8) threads compress full blocks while the
    calling thread pickles the next ones (the backend's ``block_compressor``: in the compiled
    one, ``workers - 1`` threads that never take the GIL, and the calling thread compresses
    queued blocks rather than wait); blocks are written in order, at most ``2 * workers`` of
    them in flight, and the files are byte-identical to ``workers=1`` (which compresses on the
    calling thread) and to ``compressor.compress``. Blocks of ``DIRECT_WRITE_MIN`` (64 KiB) or
    more are also written to data.bin by the compressor, by whichever of its threads has the
    next one done (under strategy 0 it stores them as they are: with ``workers > 1`` its
    helper writes them while this thread pickles), except with ``checksums=True``, whose
    digests are taken here from the stored bytes. An error on another thread is raised on the
    calling thread, naming the shard and the block (a failed write: data.bin); a shard that
    lost a block that way cannot be finished (adding to it or closing it raises again).

    Examples pickled elsewhere (``pickle_block``) are added a block at a time with
    ``add_pickled_block``.

    If the ``with`` block raises, the shard is abandoned (see ``abort()``), not finished.
    """

    VERSION = VERSION
    _kind = "shard"

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
        workers=None,
        dictionary_source=None,
    ):
        block_size = _positive_int(block_size, "block_size")
        _check_dict_size(compression_dict_size)
        strategy = CompressionStrategy(compression_strategy)
        if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
            assert compression_dict is not None, (
                "compression_strategy SHARED_DICTIONARY_COMPRESSION needs compression_dict"
            )
        if dictionary_source is not None:
            if strategy != CompressionStrategy.DICTIONARY_COMPRESSION:
                raise ValueError(
                    "dictionary_source is for compression_strategy 3 "
                    f"(DICTIONARY_COMPRESSION) only, not {int(strategy)}"
                )
            if not callable(dictionary_source):
                raise TypeError(
                    f"dictionary_source must be callable, not {type(dictionary_source).__name__}"
                )
        self.path = Path(path)
        self.path.mkdir(parents=True)
        self.metadata = AtlasDatasetShardMetadata(
            VERSION, block_size, 0, int(strategy), compression_level, compression_dict_size
        )
        self.stored_examples = 0
        self._block_size = block_size  # metadata.block_size, read once per example
        self.checksums = bool(checksums)
        self.workers = _resolve_workers(workers)
        self.compressor = None
        if strategy in (
            CompressionStrategy.STANDARD_COMPRESSION,
            CompressionStrategy.SHARED_DICTIONARY_COMPRESSION,
        ):
            self.compressor = self._new_compressor(compression_dict)
        self._strategy = strategy
        self._compression_dict = compression_dict
        self._dictionary_source = dictionary_source
        self._pending: list = []  # examples of the block being filled
        self._blocks: list = []  # strategy 3 only: pickled blocks awaiting the dictionary
        self._offsets: list = [0]
        self._checksums: list = []  # checksums=True: block_checksum of each stored block
        self._data = None  # data.bin, opened with the first block
        self._closed = False
        # The backend's block compressor (see _contract.BlockCompressorProtocol), made with
        # the first block to compress: workers > 1 compress on threads, in block order.
        self._zc = None
        self._submitted = 0  # blocks handed to _store so far
        self._failed = None  # the error that lost a block (see _fail)

    def _new_compressor(self, compression_dict=None) -> zstandard.ZstdCompressor:
        level = self.metadata.compression_level
        # checksums=True: every frame carries its content's checksum (XXH64), which every
        # zstd reader checks as it decompresses (a damaged dictionary is caught too).
        checksum = self.checksums
        if compression_dict is None:
            return zstandard.ZstdCompressor(level=level, write_checksum=checksum)
        return zstandard.ZstdCompressor(
            level=level, dict_data=compression_dict, write_checksum=checksum
        )

    def __len__(self) -> int:
        return self.stored_examples

    def add_example(self, example) -> None:
        """Append one example (anything picklable)."""
        if self._closed:
            raise ValueError(f"{self.path}: the shard writer is closed")
        pending = self._pending
        pending.append(example)
        self.stored_examples += 1
        if len(pending) == self._block_size:
            self._flush_block()

    def _flush_block(self) -> None:
        block = _pickle_block(self._pending, self.path, self._submitted + len(self._blocks))
        self._pending = []
        self._add_block(block)

    def add_pickled_block(self, block, count) -> None:
        """Append a block pickled elsewhere: ``block`` is ``pickle_block`` of its ``count``
        examples (a converter pickling ahead of time, or in another process).

        The shard is then byte for byte the one ``add_example`` of those examples writes.
        The block starts where a block starts (no example added since the last full block)
        and holds ``block_size`` examples, but for the shard's last block, which may hold
        fewer (after it nothing more can be added). The bytes are stored as given: what they
        unpickle to is what readers get, so they must be a list of ``count`` examples.
        """
        if self._closed:
            raise ValueError(f"{self.path}: the shard writer is closed")
        if self._pending:
            raise ValueError(
                f"{self.path}: add_pickled_block after {len(self._pending)} examples added "
                f"one by one: a pickled block must start a block (after a multiple of "
                f"block_size {self._block_size} examples)"
            )
        if type(self._pending) is _AfterShortBlock:
            self._pending.append(None)  # raises
        if not isinstance(block, bytes):
            try:
                block = bytes(memoryview(block))
            except TypeError:
                raise TypeError(
                    f"{self.path}: add_pickled_block needs the bytes of pickle_block, not "
                    f"{type(block).__name__}"
                ) from None
        try:
            count = operator.index(count)
        except TypeError:
            count = -1
        if not 0 < count <= self._block_size:
            raise ValueError(
                f"{self.path}: add_pickled_block's count must be 1 to block_size "
                f"({self._block_size}), not {count!r}"
            )
        self.stored_examples += count
        self._add_block(block)
        if count < self._block_size:  # the shard's last block: nothing may follow it
            self._pending = _AfterShortBlock(self.path)

    def _add_block(self, block: bytes) -> None:
        if self._strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            self._blocks.append(block)
        else:
            self._store(block)

    def _store(self, block: bytes) -> None:
        """Compress (per the strategy) and append a pickled block, in the order given."""
        self._check_not_failed()
        self._submitted += 1
        if self._data is None:
            self._start(len(block))
        if self._zc is None:  # uncompressed, through data.bin's buffer
            self._stored_bytes(block)
            return
        try:
            stored = self._zc.submit(block)
        except Exception as exc:
            raise self._fail(self._block_error(exc)) from exc
        self._stored(stored)

    def _start(self, first: int) -> None:
        """Open data.bin and make the backend's block compressor, if one is needed: to
        compress, or to write data.bin itself (off this thread with workers > 1; uncompressed,
        ``level=None``, it only writes) when the blocks are DIRECT_WRITE_MIN bytes or more
        (``first``: the first one's size) and no checksums are asked for (their digests need
        the stored bytes, which it then returns to ``_stored``)."""
        self._open_data()
        direct = not self.checksums and first >= DIRECT_WRITE_MIN
        if self.compressor is None and not direct:
            return
        zdict = self._compression_dict
        level = None if self.compressor is None else self.metadata.compression_level
        options = {"checksum": self.checksums}
        if direct:
            options["out"] = self._data.fileno()
        self._zc = _backend.compressor.block_compressor(
            level, None if zdict is None else zdict.as_bytes(), self.workers, **options
        )

    def _drain(self) -> None:
        """Write every block still being compressed."""
        if self._zc is not None:
            try:
                stored = self._zc.finish()
            except Exception as exc:
                raise self._fail(self._block_error(exc)) from exc
            self._stored(stored)

    def _fail(self, error: BaseException) -> BaseException:
        """``error``, remembered: a block is lost, so the shard can no longer be finished
        (adding to it or closing it raises again, and close() abandons it)."""
        if self._failed is None:
            self._failed = error
        return error

    def _check_not_failed(self) -> None:
        if self._failed is not None:
            error = self._failed
            raise ValueError(
                f"{self.path}: an earlier block was lost ({type(error).__name__}: {error}); "
                "the shard cannot be finished"
            ) from error

    def _block_error(self, exc: Exception) -> BaseException:
        if isinstance(exc, OSError):
            named = _naming(exc, self.path / DATA_FILE)
            if named is not exc:  # the compressor's write of data.bin failed
                return named
        # Frames come back in block order: the failing one is the next to be written.
        number = len(self._offsets) - 1
        return _with_context(exc, f"{self.path}: compressing block {number}", self.path)

    def _open_data(self) -> None:
        with _writing(self.path / DATA_FILE):
            self._data = open(self.path / DATA_FILE, "wb")

    def _stored(self, stored: list) -> None:
        """Record blocks the compressor finished, in order: their sizes (it wrote them) or
        their stored bytes, written here."""
        offsets = self._offsets
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
            error = self._fail(_naming(exc, self.path / DATA_FILE))
            if error is exc:
                raise
            raise error from exc
        self._offsets.append(self._offsets[-1] + len(frame))
        if self.checksums:
            self._checksums.append(block_checksum(frame))

    def _train_dictionary(self):
        """The shard's dictionary (strategy 3, at close), or None to fall back to strategy 1:
        from ``dictionary_source`` when given, else ``train_dictionary`` on its blocks."""
        if self._dictionary_source is not None:
            return self._dictionary_source(self._blocks)
        return train_dictionary(
            self._blocks,
            compression_dict_size=self.metadata.compression_dict_size,
            compression_level=self.metadata.compression_level,
            shard=self.path,
        )

    def close(self) -> None:
        """Write the last block, the index, the dictionary (strategy 3) and meta.json."""
        if self._closed:
            return
        self._closed = True
        try:
            self._finish()
        except BaseException as exc:
            for problem in self._abandon():
                _note(exc, f"atlas_fast: then abandoning {self.path}: {problem}")
            raise

    def _finish(self) -> None:
        self._check_not_failed()
        if self._pending:
            self._flush_block()
        if self._strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            zdict = self._train_dictionary()
            if zdict is None:
                self._strategy = CompressionStrategy.STANDARD_COMPRESSION
            else:
                with _writing(self.path / DICT_FILE):
                    (self.path / DICT_FILE).write_bytes(zdict.as_bytes())
            self._compression_dict = zdict
            self.compressor = self._new_compressor(zdict)
            blocks, self._blocks = self._blocks, []
            blocks.reverse()
            while blocks:  # each pickled block is let go once stored
                self._store(blocks.pop())
        self._drain()
        if self._data is None:
            # An empty shard still gets a (zero-byte) data.bin, so every reader can open it.
            self._open_data()
        self._release()
        total = self._offsets[-1]
        with _writing(self.path / INDEX_FILE):
            np.save(self.path / INDEX_FILE, np.array(self._offsets, dtype=index_dtype(total)))
        if self.checksums:
            with _writing(self.path / CHECKSUM_FILE):
                np.save(self.path / CHECKSUM_FILE, np.array(self._checksums, dtype="<u8"))
        self.metadata = self.metadata._replace(
            stored_examples=self.stored_examples, compression_strategy=int(self._strategy)
        )
        with _writing(self.path / META_FILE):
            dump_meta(self.path / META_FILE, self.metadata._asdict())

    def abort(self) -> None:
        """Stop without finishing: data.bin is closed as it is and no index, dictionary or
        meta.json is written, so the directory does not read as a shard. An error flushing
        data.bin is not raised: the shard is abandoned."""
        if not self._closed:
            self._closed = True
            self._abandon()

    def _abandon(self) -> list:
        self._pending, self._blocks = [], []
        try:
            self._release()
        except Exception as exc:  # flushing data.bin: it is abandoned anyway
            return [f"{type(exc).__name__}: {exc}"]
        return []

    def _left_behind(self) -> str:
        return "What was written so far is left for inspection"

    def _release(self) -> None:
        """Stop the compression threads (queued blocks are dropped) and close data.bin."""
        if self._zc is not None:
            zc, self._zc = self._zc, None
            zc.close()
        if self._data is not None:
            with _writing(self.path / DATA_FILE):
                self._data.close()


# The class above, whatever a test double patched in as ``AtlasDatasetShardWriter`` is.
_OwnShardWriter = AtlasDatasetShardWriter


class _ReadAhead:
    """A shard whose writer cannot be made yet (strategy 2, while the first shard trains the
    dictionary it needs): its full blocks pickled, the examples after them as given."""

    __slots__ = ("blocks", "pending", "count")

    def __init__(self) -> None:
        self.blocks: list = []
        self.pending: list = []
        self.count = 0


class AtlasDatasetWriter(_FinishedOnlyOnSuccess):
    """Writes a dataset as shards ``0, 1, 2, ...`` of ``shard_size`` examples each.

    The directory and the first shard writer are created here; a shard is finished when the
    example after its last one arrives, or at ``close()`` (so there is never an empty trailing
    shard, and zero examples make one empty shard, as the reference writes them).

    With strategy 2 (the default) the first shard trains the dictionary that every shard then
    shares (stored once, in the root); if the first shard has fewer than 7 blocks the whole
    dataset falls back to strategy 1. ``close()`` pads the shard folder names with zeros to one
    width and writes the root meta.json last, atomically. ``checksums=True`` gives every shard
    a ``checksums.npy`` (see ``AtlasDatasetShardWriter``).

    ``workers`` (default: the usable cores, at most 8) is the shard writers' compression
    threads (passed on to them only when given). With ``workers > 1`` full shards are also
    finished on other threads while the next one fills, up to ``workers`` at once: their last
    blocks, index and meta.json (a shard beyond that is finished on this thread); under
    strategy 3 each trains its dictionary and compresses there while this thread only
    pickles, waiting when all are busy (so up to ``workers + 1`` shards' pickled blocks are
    held at once, where the reference holds one). Under strategy 2 the first shard trains
    the shared dictionary on another thread while this one pickles the following shards'
    blocks ahead, at most ``READ_AHEAD_BYTES`` (64 MiB) of them plus one block, waiting for
    the dictionary beyond that; they are compressed once it exists. ``workers=1`` does all
    of it on the calling thread and holds one shard, as the reference does. Shard writers
    that are not ours (a test double) are made and closed in the reference's order: strategy
    2's first shard is closed before the next shard writer is made.

    If the ``with`` block raises (or ``close()`` does), the dataset is not finished: no root
    meta.json is written; the shard being filled is abandoned, shards queued on other threads
    are abandoned before they start, those being finished there are waited for (no thread is
    left running); a ``RuntimeWarning`` names the directory and which shard directories in it
    were finished and which were left unfinished (no meta.json). They stay on disk for
    inspection (readers refuse the directory: its meta.json is missing). The exception
    raised stays the one raised; errors of other shards met meanwhile are added to it as
    notes (Python 3.11+) and to the warning.
    """

    VERSION = VERSION
    _kind = "dataset"

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
        workers=None,
    ):
        shard_size = _positive_int(shard_size, "shard_size")
        block_size = _positive_int(block_size, "block_size")
        _check_dict_size(compression_dict_size)
        self.path = Path(path)
        self.shard_size = shard_size
        self.block_size = block_size
        # Becomes STANDARD_COMPRESSION if strategy 2's first shard cannot train a dictionary.
        self.compression_strategy = CompressionStrategy(compression_strategy)
        self.compression_level = compression_level
        self.compression_dict_size = compression_dict_size
        self.checksums = bool(checksums)
        self.workers = _resolve_workers(workers)
        self._workers_given = workers is not None  # passed on to shard writers only if given
        self.shard_sizes: list = []  # sizes of the shards finished so far
        self.shared_dict = None  # strategy 2: the dictionary every shard after the first uses
        self._closed = False
        # workers > 1: full shards close (strategy 3: train and compress) on a pool of
        # `workers` threads while this thread fills the next shard.
        self._finisher = None  # ThreadPoolExecutor, started with the first such shard
        self._finishing: deque = deque()  # (shard writer, future of its close())
        # Strategy 2, workers > 1, our own shard writers: while the first shard closes on the
        # pool, the next shards' examples wait here, their full blocks pickled.
        self._first = None  # (first shard writer, future of its close()) meanwhile
        self._ahead: list = []  # _ReadAhead of each shard after the first
        self._ahead_bytes = 0  # pickled bytes in self._ahead
        # Whether current_shard is being filled, by this thread only (not yet handed to
        # close() here or on the pool): what abandoning the dataset aborts.
        self._filling = False
        self.path.mkdir(parents=True)
        self.current_shard = self._new_shard()
        self._filling = True

    def _new_shard(self):
        """The next shard writer, created through the module attribute (so a patch of
        ``atlas_fast.writer.AtlasDatasetShardWriter`` takes effect), keywords only."""
        number = len(self.shard_sizes)
        strategy = self.compression_strategy
        kwargs = {}
        if number == 0:
            if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
                strategy = CompressionStrategy.DICTIONARY_COMPRESSION
        else:
            kwargs["compression_dict"] = self.shared_dict
        if self.checksums:
            kwargs["checksums"] = True
        if self._workers_given:
            kwargs["workers"] = self.workers
        return AtlasDatasetShardWriter(
            path=self.path / str(number),
            block_size=self.block_size,
            compression_strategy=strategy,
            compression_level=self.compression_level,
            compression_dict_size=self.compression_dict_size,
            **kwargs,
        )

    def __len__(self) -> int:
        if self._first is not None:
            return sum(self.shard_sizes) + sum(part.count for part in self._ahead)
        return sum(self.shard_sizes) + len(self.current_shard)

    def add_example(self, example) -> None:
        """Append one example (anything picklable)."""
        if self._closed:
            raise ValueError(f"{self.path}: the dataset writer is closed")
        shard = self.current_shard
        if (shard.stored_examples if type(shard) is _OwnShardWriter else len(shard)) >= (
            self.shard_size
        ):
            # Full (the first shard stays current, full, while the next ones are read ahead).
            if self._first is None:
                self._finish_shard()
                if self._first is None:
                    self.current_shard = self._new_shard()
                    self._filling = True
            if self._first is not None:
                self._read_ahead(example)
                return
            shard = self.current_shard
        shard.add_example(example)

    def _finish_shard(self, last: bool = False) -> None:
        shard = self.current_shard
        self.shard_sizes.append(len(shard))
        first_of_shared = (
            len(self.shard_sizes) == 1
            and self.compression_strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
        )
        if not last and self.workers > 1:
            if first_of_shared:
                if self._may_read_ahead(shard):
                    self._first = (shard, self._pool().submit(shard.close))
                    self._filling = False
                    return
            elif self._may_finish_elsewhere(shard):
                self._collect(wait=False)
                if self.compression_strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
                    # Training is most of the work: it runs on the pool only, this thread
                    # waits for a free thread rather than train itself.
                    while len(self._finishing) >= self.workers:
                        wait_futures(
                            [future for _, future in self._finishing], return_when=FIRST_COMPLETED
                        )
                        self._collect(wait=False)
                # Up to `workers` at once: closing one here would stall the pickling while
                # its last blocks compress (measured: strategy 1 1.72-1.76x the reference
                # with workers - 1 at once, 1.79-1.81x with workers; strategy 0 1.19 / 1.34x).
                if len(self._finishing) < self.workers:
                    self._finishing.append((shard, self._pool().submit(shard.close)))
                    self._filling = False
                    return
                # Every thread of the pool is busy with a shard: this one finishes it itself.
        self._filling = False
        shard.close()
        if first_of_shared:
            self._share_first_dictionary(Path(shard.path))

    def _pool(self) -> ThreadPoolExecutor:
        if self._finisher is None:
            self._finisher = ThreadPoolExecutor(self.workers, thread_name_prefix="atlas-fast-shard")
        return self._finisher

    def _may_finish_elsewhere(self, shard) -> bool:
        """Whether ``shard`` (not strategy 2's first) may be closed on another thread while
        the next one fills.

        Strategy 3 shards (whatever their writer: training is most of the work) and shards of
        our own writer under any strategy (their last blocks, index and meta.json). A test
        double of another class is closed on this thread, before the next shard is created, as
        the reference does."""
        if self.compression_strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            return True
        return type(shard) is _OwnShardWriter

    @staticmethod
    def _may_read_ahead(shard) -> bool:
        """Whether strategy 2's first shard may train on another thread while this one pickles
        the next shards ahead: only when it and the next shard writers are ours (a test double
        sees the reference's order: the first shard closed before the second is made)."""
        return type(shard) is _OwnShardWriter and AtlasDatasetShardWriter is _OwnShardWriter

    def _read_ahead(self, example) -> None:
        """Strategy 2 while the first shard trains: hold ``example`` for the shard it belongs
        to, pickling each full block; once the dictionary is there, or READ_AHEAD_BYTES are
        held, hand them to their shard writers (``_end_read_ahead``)."""
        ahead = self._ahead
        if not ahead or ahead[-1].count >= self.shard_size:
            ahead.append(_ReadAhead())
        part = ahead[-1]
        part.pending.append(example)
        part.count += 1
        if len(part.pending) == self.block_size:
            number = len(self.shard_sizes) + len(ahead) - 1
            block = _pickle_block(part.pending, self.path / str(number), len(part.blocks))
            part.pending = []
            part.blocks.append(block)
            self._ahead_bytes += len(block)
            if self._ahead_bytes >= READ_AHEAD_BYTES or self._first[1].done():
                self._end_read_ahead()

    def _end_read_ahead(self) -> None:
        """Wait for the first shard (its error is raised here) and share its dictionary; then
        make the writers of the shards read ahead, in order. The full ones are given their
        blocks and closed on the pool, a shard per thread; the last one is given its blocks
        and examples here and becomes the shard being filled."""
        first, future = self._first
        self._first = None
        ahead, self._ahead = self._ahead, []
        self._ahead_bytes = 0
        exc = future.exception()
        if exc is not None:
            raise self._shard_error(first, exc)
        self._share_first_dictionary(Path(first.path))
        ahead.reverse()
        while ahead:
            part = ahead.pop()
            shard = self._new_shard()
            if ahead:
                self.shard_sizes.append(part.count)
                # Each of the pool's threads compresses one shard: no threads of its own.
                shard.workers = 1
                future = self._pool().submit(self._replay, shard, part, self.block_size)
                self._finishing.append((shard, future))
            else:
                self.current_shard = shard
                self._filling = True
                self._replay(shard, part, self.block_size, close=False)

    @staticmethod
    def _replay(shard, part: _ReadAhead, block_size: int, close: bool = True) -> None:
        """Give ``shard`` (our own writer, new) what ``part`` holds, then close it if
        ``close``; abandon it if that fails."""
        try:
            blocks, part.blocks = part.blocks, []
            blocks.reverse()
            while blocks:  # each pickled block is let go once stored
                shard.add_pickled_block(blocks.pop(), block_size)
            for example in part.pending:
                shard.add_example(example)
            if close:
                shard.close()
        except BaseException:
            shard.abort()
            raise

    def _collect(self, wait: bool) -> None:
        """Take the shards finished on other threads (all of them, in order, if ``wait``);
        the first error is raised here, naming the shard, the shards after it left queued
        (for ``_abandon``)."""
        still = deque()
        while self._finishing:
            shard, future = self._finishing.popleft()
            if not wait and not future.done():
                still.append((shard, future))
                continue
            exc = future.exception()
            if exc is not None:
                still.extend(self._finishing)
                self._finishing = still
                raise self._shard_error(shard, exc)
        self._finishing = still

    @staticmethod
    def _shard_error(shard, exc: BaseException) -> BaseException:
        """``exc``, raised closing ``shard`` on another thread: itself when it names the shard
        (``_names``: by its type and attributes), else the same error with the shard named."""
        if _names(exc, shard.path):
            return exc
        error = _with_context(exc, f"{shard.path}: finishing the shard", shard.path)
        error.__cause__ = exc
        return error

    def _share_first_dictionary(self, shard_dir: Path) -> None:
        """Strategy 2, after the first shard closed: what it decided is read from its files.

        A first shard that fell back to strategy 1 turns the dataset to strategy 1; otherwise
        its dictionary moves to the root and its meta.json is rewritten to say strategy 2.
        """
        metadata = read_shard_metadata(shard_dir)
        if metadata.compression_strategy == CompressionStrategy.STANDARD_COMPRESSION:
            self.compression_strategy = CompressionStrategy.STANDARD_COMPRESSION
            return
        source = shard_dir / DICT_FILE
        try:
            dict_bytes = source.read_bytes()
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{source}: missing: the first shard of a SHARED_DICTIONARY_COMPRESSION "
                f"dataset says compression_strategy {metadata.compression_strategy} in its "
                "meta.json but left no dictionary to share"
            ) from None
        source.rename(self.path / DICT_FILE)
        self.shared_dict = zstandard.ZstdCompressionDict(dict_bytes)
        metadata = metadata._replace(compression_strategy=int(self.compression_strategy))
        # Not a commit marker (the root meta.json, written last, is): no flush to disk.
        dump_meta_atomic(shard_dir / META_FILE, metadata._asdict(), fsync=False)

    def close(self) -> None:
        """Finish the last shard, pad the shard folder names, then write the root meta.json."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._first is not None:
                self._end_read_ahead()
            self._finish_shard(last=True)
            self._collect(wait=True)
        except BaseException as exc:
            problems = self._abandon()
            self._say_incomplete(f"closing it raised {type(exc).__name__}", problems, exc)
            raise
        self._stop_finisher()
        count = len(self.shard_sizes)
        width = len(str(count - 1))
        for number in range(count):
            name = str(number)
            if len(name) < width:
                (self.path / name).rename(self.path / name.zfill(width))
        metadata = AtlasDatasetMetadata(
            VERSION, list(self.shard_sizes), int(self.compression_strategy)
        )
        dump_meta_atomic(self.path / META_FILE, metadata._asdict())

    def abort(self) -> None:
        """Stop without finishing: the shard being written is abandoned (when its writer has
        an ``abort()``), so are the shards queued on other threads that have not started,
        those being finished there are waited for, and no root meta.json is written, so the
        directory does not read as a dataset. Errors of those shards are not raised: the
        dataset is abandoned."""
        if not self._closed:
            self._closed = True
            self._abandon()

    def _abandon(self) -> list:
        # The shards read ahead have no writer yet: they are dropped.
        self._ahead, self._ahead_bytes = [], 0
        problems = []
        if self._filling:
            self._filling = False
            problems += self._abort_shard(self.current_shard)
        handed = list(self._finishing)
        self._finishing.clear()
        if self._first is not None:
            handed.insert(0, self._first)
            self._first = None
        for _, future in handed:
            future.cancel()  # only those not started
        self._stop_finisher()  # waits for those running
        for shard, future in handed:
            if future.cancelled():
                problems += self._abort_shard(shard)
            else:
                exc = future.exception()
                if exc is not None:
                    error = self._shard_error(shard, exc)
                    problems.append(f"{type(error).__name__}: {error}")
        return problems

    @staticmethod
    def _abort_shard(shard) -> list:
        """Abandon ``shard`` (when its writer has an ``abort()``); its error, as a message."""
        abort = getattr(shard, "abort", None)
        if abort is not None:
            try:
                abort()
            except Exception as exc:
                return [f"{shard.path}: abandoning the shard: {type(exc).__name__}: {exc}"]
        return []

    def _left_behind(self) -> str:
        finished, unfinished = [], []
        try:
            for entry in self.path.iterdir():
                if entry.name.isdigit() and entry.is_dir():
                    done = (entry / META_FILE).is_file()
                    (finished if done else unfinished).append(int(entry.name))
        except OSError as exc:
            return f"What is left in it could not be listed ({exc})"
        parts = []
        if finished:
            parts.append(f"finished (with their meta.json): {_ranges(finished)}")
        if unfinished:
            parts.append(f"unfinished (no meta.json): {_ranges(unfinished)}")
        return "Shard directories left in it for inspection: " + ("; ".join(parts) or "none")

    def _stop_finisher(self) -> None:
        """Stop the threads finishing shards, once those running are done (those queued
        were collected by close() or cancelled by _abandon())."""
        if self._finisher is not None:
            self._finisher.shutdown(wait=True, cancel_futures=True)
            self._finisher = None
        self._finishing.clear()


def _ranges(numbers: list) -> str:
    """``[0, 1, 2, 5]`` as ``"0-2, 5"``."""
    runs: list = []  # [first, last] of each run of consecutive numbers
    for number in sorted(numbers):
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
