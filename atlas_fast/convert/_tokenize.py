"""``tokenize``: documents in, token arrays out (``atlas-fast tokenize``).

The calling process reads the source in order (any format ``convert`` reads but flat-tokens,
or an Atlas dataset), takes each example's text (``field``) and hands batches of texts to
``workers`` tokenizing processes (``_Pool``); each process encodes a batch on its own core
(the tokenizers library's parallelism turned off there) and returns its token ids as one flat
array with the documents' lengths. The calling process writes the documents' arrays, in
source order, through one ``AtlasDatasetWriter``. Batches are cut from the source alone and
the writer sees the same arrays in the same order whatever the number of workers, so the
files are byte-identical for every ``workers``.

Each example written is a 1-D numpy array of the smallest unsigned dtype that holds every id
of the tokenizer's vocabulary (``token_dtype``), the end-of-document id appended when asked;
the dataset gets its token index from the writer (``token_index=True`` locally, automatic
for a URL).

DST is written as ``convert`` writes it: into a staging directory next to it, moved into
place at the end; to a URL shard by shard, the root meta.json last, and a failure deletes
what was uploaded. So DST is complete or absent.
"""

from __future__ import annotations

import errno
import itertools
import os
import queue
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .._errors import InvalidArgumentError
from ._progress import Progress
from ._source import SourceError

__all__ = [
    "TOKENIZE_FORMATS",
    "TokenizeSummary",
    "TokenizerError",
    "token_dtype",
    "tokenize",
]

# What ``tokenize`` reads: an Atlas dataset, or any source of ``convert`` but flat-tokens
# (which holds token ids already). tests/convert/test_tokenize.py checks it against FORMATS.
TOKENIZE_FORMATS = ("atlas", "parquet", "hf", "jsonl", "dolma", "mds", "wds", "energon")

# A batch handed to a tokenizing process closes at this many documents or characters,
# whichever comes first: a tenth of a second of a core's work, for the ~2 KB documents of
# text corpora, so that every process has a batch queued while the calling process writes.
BATCH_DOCUMENTS = 1024
BATCH_CHARS = 256 << 10
# Batches handed out and not yet written, per tokenizing process (each process has the next
# one queued while it encodes one).
IN_FLIGHT = 2


class TokenizerError(InvalidArgumentError):
    """The tokenizer cannot be used: its file does not load, or it gave an id beyond its
    vocabulary. The message names the file."""


def token_dtype(max_id: int):
    """The smallest unsigned numpy dtype holding ids up to ``max_id``: uint8, uint16, uint32,
    or uint64 beyond 2**32 ids."""
    import numpy as np

    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
        if max_id <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise InvalidArgumentError(f"token id {max_id}: beyond uint64")


@dataclass
class TokenizeSummary:
    """What ``tokenize`` did; ``str()`` is the one-line summary the command prints."""

    fmt: str
    dst: object
    tokenizer: str  # the tokenizer's file (or "a Tokenizer object")
    dtype: str
    vocab_size: int  # ids 0 .. vocab_size - 1 fit the dtype
    eos_id: int | None
    documents: int = 0
    tokens: int = 0
    shards: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    workers: int = 1
    datasets: list = field(default_factory=list)  # (split or None, documents, tokens, shards)

    def __str__(self) -> str:
        rate = self.tokens / self.seconds if self.seconds > 0 else 0.0
        splits = [s for s, *_ in self.datasets if s is not None]
        where = f"{self.dst}" + (f" (splits: {', '.join(splits)})" if splits else "")
        eos = "" if self.eos_id is None else f", EOS {self.eos_id}"
        return (
            f"tokenized {_count(self.documents, 'document')} ({self.fmt}) into "
            f"{_count(self.tokens, 'token')} ({self.dtype}{eos}) in "
            f"{_count(self.shards, 'shard')} at {where}: {_size(self.bytes_in)} in, "
            f"{_size(self.bytes_out)} out, {self.seconds:.1f} s ({rate:,.0f} tokens/s, "
            f"{_count(self.workers, 'worker')})"
        )


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _size(n: int) -> str:
    from ._run import _size as size

    return size(n)


# -- the tokenizer --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Encoding:
    """What a tokenizing process needs: the tokenizer (its JSON) and what to do around it."""

    tokenizer_json: str
    add_special_tokens: bool
    eos_id: int | None
    dtype: str
    label: str  # the tokenizer's file, for errors


