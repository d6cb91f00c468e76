"""Random reads decode one example out of a block (compiled core): every example exact, in
any order, from many threads, with blocks held as their pickle and scan in the cache."""

from __future__ import annotations

import datetime
import decimal
import random

import numpy as np
import pytest
from helpers import assert_same, run_threads

import atlas_fast


def _examples(n):
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append({"id": i, "text": f"document {i} " * (i % 5), "tags": ["a", str(i % 3)]})
        elif kind == 1:
            out.append(np.arange(i % 7 + 1, dtype=["u2", "f4", "i8"][i % 3]))
        elif kind == 2:
            out.append((datetime.date(2024, 1, 1 + i % 28), decimal.Decimal(i) / 8, None))
        else:
            out.append({"id": i, "text": "shared key names", "n": np.int64(i)})
    return out


@pytest.fixture(scope="module", params=[0, 1, 2, 3])
def dataset(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("partial") / f"s{request.param}"
    examples = _examples(400)
    with atlas_fast.AtlasDatasetWriter(root, 160, 16, compression_strategy=request.param) as w:
        for x in examples:
            w.add_example(x)
    return root, examples


def test_random_reads_are_exact(atlas, dataset):
    root, examples = dataset
    order = list(range(len(examples)))
    random.Random(0).shuffle(order)
    for cache_blocks in (1, 4, None):
        ds = atlas.AtlasDataset(root, cache_blocks=cache_blocks)
        for i in order:
            assert_same(ds[i], examples[i], f"example {i}")
        # Every block read again, in order, and in batches: the same examples.
        for i in range(len(examples)):
            assert_same(ds[i], examples[i], f"example {i}")
        for got, i in zip(ds.__getitems__(order[:50]), order[:50]):
            assert_same(got, examples[i], f"example {i}")


def test_no_block_read_twice_then_every_block_again(atlas, dataset):
    root, examples = dataset
    ds = atlas.AtlasDataset(root)
    blocks = list(range(len(examples) // 16))
    random.Random(1).shuffle(blocks)
    for b in blocks:  # one example of each block: the partial path
        i = b * 16 + (b * 7) % 16
        assert_same(ds[i], examples[i], f"example {i}")
    for b in blocks:  # a second example of each: the block's pickle, then whole
        i = b * 16 + (b * 7 + 3) % 16
        assert_same(ds[i], examples[i], f"example {i}")
    for i, got in enumerate(ds):
        assert_same(got, examples[i], f"example {i}")


def test_many_threads_on_one_dataset(atlas, dataset):
    root, examples = dataset
    ds = atlas.AtlasDataset(root, cache_blocks=3)  # small enough to evict all the time

    def reader(seed):
        rng = random.Random(seed)
        for _ in range(400):
            i = rng.randrange(len(examples))
            assert_same(ds[i], examples[i], f"example {i}")
        batch = [rng.randrange(len(examples)) for _ in range(40)]
        for got, i in zip(ds.__getitems__(batch), batch):
            assert_same(got, examples[i], f"example {i}")

    assert run_threads(reader, 8) == []


def test_the_compiled_core_decodes_one_example(dataset):
    """Which blocks are held as pickle and scan needs the core's cache (``_block_cache``):
    the public API reports counts, not how a block is held."""
    if atlas_fast.BACKEND != "cython":
        pytest.skip("partial decoding is the compiled core's")
    root, examples = dataset
    ds = atlas_fast.AtlasDataset(root)
    cache = ds._block_cache
    assert_same(ds[37], examples[37])  # block 2 of shard 0, read out of order
    assert cache.partial_keys() == [(0, 2)]
    assert_same(ds[38], examples[38])  # a second example: the block is unpickled whole
    assert cache.partial_keys() == []
    assert cache.keys() == [(0, 2)]
    info = ds.cache_info()
    assert (info.hits, info.misses) == (1, 1)
    assert_same(ds[200], examples[200])  # shard 1, block 2: partial
    assert_same(ds[216], examples[216])  # block 3 right after block 2: in order, whole
    assert cache.partial_keys() == [(1, 2)]
