"""Every dataset the reference wrote reads back exactly as it must, on every backend."""

import random

import pytest
from helpers import GOLDEN, assert_same, case_dataset, fixture_cases, load_expected


def test_reads_in_order(atlas, reference_case):
    expected = load_expected(reference_case)
    ds = atlas.AtlasDataset(case_dataset(reference_case))
    assert len(ds) == len(expected)
    for i, want in enumerate(expected):
        assert_same(ds[i], want, f"{reference_case}[{i}]")


def test_reads_in_random_order(atlas, reference_case):
    expected = load_expected(reference_case)
    ds = atlas.AtlasDataset(case_dataset(reference_case))
    order = list(range(len(expected))) * 2
    random.Random(reference_case).shuffle(order)
    for i in order:
        assert_same(ds[i], expected[i], f"{reference_case}[{i}]")


def test_negative_indices_and_ends(atlas, reference_case):
    expected = load_expected(reference_case)
    ds = atlas.AtlasDataset(case_dataset(reference_case))
    n = len(expected)
    for k in range(1, n + 1):
        assert_same(ds[-k], expected[n - k], f"{reference_case}[{-k}]")
    with pytest.raises(IndexError):
        ds[n]
    with pytest.raises(IndexError):
        ds[-n - 1]


def test_shards_read_alone(atlas, reference_case):
    expected = load_expected(reference_case)
    ds = atlas.AtlasDataset(case_dataset(reference_case))
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


def _golden_files(suffix: str) -> list:
    return sorted(p for p in GOLDEN.glob(f"*/dataset/**/{suffix}"))


def test_golden_data_covers_what_it_claims():
    """tests/golden (committed, written by the reference through tests/golden/make.py) holds
    every case make.py defines, and between them the edge cases the suite relies on: every
    compression strategy on disk, both of the reference writer's fallbacks to strategy 1,
    blocks of one example, 11+ shards, a high zstd level, and every index dtype up to
    uint32."""
    import json
    import sys

    import numpy as np

    sys.path.insert(0, str(GOLDEN))
    try:
        import make
    finally:
        sys.path.remove(str(GOLDEN))
    golden = [c for c in fixture_cases() if not c.startswith("extra:")]
    assert golden == sorted(make.CASES)
    shard_metas, root_metas = {}, {}
    for case in golden:
        root = case_dataset(case)
        root_metas[case] = json.loads((root / "meta.json").read_text())
        shard_metas[case] = [
            json.loads((d / "meta.json").read_text()) for d in sorted(root.iterdir()) if d.is_dir()
        ]
    on_disk = {m["compression_strategy"] for ms in shard_metas.values() for m in ms}
    assert on_disk == {0, 1, 2, 3}
    asked = {c: make.CASES[c].compression_strategy for c in golden}
    # the dataset fell back: strategy 2 asked, 1 written; a strategy-3 shard fell back alone
    assert any(asked[c] == 2 and root_metas[c]["compression_strategy"] == 1 for c in golden)
    assert any(
        asked[c] == 3 and {m["compression_strategy"] for m in shard_metas[c]} == {1, 3}
        for c in golden
    )
    assert any(ms[0]["block_size"] == 1 for ms in shard_metas.values())
    assert max(len(ms) for ms in shard_metas.values()) >= 11
    assert max(ms[0]["compression_level"] for ms in shard_metas.values()) >= 19
    dtypes = {str(np.load(p).dtype) for p in _golden_files("index.npy")}
    assert dtypes == {"uint8", "uint16", "uint32"}
    size = sum(p.stat().st_size for p in GOLDEN.rglob("*") if p.is_file())
    assert size < 1_000_000, f"tests/golden holds {size} bytes: keep golden data small"