def _load(tokenizer) -> tuple:
    """``(Tokenizer, label)`` of a path to a tokenizer.json or a ``tokenizers.Tokenizer``."""
    from .._extras import require

    tokenizers = require("tokenizers", "tokenize", "atlas_fast.convert.tokenize")
    if isinstance(tokenizer, tokenizers.Tokenizer):
        return tokenizer, "the Tokenizer given"
    if not isinstance(tokenizer, (str, os.PathLike)):
        raise InvalidArgumentError(
            "tokenizer must be the path of a tokenizer.json file or a tokenizers.Tokenizer, "
            f"not {type(tokenizer).__name__}"
        )
    path = os.fspath(tokenizer)
    if not os.path.isfile(path):
        raise TokenizerError(f"{path}: no such tokenizer file")
    try:
        return tokenizers.Tokenizer.from_file(path), path
    except Exception as exc:  # the library raises Exception itself, with serde's message
        raise TokenizerError(
            f"{path}: not a tokenizer file the tokenizers library loads ({exc})"
        ) from None


def _eos(tok, label: str, eos_token, eos_id):
    """The end-of-document id asked for (``eos_token`` or ``eos_id``), or None."""
    from .._checks import check_int

    if eos_token is not None and eos_id is not None:
        raise InvalidArgumentError("eos_token and eos_id exclude each other: give one")
    if eos_token is not None:
        if not isinstance(eos_token, str):
            raise InvalidArgumentError(f"eos_token must be a str, not {type(eos_token).__name__}")
        found = tok.token_to_id(eos_token)
        if found is None:
            raise InvalidArgumentError(f"eos_token {eos_token!r}: not in the vocabulary of {label}")
        return int(found)
    if eos_id is not None:
        eos_id = check_int("eos_id", eos_id, minimum=0)
        if tok.id_to_token(eos_id) is None:
            raise InvalidArgumentError(
                f"eos_id {eos_id}: not an id of the vocabulary of {label} "
                f"({tok.get_vocab_size(with_added_tokens=True):,} tokens)"
            )
        return eos_id
    return None


class Encoder:
    """Encodes a batch of texts into ``(flat ids, lengths)``: the documents' ids end to end
    in one array of the dtype, and each document's count (its EOS included)."""

    def __init__(self, job: _Encoding):
        import numpy as np
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(job.tokenizer_json)
        # encode_batch_fast (tokenizers 0.20+) computes no character offsets, which cost
        # encode_batch and encode more CPU for the same ids.
        self.encode = tok.encode_batch_fast
        self.special = job.add_special_tokens
        self.eos = job.eos_id
        self.dtype = np.dtype(job.dtype)
        self.label = job.label

    def __call__(self, texts: list) -> tuple:
        import numpy as np

        try:
            encodings = self.encode(texts, add_special_tokens=self.special)
        except Exception as exc:  # the library raises Exception itself
            raise TokenizerError(f"{self.label}: the tokenizer failed: {exc}") from None
        ids = [e.ids for e in encodings]
        if self.eos is not None:
            for one in ids:
                one.append(self.eos)
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        total = int(lengths.sum())
        try:
            flat = np.fromiter(itertools.chain.from_iterable(ids), self.dtype, total)
        except OverflowError:
            top = max(max(one, default=0) for one in ids)
            raise TokenizerError(
                f"{self.label}: the tokenizer gave id {top}, beyond its vocabulary (whose "
                f"ids fit {self.dtype.name})"
            ) from None
        return flat, lengths


def _child(inbox, results, job: _Encoding) -> None:
    """A tokenizing process: encodes ``(number, texts)`` batches until it gets None."""
    from ._workers import _portable

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt does
    # This process's own environment: the library encodes each batch on this process's
    # thread (one core), rather than on a pool of threads as many as the machine's cores.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        encode = Encoder(job)
    except BaseException as exc:
        results.put(("error", None, _portable(exc, 0)))
        return
    while (task := inbox.get()) is not None:
        number, texts = task
        try:
            results.put(("done", number, encode(texts)))
        except BaseException as exc:
            results.put(("error", number, _portable(exc, 0)))


