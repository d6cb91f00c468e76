"""Mixtures: train on several datasets at chosen proportions, exactly, resumably, at block speed.

``MixtureDataset(sources)`` is one map-style dataset over a dict of named datasets: index ``i``
of the mixture is index ``j`` of one source (``locate(i)`` says which). ``MixtureSampler``
decides which source fills each position of the training stream and yields mixture indices:

- **Exact proportions.** Positions are cut into windows (by default one global batch). Within
  a stage of the weight schedule, the number of examples each source has given after ``t``
  windows is the largest-remainder rounding of ``t * window * weight`` (the quota of each
  window is its target plus the remainder carried from the windows before, rounded): it never
  drifts from the exact proportion by one example or more, and each window's count is its
  carried target rounded down or up. Within a window the sources are interleaved evenly
  (source ``s``'s ``j``-th example sits at ``(j + 1/2) / q_s`` of the window), so any slice
  of it, such as one rank's share, holds about its proportion too.
- **Block speed.** A source's examples come in its own block-shuffled order (the passes of
  ``BlockShuffleSampler``: blocks permuted, examples shuffled within windows of
  ``window_blocks`` blocks), so the mixture decodes whole blocks; a small source is read
  pass after pass (each reshuffled), a large one only as far as its share takes it.
- **A pure function of (seed, schedule, position)**, computed arithmetically: resuming at any
  position costs O(stages x sources) (the past is never replayed); it does not depend on the
  number of DataLoader workers, nor on the number of ranks at a fixed global batch size.
  Each source's consumed examples are always a prefix of its order.
- **Token sources.** Sources that are packed ``TokenSequences`` make a mixture of rows of
  tokens: a position is a row, every row of a step has the step's ``seq_len`` (a
  ``seq_len_schedule`` may change it at given steps), so the example proportions are token
  proportions. A token source is read in the token order of ``TokenShuffleSampler`` (one
  lane), its rows cut at the length of the step that reads them from where its pass stands.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import math
import numbers
from bisect import bisect_right
from collections import deque
from collections.abc import Mapping
from decimal import Decimal
from fractions import Fraction
from operator import itemgetter
from types import MappingProxyType

import numpy as np

from ._checks import check_state
from ._compat import lazy_classes, torch_subclass
from ._contract import normalize_index
from ._errors import InvalidArgumentError, InvalidArgumentTypeError
from ._order import (
    BlockOrder,
    begin_iteration,
    block_lengths,
    check_int,
    distributed_defaults,
)

# The token classes' bodies: their public classes, over torch's bases, are made on first
# lookup (_compat.lazy_classes), which would import torch with this module.
from .token_sampler import _check_schedule
from .token_sampler import _TokenShuffleSampler as TokenShuffleSampler
from .tokens import _TokenSequences as TokenSequences

__all__ = ["MixtureDataset", "MixtureSampler", "from_config"]  # noqa: F822 (see __getattr__)

# Per-window targets are exact when their common denominator is at most this; otherwise
# they are rounded to multiples of 1/_QUANTUM of an example (the proportions then hold to
# within one example per _QUANTUM windows).
_QUANTUM = 1 << 32
# Positions ahead of the one handed out whose blocks are named to the sources' read-ahead,
# and how many blocks named may wait ahead at most (what the compiled read-ahead holds).
_HORIZON = 1024
_AHEAD_BLOCKS = 16
# Positions generated at once (whole windows, at least one): the vectorised unit.
_CHUNK = 8192


# -- the mixture dataset ----------------------------------------------------------------------


class MixtureDataset:
    """A map-style dataset over named datasets: indices ``0 .. len(sources[a]) - 1`` are the
    first source's, the next ones the second's, in the order of ``sources`` (a dict of name ->
    dataset: AtlasDataset, AtlasDatasetShard or any dataset with ``__len__`` and
    ``__getitem__``; ``MixtureSampler`` needs Atlas datasets, whose blocks it knows).

    ``locate(i)`` is ``(name, index in that source)``; ``index(name, j)`` the inverse.
    ``__getitems__`` (what a DataLoader calls for a batch) reads each source's share with the
    source's own ``__getitems__``. Picklable when the sources are (DataLoader workers).

    **Token sources**: when the sources are packed ``TokenSequences`` (all of them, with one
    ``dtype``, and ``varlen`` and ``compact`` alike: compact sources whose ids call for
    different dtypes need ``dtype=`` given), a key is also ``(name, key of that source)`` (a window
    number, or the tuple of token ranges ``MixtureSampler`` and ``TokenShuffleSampler``
    give), and ``__getitems__`` returns one dict of 2-D arrays, row ``r`` read for key
    ``r``, as ``TokenSequences.__getitems__`` does (with ``varlen``, ``cu_seqlens`` and
    ``max_seqlen`` of the whole batch; compact sources, a compact batch). Rows of a batch
    must have one length. ``token_rows``
    says whether the sources are token sources.
    """

    def __init__(self, sources: Mapping) -> None:
        if not isinstance(sources, Mapping):
            raise TypeError(
                f"MixtureDataset takes a dict of name -> dataset, not {type(sources).__name__}"
            )
        if not sources:
            raise ValueError("MixtureDataset needs at least one source")
        for name, dataset in sources.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"source names must be non-empty strings, not {name!r}")
            if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
                raise TypeError(
                    f"source {name!r}: a dataset needs __len__ and __getitem__ "
                    f"({type(dataset).__name__} has not)"
                )
        self._sources = dict(sources)
        self._setup()

    def _setup(self) -> None:
        self.names = tuple(self._sources)
        self._datasets = [self._sources[name] for name in self.names]
        self._position = {name: k for k, name in enumerate(self.names)}
        sizes = np.array([len(d) for d in self._datasets], dtype=np.int64)
        self._ends = np.cumsum(sizes)
        self._starts = self._ends - sizes
        self._ends_list = self._ends.tolist()
        self._starts_list = self._starts.tolist()
        self._total = int(self._ends[-1])
        # Per source: a function of a list of indices returning their examples.
        self._readers = [_batch_reader(d) for d in self._datasets]
        self.token_rows = _token_sources(self.names, self._datasets)

    def __getstate__(self) -> dict:
        return {"sources": self._sources}

    def __setstate__(self, state) -> None:
        self._sources = state["sources"]
        self._setup()

    @property
    def sources(self) -> Mapping:
        """The sources, by name (read-only)."""
        return MappingProxyType(self._sources)

    def __len__(self) -> int:
        return self._total

    def source_range(self, name: str) -> range:
        """The mixture indices of source ``name``."""
        k = self._index_of(name)
        return range(self._starts_list[k], self._ends_list[k])

    def _index_of(self, name: str) -> int:
        try:
            return self._position[name]
        except (KeyError, TypeError):
            raise KeyError(
                f"no source named {name!r} (the mixture has {_listed(self.names)})"
            ) from None

    def locate(self, i) -> tuple:
        """``(source name, index within it)`` of mixture index ``i`` (negative counts from
        the end); IndexError outside."""
        k = normalize_index(i, self._total)
        s = bisect_right(self._ends_list, k)
        return self.names[s], k - self._starts_list[s]

    def index(self, name: str, j) -> int:
        """The mixture index of example ``j`` of source ``name``."""
        k = self._index_of(name)
        return self._starts_list[k] + normalize_index(j, self._ends_list[k] - self._starts_list[k])

    def __getitem__(self, i):
        if isinstance(i, tuple) and self.token_rows:
            s, key = self._token_key(i)
            return self._datasets[s][key]
        name, j = self.locate(i)
        return self._sources[name][j]

    def _token_key(self, key) -> tuple:
        """(source, key of that source) of a key of a token mixture."""
        if isinstance(key, tuple):
            if len(key) != 2 or not isinstance(key[0], str):
                raise InvalidArgumentTypeError(
                    f"a key of a token mixture is an int or (source name, key), not {key!r}"
                )
            return self._index_of(key[0]), key[1]
        name, j = self.locate(key)
        return self._position[name], j

    def _split(self, indices):
        """(source of each index, index within it) as arrays, all checked as ``locate``."""
        idx = np.asarray(indices)
        if idx.ndim != 1 or (len(idx) and idx.dtype.kind not in "iu"):
            idx = np.array([normalize_index(i, self._total) for i in indices], dtype=np.int64)
        elif len(idx) and not (0 <= idx.min() and idx.max() < self._total):
            idx = idx.astype(np.int64)
            bad = (idx < -self._total) | (idx >= self._total)
            if bad.any():
                normalize_index(int(idx[np.argmax(bad)]), self._total)  # raises
            idx = np.where(idx < 0, idx + self._total, idx)
        src = np.searchsorted(self._ends, idx, side="right")
        return src, idx - self._starts[src]

    def __getitems__(self, indices) -> list:
        """The examples at ``indices``, in that order: each source's share read at once (a
        token mixture: one dict of 2-D arrays, see the class's docstring)."""
        if self.token_rows:
            return self._token_batch(indices)
        if not len(indices):
            return []
        src, local = self._split(indices)
        counts = np.bincount(src)
        if counts[src[0]] == len(src):  # one source
            return self._read(int(src[0]), local.tolist())
        counts = counts.tolist()
        order = np.argsort(src, kind="stable")
        local = local[order].tolist()
        got: list = []
        pos = 0
        readers = self._readers
        for s, n in enumerate(counts):
            if n:
                got += readers[s](local[pos : pos + n])
                pos += n
        back = np.empty_like(order)
        back[order] = np.arange(len(order))
        return list(itemgetter(*back.tolist())(got))

    def _token_batch(self, keys) -> dict:
        """The rows of ``keys`` as one dict of 2-D arrays: each source's rows read by one
        call, straight into their rows of the batch."""
        keys = list(keys)
        where: dict = {}  # source -> (rows, their keys)
        length = None
        for r, key in enumerate(keys):
            s, k = self._token_key(key)
            n = sum(k[1::2]) if isinstance(k, tuple) else self._datasets[s].seq_len
            if length is None:
                length = n
            elif n != length:
                raise InvalidArgumentError(
                    f"the rows of a batch must have one length: key {r} ({key!r}) has {n} "
                    f"tokens, key 0 {length}"
                )
            rows, ks = where.setdefault(s, ([], []))
            rows.append(r)
            ks.append(k)
        first = self._datasets[0]
        shape = (len(keys), first.seq_len if length is None else length)
        out = {
            "inputs": np.zeros(shape, first.dtype),
            "targets": np.zeros(shape, first.dtype),
            "positions": np.zeros(shape, first._positions_dtype),
        }
        into = (out["targets"], out["inputs"], out["positions"])
        for s, (rows, ks) in where.items():
            self._datasets[s]._packed(ks, into=(*into, np.array(rows, dtype=np.int64)))
        if first.varlen or first.compact:  # each row's start, and where each range starts
            starts = [
                r * shape[1] + offset
                for r, key in enumerate(keys)
                for offset in _range_offsets(self._token_key(key)[1])
            ]
            starts = np.array(starts, np.int64)
            if first.compact:
                return TokenSequences._compact(
                    out["targets"], out["inputs"], out["positions"], starts
                )
            out.update(TokenSequences._varlen(out["positions"], starts))
        return out

    def _read(self, s: int, local: list) -> list:
        out = self._readers[s](local)
        return out if type(out) is list else list(out)

    def prefetch(self, indices) -> bool:
        """A hint: the blocks of ``indices`` are read next; passed on to each source's
        ``prefetch`` (see ``AtlasDataset``). False once no source can use hints."""
        if not len(indices):
            return True
        if self.token_rows:
            return False
        src, local = self._split(indices)
        useful = False
        for s in dict.fromkeys(src.tolist()):
            prefetch = getattr(self._datasets[s], "prefetch", None)
            if prefetch is not None:
                useful = prefetch(local[src == s].tolist()) is not False or useful
        return useful

    def close(self) -> None:
        """Close every source that can be closed."""
        for dataset in self._datasets:
            close = getattr(dataset, "close", None)
            if close is not None:
                close()

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}={len(d)}" for n, d in zip(self.names, self._datasets))
        return f"MixtureDataset({parts})"


