"""Token sequences out of blocks, with numpy: the pure-Python twin of ``src/_tokens.pxi``.

Both cores offer the same four functions (``atlas_fast._contract.TokenCore``), which
``atlas_fast.tokens`` calls:

- ``block_token_stats(reader, first, stop, field)``: each block's token count and the
  smallest and largest id, for the token index;
- ``gather_tokens(dataset, shards, blocks, expected, pieces, targets, inputs, positions,
  start_input, field, docs)``: a batch of windows (or of documents) copied into the output
  rows, each block decoded once;
- ``token_pieces(cum, starts, counts, out)``: the pieces of ranges of the concatenation, and
  the blocks they read (what ``gather_tokens`` takes);
- ``as_tokens(example, field, where)``: one example as a 1-D integer array, or
  ``NotTokensError`` (shared: the compiled core's fallback for blocks its scanner does not
  read uses it too).

A *piece* is a row of ``pieces`` (int64, 4 columns): ``(slot, start, count, out)``: copy
``count`` tokens of block ``slot`` (of ``shards``/``blocks``) from token ``start`` of the
block (``docs``: from the start of its document ``start``, at most ``count`` of them) to flat
position ``out`` of the outputs. ``targets`` gets the tokens; ``inputs`` (if not None) at each
position the token before it in its document, or ``start_input`` where a document starts;
``positions`` (if not None) each token's index in its document. ``expected[slot]`` is the
block's token count by the token index (-1: not known): a block that holds another count is a
``TokenIndexError`` (the index does not describe this dataset), never other tokens.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .._errors import NotTokensError, TokenIndexError

__all__ = [
    "as_tokens",
    "block_tokens",
    "block_token_stats",
    "gather_tokens",
    "index_mismatch",
    "sorted_unique",
    "token_pieces",
]

_EMPTY = np.zeros(0, dtype=np.int64)


def _found(x) -> str:
    """What an example that is not a token sequence is, for the message."""
    if isinstance(x, np.ndarray):
        return f"a numpy array of dtype {x.dtype} and shape {x.shape}"
    if isinstance(x, (list, tuple)):
        kinds = sorted({type(v).__name__ for v in x if type(v) is not int})
        return f"a {type(x).__name__} holding {', '.join(kinds[:3])}"
    text = repr(x)
    return f"a {type(x).__name__} ({text[:40] + '...' if len(text) > 40 else text})"


def as_tokens(x, field, where: str) -> np.ndarray:
    """``x`` (an example; ``field``: its value under that key) as a 1-D integer array, or
    ``NotTokensError`` naming ``where`` (the shard and the example) and what was found."""
    if field is not None:
        if not isinstance(x, Mapping):
            raise NotTokensError(f"{where}: {_found(x)}, not a mapping with the field {field!r}")
        try:
            x = x[field]
        except KeyError:
            keys = ", ".join(repr(k) for k in list(x)[:5])
            raise NotTokensError(
                f"{where}: a mapping without the field {field!r} (its keys: {keys})"
            ) from None
    if isinstance(x, np.ndarray):
        if x.ndim == 1 and x.dtype.kind in "iu":
            return x
    elif type(x) in (list, tuple):
        if all(type(v) is int for v in x):
            try:
                return np.array(x, dtype=np.int64) if x else _EMPTY
            except OverflowError:
                raise NotTokensError(
                    f"{where}: a {type(x).__name__} of ints beyond int64"
                ) from None
    what = "the field " + repr(field) + " holds " if field is not None else ""
    raise NotTokensError(
        f"{where}: {what}{_found(x)}, not a token sequence (a 1-D integer numpy array or a "
        "list of ints)"
    )


def _where(reader, b: int, j: int) -> str:
    return f"{reader._root}: example {b * reader._block_size + j} (block {b})"


def block_tokens(reader, b: int, field) -> tuple:
    """``(tokens, lengths)`` of block ``b`` of shard core ``reader``: its documents' tokens
    concatenated (one array, of their common dtype; int64 when they differ) and each one's
    length (int64)."""
    examples = reader.read_block(b)
    arrays = [as_tokens(x, field, _where(reader, b, j)) for j, x in enumerate(examples)]
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    if not arrays:
        return _EMPTY, lengths
    dtypes = {a.dtype for a in arrays}
    if len(dtypes) > 1 or arrays[0].dtype.byteorder not in "=|":
        for j, a in enumerate(arrays):
            if a.dtype == np.uint64 and len(a) and int(a.max()) > np.iinfo(np.int64).max:
                raise NotTokensError(f"{_where(reader, b, j)}: a token id beyond int64")
        arrays = [a.astype(np.int64) for a in arrays]
    return np.concatenate(arrays), lengths


def block_token_stats(reader, first: int, stop: int, field) -> tuple:
    """``(counts, low, high)``: the token count of each block ``first <= b < stop`` of shard
    core ``reader`` (int64 array), and the smallest and largest id among them (None, None:
    no token)."""
    counts = np.zeros(max(stop - first, 0), dtype=np.int64)
    lows, highs = [], []
    for b in range(first, stop):
        # A pass: each block decoded and unpickled once, not kept in the cache.
        examples = reader._unpickle(reader._decoded(b), b)
        arrays = []
        for j, x in enumerate(examples):
            if field is None and type(x) is np.ndarray and x.ndim == 1 and x.dtype.kind in "iu":
                a = x  # the common case, without making the label of an error
            else:
                a = as_tokens(x, field, _where(reader, b, j))
            if len(a):
                arrays.append((j, a))
        counts[b - first] = sum(len(a) for _, a in arrays)
        if not arrays:
            continue
        if len({a.dtype for _, a in arrays}) == 1:  # one min and one max for the block
            whole = np.concatenate([a for _, a in arrays])
            lo, hi = whole.min(), whole.max()
            if whole.dtype == np.uint64 and int(hi) > np.iinfo(np.int64).max:
                j = next(j for j, a in arrays if int(a.max()) > np.iinfo(np.int64).max)
                raise NotTokensError(f"{_where(reader, b, j)}: a token id beyond int64")
            lows.append(int(lo))
            highs.append(int(hi))
            continue
        for j, a in arrays:
            hi = a.max()
            if a.dtype == np.uint64 and int(hi) > np.iinfo(np.int64).max:
                raise NotTokensError(f"{_where(reader, b, j)}: a token id beyond int64")
            lows.append(int(a.min()))
            highs.append(int(hi))
    if not lows:
        return counts, None, None
    return counts, min(lows), max(highs)


def token_pieces(cum, starts, counts, out) -> tuple:
    """``(blocks, pieces)`` of ranges of the concatenation: range ``r`` is ``counts[r]``
    tokens from token ``starts[r]``, copied to flat position ``out[r]``; ``cum`` (uint64) is
    each block's first token, then the total (the token index). ``blocks``: the global
    blocks read (ascending, int64); ``pieces``: rows ``(slot in blocks, start in the block,
    count, out)`` (see the module's doc), in the order of the ranges. Empty ranges give no
    piece."""
    starts = np.asarray(starts, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    out = np.asarray(out, dtype=np.int64)
    live = counts > 0
    starts, counts, out = starts[live], counts[live], out[live]
    if not len(starts):
        return _EMPTY, np.zeros((0, 4), dtype=np.int64)
    if (starts < 0).any() or (starts + counts > int(cum[-1])).any():
        bad = int(np.flatnonzero((starts < 0) | (starts + counts > int(cum[-1])))[0])
        s, c = int(starts[bad]), int(counts[bad])
        raise IndexError(f"tokens [{s}, {s + c}) out of range for {int(cum[-1])} tokens")
    g0 = np.searchsorted(cum, starts, side="right") - 1
    g1 = np.searchsorted(cum, starts + counts - 1, side="right") - 1
    n = g1 - g0 + 1
    seg = np.repeat(np.arange(len(starts)), n)
    g = g0[seg] + (np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n))
    first = cum[g].astype(np.int64)
    lo = np.maximum(starts[seg], first)
    hi = np.minimum(starts[seg] + counts[seg], cum[g + 1].astype(np.int64))
    keep = hi > lo
    g, lo, hi, seg, first = g[keep], lo[keep], hi[keep], seg[keep], first[keep]
    blocks, slot = sorted_unique(g, inverse=True)
    pieces = np.stack((slot, lo - first, hi - lo, out[seg] + (lo - starts[seg])), axis=1)
    return blocks.astype(np.int64), pieces.astype(np.int64)


def sorted_unique(values, inverse: bool = False):
    """The distinct values of the 1-D integer array ``values``, ascending (and with
    ``inverse``, where each value is among them): ``np.unique`` by a sort, which for the small
    arrays of one batch costs a tenth of numpy 2's hash-based ``np.unique``."""
    if not inverse:
        v = np.sort(values)
        keep = np.ones(len(v), dtype=bool)
        keep[1:] = v[1:] != v[:-1]
        return v[keep]
    order = np.argsort(values, kind="stable")
    v = values[order]
    keep = np.ones(len(v), dtype=bool)
    keep[1:] = v[1:] != v[:-1]
    where = np.empty(len(v), dtype=np.int64)
    where[order] = np.cumsum(keep) - 1
    return v[keep], where


def index_mismatch(reader, b: int, found: int, expected: int) -> TokenIndexError:
    """The error for block ``b`` of ``reader`` holding ``found`` tokens where the token index
    says ``expected`` (one wording, both cores)."""
    return TokenIndexError(
        f"{reader._root}: block {b} holds {found} tokens but the token index says {expected}: "
        "the index does not describe this shard (rewritten since?); rebuild it with "
        "TokenSequences(..., index='rebuild')"
    )


def gather_tokens(
    dataset,
    shards,
    blocks,
    expected,
    pieces,
    targets,
    inputs,
    positions,
    start_input: int,
    field,
    docs: bool,
):
    """Copy the pieces (see the module's doc) into the flat outputs; with ``docs`` return how
    many tokens each piece copied (int64), else None."""
    copied = np.zeros(len(pieces), dtype=np.int64) if docs else None
    if getattr(dataset, "_hints", None) is not None:  # named by prefetch(): decoded ahead now
        dataset._queue_hints()
    order = np.argsort(pieces[:, 0], kind="stable")
    bounds = np.searchsorted(pieces[order, 0], np.arange(len(shards) + 1))
    for slot in range(len(shards)):
        mine = order[bounds[slot] : bounds[slot + 1]]
        if not len(mine):
            continue
        reader = dataset._reader(int(shards[slot]))
        b = int(blocks[slot])
        tokens, lengths = block_tokens(reader, b, field)
        if expected[slot] >= 0 and len(tokens) != expected[slot]:
            raise index_mismatch(reader, b, len(tokens), int(expected[slot]))
        starts = np.cumsum(lengths) - lengths
        if positions is not None or inputs is not None or docs:
            within = np.arange(len(tokens), dtype=np.int64) - np.repeat(starts, lengths)
        for p in mine:
            _, start, count, out = (int(v) for v in pieces[p])
            if docs:
                start, count = int(starts[start]), min(count, int(lengths[start]))
                copied[p] = count
            stop = start + count
            targets[out : out + count] = tokens[start:stop]
            if positions is not None:
                positions[out : out + count] = within[start:stop]
            if inputs is not None and count:
                if start:
                    inputs[out : out + count] = tokens[start - 1 : stop - 1]
                else:
                    inputs[out + 1 : out + count] = tokens[start : stop - 1]
                inputs[out : out + count][within[start:stop] == 0] = start_input
    return copied