class _Pool:
    """``n`` tokenizing processes sharing one queue of batches; their results taken back in
    the order the batches were put."""

    def __init__(self, n: int, job: _Encoding):
        import multiprocessing

        from .._compat import NO_TORCH_PROCESS_PREFIX
        from ._workers import start_method, start_processes

        method = start_method()
        ctx = multiprocessing.get_context(method)
        self.inbox = ctx.Queue()
        self.results = ctx.Queue()
        # They only tokenize: named so, a spawned one imports atlas_fast without torch.
        self.processes = [
            ctx.Process(
                target=_child,
                args=(self.inbox, self.results, job),
                name=f"{NO_TORCH_PROCESS_PREFIX}tokenize-{k}",
                daemon=True,
            )
            for k in range(n)
        ]
        start_processes(self.processes, method)
        self.put = 0  # batches put so far
        self.taken = 0  # results taken so far (in order)
        self.where: dict = {}  # batch number -> where its first document is (for errors)
        self.done: dict = {}  # batch number -> its result, arrived before its turn

    @property
    def in_flight(self) -> int:
        return self.put - self.taken

    def submit(self, texts: list, where: str) -> None:
        self.where[self.put] = where
        self.inbox.put((self.put, texts))
        self.put += 1

    def take(self) -> tuple:
        """The result of the oldest batch not yet taken (waiting for it)."""
        number = self.taken
        while number not in self.done:
            try:
                kind, k, payload = self.results.get(timeout=0.5)
            except queue.Empty:
                self._check_alive()
                continue
            if kind == "error":
                if k is None:  # the process could not start encoding
                    raise payload
                batch = f"(tokenizing the batch of documents from {self.where[k]})"
                if isinstance(payload, TokenizerError):
                    raise TokenizerError(f"{payload} {batch}") from None
                raise RuntimeError(f"{type(payload).__name__}: {payload} {batch}") from payload
            self.done[k] = payload
        self.taken += 1
        self.where.pop(number, None)
        return self.done.pop(number)

    def _check_alive(self) -> None:
        for k, p in enumerate(self.processes):
            if not p.is_alive():
                raise RuntimeError(
                    f"tokenizing process {k} ended unexpectedly (exit code {p.exitcode}; a "
                    "script that tokenizes needs its work under `if __name__ == '__main__':` "
                    "where processes are spawned)"
                )

    def close(self, *, kill: bool) -> None:
        for p in self.processes:
            if kill:
                p.terminate()
            elif p.is_alive():
                self.inbox.put(None)
        for p in self.processes:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        for q in (self.inbox, self.results):
            q.close()
            q.cancel_join_thread()


# -- the source ------------------------------------------------------------------------------


def _sources(src, fmt, format_options: dict) -> tuple:
    """``(format, sources)``: ``fmt`` None reads an Atlas dataset."""
    import inspect

    from ._formats import format_module

    if fmt is None:
        from ._atlas import is_atlas_dataset

        if not is_atlas_dataset(src):
            raise SourceError(
                f"{src}: not an Atlas dataset (no dataset meta.json); for another format say "
                f"which (fmt=, --from: {', '.join(TOKENIZE_FORMATS)})"
            )
        fmt = "atlas"
    if fmt not in TOKENIZE_FORMATS:
        if fmt == "flat-tokens":
            raise InvalidArgumentError(
                "fmt 'flat-tokens': it holds token ids already (convert it with "
                "atlas_fast.convert.convert)"
            )
        raise InvalidArgumentError(
            f"unknown format {fmt!r}; tokenize reads {', '.join(TOKENIZE_FORMATS)}"
        )
    if fmt == "atlas":
        from . import _atlas as module
    else:
        module = format_module(fmt)
    accepted = set(inspect.signature(module.sources).parameters) - {"src"}
    for key in format_options:
        if key not in accepted:
            hint = ", ".join(sorted(accepted)) or "none"
            raise TypeError(
                f"tokenize() got an unexpected option {key!r} (options of {fmt}: {hint}; "
                "writer options: see atlas_fast.convert.WRITER_DEFAULTS)"
            )
    sources = module.sources(src, **format_options)
    from ._run import _check_sources

    _check_sources(sources)
    return fmt, sources