def _token_sources(names, datasets) -> bool:
    """Whether the sources are token sources (packed TokenSequences alike in dtype, varlen
    and compact); a mixture of token sources and others is refused."""
    tokens = [isinstance(d, TokenSequences) for d in datasets]
    if not any(tokens):
        return False
    if not all(tokens):
        other = names[tokens.index(False)]
        raise InvalidArgumentTypeError(
            f"source {other!r} is not a TokenSequences, but {names[tokens.index(True)]!r} is: "
            "a mixture's sources are all token sequences or none"
        )
    for name, d in zip(names, datasets):
        if not d.packed:
            raise InvalidArgumentError(
                f"source {name!r}: a mixture of token sources reads packed rows, and these "
                "are documents (packed=False)"
            )
        for what in ("dtype", "varlen", "compact"):
            if getattr(d, what) != getattr(datasets[0], what):
                raise InvalidArgumentError(
                    f"source {name!r} has {what}={getattr(d, what)!r}, {names[0]!r} "
                    f"{getattr(datasets[0], what)!r}: the rows of a batch are one array"
                )
    return True


def _range_offsets(key) -> list:
    """Where each range of a token key starts in its row (a window number: one range)."""
    if not isinstance(key, tuple):
        return [0]
    return list(itertools.accumulate(key[1:-1:2], initial=0))


def _batch_reader(dataset):
    """``dataset.__getitems__``, or a function reading a batch one example at a time."""
    batch = getattr(dataset, "__getitems__", None)
    if batch is not None:
        return batch
    return lambda local: [dataset[j] for j in local]


def _source_blocks(name: str, dataset) -> np.ndarray:
    try:
        return block_lengths(dataset)
    except TypeError:
        raise TypeError(
            f"source {name!r}: MixtureSampler needs an AtlasDataset or AtlasDatasetShard, "
            f"not {type(dataset).__name__}"
        ) from None


def _listed(names) -> str:
    return ", ".join(repr(n) for n in names) or "none"


# -- weights and stages -----------------------------------------------------------------------


def _weight(where: str, value) -> Fraction:
    """A weight as an exact fraction: a float as written (``0.6`` is 3/5), or a string such
    as ``"2/7"`` (plain data has no fractions)."""
    if isinstance(value, str):
        try:
            value = Fraction(value.strip())
        except (ValueError, ZeroDivisionError):
            raise TypeError(
                f"{where} must be a number, or a string such as '2/7', not {value!r}"
            ) from None
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, Decimal)):
        raise TypeError(f"{where} must be a number, not {type(value).__name__}")
    if isinstance(value, numbers.Integral):
        value = Fraction(int(value))
    elif isinstance(value, (Fraction, Decimal)):
        if isinstance(value, Decimal) and not value.is_finite():
            raise ValueError(f"{where} must be finite, not {value}")
        value = Fraction(value)
    else:
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"{where} must be finite, not {value}")
        value = Fraction(repr(value))
    if value < 0:
        raise ValueError(f"{where} must not be negative, not {value}")
    return value


def _plain(weights: dict) -> dict:
    """``weights`` as plain data: ints and floats as they are, other numbers as strings
    (``"2/7"``) that ``_weight`` reads back exactly."""
    return {
        name: value if type(value) in (int, float, str) else str(value)
        for name, value in weights.items()
    }


class _Stage:
    """One stage of the schedule: from global step ``step`` on, ``names`` (the sources of
    positive weight, sorted) get ``targets[k] / denominator`` examples per window."""

    __slots__ = ("step", "weights", "names", "targets", "denominator", "cols")

    def __init__(self, step, weights, names, targets, denominator) -> None:
        self.step = step
        self.weights = weights  # as given: name -> number
        self.names = names
        self.targets = targets  # ints, summing to window * denominator
        self.denominator = denominator
        self.cols = None  # the names' positions in the mixture (set by the plan)

    def as_data(self) -> dict:
        return {
            "step": self.step,
            "weights": _plain(self.weights),
            "targets": dict(zip(self.names, self.targets)),
            "denominator": self.denominator,
        }


