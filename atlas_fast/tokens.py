"""Token sequences for language-model training: ``TokenSequences`` over an Atlas dataset of
token arrays, with the sequence length, packing and batch size chosen at training time.

The guide is docs/tokens.md; the order that goes with it, ``TokenShuffleSampler``, is in
``atlas_fast.token_sampler``.
"""

from __future__ import annotations

import itertools
import math
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np

from . import _token_index as _ti
from ._checks import check_int
from ._compat import lazy_classes, torch_subclass
from ._core._tokens_py import sorted_unique
from ._errors import InvalidArgumentError, InvalidArgumentTypeError, TokenIndexError

__all__ = ["TokenSequences", "collate", "expand"]  # noqa: F822 (see __getattr__)

_INDEX_MODES = ("auto", "rebuild", "require")


def collate(batch: dict) -> dict:
    """A ``DataLoader``'s ``collate_fn`` for ``TokenSequences``: the batch's arrays as torch
    tensors, without a copy (``torch.from_numpy``); other values as they are. Arrays that
    are parts of one array (a packed batch's ``targets``, ``inputs`` and ``positions``)
    become views of one tensor: a DataLoader worker then hands the batch over in one
    shared-memory segment, not one per field (each costs milliseconds to make).

    A compact batch (``compact=True``) stays numpy arrays: a worker's pipe carries its few
    bytes faster than a shared-memory segment would (about twice the batches a second,
    measured), and ``expand`` makes the tensors where they are used."""
    if _COMPACT_FIELDS.issubset(batch):
        return batch
    import torch

    out = {}
    whole = {}  # id of a shared base array -> its tensor
    for key, value in batch.items():
        if not isinstance(value, np.ndarray):
            out[key] = value
            continue
        base = value.base
        if (
            isinstance(base, np.ndarray)
            and base.dtype == value.dtype
            and base.flags.c_contiguous
            and value.flags.c_contiguous
        ):
            tensor = whole.get(id(base))
            if tensor is None:
                tensor = whole[id(base)] = torch.from_numpy(base).reshape(-1)
            at = (value.ctypes.data - base.ctypes.data) // value.itemsize
            out[key] = tensor[at : at + value.size].view(value.shape)
        else:
            out[key] = torch.from_numpy(value)
    return out


_COMPACT_FIELDS = frozenset(("targets", "starts", "start_inputs", "start_positions"))


_TORCH_DTYPES: dict = {}  # numpy dtype -> torch dtype, as torch.from_numpy maps them


def _torch_dtype(dtype: np.dtype):
    found = _TORCH_DTYPES.get(dtype)
    if found is None:
        import torch

        found = _TORCH_DTYPES[dtype] = torch.from_numpy(np.zeros(0, dtype=dtype)).dtype
    return found


def _numpy_dtype(dtype) -> np.dtype:
    if type(dtype).__module__ == "torch":
        import torch

        return torch.empty(0, dtype=dtype).numpy().dtype
    return np.dtype(dtype)


def expand(batch: dict, *, dtype=None, varlen: bool = False, device=None) -> dict:
    """The rows of a compact batch (``TokenSequences(..., compact=True)``): ``{"inputs",
    "targets", "positions"}`` as ``TokenSequences`` gives them without ``compact``, and with
    ``varlen=True`` also ``cu_seqlens`` and ``max_seqlen``.

    ``batch`` holds numpy arrays (what ``__getitems__`` and ``collate`` give) or torch
    tensors: 2-D for a batch, 1-D for one item (``ts[k]``). Numpy arrays give numpy arrays,
    unless ``device`` is named: then, as for tensors, torch tensors built on that device
    (``"cpu"``, ``"cuda"``, ...), the compact batch moved there first, so a training loop
    hands the GPU 2 bytes a token instead of 24. ``dtype``: of ``inputs`` and ``targets``
    (default int64; ``positions`` are int32 when it is int32, else int64), a numpy or torch
    integer dtype that holds every value of the batch's token dtype. The rows are new
    arrays: the batch is not changed."""
    try:
        targets = batch["targets"]
        starts = batch["starts"]
        start_inputs = batch["start_inputs"]
        start_positions = batch["start_positions"]
        shape = tuple(targets.shape)
    except (KeyError, TypeError, AttributeError):
        raise InvalidArgumentError(
            "expand takes a compact batch (TokenSequences(..., compact=True)): a dict of "
            "targets, starts, start_inputs and start_positions"
        ) from None
    if len(shape) not in (1, 2):
        raise InvalidArgumentError(f"a compact batch's targets are 1-D or 2-D, not {shape}")
    _check_starts(starts, start_inputs, start_positions, math.prod(shape))
    numpy_in = isinstance(targets, np.ndarray)
    stored = targets.dtype if numpy_in else _numpy_dtype(targets.dtype)
    out_dtype = np.dtype(np.int64) if dtype is None else _numpy_dtype(dtype)
    if out_dtype.kind not in "iu" or not np.can_cast(stored, out_dtype, "safe"):
        raise InvalidArgumentError(
            f"expand's dtype must be an integer dtype that holds every {stored} token, "
            f"not {out_dtype}"
        )
    if numpy_in and device is None:
        out = _expand_numpy(targets, starts, start_inputs, start_positions, out_dtype, varlen)
    else:
        if numpy_in:
            import torch

            targets, starts, start_inputs, start_positions = (
                torch.from_numpy(np.ascontiguousarray(a))
                for a in (targets, starts, start_inputs, start_positions)
            )
        out = _expand_torch(
            targets, starts, start_inputs, start_positions, out_dtype, varlen, device
        )
    if len(shape) == 1:  # one item: its rows' first (only) row
        for key in ("inputs", "targets", "positions"):
            out[key] = out[key][0]
    return out