def _text(example, text_field, part, number: int, index: int) -> str:
    """The text of ``example`` (``number`` of ``part``, ``index`` of the source)."""
    value = example
    if text_field is not None:
        if not isinstance(example, Mapping):
            raise SourceError(
                f"{_where(part, number, index)}: {_a(type(example).__name__)}, not a "
                f"mapping with a field {text_field!r}"
            )
        try:
            value = example[text_field]
        except KeyError:
            names = ", ".join(repr(k) for k in itertools.islice(example, 12))
            raise SourceError(
                f"{_where(part, number, index)}: no field {text_field!r} (its fields: "
                f"{names or 'none'})"
            ) from None
    if not isinstance(value, str):
        what = "the example" if text_field is None else f"field {text_field!r}"
        hint = ""
        if isinstance(value, (bytes, bytearray)):
            hint = " (webdataset members are bytes unless decoded: decode=True, --decode)"
        raise SourceError(
            f"{_where(part, number, index)}: {what} is {_a(type(value).__name__)}, not a "
            f"string{hint}"
        )
    return value


def _a(noun: str) -> str:
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


def _where(part, number: int, index: int) -> str:
    return f"{part.label}: example {number} (document {index} of the source)"


# -- writing ---------------------------------------------------------------------------------


class _Bar(Progress):
    """The progress bar, with tokens."""

    tokens = 0

    def postfix(self, seconds: float) -> str:
        return (
            f"{self.examples:,} documents, {self.tokens:,} tokens, "
            f"{self.tokens / seconds:,.0f} tokens/s"
        )


def _write_source(source, writer, pool, text_field, bar) -> tuple:
    """Tokenize ``source`` into ``writer``; returns (documents, tokens)."""
    import numpy as np

    limit = IN_FLIGHT * len(pool.processes)
    documents = tokens = 0

    def write_oldest():
        nonlocal documents, tokens
        flat, lengths = pool.take()
        for array in np.split(flat, np.cumsum(lengths[:-1])) if len(lengths) else ():
            writer.add_example(array)
        documents += len(lengths)
        tokens += flat.size
        bar.tokens = tokens
        bar(len(lengths), 0)

    batch: list = []
    chars = 0
    index = 0
    first = ""
    for part in source.parts:
        for number, example in enumerate(part.read()):
            text = _text(example, text_field, part, number, index)
            if not batch:
                first = _where(part, number, index)
            batch.append(text)
            chars += len(text)
            index += 1
            if len(batch) >= BATCH_DOCUMENTS or chars >= BATCH_CHARS:
                pool.submit(batch, first)
                batch, chars = [], 0
                while pool.in_flight >= limit:
                    write_oldest()
        bar(0, part.nbytes)
    if batch:
        pool.submit(batch, first)
    while pool.in_flight:
        write_oldest()
    return documents, tokens


def _is_dataset_dir(path: Path) -> bool:
    """An Atlas dataset root, or a directory of split datasets only (what tokenize and
    convert write): what ``overwrite`` may replace."""
    from .._format import META_FILE

    if (path / META_FILE).is_file():
        return True
    entries = list(path.iterdir())
    return bool(entries) and all(e.is_dir() and (e / META_FILE).is_file() for e in entries)


def _local_destination(dst: Path, overwrite: bool) -> bool:
    """Check a local DST; whether a dataset there is to be replaced."""
    if dst.is_dir() and not any(dst.iterdir()):
        return False
    if not (dst.exists() or dst.is_symlink()):
        return False
    if not overwrite:
        from .._errors import destination_exists

        raise destination_exists(
            dst,
            "tokenize",
            empty_dir_ok=True,
            fix="pass overwrite=True (--overwrite) to replace a dataset there, remove it, or "
            "choose another path",
        )
    if dst.is_symlink() or not dst.is_dir() or not _is_dataset_dir(dst):
        raise FileExistsError(
            errno.EEXIST,
            f"{dst}: already exists and is not an Atlas dataset (nor a directory of split "
            "datasets); overwrite replaces a dataset, never other files: remove it by hand "
            "or choose another path",
        )
    return True


