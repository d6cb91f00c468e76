"""Every dataset the reference wrote reads back exactly as it must, on every backend."""

import random

import pytest
from helpers import FIXTURES, assert_same, load_expected


def test_reads_in_order(atlas, reference_case):
    expected = load_expected(reference_case)
    ds = atlas.AtlasDataset(FIXTURES / reference_case / "dataset")
    assert len(ds) == len(expected)
    for i, want in enumerate(expected):
        assert_same(ds[i], want, f"{reference_case}[{i}]")


def test_reads_in_random_order(atlas, reference_case):
    expected = load_expected(reference_case)
    ds = atlas.AtlasDataset(FIXTURES / reference_case / "dataset")
    order = list(range(len(expected))) * 2
    random.Random(reference_case).shuffle(order)
    for i in order:
        assert_same(ds[i], expected[i], f"{reference_case}[{i}]")


def test_negative_indices_and_ends(atlas, reference_case):
    expected = load_expected(reference_case)
    ds = atlas.AtlasDataset(FIXTURES / reference_case / "dataset")
    n = len(expected)
    for k in range(1, n + 1):
        assert_same(ds[-k], expected[n - k], f"{reference_case}[{-k}]")
    with pytest.raises(IndexError):
        ds[n]
    with pytest.raises(IndexError):
        ds[-n - 1]


def test_shards_read_alone(atlas, reference_case):
    expected = load_expected(reference_case)
    ds = atlas.AtlasDataset(FIXTURES / reference_case / "dataset")
    start = 0
    for shard in ds.shards:
        alone = atlas.AtlasDatasetShard(
            shard.root, compression_dict_bytes=shard.compression_dict_bytes
        )
        for j in range(len(alone)):
            assert_same(alone[j], expected[start + j], f"{shard.root}[{j}]")
        with pytest.raises(IndexError):
            alone[len(alone)]
        start += len(alone)
    assert start == len(expected)