def _check_starts(starts, start_inputs, start_positions, total: int) -> None:
    """The sequence starts of a compact batch of ``total`` tokens: the first at 0, then
    increasing, all inside the rows, one input and one position each. Checked before
    anything is sized from them (a tensor on a device is copied to the host for it: a few
    hundred bytes)."""
    host = starts if isinstance(starts, np.ndarray) else starts.detach().cpu().numpy()
    host = host.astype(np.int64, copy=False).reshape(-1)
    if len(start_inputs) != len(host) or len(start_positions) != len(host):
        raise InvalidArgumentError(
            f"a compact batch has {len(host)} starts but {len(start_inputs)} start_inputs "
            f"and {len(start_positions)} start_positions"
        )
    if total and not (
        len(host) and host[0] == 0 and host[-1] < total and (np.diff(host) > 0).all()
    ):
        raise InvalidArgumentError(
            f"a compact batch's starts must begin at 0 and increase below its {total} tokens"
        )
    if not total and len(host):
        raise InvalidArgumentError("a compact batch of no tokens has no starts")


def _expand_numpy(targets, starts, start_inputs, start_positions, dtype, varlen) -> dict:
    targets = np.array(targets, dtype=dtype, order="C", ndmin=2)  # a copy, C-ordered
    n, length = targets.shape
    total = n * length
    flat = targets.reshape(-1)
    inputs = np.empty_like(targets)
    flat_inputs = inputs.reshape(-1)
    flat_inputs[1:] = flat[:-1]
    starts = np.asarray(starts, dtype=np.int64)
    flat_inputs[starts] = start_inputs
    lengths = np.diff(starts, append=total)
    positions = np.arange(total, dtype=np.int64) - np.repeat(starts - start_positions, lengths)
    positions = positions.astype(np.int32 if dtype == np.int32 else np.int64, copy=False)
    out = {"inputs": inputs, "targets": targets, "positions": positions.reshape(n, length)}
    if varlen:
        out["cu_seqlens"] = np.append(starts, total).astype(np.int32)
        out["max_seqlen"] = int(lengths.max()) if len(lengths) else 0
    return out


def _expand_torch(targets, starts, start_inputs, start_positions, dtype, varlen, device) -> dict:
    import torch

    final = _torch_dtype(dtype)
    # Built in int64 where torch cannot index-assign the dtype (its unsigned ones), then
    # converted.
    work = final if final.is_signed or final == torch.uint8 else torch.int64
    if device is not None:
        targets, starts, start_inputs, start_positions = (
            t.to(device, non_blocking=True)
            for t in (targets, starts, start_inputs, start_positions)
        )
    targets = targets.reshape(1, -1) if targets.dim() == 1 else targets
    n, length = targets.shape
    total = n * length
    targets = targets.to(work, memory_format=torch.contiguous_format, copy=True)
    flat = targets.view(-1)
    inputs = torch.empty_like(targets)
    flat_inputs = inputs.view(-1)
    flat_inputs[1:] = flat[:-1]
    starts = starts.to(torch.int64)
    flat_inputs[starts] = start_inputs.to(work)
    lengths = torch.diff(starts, append=starts.new_full((1,), total))
    positions = torch.arange(total, device=targets.device) - torch.repeat_interleave(
        starts - start_positions, lengths, output_size=total
    )
    positions = positions.to(torch.int32 if final == torch.int32 else torch.int64)
    out = {
        "inputs": inputs.to(final),
        "targets": targets.to(final),
        "positions": positions.view(n, length),
    }
    if varlen:
        out["cu_seqlens"] = torch.cat((starts, starts.new_full((1,), total))).to(torch.int32)
        out["max_seqlen"] = int(lengths.max()) if len(lengths) else 0
    return out