def tokenize(
    src,
    dst,
    tokenizer,
    *,
    field="text",
    fmt=None,
    eos_token=None,
    eos_id=None,
    add_special_tokens=False,
    workers=None,
    progress=None,
    overwrite=False,
    storage_options=None,
    staging_dir=None,
    staging_bytes=None,
    **options,
):
    """Tokenize the documents of ``src`` into a new Atlas dataset of token arrays at ``dst``;
    returns a ``TokenizeSummary``.

    ``src`` is an Atlas dataset (a directory or URL; the default when ``fmt`` is None) or a
    source ``convert`` reads, in format ``fmt`` (``TOKENIZE_FORMATS``: parquet, hf, jsonl,
    dolma, mds, wds, energon). ``field`` names the text of each example (a mapping: a row, a
    JSON object, a webdataset sample); None takes the example itself, which must be a str.
    A source with splits (a ``DatasetDict``, an Energon dataset) gives ``dst/<split>``.

    ``tokenizer``: the path of a ``tokenizer.json`` (the Hugging Face ``tokenizers``
    library's file; the ``tokenize`` extra) or a ``tokenizers.Tokenizer``. Each document
    becomes ``tokenizer.encode(text, add_special_tokens=add_special_tokens).ids`` (default
    False: the ids of the text alone; True adds what the tokenizer's post-processor adds,
    such as a BOS token), as a 1-D numpy array of the smallest unsigned dtype holding every
    id of the vocabulary (uint8, uint16, uint32: ``token_dtype``), followed by the
    end-of-document id if ``eos_token`` (a token of the vocabulary) or ``eos_id`` asks for
    one. An empty document is an empty array (or the EOS alone).

    ``workers`` (default: the usable cores, at most 8) is the tokenizing processes, each
    encoding batches of documents on one core; this process reads the source and writes the
    dataset. The dataset holds the documents in source order and its files are the same
    bytes whatever ``workers`` is. ``options``: writer options (``shard_size``,
    ``block_size``, ``compression_strategy``, ``compression_level``,
    ``compression_dict_size``, ``checksums``: ``WRITER_DEFAULTS``) and the format's own
    (``attributes`` for dolma, ``decode`` for wds and energon, ``allow_unsafe_types`` for
    mds). ``progress``: True for a tqdm bar on stderr, or a callable given ``(documents,
    nbytes)`` increments.

    A local ``dst`` carries the token index ``atlas_fast.TokenSequences`` reads
    (``tokens.idx``); one in object storage gets it on first use.

    ``dst`` must not exist or be an empty directory, unless ``overwrite=True``, which
    replaces the Atlas dataset there (locally only a dataset, or a directory of split
    datasets, is replaced; the old one stays until the new one is complete). The dataset is
    written into a staging directory next to ``dst`` and moved in at the end, so ``dst`` is
    complete or absent. ``dst`` may be a URL (``s3://``, ``gs://``, ``az://``;
    ``storage_options``, ``staging_dir``, ``staging_bytes`` as for ``convert``): shards are
    uploaded as they are finished and the root meta.json last; objects already there are
    refused unless ``overwrite=True``, which deletes them first; a failure deletes what was
    uploaded.

    A missing field or a text that is not a str raises ``SourceError`` naming the file (or
    part) and the example; a tokenizer file that does not load, ``TokenizerError``; an
    ``eos_token`` not in the vocabulary or an ``eos_id`` beyond it, ``InvalidArgumentError``.
    Nothing is left at ``dst`` then.
    """
    from .._checks import check_int
    from .._writing.options import WriterOptions, default_workers
    from .._writing.upload import is_remote
    from ._run import WRITER_DEFAULTS

    started = time.monotonic()
    writer_options = {k: v for k, v in options.items() if k in WRITER_DEFAULTS}
    format_options = {k: v for k, v in options.items() if k not in WRITER_DEFAULTS}
    writer_options = WriterOptions(**writer_options).as_dict(exclude=("workers",))
    workers = default_workers() if workers is None else check_int("workers", workers, minimum=1)
    if field is not None and not isinstance(field, str):
        raise InvalidArgumentError(f"field must be a str or None, not {type(field).__name__}")
    tok, label = _load(tokenizer)
    eos = _eos(tok, label, eos_token, eos_id)
    top = max(tok.get_vocab(with_added_tokens=True).values(), default=0)
    dtype = token_dtype(max(top, eos or 0))
    job = _Encoding(tok.to_str(), bool(add_special_tokens), eos, dtype.name, label)
    remote = is_remote(dst)
    if not remote:
        if storage_options is not None or staging_dir is not None or staging_bytes is not None:
            raise InvalidArgumentError(
                f"{dst}: storage_options, staging_dir and staging_bytes are for a URL DST"
            )
        from ..storage import local_path

        dst = Path(local_path(dst))
        replace = _local_destination(dst, bool(overwrite))
    fmt, sources = _sources(src, fmt, format_options)
    summary = TokenizeSummary(fmt, dst, label, dtype.name, int(top) + 1, eos, workers=workers)
    summary.bytes_in = sum(p.nbytes for s in sources for p in s.parts)
    if remote:
        _to_url(
            sources,
            dst,
            job,
            workers,
            field,
            progress,
            writer_options,
            summary,
            storage_options,
            bool(overwrite),
            staging_dir,
            staging_bytes,
        )
    else:
        _to_path(sources, dst, replace, job, workers, field, progress, writer_options, summary)
    summary.documents = sum(d for _, d, _, _ in summary.datasets)
    summary.tokens = sum(t for _, _, t, _ in summary.datasets)
    summary.shards = sum(s for *_, s in summary.datasets)
    summary.seconds = time.monotonic() - started
    return summary