def _targets(shares: dict, window: int) -> tuple:
    """(names, targets, denominator): ``shares`` (name -> Fraction, summing to 1) as integer
    examples per window over a common denominator, exact when it is at most _QUANTUM."""
    names = tuple(sorted(shares))
    exact = [window * shares[n] for n in names]
    denominator = math.lcm(*(x.denominator for x in exact))
    if denominator <= _QUANTUM:
        return names, tuple(int(x * denominator) for x in exact), denominator
    denominator = _QUANTUM
    scaled = [x * denominator for x in exact]
    targets = [math.floor(x) for x in scaled]
    short = window * denominator - sum(targets)
    order = sorted(range(len(names)), key=lambda k: (-(scaled[k] - targets[k]), k))
    for k in order[:short]:
        targets[k] += 1
    return names, tuple(targets), denominator


def _cumulative(targets, denominator: int, window: int, t: int) -> list:
    """Examples of each source after ``t`` windows of a stage: the largest-remainder rounding
    of ``t * targets / denominator`` (ties to the earlier name). Exact integers."""
    floors = [t * a // denominator for a in targets]
    remainders = [t * a % denominator for a in targets]
    short = t * window - sum(floors)
    for k in sorted(range(len(targets)), key=lambda k: (-remainders[k], k))[:short]:
        floors[k] += 1
    return floors


def _cumulative_rows(targets: np.ndarray, denominator: int, window: int, t0: int, rows: int):
    """``_cumulative`` for ``t = t0 .. t0 + rows``, as a (rows + 1, sources) int64 array."""
    a = [int(x) for x in targets]
    base = np.array([t0 * x // denominator for x in a], dtype=np.int64)
    rest = np.array([t0 * x % denominator for x in a], dtype=np.int64)
    i = np.arange(rows + 1, dtype=np.int64)[:, None]
    r = rest + i * targets  # < 2**62 (see _rows_limit)
    floors = base + r // denominator
    remainders = r % denominator
    short = (t0 + i[:, 0]) * window - floors.sum(axis=1)
    order = np.argsort(-remainders, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(len(a))[None, :], axis=1)
    return floors + (rank < short[:, None])


def _rows_limit(stage) -> int:
    """Windows one _cumulative_rows call may span without overflowing int64."""
    return max(1, ((1 << 62) - stage.denominator) // max(max(stage.targets), 1))


# -- the schedule, as positions -----------------------------------------------------------------


class _Plan:
    """The schedule laid out over windows: each stage's first window and the examples every
    source had given before it (O(stages x sources) to build)."""

    def __init__(self, stages: list, window: int, batch: int, sources: int) -> None:
        self.stages = stages
        self.window = window
        self.firsts = [s.step * batch // window for s in stages]  # first window of each
        self._arrangements: dict = {}  # quotas (bytes) -> _arrangement
        self.before = []  # per stage: examples of every mixture source before it
        consumed = np.zeros(sources, dtype=np.int64)
        for k, stage in enumerate(stages):
            self.before.append(consumed.copy())
            if k + 1 < len(stages):
                t = self.firsts[k + 1] - self.firsts[k]
                consumed[stage.cols] += _cumulative(stage.targets, stage.denominator, window, t)

    def stage_of(self, n: int) -> int:
        return bisect_right(self.firsts, n) - 1

    def consumed(self, n: int) -> np.ndarray:
        """Examples of every source given by windows ``0 .. n - 1``."""
        k = self.stage_of(n)
        stage = self.stages[k]
        out = self.before[k].copy()
        out[stage.cols] += _cumulative(
            stage.targets, stage.denominator, self.window, n - self.firsts[k]
        )
        return out

    def end_of_stage(self, n: int):
        """The first window of the stage after window ``n``'s, or None."""
        k = self.stage_of(n)
        return self.firsts[k + 1] if k + 1 < len(self.firsts) else None

    def windows(self, n0: int, n1: int):
        """Positions ``n0 * window .. n1 * window`` (windows of one stage): the source (its
        column in ``before``) and the source's stream position at each, as arrays; the
        stage's sources (``cols``) and their stream positions at each window boundary
        (``bounds``, ``(n1 - n0 + 1, len(cols))``)."""
        k = self.stage_of(n0)
        stage = self.stages[k]
        rows = n1 - n0
        targets = np.array(stage.targets, dtype=np.int64)
        counts = _cumulative_rows(
            targets, stage.denominator, self.window, n0 - self.firsts[k], rows
        )
        quotas = np.diff(counts, axis=0)
        bounds = self.before[k][stage.cols] + counts
        sources = np.empty((rows, self.window), dtype=np.int64)
        within = np.empty((rows, self.window), dtype=np.int64)
        for r in range(rows):
            sources[r], within[r] = self._arrangement(quotas[r])
        stream = np.take_along_axis(bounds[:-1], sources, axis=1) + within
        return stage.cols[sources].ravel(), stream.ravel(), stage.cols, bounds

    def _arrangement(self, quotas: np.ndarray) -> tuple:
        """A window's order of its stage's sources for these ``quotas``: source ``s``'s
        ``j``-th example at ``(j + 1/2) / quotas[s]`` of the window, ties to the earlier name;
        (source, j) per position. Windows repeat few quota vectors: they are kept."""
        key = quotas.tobytes()
        found = self._arrangements.get(key)
        if found is None:
            source = np.repeat(np.arange(len(quotas)), quotas)
            starts = np.cumsum(quotas) - quotas
            j = np.arange(len(source), dtype=np.int64) - np.repeat(starts, quotas)
            order = np.argsort((j + 0.5) / np.repeat(quotas, quotas), kind="stable")
            found = (source[order], j[order])
            if len(self._arrangements) >= 4096:
                self._arrangements.clear()
            self._arrangements[key] = found
        return found


class _Stream:
    """Source ``name``'s examples in order, pass after pass (pass ``e`` is its BlockOrder's
    order ``e``), read forward through a buffer of whole windows."""

    def __init__(self, order: BlockOrder) -> None:
        self.order = order
        self.n = order.n
        self._lo = 0  # stream positions in the buffer: lo .. lo + len(buf)
        self._buf = np.zeros(0, dtype=np.int64)

    def take(self, lo: int, hi: int) -> np.ndarray:
        """The source's indices at stream positions ``lo .. hi``."""
        end = self._lo + len(self._buf)
        if not self._lo <= lo <= end:
            self._lo, self._buf, end = lo, self._buf[:0], lo
        parts = [self._buf[lo - self._lo :]]
        while end < hi:
            epoch, offset = divmod(end, self.n)
            want = min(self.n, offset + (hi - end))
            stop = self.order.window_at(epoch, want - 1)[1]  # whole windows
            parts.extend(self.order.windows(epoch, offset, stop))
            end += stop - offset
        self._buf = np.concatenate(parts) if len(parts) > 1 else parts[0]
        self._lo = lo
        return self._buf[: hi - lo]


class _Run:
    """One iteration's state: the sources' streams, and the blocks named to them ahead
    (each window of a source's order once, when its first example is ``_HORIZON``
    positions ahead)."""

    def __init__(self, sampler, naming: bool) -> None:
        self.sampler = sampler
        self.streams: dict = {}  # column -> _Stream
        self.naming = naming
        self.named: dict = {}  # column -> (pass, window) named last
        self.events: list = []  # heap of (position, seq, column, block starts)
        self.seq = 0
        self.named_ahead: deque = deque()  # (position, blocks) named and not reached yet
        self.ahead = 0  # their blocks
        datasets = sampler.mixture._datasets
        self.prefetch = [getattr(d, "prefetch", None) for d in datasets] if naming else None

    def stream(self, c: int) -> _Stream:
        found = self.streams.get(c)
        if found is None:
            found = self.streams[c] = _Stream(self.sampler._order(self.sampler.names[c]))
        return found

    def windows_read(self, c: int, lo: int, hi: int, bounds: np.ndarray, n0: int) -> None:
        """Source ``c`` gives stream positions ``lo .. hi`` in windows ``n0 ..`` (``bounds``:
        its stream position at each window boundary): note the windows of its order they
        enter, at the position where each is entered."""
        if not self.naming or self.prefetch[c] is None:
            return
        order = self.sampler._order(self.sampler.names[c])
        n = order.n
        named = self.named.get(c)
        u = lo
        while u < hi:
            epoch, offset = divmod(u, n)
            perm, _, starts, window_ends, _ = order.layout(epoch)
            k = int(np.searchsorted(window_ends, offset, side="right"))
            if named is None or (epoch, k) > named:
                row = int(np.searchsorted(bounds, u, side="right")) - 1
                position = (n0 + row) * self.sampler.window
                blocks = order.starts[perm[starts[k] : starts[k + 1]]]
                heapq.heappush(self.events, (position, self.seq, c, blocks))
                self.seq += 1
                named = (epoch, k)
            u = epoch * n + int(window_ends[k])
        self.named[c] = named

    def name_until(self, current: int, limit: int) -> None:
        """Name to their sources the windows entered before position ``limit``, in order,
        while the blocks named and not reached by position ``current`` fit the read-ahead
        (_AHEAD_BLOCKS; a window is always named once nothing is ahead)."""
        named = self.named_ahead
        while named and named[0][0] < current:
            self.ahead -= named.popleft()[1]
        events = self.events
        while events and events[0][0] < limit:
            size = len(events[0][3])
            if self.ahead and self.ahead + size > _AHEAD_BLOCKS:
                return
            position, _, c, blocks = heapq.heappop(events)
            prefetch = self.prefetch[c]
            if prefetch is None:
                continue
            if prefetch(blocks.tolist()) is False:
                self.prefetch[c] = None  # of no use to this source
            named.append((position, size))
            self.ahead += size


def _name_entropy(name: str) -> tuple:
    """Four 32-bit words of the SHA-256 of ``name``: a source's order depends on its name, not
    on its place in the mixture."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return tuple(int.from_bytes(digest[k : k + 4], "little") for k in range(0, 16, 4))


def _token_seed(seed: int, name: str) -> int:
    """The seed of a token source's order: the mixture's seed and the source's name."""
    words = _name_entropy(name)
    return (seed << 128) | sum(w << (32 * k) for k, w in enumerate(words))


def _advance(cursor: tuple, rows: int, length: int, tokens: int) -> tuple:
    """``(pass, offset)`` after ``rows`` rows of ``length`` from ``cursor`` in passes of
    ``tokens`` tokens, a row that would run past its pass's end starting the next pass."""
    e, o = cursor
    if rows <= 0:
        return cursor
    fit = max(0, (tokens - o) // length)
    if rows <= fit:
        return e, o + rows * length
    q, r = divmod(rows - fit, tokens // length)
    return (e + q, tokens // length * length) if r == 0 else (e + 1 + q, r * length)


class _TokenSource:
    """A token source as a mixture reads it: pass ``e`` is epoch ``e`` of ``order`` (a
    ``TokenShuffleSampler`` of one lane, one rank, batches of one row), its token stream cut
    into rows in turn, each of the length of the step that reads it; a row that would run
    past the pass's end starts the next pass (what is left, less than a row, is not read in
    that pass). ``phases``: ``(first rows, cursors, lengths)`` of the seq_len schedule's
    steps: the rows read before each, where the pass stood then, the length from then on."""

    def __init__(self, sequences, seed, piece_tokens, group_pieces, window_blocks) -> None:
        self.order = TokenShuffleSampler(
            sequences,
            batch_size=1,
            seed=seed,
            lanes=1,
            piece_tokens=piece_tokens,
            group_pieces=group_pieces,
            window_blocks=window_blocks,
            num_replicas=1,
            rank=0,
        )
        self.tokens = sequences.num_tokens

    def phases(self, firsts: list, lengths: list) -> tuple:
        cursors = [(0, 0)]
        for k in range(1, len(firsts)):
            rows = firsts[k] - firsts[k - 1]
            cursors.append(_advance(cursors[-1], rows, lengths[k - 1], self.tokens))
        return firsts, cursors, lengths

    def cursor(self, phases: tuple, j: int) -> tuple:
        """``(pass, offset)`` after the source's first ``j`` rows."""
        firsts, cursors, lengths = phases
        k = bisect_right(firsts, j) - 1
        return _advance(cursors[k], j - firsts[k], lengths[k], self.tokens)

    def rows(self, phases: tuple, lo: int, hi: int) -> list:
        """The keys of the source's rows ``lo .. hi`` (its stream positions)."""
        firsts, _, lengths = phases
        keys: list = []
        order = self.order
        while lo < hi:
            k = bisect_right(firsts, lo) - 1
            length = lengths[k]
            e, o = self.cursor(phases, lo)
            if o + length > self.tokens:
                e, o = e + 1, 0
            end = hi if k + 1 == len(firsts) else min(hi, firsts[k + 1])
            n = min(end - lo, (self.tokens - o) // length)
            keys += order._rows(order._layout(e), 0, o, n, length)
            lo += n
        return keys


# -- the sampler ----------------------------------------------------------------------------------


class _MixtureSampler:
    """Which source fills each position of a training stream, as indices of a MixtureDataset.

    ``weights``: source name -> weight, relative (normalised to sum 1); a source left out (or
    of weight 0) gives nothing. By default the weights count examples; ``unit="tokens"`` makes
    them count tokens, given ``tokens``: source name -> the source's total token count, or a
    function of an example returning its token count (applied to every example of every
    source once, here: for small sources; give the totals for large ones). Token weights become
    example weights through each source's mean tokens per example, so the token proportions
    hold on average while the example proportions hold exactly.

    ``global_batch_size`` examples form a step (all ranks together); ``window`` positions
    (default: the global batch) get their quotas together (see the module docstring). A
    schedule changes the weights at given steps: ``schedule=[(0, weights), (10_000, other)]``,
    or ``set_weights(other, at_step=10_000)``; a stage starts at a window boundary, and may add
    sources or drop them. ``window_blocks`` (int, or name -> int) is each source's shuffle
    window in blocks, as for ``BlockShuffleSampler`` (``2 * window_blocks`` blocks are reserved
    in each source's cache).

    An epoch is ``epoch_length`` positions of the endless stream (default: as many as the
    sources of the first stage hold together, rounded down to whole steps; at least one
    step); ``set_epoch(e)`` selects positions ``e * epoch_length ..`` as with a
    DistributedSampler, and ``len(sampler)`` is this rank's share of an epoch. A source that
    runs out starts its next pass (reshuffled); ``max_repeats`` (int, or name -> int) refuses
    a schedule under which a source would be read more than that many times within
    ``total_steps`` steps (default: one epoch).

    Ranks (``num_replicas``/``rank``, by default from torch.distributed) split each global batch
    into contiguous equal shares: rank ``r`` gets its positions ``r * b .. (r + 1) * b`` with
    ``b = global_batch_size // num_replicas`` (``batch_size``, the per-rank DataLoader batch
    size). The stream of global batches does not depend on the number of ranks or of
    DataLoader workers.

    ``state_dict()``/``load_state_dict()`` resume exactly (also with another number of workers,
    or of ranks at a step boundary), holding the schedule; ``state_dict(step=k)`` is the state
    after ``k`` global steps (what a training loop knows; the sampler itself runs ahead of
    training behind a DataLoader that prefetches). torchdata's StatefulDataLoader saves and
    restores it by itself.

    **Token sources** (a mixture of packed ``TokenSequences``): a position is a row and every
    row of a step has that step's length, so the weights count tokens (``unit`` is
    ``"tokens"``, ``tokens`` is not needed) and a global batch holds each source's exact
    share of its tokens, rounded to whole rows. ``seq_len_schedule=[(0, 512), (10_000,
    2048)]`` (first global step, row length; default: the sources' ``seq_len``, which must
    then agree) changes the length at any step. The sampler yields keys ``(name, ranges)``,
    which ``MixtureDataset`` reads. Source ``name`` is read in the token order of a
    ``TokenShuffleSampler`` of one lane (its passes that sampler's epochs, with a seed made of
    the mixture's and the source's name, and ``group_pieces`` from ``window_blocks``);
    ``piece_tokens`` (int, or name -> int; default: the first row length) is that sampler's:
    give the longest row length, so that rows never split a piece. Each row takes the next
    tokens of its source's pass, so a length change repeats or skips no token; a row that
    would run past the pass's end starts the next pass (the rest, less than a row, is left
    out of that pass).
    """

    def __init__(
        self,
        mixture: MixtureDataset,
        weights=None,
        *,
        global_batch_size,
        seed=0,
        schedule=None,
        window=None,
        unit=None,
        tokens=None,
        epoch_length=None,
        max_repeats=None,
        total_steps=None,
        window_blocks=8,
        num_replicas=None,
        rank=None,
        seq_len_schedule=None,
        piece_tokens=None,
    ):
        if not isinstance(mixture, MixtureDataset):
            raise TypeError(f"MixtureSampler needs a MixtureDataset, not {type(mixture).__name__}")
        self.mixture = mixture
        self.names = mixture.names
        self.global_batch_size = check_int("global_batch_size", global_batch_size, 1)
        self.seed = check_int("seed", seed, 0)
        self.window = self.global_batch_size if window is None else check_int("window", window, 1)
        if num_replicas is None or rank is None:
            world, own = distributed_defaults()
            num_replicas = world if num_replicas is None else num_replicas
            rank = own if rank is None else rank
        self.num_replicas = check_int("num_replicas", num_replicas, 1)
        self.rank = check_int("rank", rank, 0)
        if self.rank >= self.num_replicas:
            raise ValueError(f"rank must be below num_replicas ({self.num_replicas}), not {rank}")
        if self.global_batch_size % self.num_replicas:
            raise ValueError(
                f"global_batch_size ({self.global_batch_size}) must be a multiple of "
                f"num_replicas ({self.num_replicas})"
            )
        self.batch_size = self.global_batch_size // self.num_replicas
        self._token_rows = mixture.token_rows
        if self._token_rows:
            unit = self._token_unit(unit, tokens)
        elif seq_len_schedule is not None or piece_tokens is not None:
            raise InvalidArgumentError(
                "seq_len_schedule and piece_tokens are for a mixture of TokenSequences"
            )
        elif unit is None:
            unit = "examples"
        if unit not in ("examples", "tokens"):
            raise ValueError(f"unit must be 'examples' or 'tokens', not {unit!r}")
        self.unit = unit
        self._lengths = {name: len(d) for name, d in mixture.sources.items()}
        if self._token_rows:
            self._tokens = {n: d.num_tokens for n, d in mixture.sources.items()}
        else:
            self._tokens = self._token_totals(tokens) if unit == "tokens" else None
        if unit == "examples" and tokens is not None:
            raise ValueError("tokens is for unit='tokens'")
        self.window_blocks = self._per_source("window_blocks", window_blocks, 1)
        self._max_repeats = (
            None if max_repeats is None else self._per_source("max_repeats", max_repeats, 1)
        )
        self.seq_len_schedule = None
        self._token_params = {}  # token source -> (piece_tokens, group_pieces), None: defaults
        if self._token_rows:
            self.seq_len_schedule = self._seq_lens(seq_len_schedule)
            pieces = (
                {} if piece_tokens is None else self._per_source("piece_tokens", piece_tokens, 1)
            )
            self._token_params = {n: (pieces.get(n), None) for n in self.names}
            self._blocks = {}
        else:
            self._blocks = {name: _source_blocks(name, d) for name, d in mixture.sources.items()}
            for name, dataset in mixture.sources.items():
                reserve = getattr(dataset, "cache_reserve", None)
                if reserve is not None:
                    reserve(2 * self.window_blocks[name])
        self._token_sources: dict = {}  # name -> _TokenSource
        self._phases_of = (None, None)  # (schedule version, name -> phases)
        for name in self._token_params:  # now: each reserves its blocks in its source's cache
            self._token_source(name)  # before a DataLoader's workers copy the datasets

        if (weights is None) == (schedule is None):
            raise ValueError("give weights or a schedule (one of them)")
        if schedule is None:
            schedule = [(0, weights)]
        self._stages = self._build_schedule(schedule)
        first = self._stages[0]
        if epoch_length is None and self._token_rows:
            rows = self.seq_len_schedule[0][1]
            held = sum(self._tokens[n] // rows for n in first.names)
            epoch_length = max(1, held // self.global_batch_size) * self.global_batch_size
        elif epoch_length is None:
            held = sum(self._lengths[n] for n in first.names)
            steps = max(1, held // self.global_batch_size)
            epoch_length = steps * self.global_batch_size
        self.epoch_length = check_int("epoch_length", epoch_length, 1)
        if self.epoch_length % self.global_batch_size:
            raise ValueError(
                f"epoch_length ({self.epoch_length}) must be a multiple of global_batch_size "
                f"({self.global_batch_size})"
            )
        self.total_steps = (
            self.epoch_length // self.global_batch_size
            if total_steps is None
            else check_int("total_steps", total_steps, 1)
        )
        self._plan = self._lay_out(self._stages)
        self._check_repeats(self._plan)
        self.epoch = 0
        self._orders = {}  # name -> BlockOrder (made on first use)
        self._counted = None  # the current (or last) iteration's Counted
        self._iteration = None  # (epoch, first global position) of it
        self._resume = None  # (epoch, yielded) from load_state_dict, for the next iteration
        self._version = 0  # bumped by every schedule change

    # -- arguments ------------------------------------------------------------------------

    @staticmethod
    def _token_unit(unit, tokens) -> str:
        if unit not in (None, "tokens"):
            raise InvalidArgumentError(
                f"unit={unit!r}: the sources are token sequences, whose rows of a step have one "
                "length: the weights count tokens (leave unit out, or give 'tokens')"
            )
        if tokens is not None:
            raise InvalidArgumentError(
                "tokens: the sources are token sequences, whose token counts are known"
            )
        return "tokens"

    def _seq_lens(self, schedule) -> tuple:
        """The seq_len schedule, ``((first step, length), ...)``; every token source must
        hold a row of the longest."""
        if schedule is None:
            lengths = {n: d.seq_len for n, d in self.mixture.sources.items()}
            if len(set(lengths.values())) > 1:
                raise InvalidArgumentError(
                    f"the sources' seq_len differ ({lengths}): give seq_len_schedule, "
                    "e.g. [(0, 2048)]"
                )
            schedule = [(0, next(iter(lengths.values())))]
        pairs = _check_schedule(schedule, None)
        longest = max(length for _, length in pairs)
        for name, total in self._tokens.items():
            if total < longest:
                raise InvalidArgumentError(
                    f"source {name!r} holds {total} tokens, fewer than one row of {longest}"
                )
        return pairs

    def _per_source(self, what: str, value, minimum: int) -> dict:
        if isinstance(value, Mapping):
            unknown = [n for n in value if n not in self._lengths]
            if unknown:
                raise ValueError(
                    f"{what} names unknown sources {_listed(unknown)} "
                    f"(the mixture has {_listed(self.names)})"
                )
            default = 8 if what == "window_blocks" else None
            out = {n: value.get(n, default) for n in self.names}
            return {
                n: (v if v is None else check_int(f"{what}[{n!r}]", v, minimum))
                for n, v in out.items()
            }
        value = check_int(what, value, minimum)
        return dict.fromkeys(self.names, value)

    def _token_totals(self, tokens) -> dict:
        if tokens is None:
            raise ValueError("unit='tokens' needs tokens: name -> total tokens, or a function")
        if callable(tokens):
            count = tokens
            return {n: sum(int(count(x)) for x in d) for n, d in self.mixture.sources.items()}
        if not isinstance(tokens, Mapping):
            raise TypeError(f"tokens must be a dict or a function, not {type(tokens).__name__}")
        unknown = [n for n in tokens if n not in self._lengths]
        if unknown:
            raise ValueError(
                f"tokens names unknown sources {_listed(unknown)} "
                f"(the mixture has {_listed(self.names)})"
            )
        out = {}
        for name, total in tokens.items():
            if callable(total):
                total = sum(int(total(x)) for x in self.mixture.sources[name])
            out[name] = check_int(f"tokens[{name!r}]", total, 0)
        return out

    def _stage(self, step, weights) -> _Stage:
        step = check_int("step", step, 0)
        if (step * self.global_batch_size) % self.window:
            raise ValueError(
                f"a stage must start at a window boundary: step {step} is position "
                f"{step * self.global_batch_size}, not a multiple of window ({self.window})"
            )
        if not isinstance(weights, Mapping):
            raise TypeError(
                f"weights must be a dict of name -> weight, not {type(weights).__name__}"
            )
        unknown = [n for n in weights if n not in self._lengths]
        if unknown:
            raise ValueError(
                f"weights name unknown sources {_listed(unknown)} "
                f"(the mixture has {_listed(self.names)})"
            )
        given = {n: _weight(f"the weight of {n!r}", w) for n, w in weights.items()}
        positive = {n: w for n, w in given.items() if w > 0}
        if not positive:
            raise ValueError(
                f"every weight is zero (step {step}): at least one source needs a positive weight"
            )
        for name in positive:
            if not (self._tokens[name] if self._token_rows else self._lengths[name]):
                raise ValueError(f"source {name!r} has no examples, but weight {weights[name]}")
        if self.unit == "tokens" and not self._token_rows:
            missing = [n for n in positive if n not in self._tokens]
            if missing:
                raise ValueError(f"no token count for {_listed(missing)} (unit='tokens')")
            for name in positive:
                if not self._tokens[name]:
                    raise ValueError(f"source {name!r} has no tokens, but weight {weights[name]}")
            positive = {n: w * self._lengths[n] / self._tokens[n] for n, w in positive.items()}
        total = sum(positive.values())
        names, targets, denominator = _targets(
            {n: w / total for n, w in positive.items()}, self.window
        )
        plain = {n: weights[n] for n in weights}
        return _Stage(step, plain, names, targets, denominator)

    def _build_schedule(self, schedule) -> list:
        stages = []
        for item in schedule:
            if isinstance(item, Mapping):
                if set(item) - {"step", "weights"} or "weights" not in item:
                    raise ValueError(f"a schedule entry is (step, weights), not {item!r}")
                step, weights = item.get("step", 0), item["weights"]
            else:
                try:
                    step, weights = item
                except (TypeError, ValueError):
                    raise ValueError(f"a schedule entry is (step, weights), not {item!r}") from None
            stages.append(self._stage(step, weights))
        if not stages or stages[0].step != 0:
            raise ValueError("the schedule must start at step 0")
        for a, b in itertools.pairwise(stages):
            if b.step <= a.step:
                raise ValueError(f"schedule steps must increase: {a.step} then {b.step}")
        return stages

    def _lay_out(self, stages) -> _Plan:
        """The plan of ``stages``. A stage restored from a state may name sources this mixture
        no longer has (``_check_present`` allows it before the resumed position): they are
        counted after the mixture's own."""
        position = {n: k for k, n in enumerate(self.names)}
        for stage in stages:
            for name in stage.names:
                position.setdefault(name, len(position))
            stage.cols = np.array([position[n] for n in stage.names], dtype=np.int64)
        return _Plan(stages, self.window, self.global_batch_size, len(position))

    def _check_repeats(self, plan: _Plan) -> None:
        if self._max_repeats is None:
            return
        end = self.total_steps * self.global_batch_size
        consumed = plan.consumed(-(-end // self.window)).tolist()
        phases = self._token_phases(plan) if self._token_rows else None
        for name, used in zip(self.names, consumed):
            cap = self._max_repeats[name]
            if cap is None:
                continue
            if phases is not None:  # passes over its tokens, the one under way in part
                size = self._tokens[name]
                e, o = self._token_source(name).cursor(phases[name], used)
                what, reads = f"{size} tokens", e + o / size
                over = e > cap or (e == cap and o > 0)
            else:
                size = self._lengths[name]
                what, reads, over = f"{size} examples", used / size, used > cap * size
            if over:
                raise ValueError(
                    f"source {name!r} ({what}) would be read {reads:.2f} times "
                    f"in {self.total_steps} steps of {self.global_batch_size} under this "
                    f"schedule, more than max_repeats={cap}: lower its weight, raise "
                    "max_repeats, or shorten total_steps"
                )

    # -- the schedule -----------------------------------------------------------------------

    @property
    def schedule(self) -> list:
        """``[(step, weights), ...]``: the stages, weights as given."""
        return [(s.step, dict(s.weights)) for s in self._stages]

    def set_weights(self, weights, *, at_step) -> None:
        """Use ``weights`` from global step ``at_step`` on, until the next stage of the
        schedule (a stage at that step is replaced). A step whose indices this sampler has
        handed out already is the past: refused. Checked as the constructor checks weights."""
        stage = self._stage(at_step, weights)
        handed = self._handed_out()
        if stage.step * self.batch_size < handed:
            raise ValueError(
                f"cannot change the weights at step {stage.step}: this sampler has handed "
                f"out indices of step {(handed - 1) // self.batch_size} already (a DataLoader "
                "runs ahead of training); choose a later step"
            )
        stages = [s for s in self._stages if s.step != stage.step] + [stage]
        stages.sort(key=lambda s: s.step)
        plan = self._lay_out(stages)
        self._check_repeats(plan)
        self._stages, self._plan = stages, plan
        self._version += 1

    # -- positions --------------------------------------------------------------------------

    def _own_before(self, p: int) -> int:
        """This rank's positions among ``0 .. p - 1``."""
        g, b = self.global_batch_size, self.batch_size
        return (p // g) * b + min(max(p % g - self.rank * b, 0), b)

    def _position_of(self, own: int) -> int:
        """The global position of this rank's ``own``-th position."""
        step, offset = divmod(own, self.batch_size)
        return step * self.global_batch_size + self.rank * self.batch_size + offset

    def _handed_out(self) -> int:
        """This rank's positions before the next index it hands out (all epochs)."""
        if self._resume is not None:
            epoch, yielded = self._resume
        elif self._counted is not None:
            epoch, yielded = self._iteration[0], self._counted.count()
        else:
            return 0
        return epoch * (self.epoch_length // self.num_replicas) + yielded

    def __len__(self) -> int:
        return self.epoch_length // self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Use positions ``epoch * epoch_length ..`` from the next iteration on."""
        self.epoch = check_int("epoch", epoch, 0)

    def consumed(self, step: int) -> dict:
        """Examples (token sources: rows) of each source that global steps ``0 .. step - 1``
        read (all ranks): always the first ones of the source's ``source_order``."""
        step = check_int("step", step, 0)
        return dict(zip(self.names, self._consumed_in(self._plan, step).tolist()))

    def _consumed_in(self, plan: _Plan, step: int) -> np.ndarray:
        p = step * self.global_batch_size
        n, rest = divmod(p, self.window)
        counts = plan.consumed(n)
        if rest:  # a step ending inside a window
            src = plan.windows(n, n + 1)[0]
            counts = counts + np.bincount(src[:rest], minlength=len(counts))
        return counts

    def source_order(self, name: str, start: int, stop: int) -> list:
        """Source ``name``'s indices at positions ``start .. stop`` of its stream: its passes
        (block-shuffled, each reshuffled), one after another, as the mixture reads them. A
        token source's are keys of rows (tuples of token ranges), of the length of the step
        that reads each."""
        self.mixture._index_of(name)
        start, stop = check_int("start", start, 0), check_int("stop", stop, 0)
        if stop <= start:
            return []
        if self._token_rows:
            return self._token_source(name).rows(self._phases()[name], start, stop)
        return _Stream(self._order(name)).take(start, stop).tolist()

    def _token_source(self, name: str) -> _TokenSource:
        found = self._token_sources.get(name)
        if found is None:
            piece, group = self._token_params[name]
            if piece is None:
                piece = self.seq_len_schedule[0][1]
            found = self._token_sources[name] = _TokenSource(
                self.mixture.sources[name],
                _token_seed(self.seed, name),
                piece,
                group,
                self.window_blocks[name],
            )
        return found

    def _token_phases(self, plan: _Plan) -> dict:
        """name -> the phases of its rows under ``plan`` (see ``_TokenSource``)."""
        before = [self._consumed_in(plan, step) for step, _ in self.seq_len_schedule]
        lengths = [length for _, length in self.seq_len_schedule]
        return {
            name: self._token_source(name).phases([int(b[c]) for b in before], lengths)
            for c, name in enumerate(self.names)
        }

    def _phases(self) -> dict:
        version, found = self._phases_of
        if version != self._version:
            found = self._token_phases(self._plan)
            self._phases_of = (self._version, found)
        return found

    def _order(self, name: str) -> BlockOrder:
        order = self._orders.get(name)
        if order is None or order.entropy[0] != self.seed:
            order = BlockOrder(
                self._blocks[name], self.window_blocks[name], (self.seed, *_name_entropy(name))
            )
            self._orders[name] = order
        return order

    # -- iterating --------------------------------------------------------------------------

    def __iter__(self):
        epoch, skip = begin_iteration(self)
        self._iteration = (epoch, skip)
        return self._counted.iterate(self._steps(epoch, skip))

    def _steps(self, epoch: int, skip: int):
        """This rank's indices of ``epoch`` after its first ``skip``, one step at a time; the
        blocks read ``_HORIZON`` positions ahead are named to the sources (prefetch)."""
        b = self.batch_size
        share = self.epoch_length // self.num_replicas
        own = epoch * share + skip  # this rank's positions before
        end = (epoch + 1) * share
        run = _Run(self, naming=True)
        lead = -(-_HORIZON // self.global_batch_size)  # steps ahead whose blocks are named
        version = None
        while own < end:
            step = own // b
            if version != self._version:  # the schedule changed: what was made is stale
                version = self._version
                made = {}  # step -> this rank's indices of it
                step_made = step
            while step_made <= min(step + lead, (end - 1) // b):
                for t, indices in self._make(step_made, run, -(-end // b)):
                    made[t] = indices
                    step_made = t + 1
            g = self.global_batch_size
            run.name_until(step * g, (step + lead + 1) * g)
            indices = made.pop(step)
            yield indices[own - step * b :]
            own = (step + 1) * b

    def _make(self, step: int, run: _Run, last: int) -> list:
        """This rank's indices of the steps from ``step`` on, before step ``last`` (whole
        windows, about _CHUNK positions, within one stage): ``(step, array)`` pairs."""
        g, w, b = self.global_batch_size, self.window, self.batch_size
        plan = self._plan
        n0 = step * g // w
        stop = plan.end_of_stage(n0)
        n1 = min(n0 + max(1, _CHUNK // w), -(-last * g // w))
        if stop is not None:
            n1 = min(n1, stop)
        n1 = min(n1, n0 + _rows_limit(plan.stages[plan.stage_of(n0)]))
        # Whole steps: up to the last step ending in these windows (at least this one; a
        # stage starts at a step boundary, so they stay in one stage).
        t1 = max(step + 1, n1 * w // g)
        n1 = max(n1, -(-t1 * g // w))
        sources, stream, cols, bounds = plan.windows(n0, n1)
        lo = step * g - n0 * w
        positions = np.arange(lo, lo + (t1 - step) * g)
        if self.num_replicas > 1:
            positions = positions[((positions + n0 * w) % g) // b == self.rank]
        src, pos = sources[positions], stream[positions]
        if self._token_rows:
            return self._make_rows(step, t1, src, pos, cols, bounds)
        # Each source's stream over these windows, end to end in ``joined``.
        first = np.zeros(len(plan.before[0]), dtype=np.int64)
        offset = np.zeros(len(plan.before[0]), dtype=np.int64)
        parts = []
        total = 0
        for k, c in enumerate(cols.tolist()):
            lo_c, hi_c = int(bounds[0, k]), int(bounds[-1, k])
            if hi_c > lo_c:
                parts.append(run.stream(c).take(lo_c, hi_c))
                first[c], offset[c] = lo_c, total
                total += hi_c - lo_c
                run.windows_read(c, lo_c, hi_c, bounds[:, k], n0)
        joined = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        out = self.mixture._starts[src] + joined[offset[src] + pos - first[src]]
        per_step = out.reshape(t1 - step, b)
        return [(step + k, per_step[k]) for k in range(t1 - step)]

    def _make_rows(self, step, t1, src, pos, cols, bounds) -> list:
        """``_make`` for token sources: the keys ``(name, ranges)`` of the positions."""
        phases = self._phases()
        first = np.zeros(len(self._plan.before[0]), dtype=np.int64)
        offset = np.zeros(len(self._plan.before[0]), dtype=np.int64)
        joined: list = []
        for k, c in enumerate(cols.tolist()):
            lo_c, hi_c = int(bounds[0, k]), int(bounds[-1, k])
            if hi_c > lo_c:
                name = self.names[c]
                first[c], offset[c] = lo_c, len(joined)
                joined += self._token_source(name).rows(phases[name], lo_c, hi_c)
        names = self.names
        out = [
            (names[s], joined[i])
            for s, i in zip(src.tolist(), (offset[src] + pos - first[src]).tolist())
        ]
        b = self.batch_size
        return [(step + k, out[k * b : (k + 1) * b]) for k in range(t1 - step)]

    def epoch_indices(self, epoch=None, start: int = 0, stop=None) -> np.ndarray:
        """This rank's indices of ``epoch`` (default: the current one) at its positions
        ``start .. stop`` of the epoch (default: to the end), as an array (token sources: a
        list of keys); the sampler's iteration is not touched."""
        epoch = self.epoch if epoch is None else check_int("epoch", epoch, 0)
        share = self.epoch_length // self.num_replicas
        stop = share if stop is None else min(check_int("stop", stop, 0), share)
        start = check_int("start", start, 0)
        if start >= stop:
            return [] if self._token_rows else np.zeros(0, dtype=np.int64)
        parts = []
        count = 0
        for part in self._plain_steps(epoch, start):
            parts.append(part[: stop - start - count])
            count += len(parts[-1])
            if count >= stop - start:
                break
        if self._token_rows:
            return list(itertools.chain.from_iterable(parts))
        return np.concatenate(parts)

    def _plain_steps(self, epoch: int, skip: int):
        """As _steps, naming no block."""
        b = self.batch_size
        share = self.epoch_length // self.num_replicas
        own = epoch * share + skip
        end = (epoch + 1) * share
        run = _Run(self, naming=False)
        while own < end:
            for t, indices in self._make(own // b, run, -(-end // b)):
                yield indices[own - t * b :]
                own = (t + 1) * b
                if own >= end:
                    return

    # -- resuming ---------------------------------------------------------------------------

    def state_dict(self, step=None) -> dict:
        """Where this rank is: ``epoch`` and ``yielded`` (indices of the epoch handed out), the
        schedule and what the order depends on. ``step``: the state after that many global
        steps instead (what a training loop counts)."""
        share = self.epoch_length // self.num_replicas
        if step is not None:
            own = check_int("step", step, 0) * self.batch_size
            epoch, yielded = divmod(own, share)
        elif self._resume is not None:
            epoch, yielded = self._resume
        elif self._counted is not None:
            epoch, yielded = self._iteration[0], self._counted.count()
        else:
            epoch, yielded = self.epoch, 0
        return {
            "epoch": epoch,
            "yielded": yielded,
            "seed": self.seed,
            "global_batch_size": self.global_batch_size,
            "window": self.window,
            "epoch_length": self.epoch_length,
            "num_replicas": self.num_replicas,
            "rank": self.rank,
            "unit": self.unit,
            "sources": dict(self._lengths),
            "window_blocks": dict(self.window_blocks),
            "schedule": [s.as_data() for s in self._stages],
            **self._token_state(),
        }

    def _token_state(self) -> dict:
        """What a token sources' order depends on beyond the rest: the seq_len schedule and
        each source's tokens and pieces."""
        if not self._token_rows:
            return {}
        sources = {}
        for name in self.names:
            order = self._token_source(name).order
            sources[name] = {
                "tokens": self._tokens[name],
                "piece_tokens": order.piece_tokens,
                "group_pieces": order.group_pieces,
            }
        return {
            "seq_len_schedule": [list(p) for p in self.seq_len_schedule],
            "token_sources": sources,
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Continue where ``state`` (from ``state_dict``) was: the next iteration resumes its
        epoch after the indices it had handed out, with its schedule (which replaces this
        sampler's; ``set_weights`` may add stages after). Another number of ranks is taken at
        a step boundary; what the order depends on must agree (a ValueError says what not)."""
        check_state("MixtureSampler", state, ("epoch", "yielded"))
        for key in ("global_batch_size", "window", "epoch_length", "unit"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"cannot resume: the state has {key}={state[key]!r}, "
                    f"this sampler {getattr(self, key)!r}"
                )
        for key, mine in (("sources", self._lengths), ("window_blocks", self.window_blocks)):
            for name, value in dict(state.get(key, {})).items():
                if name in mine and mine[name] != value:
                    raise ValueError(
                        f"cannot resume: the state has {key}[{name!r}]={value!r}, "
                        f"this sampler {mine[name]!r}"
                    )
        epoch = check_int("epoch", state["epoch"], 0)
        yielded = check_int("yielded", state["yielded"], 0)
        replicas = state.get("num_replicas", self.num_replicas)
        share = self.epoch_length // self.num_replicas
        if replicas != self.num_replicas:
            theirs = self.global_batch_size // check_int("num_replicas", replicas, 1)
            if yielded % theirs:
                raise ValueError(
                    f"cannot resume on {self.num_replicas} ranks from a state of {replicas} "
                    f"ranks taken inside a step ({yielded} indices of {theirs} per step): "
                    "resume on as many ranks, or from a step boundary"
                )
            yielded = yielded // theirs * self.batch_size
        if yielded > share:
            raise ValueError(f"cannot resume after {yielded} indices: an epoch has {share}")
        seed = check_int("seed", state.get("seed", self.seed), 0)
        stages = self._stages
        if "schedule" in state:
            stages = [self._restore_stage(item) for item in state["schedule"]]
            if not stages or stages[0].step != 0:
                raise ValueError("cannot resume: the state's schedule does not start at step 0")
        position = self._position_of(epoch * share + yielded)
        self._check_present(stages, position)
        plan = self._lay_out(stages)
        if self._token_rows:
            self._load_token_state(state)
        self.seed = seed
        self._stages, self._plan = stages, plan
        self._version += 1
        for name in self._token_params:  # in the state's order (seed, pieces)
            self._token_source(name)
        self.epoch = epoch
        self._counted = None
        self._resume = (epoch, yielded)

    def _load_token_state(self, state: Mapping) -> None:
        """Adopt the seq_len schedule and the token sources' pieces of ``state``."""
        params = dict(self._token_params)
        for name, item in dict(state.get("token_sources", {})).items():
            if name not in params:
                continue
            if item.get("tokens", self._tokens[name]) != self._tokens[name]:
                raise ValueError(
                    f"cannot resume: the state has {item['tokens']} tokens of {name!r}, this "
                    f"mixture {self._tokens[name]}"
                )
            params[name] = (
                check_int("piece_tokens", item["piece_tokens"], 1),
                check_int("group_pieces", item["group_pieces"], 1),
            )
        schedule = self.seq_len_schedule
        if "seq_len_schedule" in state:
            schedule = self._seq_lens(state["seq_len_schedule"])
        self.seq_len_schedule, self._token_params = schedule, params
        self._token_sources.clear()

    def _restore_stage(self, item: Mapping) -> _Stage:
        targets = item["targets"]
        names = tuple(sorted(targets))
        stage = _Stage(
            check_int("step", item["step"], 0),
            dict(item.get("weights", {})),
            names,
            tuple(check_int("target", targets[n], 0) for n in names),
            check_int("denominator", item["denominator"], 1),
        )
        if sum(stage.targets) != self.window * stage.denominator:
            raise ValueError(f"cannot resume: a stage's targets do not fill a window: {item!r}")
        return stage

    def _check_present(self, stages: list, position: int) -> None:
        """Every source a stage reads from ``position`` on is in the mixture."""
        for k, stage in enumerate(stages):
            end = stages[k + 1].step * self.global_batch_size if k + 1 < len(stages) else None
            if end is not None and end <= position:
                continue
            missing = [n for n in stage.names if n not in self._lengths]
            if missing:
                raise ValueError(
                    f"cannot resume: the schedule reads {_listed(missing)} from step "
                    f"{stage.step} on, which this mixture does not have"
                )

    # -- plain data -------------------------------------------------------------------------

    def config(self) -> dict:
        """The sampler's settings as plain data (for a YAML config): ``from_config`` takes
        them back, with the sources."""
        out = {
            "schedule": [{"step": s.step, "weights": _plain(s.weights)} for s in self._stages],
            "global_batch_size": self.global_batch_size,
            "seed": self.seed,
            "unit": self.unit,
            "epoch_length": self.epoch_length,
            "total_steps": self.total_steps,
        }
        if self.window != self.global_batch_size:
            out["window"] = self.window
        if self._max_repeats is not None:
            out["max_repeats"] = dict(self._max_repeats)
        if self.unit == "tokens" and not self._token_rows:
            out["tokens"] = dict(self._tokens)
        if self._token_rows:
            out["seq_len_schedule"] = [list(p) for p in self.seq_len_schedule]
            pieces = {n: self._token_source(n).order.piece_tokens for n in self.names}
            same = len(set(pieces.values())) == 1
            out["piece_tokens"] = next(iter(pieces.values())) if same else pieces
        if len(set(self.window_blocks.values())) == 1:
            out["window_blocks"] = next(iter(self.window_blocks.values()))
        else:
            out["window_blocks"] = dict(self.window_blocks)
        return out

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(sources={len(self.names)}, stages={len(self._stages)}, "
            f"global_batch_size={self.global_batch_size}, seed={self.seed}, "
            f"epoch={self.epoch}, rank={self.rank}/{self.num_replicas})"
        )


_SAMPLER_KEYS = {
    "weights",
    "schedule",
    "global_batch_size",
    "seed",
    "window",
    "unit",
    "tokens",
    "epoch_length",
    "max_repeats",
    "total_steps",
    "window_blocks",
    "seq_len_schedule",
    "piece_tokens",
}


def from_config(config: Mapping, *, open_dataset=None, **overrides) -> tuple:
    """``(MixtureDataset, MixtureSampler)`` from plain data (a YAML mapping):

        sources: {web: /data/web, code: {path: /data/code, tokens: 120000000}}
        schedule: [{step: 0, weights: {web: 0.7, code: 0.3}},
                   {step: 20000, weights: {web: 0.5, code: 0.5}}]   # or weights: {...}
        global_batch_size: 1024
        seed: 0

    A source is a path (or ``{path: ..., tokens: ..., window_blocks: ..., max_repeats: ...}``),
    opened with ``open_dataset(path)`` (default: ``atlas_fast.AtlasDataset``). The other keys
    are MixtureSampler's arguments; ``overrides`` (``num_replicas``, ``rank``, ...) are added.
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"a mixture config is a mapping, not {type(config).__name__}")
    unknown = set(config) - _SAMPLER_KEYS - {"sources"}
    if unknown:
        raise ValueError(f"unknown mixture config keys: {_listed(sorted(unknown))}")
    if not isinstance(config.get("sources"), Mapping) or not config["sources"]:
        raise ValueError("a mixture config needs sources: a mapping of name -> path")
    if open_dataset is None:
        from .atlas import AtlasDataset as open_dataset
    datasets = {}
    per_source = {"tokens": {}, "window_blocks": {}, "max_repeats": {}}
    for name, source in config["sources"].items():
        if isinstance(source, Mapping):
            extra = set(source) - {"path"} - set(per_source)
            if extra or "path" not in source:
                raise ValueError(
                    f"source {name!r}: a path, or a mapping with path (and tokens, "
                    f"window_blocks, max_repeats), not {dict(source)!r}"
                )
            for key in per_source:
                if key in source:
                    per_source[key][name] = source[key]
            source = source["path"]
        datasets[name] = open_dataset(source)
    kwargs = {k: v for k, v in config.items() if k != "sources"}
    for key, values in per_source.items():
        if values:
            if key in kwargs and not isinstance(kwargs[key], Mapping):
                values = {**dict.fromkeys(datasets, kwargs[key]), **values}
            elif key in kwargs:
                values = {**kwargs[key], **values}
            kwargs[key] = values
    kwargs.update(overrides)
    mixture = MixtureDataset(datasets)
    sampler_class = __getattr__("MixtureSampler")  # made on first lookup
    return mixture, sampler_class(mixture, **kwargs)


def _make_sampler() -> dict:
    cls = torch_subclass(_MixtureSampler, "Sampler", __name__, "MixtureSampler")
    return {"MixtureSampler": cls}


# ``MixtureSampler`` subclasses torch's Sampler: made on first lookup (_compat.py).
__getattr__, __dir__ = lazy_classes(globals(), {"MixtureSampler": _make_sampler})