def _shard_numbers(dataset) -> list:
    """Each shard's number (its folder's name as an integer; its position if not digits)."""
    out = []
    for k, d in enumerate(dataset._shard_dirs):
        name = os.path.basename(str(d).rstrip("/"))
        out.append(int(name) if name.isascii() and name.isdigit() else k)
    return out


class _Located:
    """The index as the dataset's shards see it: ``cum`` (each block's first token in the
    concatenation of the dataset's shards, then the total), ``first`` (each shard's first
    block, then the block count), the shards' records, and the file they came from."""

    def __init__(self, path, cum, first, records) -> None:
        self.path = path
        self.cum = cum
        self.first = first
        self.records = records
        self.total = int(cum[-1])


class _TokenSequences:
    """The token sequences of an Atlas dataset, as fixed-length rows for training.

    ``dataset``: an ``AtlasDataset`` or a path or URL to open one (``open_kwargs`` passed to
    it). Its examples are documents: 1-D integer numpy arrays (any integer dtype), lists of
    ints, or mappings holding one under ``field``. Documents are concatenated in dataset order;
    empty ones contribute nothing.

    **Packed** (default): ``len(ts)`` is ``num_tokens // seq_len``, and ``ts[k]`` covers tokens
    ``[k * seq_len, (k + 1) * seq_len)`` of the concatenation: a dict of 1-D arrays of length
    ``seq_len``: ``targets`` (those tokens), ``inputs`` (at each position the token before it
    in its document, or ``start_input`` where a document starts: every token is a target
    exactly once and nothing needs masking) and ``positions`` (each token's index in its
    document; a window starting inside a document continues the count).

    **Not packed** (``packed=False``): ``ts[k]`` is document ``k``, truncated to ``seq_len``
    and padded with ``pad_value``: ``targets``, ``inputs``, ``positions`` and ``mask`` (True
    where a position holds a token of the document).

    ``ts.__getitems__(keys)`` gives one dict of 2-D arrays ``[len(keys), seq_len]`` whose rows
    are ``ts[k]``; with ``varlen=True`` (packed) also ``cu_seqlens`` (int32: where each
    document, or its part in a row, starts in the flattened batch, then its length) and
    ``max_seqlen`` (an int), what FlashAttention's variable-length kernels take. A key is a
    window number, or (packed) a window described by ``TokenShuffleSampler``: a tuple
    ``(start, count, start, count, ...)`` of ranges of the concatenation, whose lengths add up
    to the row length (all keys of a batch alike).

    ``dtype`` (default int64, what torch's embedding and cross-entropy take) is the dtype of
    ``targets`` and ``inputs``; ``positions`` are int64 (int32 if ``dtype`` is int32).
    ``vocab_size``: every id must be below it (checked at open from the token index).

    **Compact** (``compact=True``, packed rows): a batch is ``targets`` and, at each
    sequence start, its index in the flattened rows (``starts``, int32), its input
    (``start_inputs``) and its position (``start_positions``): what ``expand`` rebuilds the
    rows from, where they are used. ``dtype`` then defaults to the smallest of uint16,
    int32 and int64 that holds every id and ``start_input``. For DataLoader workers: the
    hand-over costs by the byte (2 a token for uint16, against 24 for the int64 rows).

    The token index (a file at the dataset root, ``tokens.idx``; see docs/tokens.md) locates
    windows with 8 bytes per block, memory-mapped. Datasets written by atlas_fast carry it;
    for others it is built on first use by a parallel pass over the blocks (a progress bar
    when stderr is a terminal, or ``progress=True``), saved at the root when writable, else in
    ``$XDG_CACHE_HOME/atlas-fast/tokens``. A dataset in object storage: the index at its root
    (its writer puts one there) fetched once into that cache folder, keyed by the dataset's
    version (the ETag of its root meta.json), where a built one goes too.
    ``index="rebuild"`` builds it afresh,
    ``index="require"`` refuses to build one. A shard rewritten since its entry was made is a
    ``TokenIndexError`` at its first read, never other tokens.

    Use with a DataLoader: ``DataLoader(ts, batch_size=B, sampler=TokenShuffleSampler(ts,
    batch_size=B, ...), collate_fn=atlas_fast.tokens.collate, num_workers=N,
    pin_memory=True)``: each batch is one ``__getitems__`` call and one array per field
    (compact batches stay numpy arrays, which ``pin_memory`` leaves as they are: ``expand``
    moves them to the device).
    """

    def __init__(
        self,
        dataset,
        seq_len,
        *,
        packed=True,
        field=None,
        start_input=0,
        vocab_size=None,
        dtype=None,
        pad_value=0,
        varlen=False,
        compact=False,
        index="auto",
        progress=None,
        _index_path=None,
        **open_kwargs,
    ):
        self.seq_len = check_int("seq_len", seq_len, minimum=1)
        if not isinstance(packed, bool):
            raise InvalidArgumentTypeError(f"packed must be True or False, not {packed!r}")
        if field is not None and not isinstance(field, str):
            raise InvalidArgumentTypeError(f"field must be a str or None, not {field!r}")
        if index not in _INDEX_MODES:
            raise InvalidArgumentError(f"index must be one of {_INDEX_MODES}, not {index!r}")
        if dtype is not None:
            try:
                dtype = np.dtype(dtype)
            except TypeError:
                raise InvalidArgumentTypeError(
                    f"dtype must be a numpy integer dtype, not {dtype!r}"
                ) from None
            if dtype.kind not in "iu":
                raise InvalidArgumentError(f"dtype must be an integer dtype, not {dtype}")
        self.start_input = check_int("start_input", start_input)
        self.pad_value = check_int("pad_value", pad_value)
        self.vocab_size = check_int("vocab_size", vocab_size, minimum=1, none=True)
        if varlen and not packed:
            raise InvalidArgumentError("varlen=True is for packed rows (packed=True)")
        if not isinstance(compact, bool):
            raise InvalidArgumentTypeError(f"compact must be True or False, not {compact!r}")
        if compact and not packed:
            raise InvalidArgumentError("compact=True is for packed rows (packed=True)")
        if compact and varlen:
            raise InvalidArgumentError(
                "compact=True with varlen=True: a compact batch carries where each sequence "
                "starts; expand(batch, varlen=True) gives cu_seqlens and max_seqlen"
            )
        self.packed = packed
        self.field = field
        self.varlen = bool(varlen)
        self.compact = compact
        self._index_path = _index_path
        if dtype is not None:  # checked before anything is opened
            self._check_fill_values(dtype)
        if isinstance(dataset, (str, os.PathLike)):
            from .atlas import AtlasDataset

            dataset = AtlasDataset(dataset, **open_kwargs)
        elif open_kwargs:
            raise InvalidArgumentError(
                f"{', '.join(open_kwargs)}: options for opening a dataset, given with one "
                "already open"
            )
        if not hasattr(dataset, "_shard_dirs"):
            raise InvalidArgumentTypeError(
                f"dataset must be an AtlasDataset, a path or a URL, not {type(dataset).__name__}"
            )
        self.dataset = dataset
        self._core = dataset._backend
        self._verified: set = set()  # shards checked against their entry in this process
        self._block_examples = None  # each global block's first example (_prefetch_blocks)
        self._index = self._open_index(index, progress)
        if dtype is None:
            dtype = self._smallest_dtype() if compact else np.dtype(np.int64)
            self._check_fill_values(dtype)
        self.dtype = dtype
        self._positions_dtype = np.dtype(np.int32) if dtype == np.int32 else np.dtype(np.int64)
        self._check_ids(np.iinfo(dtype))
        if packed:
            self._len = self._index.total // self.seq_len
        else:
            self._len = len(dataset)
        if self._len == 0:
            what = f"{self._index.total} tokens" if packed else "no documents"
            warnings.warn(
                f"{dataset.root}: {what}, fewer than one sequence of {self.seq_len}: "
                "TokenSequences has length 0",
                RuntimeWarning,
                stacklevel=2,
            )

    # -- the index -------------------------------------------------------------------------

    @property
    def num_tokens(self) -> int:
        """Tokens in the concatenation of the documents."""
        return self._index.total

    @property
    def index_path(self):
        """The token index file in use (None: held in memory only)."""
        return self._index.path

    def _open_index(self, mode: str, progress) -> _Located:
        ds = self.dataset
        sizes = list(ds.actual_shard_sizes)
        numbers = _shard_numbers(ds)
        name = _ti.index_name(self.field)
        if self._index_path is not None:  # a pickled copy: the file its original used
            found = _ti.TokenIndex(self._index_path)
            return self._located(found, numbers, sizes)
        remote = getattr(ds, "_remote", None)
        if remote is None:
            root_file = Path(ds.root) / name
            cache_file = _ti.cache_folder(ds.root) / name
        else:
            # In object storage: the index at the URL's root (its writer's), copied once into
            # the cache folder of this version of the dataset, where a built one goes too.
            root_file = None
            cache_file = _ti.cache_folder(ds.root, remote.identity) / name
            if mode != "rebuild" and not cache_file.is_file():
                root_file = self._fetch_index(remote, name, cache_file)
        best, best_reused = None, -1
        if mode != "rebuild":
            for path in (root_file, cache_file):
                if path is None or not path.is_file():
                    continue
                try:
                    found = _ti.TokenIndex(path)
                except TokenIndexError as exc:
                    if mode == "require":
                        raise
                    warnings.warn(f"{exc}; building it again", RuntimeWarning, stacklevel=4)
                    continue
                if found.field != self.field:
                    continue
                reused = sum(
                    1
                    for n, size in zip(numbers, sizes)
                    if n < len(found.shards) and int(found.shards[n]["examples"]) == size
                )
                if reused > best_reused:
                    best, best_reused = found, reused
                if reused == len(sizes) and len(found.shards) == len(sizes):
                    break
        complete = numbers == list(range(len(sizes)))
        if (
            best is not None
            and best_reused == len(sizes)
            and (not complete or len(best.shards) == len(sizes))
        ):
            return self._located(best, numbers, sizes)
        if mode == "require":
            raise TokenIndexError(
                f"{ds.root}: no token index {name} covering every shard "
                f"(looked at {root_file or '-'} and {cache_file})"
            )
        keep = {}
        if best is not None:
            for k, (n, size) in enumerate(zip(numbers, sizes)):
                if n < len(best.shards) and int(best.shards[n]["examples"]) == size:
                    keep[k] = best.entry(n)
        todo = [k for k in range(len(sizes)) if k not in keep]
        built = _ti.build_entries(ds, todo, self.field, self._core, progress) if todo else {}
        entries = {**keep, **built}
        if not complete:  # some shards only (a node holding a few): kept in memory
            return self._in_memory(entries, len(sizes))
        for path in (root_file, cache_file):
            if path is None:
                continue
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                if not _ti.writable_dir(path.parent):
                    continue
                _ti.write_index(path, self.field, [entries[k] for k in range(len(sizes))])
            except OSError:
                continue
            return self._located(_ti.TokenIndex(path), numbers, sizes)
        warnings.warn(
            f"{ds.root}: the token index could be saved neither there nor in {cache_file.parent}: "
            "kept in memory, built again next time",
            RuntimeWarning,
            stacklevel=4,
        )
        return self._in_memory(entries, len(sizes))

    @staticmethod
    def _fetch_index(remote, name: str, target: Path):
        """The dataset's own index ``name`` from its root in object storage, saved as
        ``target`` (when its folder cannot be written, as a temporary file: fetched again
        next time); its path, or None when the dataset has none."""
        data = remote.root_file(name, _ti.MAX_INDEX_BYTES)
        if data is None:
            return None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            _ti.write_atomic(target, data)
            return target
        except OSError:
            fd, tmp = tempfile.mkstemp(prefix="atlas-fast-tokens-", suffix=".idx")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return Path(tmp)

    def _in_memory(self, entries: dict, n: int) -> _Located:
        counts = [np.asarray(entries[k].counts, dtype=np.int64) for k in range(n)]
        blocks = np.array([len(c) for c in counts], dtype=np.int64)
        first = np.concatenate(([0], np.cumsum(blocks)))
        cum = np.zeros(int(first[-1]) + 1, dtype=np.uint64)
        if first[-1]:
            np.cumsum(np.concatenate(counts), out=cum[1:])
        records = np.zeros(n, dtype=_ti.SHARD_DTYPE)
        for k in range(n):
            e = entries[k]
            low, high = _ti._NO_ID if e.low is None else (e.low, e.high)
            records[k] = (
                e.examples,
                len(counts[k]),
                e.data_bytes,
                e.digest,
                int(counts[k].sum()),
                low,
                high,
                first[k],
            )
        return _Located(None, cum, first, records)

    def _located(self, found, numbers, sizes) -> _Located:
        records = found.shards
        if numbers == list(range(len(records))):  # the common case: the mapped table itself
            first = np.concatenate((records["first_block"].astype(np.int64), [len(found.cum) - 1]))
            return _Located(found.path, found.cum, first, records)
        picked = records[numbers]
        entries = {k: found.entry(n) for k, n in enumerate(numbers)}
        located = self._in_memory(entries, len(numbers))
        located.records = picked
        located.path = found.path
        return located

    def _check_fill_values(self, dtype) -> None:
        """``start_input`` (and, for documents, ``pad_value``) must fit ``dtype``."""
        info = np.iinfo(dtype)
        values = [("start_input", self.start_input)]
        if not self.packed:  # padding is for documents; packed rows have none
            values.append(("pad_value", self.pad_value))
        for what, value in values:
            if not info.min <= value <= info.max:
                raise InvalidArgumentError(
                    f"{what} {value} is outside dtype {dtype} [{info.min}, {info.max}]"
                )

    def _id_range(self):
        """``(lowest, highest)`` token id of the dataset (from the index), None if empty."""
        records = self._index.records
        has = records["tokens"] > 0
        if not has.any():
            return None
        return int(records["low"][has].min()), int(records["high"][has].max())

    def _smallest_dtype(self) -> np.dtype:
        """A compact batch's token dtype: the smallest of uint16, int32 and int64 that holds
        every id and ``start_input`` (torch shares and converts each)."""
        low, high = self._id_range() or (0, 0)
        low, high = min(low, self.start_input), max(high, self.start_input)
        for dtype in (np.uint16, np.int32, np.int64):
            info = np.iinfo(dtype)
            if info.min <= low and high <= info.max:
                return np.dtype(dtype)
        return np.dtype(np.int64)  # ids beyond int64 fail _check_ids

    def _check_ids(self, info) -> None:
        found = self._id_range()
        if found is None:
            return
        low, high = found
        if self.vocab_size is not None and (high >= self.vocab_size or low < 0):
            bad = high if high >= self.vocab_size else low
            raise InvalidArgumentError(
                f"{self.dataset.root}: token id {bad} is outside vocab_size {self.vocab_size} "
                f"(ids from {low} to {high})"
            )
        if low < info.min or high > info.max:
            raise InvalidArgumentError(
                f"{self.dataset.root}: token ids from {low} to {high} do not fit dtype {self.dtype}"
            )

    # -- items -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, k) -> dict:
        batch = self.__getitems__([k])
        return {
            key: (v[0] if isinstance(v, np.ndarray) and v.ndim == 2 else v)
            for key, v in batch.items()
        }

    def __getitems__(self, keys) -> dict:
        keys = list(keys)
        if self.packed:
            return self._packed(keys)
        return self._documents(keys)

    def _prefetch_blocks(self, blocks) -> bool:
        """A hint (``TokenShuffleSampler``'s): global blocks ``blocks`` are read next, named to
        the dataset's ``prefetch``; False once that is of no use to it."""
        prefetch = getattr(self.dataset, "prefetch", None)
        if prefetch is None:
            return False
        firsts = self._block_examples
        if firsts is None:
            index = self._index
            starts = np.asarray(self.dataset.cumulative_shard_sizes, dtype=np.int64)
            starts = np.concatenate(([0], starts[:-1]))
            blocks_per = np.diff(index.first)
            sizes = [self.dataset._reader(s)._block_size for s in range(len(blocks_per))]
            within = np.arange(int(index.first[-1])) - np.repeat(index.first[:-1], blocks_per)
            firsts = self._block_examples = np.repeat(starts, blocks_per) + within * np.repeat(
                sizes, blocks_per
            )
        return prefetch(firsts[np.asarray(blocks, dtype=np.int64)].tolist())

    def _window_number(self, k) -> int:
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
            raise InvalidArgumentTypeError(
                f"a window key must be an int or a tuple of ranges, not {k!r}"
            )
        k = int(k)
        if k < 0:
            k += self._len
        if not 0 <= k < self._len:
            raise IndexError(f"window {k} out of range for {self._len} windows")
        return k

    def _segments(self, keys: list) -> tuple:
        """``(length, starts, counts)`` of the keys: their row length and each range, in
        order."""
        if keys and all(type(k) is tuple for k in keys):
            fast = self._tuple_segments(keys)
            if fast is not None:
                return fast
        starts, counts = [], []
        length = None
        total = self._index.total
        for k in keys:
            if isinstance(k, tuple):
                if len(k) < 2 or len(k) % 2:
                    raise InvalidArgumentError(
                        f"a window key is (start, count, ...) pairs, not {k!r}"
                    )
                row_len = 0
                for j in range(0, len(k), 2):
                    s, c = int(k[j]), int(k[j + 1])
                    if s < 0 or c < 0 or s + c > total:
                        raise IndexError(f"tokens [{s}, {s + c}) out of range for {total} tokens")
                    starts.append(s)
                    counts.append(c)
                    row_len += c
            else:
                w = self._window_number(k)
                starts.append(w * self.seq_len)
                counts.append(self.seq_len)
                row_len = self.seq_len
            if length is None:
                length = row_len
            elif row_len != length:
                raise InvalidArgumentError(
                    f"the keys of a batch must make rows of one length: {length} and {row_len}"
                )
        return (
            length or 0,
            np.array(starts, dtype=np.int64),
            np.array(counts, dtype=np.int64),
        )

    def _tuple_segments(self, keys: list):
        """``_segments`` of keys that are all tuples of ints, with numpy; None when one is not
        well formed (the loop then says which)."""
        sizes = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
        if (sizes < 2).any() or (sizes % 2).any():
            return None
        try:
            flat = np.fromiter(itertools.chain.from_iterable(keys), dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            return None
        if len(flat) != int(sizes.sum()):
            return None
        starts, counts = flat[0::2], flat[1::2]
        rows = np.add.reduceat(counts, np.cumsum(sizes // 2) - sizes // 2)
        if (
            (starts < 0).any()
            or (counts < 0).any()
            or (starts + counts > self._index.total).any()
            or (rows != rows[0]).any()
        ):
            return None
        return int(rows[0]), starts, counts

    def _check_shards(self, shards) -> None:
        index = self._index
        for s in set(shards.tolist()):
            if s in self._verified:
                continue
            reader = self.dataset._reader(s)
            _ti.check_shard(
                index.path or "the token index",
                index.records[s],
                s,
                reader._root,
                reader._block_offsets(),
            )
            self._verified.add(s)

    def _blocks(self, g: np.ndarray) -> tuple:
        """``(shards, blocks in them, expected token counts)`` of global blocks ``g``."""
        first = self._index.first
        shards = np.searchsorted(first, g, side="right") - 1
        cum = self._index.cum
        expected = cum[g + 1].astype(np.int64) - cum[g].astype(np.int64)
        self._check_shards(shards)
        return shards, g - first[shards], expected

    def _outputs(self, n: int, length: int, fill: int) -> tuple:
        shape = (n, length)
        targets = np.full(shape, fill, dtype=self.dtype) if fill else np.zeros(shape, self.dtype)
        inputs = np.full(shape, fill, dtype=self.dtype) if fill else np.zeros(shape, self.dtype)
        positions = np.zeros(shape, dtype=self._positions_dtype)
        return targets, inputs, positions

    def _packed(self, keys: list, into=None) -> dict:
        """The rows of ``keys``; ``into``: ``(targets, inputs, positions, rows)``, arrays of
        a larger batch to write them to, at ``rows`` (a mixture's batch)."""
        length, starts, counts = self._segments(keys)
        out = np.cumsum(counts) - counts  # every row holds ``length`` tokens
        if into is None:
            # Not cleared: the pieces cover every position of every row. One array holds the
            # three when they share a dtype (collate makes one tensor of it).
            shape = (len(keys), length)
            if self._positions_dtype == self.dtype:
                targets, inputs, positions = np.empty((3, *shape), dtype=self.dtype)
            else:
                targets = np.empty(shape, dtype=self.dtype)
                inputs = np.empty(shape, dtype=self.dtype)
                positions = np.empty(shape, dtype=self._positions_dtype)
        else:
            targets, inputs, positions, rows = into
            out = rows[out // length] * length + out % length if len(out) else out
        unique, pieces = self._core.token_pieces(self._index.cum, starts, counts, out)
        if len(pieces):
            shards, blocks, expected = self._blocks(unique)
            self._core.gather_tokens(
                self.dataset,
                shards,
                blocks,
                expected,
                pieces,
                targets.reshape(-1),
                inputs.reshape(-1),
                positions.reshape(-1),
                self.start_input,
                self.field,
                False,
            )
        piece_starts = pieces[:, 3] if len(pieces) else pieces[:, 0]
        if self.compact and into is None:
            return self._compact(targets, inputs, positions, piece_starts)
        batch = {"inputs": inputs, "targets": targets, "positions": positions}
        if self.varlen and into is None:
            batch.update(self._varlen(positions, piece_starts))
        return batch

    @staticmethod
    def _sequence_starts(positions: np.ndarray, piece_starts: np.ndarray) -> np.ndarray:
        """Where a sequence starts in the flattened rows: at each document start (position
        0), at each row start, and where a range of a key starts; then the end."""
        n, length = positions.shape
        flat = positions.reshape(-1)
        starts = np.zeros(flat.shape[0] + 1, dtype=bool)
        starts[:-1] = flat == 0
        if length:
            starts[0 : n * length : length] = True
        starts[piece_starts] = True
        starts[-1] = True
        return np.flatnonzero(starts)

    @staticmethod
    def _compact(targets, inputs, positions, piece_starts) -> dict:
        """The compact form of packed rows (see ``expand``): ``targets`` as they are, and at
        each sequence start its index in the flattened rows, its input and its position; the
        rest follows from them."""
        starts = _TokenSequences._sequence_starts(positions, piece_starts)[:-1]
        return {
            "targets": targets,
            "starts": starts.astype(np.int32),
            "start_inputs": inputs.reshape(-1)[starts],
            "start_positions": positions.reshape(-1)[starts].astype(np.int64, copy=False),
        }

    @staticmethod
    def _varlen(positions: np.ndarray, piece_starts: np.ndarray) -> dict:
        """``cu_seqlens`` and ``max_seqlen``: a sequence starts at each document start
        (position 0), at each row start, and where a range of a key starts."""
        cu = _TokenSequences._sequence_starts(positions, piece_starts).astype(np.int32)
        return {"cu_seqlens": cu, "max_seqlen": int(np.diff(cu).max()) if len(cu) > 1 else 0}

    def _documents(self, keys: list) -> dict:
        n = len(keys)
        length = self.seq_len
        targets, inputs, positions = self._outputs(n, length, self.pad_value)
        ds = self.dataset
        ends = ds.cumulative_shard_sizes
        docs = np.array([self._window_number(k) for k in keys], dtype=np.int64)
        mask = np.zeros((n, length), dtype=bool)
        if n:
            shards = np.searchsorted(ends, docs, side="right")
            local = docs - (
                ends[shards] - np.asarray(ds.actual_shard_sizes, dtype=np.int64)[shards]
            )
            sizes = np.array([ds._reader(s)._block_size for s in shards.tolist()], dtype=np.int64)
            b = local // sizes
            first = self._index.first
            g = first[shards] + b
            unique, slot = sorted_unique(g, inverse=True)
            pieces = np.stack(
                (slot, local - b * sizes, np.full(n, length), np.arange(n) * length), axis=1
            ).astype(np.int64)
            shards_u, blocks_u, expected = self._blocks(unique)
            copied = self._core.gather_tokens(
                ds,
                shards_u,
                blocks_u,
                expected,
                pieces,
                targets.reshape(-1),
                inputs.reshape(-1),
                positions.reshape(-1),
                self.start_input,
                self.field,
                True,
            )
            mask = np.arange(length) < copied[:, None]
            positions[~mask] = 0
        return {"inputs": inputs, "targets": targets, "positions": positions, "mask": mask}

    # -- pickling --------------------------------------------------------------------------

    def __reduce__(self):
        kwargs = {
            "packed": self.packed,
            "field": self.field,
            "start_input": self.start_input,
            "vocab_size": self.vocab_size,
            "dtype": self.dtype.str,
            "pad_value": self.pad_value,
            "varlen": self.varlen,
            "compact": self.compact,
        }
        if self._index.path is not None:
            kwargs["_index_path"] = str(self._index.path)
        return (_rebuild, (self.dataset, self.seq_len, kwargs))

    def __repr__(self) -> str:
        kind = "packed" if self.packed else "documents"
        return (
            f"TokenSequences({str(self.dataset.root)!r}, seq_len={self.seq_len}, {kind}, "
            f"tokens={self._index.total}, sequences={self._len})"
        )


def _rebuild(dataset, seq_len, kwargs):
    return __getattr__("TokenSequences")(dataset, seq_len, **kwargs)


def _make_sequences() -> dict:
    cls = torch_subclass(_TokenSequences, "Dataset", __name__, "TokenSequences")
    return {"TokenSequences": cls}


# ``TokenSequences`` subclasses torch's Dataset: made on first lookup (_compat.py).
__getattr__, __dir__ = lazy_classes(globals(), {"TokenSequences": _make_sequences})