def _new_writer(path, options: dict, **remote):
    from ..writer import AtlasDatasetWriter

    # The writer compresses on this thread: the cores are the tokenizing processes'. The
    # dataset gets its token index (tokens.idx) from the writer: required locally, automatic
    # to a URL (uploaded beside the root meta.json).
    index = {} if remote else {"token_index": True}
    return AtlasDatasetWriter(path, **options, workers=1, **index, **remote)


def _write_all(sources, open_writer, job, workers, text_field, progress, summary) -> None:
    """Each source through the pool into the writer ``open_writer(split)`` makes."""
    pool = _Pool(workers, job)
    ok = False
    try:
        for source in sources:
            desc = "tokenizing" if source.split is None else f"tokenizing {source.split}"
            bar = _Bar(progress, sum(p.nbytes for p in source.parts) or None, desc)
            writer = open_writer(source.split)
            try:
                documents, tokens = _write_source(source, writer, pool, text_field, bar)
                writer.close()
            except BaseException:
                writer.abort()
                raise
            finally:
                bar.close()
            summary.datasets.append((source.split, documents, tokens, len(writer.shard_sizes)))
        ok = True
    finally:
        pool.close(kill=not ok)


def _to_path(sources, dst, replace, job, workers, text_field, progress, options, summary):
    from ._run import _tree_bytes
    from ._staging import Staging

    staging = Staging(dst, "tokenizing")
    try:

        def open_writer(split):
            return _new_writer(staging.out if split is None else staging.out / split, options)

        _write_all(sources, open_writer, job, workers, text_field, progress, summary)
        if replace:
            # The old dataset stays whole until the new one is: a crash between the two
            # renames leaves it in the staging directory, and no DST.
            os.rename(dst, staging.path / "replaced")
        elif dst.is_dir():
            dst.rmdir()  # empty (checked): the rename needs it gone
        os.rename(staging.out, dst)
    finally:
        staging.remove()
    summary.bytes_out = _tree_bytes(dst)


def _to_url(
    sources,
    url,
    job,
    workers,
    text_field,
    progress,
    options,
    summary,
    storage_options,
    overwrite,
    staging_dir,
    staging_bytes,
):
    from .._writing.upload import open_destination, remove_objects

    dest = open_destination(url, storage_options, overwrite=overwrite, who="tokenize")
    summary.dst = dest.location.url
    remote = {
        "storage_options": storage_options,
        "staging_dir": staging_dir,
        "staging_bytes": staging_bytes,
    }

    def open_writer(split):
        where = dest.location.url if split is None else dest.location.child(split).url
        source = next(s for s in sources if s.split == split)
        counts = [p.examples for p in source.parts]
        expected = sum(counts) if None not in counts else None
        return _new_writer(where, options, expected_examples=expected, **remote)

    ok = False
    try:
        _write_all(sources, open_writer, job, workers, text_field, progress, summary)
        ok = True
    finally:
        if not ok:
            # DST held nothing before (refused, or emptied by overwrite): what is there is
            # this run's, the datasets of splits already finished included.
            try:
                remove_objects(dest, dest.names())
                dest.abort_uploads()
            except Exception:
                pass
    summary.bytes_out = dest.total_bytes()
