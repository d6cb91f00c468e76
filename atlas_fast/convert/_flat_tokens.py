"""flat-tokens zarr groups as conversion sources.

A flat-tokens array is a zarr group holding ``encoded_tokens`` (every sequence's tokens
concatenated, each encoded ``token_id * 2 + 1`` at the start of a sequence and ``token_id *
2`` elsewhere), ``seq_starts`` (the index of each sequence's first token, then the token
count) and the attribute ``max_token_id``. A flat-tokens dataset is a group of such arrays,
one per split (``train``, ``validation``, ...).

Each sequence becomes one example: a 1-D numpy array of its token ids, of the smallest
unsigned dtype that holds ``max_token_id`` (uint8, uint16 or uint32). A group that is itself
a flat-tokens array gives one ``Source``; a dataset gives one per split, in name order.

Parts are runs of whole ``seq_starts`` chunks (about 4 Mi tokens each): a part reads its slice
of ``seq_starts`` and the tokens it spans, checks that the starts increase and agree with the
start flags and that no id exceeds ``max_token_id``, and yields its sequences.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .._extras import require
from ._source import Part, Source, SourceError

__all__ = ["sources"]

_PART_TOKENS = 1 << 22
_ARRAYS = ("encoded_tokens", "seq_starts")


def sources(src) -> list[Source]:
    """One ``Source`` per flat-tokens array in the zarr group ``src``: the group itself
    (split None), or each sub-group that is one (split: its name)."""
    path = Path(src)
    root = _open(path, "")
    if _is_flat_tokens(root):
        return [Source(_parts(path, ""), None)]
    splits = sorted(name for name in root.group_keys() if _is_flat_tokens(root[name]))
    if not splits:
        raise SourceError(
            f"{path}: no flat-tokens array (a group with encoded_tokens and seq_starts) in it "
            "or in its sub-groups"
        )
    return [Source(_parts(path, name), name) for name in splits]


def _open(path: Path, group: str):
    zarr = require("zarr", "zarr", "the flat-tokens converter")
    if not path.exists():
        raise SourceError(f"{path}: no such file or directory")
    try:
        root = zarr.open_group(str(path), mode="r")
        return root[group] if group else root
    except Exception as exc:  # zarr raises several types (KeyError, its own, FileNotFound...)
        where = f"{path}/{group}" if group else str(path)
        raise SourceError(f"{where}: not a zarr group: {type(exc).__name__}: {exc}") from None


def _is_flat_tokens(group) -> bool:
    return all(name in group.array_keys() for name in _ARRAYS)


def _dtype(where: str, max_token_id) -> np.dtype:
    if isinstance(max_token_id, bool) or not isinstance(max_token_id, int) or max_token_id < 0:
        raise SourceError(f"{where}: attribute max_token_id is {max_token_id!r}, not an id >= 0")
    for dtype in (np.uint8, np.uint16, np.uint32):
        if max_token_id <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise SourceError(f"{where}: attribute max_token_id {max_token_id} exceeds 2**32 - 1")


def _parts(path: Path, name: str) -> list[Part]:
    where = f"{path}/{name}" if name else str(path)
    group = _open(path, name)
    tokens, starts = group["encoded_tokens"], group["seq_starts"]
    dtype = _dtype(where, group.attrs.get("max_token_id"))
    if len(tokens.shape) != 1 or len(starts.shape) != 1 or starts.shape[0] < 1:
        raise SourceError(
            f"{where}: encoded_tokens {tokens.shape} and seq_starts {starts.shape} must be "
            "1-D, seq_starts with at least the final entry"
        )
    count = starts.shape[0] - 1
    first, last = int(starts[0]), int(starts[count])
    if first != 0:
        raise SourceError(f"{where}/seq_starts: index 0: {first}, not 0")
    if last != tokens.shape[0]:
        raise SourceError(
            f"{where}/seq_starts: index {count}: the last entry is {last}, but encoded_tokens "
            f"holds {tokens.shape[0]} tokens"
        )
    if count == 0:
        return []
    chunk = starts.chunks[0]
    per_part = max(1, math.ceil(_PART_TOKENS * count / max(last, 1) / chunk)) * chunk
    bounds = [*range(0, count, per_part), count]
    offsets = [int(starts[b]) for b in bounds]
    itemsize = tokens.dtype.itemsize
    parts = []
    for i in range(len(bounds) - 1):
        a, b = bounds[i], bounds[i + 1]
        read = functools.partial(_read, str(path), name, a, b, dtype.str)
        nbytes = max(offsets[i + 1] - offsets[i], 0) * itemsize + (b - a + 1) * 8
        parts.append(Part(f"{where}: sequences {a}-{b - 1}", nbytes, read, b - a))
    return parts


def _read(path: str, name: str, a: int, b: int, dtype: str) -> Iterator[np.ndarray]:
    """Sequences ``a`` to ``b - 1`` of one flat-tokens array, checked."""
    where = f"{path}/{name}" if name else path
    group = _open(Path(path), name)
    tokens, starts_array = group["encoded_tokens"], group["seq_starts"]
    max_id = int(group.attrs.get("max_token_id"))
    starts = np.asarray(starts_array[a : b + 1]).astype(np.int64)
    steps = np.diff(starts)
    if (steps <= 0).any() or starts[-1] > tokens.shape[0]:
        j = int(np.argmax(steps <= 0)) + 1 if (steps <= 0).any() else len(starts) - 1
        raise SourceError(
            f"{where}/seq_starts: index {a + j}: {int(starts[j])} after {int(starts[j - 1])}: "
            f"the starts must increase, up to the token count {tokens.shape[0]}"
        )
    lo = int(starts[0])
    encoded = np.asarray(tokens[lo : int(starts[-1])])
    flagged = np.flatnonzero(encoded & 1)
    expected = starts[:-1] - lo
    if len(flagged) != len(expected) or (flagged != expected).any():
        n = min(len(flagged), len(expected))
        k = (
            int(np.argmax(flagged[:n] != expected[:n]))
            if (flagged[:n] != expected[:n]).any()
            else n
        )
        if k < len(expected) and (k >= len(flagged) or expected[k] < flagged[k]):
            raise SourceError(
                f"{where}/encoded_tokens: index {lo + int(expected[k])}: seq_starts[{a + k}] "
                "starts a sequence here, but the token's start flag (low bit) is not set"
            )
        raise SourceError(
            f"{where}/encoded_tokens: index {lo + int(flagged[k])}: the start flag (low bit) is "
            "set, but seq_starts starts no sequence here"
        )
    ids = encoded >> 1
    if len(ids) and (int(ids.max()) > max_id or int(ids.min()) < 0):
        k = int(np.argmax((ids > max_id) | (ids < 0)))
        raise SourceError(
            f"{where}/encoded_tokens: index {lo + k}: token id {int(ids[k])} is not within "
            f"0..max_token_id ({max_id})"
        )
    ids = ids.astype(dtype)
    for s, e in zip(expected, np.append(expected[1:], len(ids))):
        yield ids[s:e].copy()
