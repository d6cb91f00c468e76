"""Writers of Atlas datasets: ``AtlasDatasetWriter`` and ``AtlasDatasetShardWriter``.

Same names, signatures, defaults and files as ``torch_atlas_ds.writer``: what these write,
the reference reads example for example, and the other way round. A bad argument raises
``InvalidArgumentError``, which is an ``AssertionError`` as the reference's (so existing
``except AssertionError`` code keeps working) and a ``ValueError``; the options and their
checks are ``WriterOptions``'.

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

An error raised while writing keeps its type and message (it is the same exception); where
it happened (the shard directory, the block) is added to it as a note, and an ``OSError``
that names no file is made to name the file being written.

Converters build on ``pickle_block``, ``AtlasDatasetShardWriter.add_pickled_block``,
``train_dictionary`` and the shard writer's ``dictionary_source``.
"""

from __future__ import annotations

import dataclasses
import pickle
import shutil
import warnings
from pathlib import Path

import zstandard

from ._checks import check_int
from ._errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    UnpicklableExampleError,
    destination_exists,
)
from ._format import (
    DICT_FILE,
    META_FILE,
    VERSION,
    AtlasDatasetMetadata,
    AtlasDatasetShardMetadata,
    CompressionStrategy,
    dump_meta,
    read_shard_metadata,
)
from ._token_index import covering_entries
from ._writing.blocks import DIRECT_WRITE_MIN as DIRECT_WRITE_MIN  # the value, documented
from ._writing.blocks import (
    BlockStore,
    pickle_block,
    pickle_examples,
    train_dictionary,
)
from ._writing.commit import dump_meta_atomic
from ._writing.context import note, writing
from ._writing.options import WriterOptions, default_workers
from ._writing.pipeline import ShardFinisher, abort_shard
from .storage._url import local_path

