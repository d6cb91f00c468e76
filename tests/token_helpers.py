"""Datasets of token sequences and a plain-numpy model of what ``TokenSequences`` gives."""

from __future__ import annotations

import numpy as np

import atlas_fast


def make_docs(seed: int, n: int, dtype, long: int = 0, empty: float = 0.1) -> list:
    """``n`` documents of ``dtype``: lengths 0-40 (``empty`` of them empty), and ``long`` of
    them several thousand tokens long; ids spread over the dtype's range (below 2**20)."""
    rng = np.random.default_rng(seed)
    high = min(int(np.iinfo(dtype).max), 1 << 20)
    docs = []
    for _ in range(n):
        length = 0 if rng.random() < empty else int(rng.integers(1, 41))
        docs.append(rng.integers(0, high, length, endpoint=True).astype(dtype))
    for k in rng.choice(n, size=min(long, n), replace=False):
        docs[k] = rng.integers(0, high, int(rng.integers(2000, 5000)), endpoint=True).astype(dtype)
    return docs


def write_docs(path, docs, *, strategy=0, shard_size=100, block_size=10, wrap=None, **options):
    """Write ``docs`` (each wrapped by ``wrap`` first, e.g. into a dict or a list)."""
    with atlas_fast.AtlasDatasetWriter(
        path,
        shard_size=shard_size,
        block_size=block_size,
        compression_strategy=strategy,
        **options,
    ) as writer:
        for d in docs:
            writer.add_example(d if wrap is None else wrap(d))
    return path


class Model:
    """The concatenation of ``docs`` and what each token's row entries must be."""

    def __init__(self, docs, start_input: int = 0) -> None:
        docs = [np.asarray(d, dtype=np.int64) for d in docs]
        self.docs = docs
        self.tokens = np.concatenate(docs) if docs else np.zeros(0, np.int64)
        self.positions = np.concatenate([np.arange(len(d)) for d in docs]) if docs else self.tokens
        before = [np.concatenate(([start_input], d[:-1])) for d in docs if len(d)]
        self.inputs = np.concatenate(before) if before else self.tokens
        lengths = np.array([len(d) for d in docs], dtype=np.int64)
        self.doc_starts = np.cumsum(lengths) - lengths
        self.start_input = start_input

    def windows(self, seq_len: int) -> dict:
        """Every packed window, as ``TokenSequences.__getitems__`` must give them."""
        n = len(self.tokens) // seq_len
        cut = n * seq_len
        return {
            "targets": self.tokens[:cut].reshape(n, seq_len),
            "inputs": self.inputs[:cut].reshape(n, seq_len),
            "positions": self.positions[:cut].reshape(n, seq_len),
        }

    def ranges(self, ranges) -> dict:
        """A row made of token ranges ``[(start, count), ...]`` of the concatenation."""
        idx = np.concatenate([np.arange(s, s + c) for s, c in ranges])
        return {
            "targets": self.tokens[idx],
            "inputs": self.inputs[idx],
            "positions": self.positions[idx],
        }

    def documents(self, seq_len: int, pad: int = 0) -> dict:
        n = len(self.docs)
        out = {
            "targets": np.full((n, seq_len), pad, np.int64),
            "inputs": np.full((n, seq_len), pad, np.int64),
            "positions": np.zeros((n, seq_len), np.int64),
            "mask": np.zeros((n, seq_len), bool),
        }
        for k, d in enumerate(self.docs):
            m = min(len(d), seq_len)
            out["targets"][k, :m] = d[:m]
            out["inputs"][k, :m] = np.concatenate(([self.start_input], d[: m - 1]))[:m]
            out["positions"][k, :m] = np.arange(m)
            out["mask"][k, :m] = True
        return out


def assert_rows(got: dict, want: dict, keys=None) -> None:
    for key in keys or want:
        assert key in got, key
        np.testing.assert_array_equal(np.asarray(got[key]).astype(np.int64), want[key], err_msg=key)


# The corpora both TokenSequences test files read, one per strategy:
# (strategy, dtype, shard_size, block_size, long documents, how each document is wrapped)
CASES = [
    (0, np.uint16, 50, 7, 2, None),
    (1, np.uint8, 120, 16, 0, None),
    (2, np.uint32, 64, 8, 3, "dict"),
    (3, np.int64, 90, 30, 2, "list"),
]


def write_case(folder, k: int, seed: int) -> tuple:
    """``(root, docs, field)``: the documents of ``CASES[k]`` (260 of them, from ``seed``)
    written into ``folder``/ds, each wrapped as the case says (in a dict under
    "input_ids", or as a list)."""
    strategy, dtype, shard_size, block_size, long, wrap = CASES[k]
    docs = make_docs(seed, 260, dtype, long=long)
    wrapping = {
        "dict": lambda d: {"input_ids": d, "id": 1},
        "list": lambda d: d.tolist(),
        None: None,
    }[wrap]
    root = write_docs(
        folder / "ds",
        docs,
        strategy=strategy,
        shard_size=shard_size,
        block_size=block_size,
        wrap=wrapping,
    )
    return root, docs, "input_ids" if wrap == "dict" else None