__all__ = [
    "AtlasDatasetWriter",
    "AtlasDatasetShardWriter",
    "WriterOptions",
    "default_workers",
    "pickle_block",
    "train_dictionary",
]


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
    errors met while abandoning are added to it as notes and to the warning."""

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
                note(exc, f"atlas_fast: abandoning {self.path} failed: {error!r}")

    def _abandon(self) -> list:
        """Stop without finishing; the errors met meanwhile, as messages, raising none."""
        raise NotImplementedError

    def _left_behind(self) -> str:
        """What the directory holds now, and what to do, in sentences for the warning."""
        raise NotImplementedError

    def _shown(self):
        """Where the writer writes, as the warning names it."""
        return self.path

    def _say_incomplete(self, why: str, problems: list, exc: BaseException) -> None:
        """Warn that the writer ended unfinished (``why``), naming its directory and what is
        left in it; ``problems`` (met while abandoning it) are added to ``exc`` as notes."""
        message = (
            f"{self._shown()}: the {self._kind} is incomplete and has no meta.json: {why}. "
            f"{self._left_behind()}"
        )
        for problem in problems:
            note(exc, f"atlas_fast: abandoning {self.path}: {problem}")
        if problems:
            message += " Abandoning it also failed: " + "; ".join(problems)
        try:
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        except Warning:
            # Warnings are errors here: ``exc`` stays the one raised, the warning its note.
            note(exc, f"atlas_fast: {message}")


class AtlasDatasetShardWriter(_FinishedOnlyOnSuccess):
    """Writes one shard: examples are grouped into blocks of ``block_size``, pickled,
    compressed per ``compression_strategy`` and appended to data.bin.

    With strategy 3 (the default) a dictionary is trained on the shard's blocks at ``close()``
    (``train_dictionary``); a shard of fewer than 7 blocks falls back to strategy 1 and its
    meta.json says so. Strategy 2 compresses with ``compression_dict`` (a
    ``zstandard.ZstdCompressionDict``), which it needs.

    ``dictionary_source`` (strategy 3 only) replaces that training: a callable given the
    shard's pickled blocks (a list of bytes, in order) at ``close()``, on the thread closing
    the shard, returning the ``zstandard.ZstdCompressionDict`` to compress them with (stored
    as the shard's zstd_dict.bin), or None to fall back to strategy 1. For a dictionary
    trained elsewhere (a converter's other process), or training that also hands the
    dictionary on (calling ``train_dictionary`` itself).

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
    calling thread, noted with the shard and the block (a failed write names data.bin); a
    shard that lost a block that way cannot be finished (adding to it or closing it raises
    again).

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
        options = WriterOptions.from_arguments(locals())
        strategy = options.compression_strategy
        if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION and (
            compression_dict is None
        ):
            raise InvalidArgumentError(
                "compression_strategy 2 (SHARED_DICTIONARY_COMPRESSION) needs compression_dict"
            )
        if dictionary_source is not None:
            if strategy != CompressionStrategy.DICTIONARY_COMPRESSION:
                raise InvalidArgumentError(
                    "dictionary_source is for compression_strategy 3 "
                    f"(DICTIONARY_COMPRESSION) only, not {int(strategy)}"
                )
            if not callable(dictionary_source):
                raise TypeError(
                    f"dictionary_source must be callable, not {type(dictionary_source).__name__}"
                )
        from ._writing.upload import is_remote

        if is_remote(path):
            raise InvalidArgumentError(
                f"{path}: AtlasDatasetShardWriter writes a local directory; write a dataset "
                "to object storage with AtlasDatasetWriter"
            )
        self.path = Path(local_path(path))
        _create_directory(self.path, "AtlasDatasetShardWriter", "shard")
        self.metadata = AtlasDatasetShardMetadata(
            VERSION,
            options.block_size,
            0,
            int(strategy),
            options.compression_level,
            options.compression_dict_size,
        )
        self.stored_examples = 0
        self._block_size = options.block_size  # metadata.block_size, read once per example
        self.checksums = options.checksums
        self.workers = options.threads
        self._strategy = strategy
        self._dictionary_source = dictionary_source
        self._pending: list = []  # examples of the block being filled
        self._blocks: list = []  # strategy 3 only: pickled blocks awaiting the dictionary
        self._store = BlockStore(self.path, checksums=self.checksums, workers=self.workers)
        self._closed = False
        self.compressor = None
        if strategy in (
            CompressionStrategy.STANDARD_COMPRESSION,
            CompressionStrategy.SHARED_DICTIONARY_COMPRESSION,
        ):
            self._compress_with(compression_dict)

    def _compress_with(self, zdict) -> None:
        """Compress the blocks stored from now on, with ``zdict`` (or no dictionary)."""
        level = self.metadata.compression_level
        # checksums=True: every frame carries its content's checksum (XXH64), which every
        # zstd reader checks as it decompresses (a damaged dictionary is caught too).
        if zdict is None:
            self.compressor = zstandard.ZstdCompressor(level=level, write_checksum=self.checksums)
        else:
            self.compressor = zstandard.ZstdCompressor(
                level=level, dict_data=zdict, write_checksum=self.checksums
            )
        self._store.compress_with(level, zdict)

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
        number = self._store.submitted + len(self._blocks)
        try:
            block = pickle_examples(self._pending, self.path, number)
        except Exception as exc:
            raise self._unpicklable(exc, number) from exc
        self._pending = []
        self._add_block(block)

    def _unpicklable(self, exc: Exception, number: int) -> UnpicklableExampleError:
        """The error for a block that does not pickle, naming its first example that does
        not; the writer is closed and its directory removed."""
        first = self.stored_examples - len(self._pending)
        bad = _first_unpicklable(self._pending)
        what = f"example {first + bad}" if bad is not None else f"block {number}"
        self._closed = True
        self._abandon()
        shutil.rmtree(self.path, ignore_errors=True)
        return UnpicklableExampleError(
            f"{self.path}: {what} does not pickle ({type(exc).__name__}: {exc}); the shard "
            "writer is closed and its directory removed",
            self.path,
            first + (bad or 0),
        )

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
        if isinstance(count, bool) or type(count) is not int or not 0 < count <= self._block_size:
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
            self._store.store(block)

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
                note(exc, f"atlas_fast: then abandoning {self.path}: {problem}")
            raise

    def _finish(self) -> None:
        self._store.check_not_failed()
        if self._pending:
            self._flush_block()
        if self._strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            zdict = self._train_dictionary()
            if zdict is None:
                self._strategy = CompressionStrategy.STANDARD_COMPRESSION
            else:
                with writing(self.path / DICT_FILE):
                    (self.path / DICT_FILE).write_bytes(zdict.as_bytes())
            self._compress_with(zdict)
            blocks, self._blocks = self._blocks, []
            blocks.reverse()
            while blocks:  # each pickled block is let go once stored
                self._store.store(blocks.pop())
        self._store.finish()
        self.metadata = self.metadata._replace(
            stored_examples=self.stored_examples, compression_strategy=int(self._strategy)
        )
        with writing(self.path / META_FILE):
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
            self._store.release()
        except Exception as exc:  # flushing data.bin: it is abandoned anyway
            return [f"{type(exc).__name__}: {exc}"]
        return []

    def _left_behind(self) -> str:
        return (
            "What was written so far is left for inspection; remove the directory before "
            "writing there again."
        )


# The class above, whatever a test double patched in as ``AtlasDatasetShardWriter`` is.
_SHARD_WRITER = AtlasDatasetShardWriter


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
    held at once, where the reference holds one). Strategy 2's first shard, whose dictionary
    every other shard needs before its writer can be made, is finished on this thread (its
    blocks compressed on its writer's threads). ``workers=1`` does all of it on the calling
    thread and holds one shard, as the reference does. Shard writers that are not ours (a
    test double) are made and closed in the reference's order: only strategy 3's shards are
    closed on other threads.

    ``path`` may be a URL (``s3://``, ``gs://``, ``az://``; ``storage_options`` as for
    reading): each shard is written into a local staging directory (under ``staging_dir``,
    default the system's temporary directory), uploaded while the next is written and
    removed once stored; finished shards waiting for their upload hold at most
    ``staging_bytes`` (default 2 GiB). Objects already there are refused unless
    ``overwrite=True``. The root meta.json is put last. Shard folders are named with the
    width of the final shard count; a shard uploaded before the count reached 10, 100, ...
    is copied to its final name within the store at the commit, unless
    ``expected_examples`` (the number of examples the dataset will hold) said the count
    from the start: then each shard is stored under its final name at once (a wrong count
    costs those copies again, never a wrong dataset). Locally it changes nothing.

    ``append=True`` adds the examples after the last one of the dataset already at ``path``
    instead (docs/growing.md): its new shards are numbered after its last, written with
    the dataset's compression strategy (``compression_strategy`` must be that one, or 2 for
    a dataset stored with 1: the reference's fallback) and, under strategy 2, its shared
    dictionary; ``shard_size``, ``block_size``, ``compression_level`` and
    ``compression_dict_size`` apply to the new shards only. The dataset is checked first (as
    ``atlas-fast verify`` checks its files, blocks aside): a path that is not a whole
    dataset raises ``AtlasFormatError``, another strategy ``InvalidArgumentError``, and
    nothing is written. Locally the new shards are written into a folder next to ``path``
    and the grown dataset swapped in at ``close()`` in one step (the old shards hard-linked,
    renamed to a wider name when the count crosses a power of ten): after a crash ``path``
    holds the old dataset or the new one, whole; the next append (or ``atlas-fast verify
    --repair``) removes what the crash left next to it. To a URL, the new shards are
    uploaded under names no reader of the old dataset looks at and the root meta.json put
    last, as for a new dataset (a widening copies the old shards within the store first).
    Zero examples appended change nothing.

    If the ``with`` block raises (or ``close()`` does), the dataset is not finished: no root
    meta.json is written; the shard being filled is abandoned, shards queued on other threads
    are abandoned before they start, those being finished there are waited for (no thread is
    left running); a ``RuntimeWarning`` names the directory and which shard directories in it
    were finished and which were left unfinished (no meta.json). They stay on disk for
    inspection (readers refuse the directory: its meta.json is missing). The exception
    raised stays the one raised; errors of other shards met meanwhile are added to it as
    notes and to the warning.
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
        storage_options=None,
        overwrite=False,
        staging_dir=None,
        staging_bytes=None,
        expected_examples=None,
        token_index=None,
        token_field=None,
        append=False,
    ):
        options = WriterOptions.from_arguments(locals())
        if not isinstance(append, bool):
            raise InvalidArgumentTypeError(f"append must be True or False, not {append!r}")
        if append and overwrite:
            raise InvalidArgumentError("append=True and overwrite=True: choose one")
        # A URL: the dataset is written into a local staging directory, shard by shard, each
        # uploaded and removed locally once finished (``_writing.upload.ShardUploads``).
        self._uploads = _uploads_for(
            path,
            storage_options,
            overwrite,
            staging_dir,
            staging_bytes,
            "AtlasDatasetWriter",
            append=append,
        )
        # append=True to a local path: the dataset locked and checked, the new shards
        # written aside (``_writing.grow.LocalAppend``).
        self._append = None
        self._old_token_entries = []  # append=True: the old shards' token index entries
        self._first = 0  # the number of the first shard this writer writes
        self.shared_dict = None  # strategy 2: the dictionary every shard after the first uses
        try:
            if append:
                strategy = self._grown(path, options)
                options = dataclasses.replace(options, compression_strategy=strategy)
            if expected_examples is not None:
                expected_examples = check_int("expected_examples", expected_examples, minimum=0)
                if self._uploads is not None:
                    # The count of shards that many examples make: their names' width from
                    # the start (the commit renames only if the count turns out otherwise).
                    shards = -(-expected_examples // options.shard_size)
                    self._uploads.expected = self._first + shards
        except BaseException:
            if self._uploads is not None:
                self._uploads.close()
            if self._append is not None:
                self._append.abandon()
            raise
        self.path = self._uploads.local if self._uploads is not None else Path(local_path(path))
        # Where the shard folders are written: the dataset's folder, or an append's aside.
        self._dir = self.path if self._append is None else self._append.aside.dir
        self._url = self._uploads.dest.location.url if self._uploads is not None else None
        self.shard_size = options.shard_size
        self.block_size = options.block_size
        # Becomes STANDARD_COMPRESSION if strategy 2's first shard cannot train a dictionary.
        self.compression_strategy = options.compression_strategy
        self.compression_level = options.compression_level
        self.compression_dict_size = options.compression_dict_size
        self.checksums = options.checksums
        self.workers = options.threads
        self._workers_given = options.workers is not None  # passed on to shard writers if so
        self.shard_sizes: list = []  # sizes of the shards finished so far (by this writer)
        self._closed = False
        # workers > 1: shards closed on a pool (``_stored`` is told of each, once closed).
        self._finisher = ShardFinisher(self.workers, self._stored)
        # Whether current_shard is being filled, by this thread only (not yet handed to
        # close() here or on the pool): what abandoning the dataset aborts.
        self._filling = False
        self._own = False  # whether current_shard's writer is this module's class
        self._tokens = _token_tally(
            token_index, token_field, options.shard_size, options.block_size, self._uploads
        )
        if append and self._uploads is not None:
            # To a URL: the old index is left as it is (a reader extends or rebuilds an
            # index that does not cover every shard), none is written for the new shards.
            self._tokens = None
        elif append and not self._append.existing.count:
            pass  # a dataset of no shard: its index is the new shards' alone
        elif append and self._tokens is not None:
            # The grown dataset's index: the old one's entries (read from it, no shard
            # read), then the new shards' from the tally; written into the aside tree
            # before the commit (``_write_grown_token_index``). Without an old index
            # covering every old shard, the old file is carried over as it is.
            name = self._tokens_file()
            sizes = self._append.existing.metadata.shard_sizes
            self._old_token_entries = covering_entries(
                self._append.existing.root / name, self._tokens.field, sizes
            )
            if self._old_token_entries is None:
                self._tokens = None
        try:
            if append:
                if self._uploads is not None:
                    self.path.mkdir(parents=True)  # the staging of the new shards
            else:
                _create_directory(self.path, "AtlasDatasetWriter", "dataset")
            self.current_shard = self._new_shard()
        except BaseException:
            if self._uploads is not None:
                self._uploads.close()
            if self._append is not None:
                self._append.abandon()
            raise
        self._filling = True

    def _grown(self, path, options) -> CompressionStrategy:
        """``append=True``: open the dataset at ``path`` for growing (locally: lock it, remove
        leftovers, check it; to a URL: ``self._uploads`` read it); the strategy its new
        shards are written with. Its shared dictionary becomes ``shared_dict``."""
        from ._writing.grow import LocalAppend

        asked = options.compression_strategy
        if self._uploads is not None:
            grown = self._uploads.grown
            strategy = grown.strategy_for(asked)
            dict_bytes = grown.dict_bytes
            self._first = grown.count
        else:
            self._append = LocalAppend(local_path(path), "AtlasDatasetWriter", asked)
            strategy = self._append.strategy
            dict_bytes = self._append.existing.dict_bytes
            self._first = self._append.first
        if dict_bytes is not None:  # else a dataset of no shard: its first new one trains
            self.shared_dict = zstandard.ZstdCompressionDict(dict_bytes)
        return CompressionStrategy(strategy)

    def _new_shard(self):
        """The next shard writer, created through the module attribute (so a patch of
        ``atlas_fast.writer.AtlasDatasetShardWriter`` takes effect), keywords only."""
        number = self._first + len(self.shard_sizes)
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
        factory = AtlasDatasetShardWriter
        self._own = factory is _SHARD_WRITER
        return factory(
            path=self._dir / str(number),
            block_size=self.block_size,
            compression_strategy=strategy,
            compression_level=self.compression_level,
            compression_dict_size=self.compression_dict_size,
            **kwargs,
        )

    def __len__(self) -> int:
        return sum(self.shard_sizes) + len(self.current_shard)

    def add_example(self, example) -> None:
        """Append one example (anything picklable)."""
        if self._closed:
            raise ValueError(f"{self.path}: the dataset writer is closed")
        shard = self.current_shard
        try:
            if (shard.stored_examples if self._own else len(shard)) >= self.shard_size:
                self._finish_shard()
                shard = self.current_shard = self._new_shard()
                self._filling = True
            tally = self._tokens
            if tally is not None:
                tally.add(example)
                if not tally.active:
                    self._tokens = None
            shard.add_example(example)
        except UnpicklableExampleError as exc:
            raise self._unpicklable(exc) from exc.__cause__

    def _unpicklable(self, exc: UnpicklableExampleError) -> UnpicklableExampleError:
        """A shard's ``exc`` as the dataset's: the example numbered in the dataset; the writer
        is closed, and what it had begun removed (the uploaded objects too)."""
        shard = Path(exc.path).name
        index = int(shard) * self.shard_size + exc.index if shard.isdigit() else exc.index
        where = f"shard {shard}, block {exc.index // self.block_size}"
        self._closed = True
        problems = self._abandon()
        if self._uploads is None:
            shutil.rmtree(self.path, ignore_errors=True)
        cause = exc.__cause__
        error = UnpicklableExampleError(
            f"{self._shown()}: example {index} ({where}) does not pickle ({type(cause).__name__}: "
            f"{cause}); the writer is closed and the dataset it had begun removed",
            self._shown(),
            index,
        )
        for problem in problems:
            note(error, f"atlas_fast: abandoning {self.path}: {problem}")
        return error

    def _finish_shard(self, last: bool = False) -> None:
        """Close the current shard: on the pool (workers > 1: see the class) or here."""
        shard = self.current_shard
        self.shard_sizes.append(len(shard))
        self._filling = False
        strategy = self.compression_strategy
        if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
            if self.shared_dict is None:  # the first shard: the others need its dictionary
                shard.close()
                self._share_first_dictionary(Path(shard.path))
                self._stored(shard)
                return
        if not last and self.workers > 1:
            train = strategy == CompressionStrategy.DICTIONARY_COMPRESSION
            # Strategy 3's training is most of the work: it runs on the pool only, this
            # thread waits for a free thread rather than train itself. Our own shards of
            # the other strategies are closed here when every thread of the pool is busy.
            if (train or self._own) and self._finisher.take(shard, wait_for_thread=train):
                return
        shard.close()
        self._stored(shard)

    def _stored(self, shard) -> None:
        """``shard`` is finished (closed here or on the pool): to a URL, it is uploaded."""
        if self._uploads is not None:
            # Shards begun so far (the next one too, unless closing): its name's width.
            started = self._first + len(self.shard_sizes) + (0 if self._closed else 1)
            self._uploads.add(int(Path(shard.path).name), started)

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
        except FileNotFoundError as exc:
            note(
                exc,
                "atlas_fast: the first shard of a SHARED_DICTIONARY_COMPRESSION "
                f"dataset says compression_strategy {metadata.compression_strategy} in its "
                "meta.json but left no dictionary to share",
            )
            raise
        source.rename(self._dir / DICT_FILE)
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
            self._finish_shard(last=True)
            self._finisher.collect(wait=True)
        except UnpicklableExampleError as exc:
            raise self._unpicklable(exc) from exc.__cause__
        except BaseException as exc:
            problems = self._abandon()
            self._say_incomplete(f"closing it raised {type(exc).__name__}", problems, exc)
            raise
        self._finisher.stop()
        if self._append is not None or (self._uploads is not None and self._uploads.grown):
            self._commit_append()
            return
        metadata = AtlasDatasetMetadata(
            VERSION, list(self.shard_sizes), int(self.compression_strategy)
        )
        if self._uploads is not None:
            try:
                shared = self.path / DICT_FILE
                self._uploads.commit(
                    metadata._asdict(),
                    shared if shared.is_file() else None,
                    self._token_index_files(),
                )
            except BaseException as exc:
                problems = self._abandon()
                self._say_incomplete(f"committing it raised {type(exc).__name__}", problems, exc)
                raise
            return
        count = len(self.shard_sizes)
        width = len(str(count - 1))
        for number in range(count):
            name = str(number)
            if len(name) < width:
                (self.path / name).rename(self.path / name.zfill(width))
        if self._tokens is not None:
            self._write_token_index(width)
        dump_meta_atomic(self.path / META_FILE, metadata._asdict())

    def _token_index_files(self) -> dict:
        """``{name: bytes}`` of the token index of a dataset written to a URL (empty: none),
        from the block offsets of each shard kept as it was uploaded."""
        if self._tokens is None or not self._tokens.active:
            return {}
        from ._token_index import index_bytes, index_name

        offsets = self._uploads.offsets
        if sorted(offsets) != list(range(len(self.shard_sizes))):
            return {}
        entries = self._tokens.entries(
            [offsets[k] for k in range(len(self.shard_sizes))], self.shard_sizes
        )
        return {index_name(self._tokens.field): index_bytes(self._tokens.field, entries)}

    def _write_token_index(self, width: int) -> None:
        """The token index of the shards written (before the root meta.json: a dataset that
        has one has its index). Shard writers that are not ours (a test double) may have
        written other files: then there is none."""
        from ._token_index import index_name, write_index

        dirs = [self.path / str(k).zfill(width) for k in range(len(self.shard_sizes))]
        if not all((d / "index.npy").is_file() for d in dirs):
            return
        entries = self._tokens.entries(dirs, self.shard_sizes)
        write_index(self.path / index_name(self._tokens.field), self._tokens.field, entries)

    def _tokens_file(self) -> str:
        from ._token_index import index_name

        return index_name(self._tokens.field)

    def _write_grown_token_index(self, sizes: list) -> tuple:
        """A local append of token sequences: the grown dataset's token index (the old
        entries, then the new shards') written into the aside tree; the root files written
        there (not carried over from the old root)."""
        if self._tokens is None or not sizes:
            return ()
        from ._token_index import write_index

        dirs = [self._dir / str(self._first + k) for k in range(len(sizes))]
        if not all((d / "index.npy").is_file() for d in dirs):
            return ()  # shard writers that are not ours (see _write_token_index)
        entries = self._old_token_entries + self._tokens.entries(dirs, sizes)
        name = self._tokens_file()
        write_index(self._dir / name, self._tokens.field, entries)
        return (name,)

    def _commit_append(self) -> None:
        """``append=True``, every new shard finished: the grown dataset committed (an empty
        last shard, the only one when nothing was added, is not kept)."""
        sizes = list(self.shard_sizes)
        if sizes and sizes[-1] == 0:
            sizes.pop()
            shutil.rmtree(self._dir / str(self._first + len(sizes)), ignore_errors=True)
        try:
            if self._append is not None:
                written = self._write_grown_token_index(sizes)
                self._append.commit(sizes, int(self.compression_strategy), written=written)
            else:
                from ._writing.grow_remote import commit_remote_append

                new = self._uploads.uploaded(len(sizes))
                strategy = int(self.compression_strategy)
                commit_remote_append(self._uploads.grown, new, sizes, strategy)
                self._uploads.close()
        except BaseException as exc:
            problems = self._abandon()
            self._say_incomplete(f"committing it raised {type(exc).__name__}", problems, exc)
            raise

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
        problems = []
        if self._filling:
            self._filling = False
            problems += abort_shard(self.current_shard)
        problems += self._finisher.abandon()
        if self._uploads is not None:
            problems += self._uploads.abandon()
        if self._append is not None:
            try:
                self._append.abandon()
            except Exception as exc:
                problems.append(f"removing {self._append.aside.dir}: {exc!r}")
        return problems

    def _shown(self):
        return self._url if self._uploads is not None else self.path

    def _left_behind(self) -> str:
        if self._uploads is not None:
            return (
                "The objects it had uploaded were deleted, its open multipart uploads aborted "
                "and its local staging directory removed."
            )
        if self._append is not None:
            return "The dataset is as it was: the new shards written aside were removed."
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
            its = "its" if len(finished) == 1 else "their"
            parts.append(f"{_shards(finished)} finished (with {its} meta.json)")
        if unfinished:
            parts.append(f"{_shards(unfinished)} unfinished (no meta.json)")
        return (
            "Shard directories left in it for inspection: "
            + (", ".join(parts) or "none")
            + "; remove the directory before writing there again."
        )


def _token_tally(token_index, token_field, shard_size, block_size, uploads):
    """The ``_token_index.Tally`` of a dataset writer's ``token_index`` (None: automatic,
    when the examples are token sequences; True: they must be; False: never) and
    ``token_field``, or None: no index."""
    if token_index is not None and not isinstance(token_index, bool):
        raise InvalidArgumentTypeError(
            f"token_index must be True, False or None (automatic), not {token_index!r}"
        )
    if token_field is not None and not isinstance(token_field, str):
        raise InvalidArgumentTypeError(f"token_field must be a str or None, not {token_field!r}")
    if token_index is False:
        return None
    if uploads is not None:  # each shard's index.npy kept as it goes up: the index needs it
        uploads.keep_offsets = True
    from ._token_index import Tally

    required = token_index is True or token_field is not None
    return Tally(shard_size, block_size, token_field, required)


def _uploads_for(
    path, storage_options, overwrite, staging_dir, staging_bytes, who, *, append=False
):
    """The ``ShardUploads`` of a writer to the URL ``path``, or None for a local path
    (``append``: of an append to the dataset there)."""
    from ._writing.upload import ShardUploads, is_remote, open_destination

    if not is_remote(path):
        if storage_options is not None or overwrite or staging_bytes is not None:
            raise InvalidArgumentError(
                f"{path}: storage_options, overwrite and staging_bytes are for a URL "
                "(s3://, gs://, az:// ...), not a local path"
            )
        return None
    if staging_bytes is not None:
        staging_bytes = check_int("staging_bytes", staging_bytes, minimum=1)
    if append:
        from ._writing.grow_remote import RemoteGrowth

        grown = RemoteGrowth.open(path, storage_options, who)
        uploads = ShardUploads(grown.dest, staging_dir=staging_dir, staging_bytes=staging_bytes)
        uploads.grown = grown
        return uploads
    dest = open_destination(path, storage_options, overwrite=bool(overwrite), who=who)
    return ShardUploads(dest, staging_dir=staging_dir, staging_bytes=staging_bytes)


def _first_unpicklable(examples: list):
    """The position of the first of ``examples`` that does not pickle alone (None: each
    does; the block as a whole does not)."""
    for k, example in enumerate(examples):
        try:
            pickle.dumps(example)
        except Exception:
            return k
    return None


def _create_directory(path: Path, who: str, what: str) -> None:
    """Create ``path`` (and its parents); if it exists, the reference's ``FileExistsError``,
    with a sentence that names it and says what to do."""
    try:
        path.mkdir(parents=True)
    except FileExistsError:
        raise destination_exists(path, who, what=what) from None


def _shards(numbers: list) -> str:
    """``[0]`` as ``"shard 0"``, ``[0, 1, 2, 5]`` as ``"shards 0-2, 5"``."""
    return ("shard " if len(numbers) == 1 else "shards ") + _ranges(numbers)


def _ranges(numbers: list) -> str:
    """``[0, 1, 2, 5]`` as ``"0-2, 5"``."""
    runs: list = []  # [first, last] of each run of consecutive numbers
    for number in sorted(numbers):
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
