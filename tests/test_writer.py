"""Our writer's datasets: read back by both backends and by the reference's algorithm."""

import json
import shutil

import numpy as np
import pytest
from helpers import assert_same, case_dataset, load_expected, reference_read

import atlas_fast
from atlas_fast import AtlasDatasetShardWriter, AtlasDatasetWriter, CompressionStrategy


def make_examples(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append({"id": i, "text": f"document {i} " * int(rng.integers(1, 30))})
        elif kind == 1:
            out.append(rng.integers(0, 50000, size=int(rng.integers(1, 64)), dtype=np.uint16))
        elif kind == 2:
            out.append(
                (i, bytes(rng.integers(0, 256, size=int(rng.integers(0, 200)), dtype=np.uint8)))
            )
        else:
            out.append([float(i), None, "x" * (i % 7)])
    return out


def write(path, examples, shard_size, block_size, strategy, level=3, dict_size=0.01):
    with AtlasDatasetWriter(
        path,
        shard_size=shard_size,
        block_size=block_size,
        compression_strategy=strategy,
        compression_level=level,
        compression_dict_size=dict_size,
    ) as w:
        for x in examples:
            w.add_example(x)
    return path


# (examples, shard_size, block_size): the edge sizes of the format.
SIZES = {
    "one-example": (1, 10, 4),
    "block-size-1": (9, 20, 1),
    "shard-smaller-than-block": (25, 3, 8),
    "fewer-than-7-blocks": (30, 30, 5),
    "exact-multiples": (64, 16, 4),
    "ten-plus-shards": (57, 5, 2),
    "many-blocks": (150, 100, 7),
}


@pytest.mark.parametrize("strategy", list(CompressionStrategy))
@pytest.mark.parametrize("size", sorted(SIZES))
def test_round_trip(atlas, tmp_path, strategy, size):
    n, shard_size, block_size = SIZES[size]
    examples = make_examples(n)
    root = write(tmp_path / "ds", examples, shard_size, block_size, strategy)
    ds = atlas.AtlasDataset(root)
    assert len(ds) == n
    for i in range(n):
        assert_same(ds[i], examples[i], f"[{i}]")
    for i in range(1, n + 1):
        assert_same(ds[-i], examples[n - i], f"[{-i}]")
    with pytest.raises(IndexError):
        ds[n]
    with pytest.raises(IndexError):
        ds[-n - 1]
    # The reference's algorithm reads it too, example for example.
    got = reference_read(root)
    assert len(got) == n
    for i in range(n):
        assert_same(got[i], examples[i], f"reference[{i}]")


@pytest.mark.parametrize("level", [1, 3, 19])
@pytest.mark.parametrize("dict_size", [0, 0.01])
@pytest.mark.parametrize("strategy", [2, 3])
def test_levels_and_dictionary_sizes(atlas, tmp_path, level, dict_size, strategy):
    examples = make_examples(120, seed=level)
    root = write(tmp_path / "ds", examples, 60, 6, strategy, level=level, dict_size=dict_size)
    meta = json.loads((root / "0" / "meta.json").read_text())
    assert meta["compression_level"] == level
    assert meta["compression_dict_size"] == dict_size
    assert meta["compression_strategy"] == strategy
    ds = atlas.AtlasDataset(root)
    for i, x in enumerate(examples):
        assert_same(ds[i], x, f"[{i}]")
    assert reference_read(root) is not None


def test_layout_and_meta_files_match_the_reference_format(tmp_path):
    root = write(tmp_path / "ds", make_examples(230), 20, 2, 2)
    names = sorted(p.name for p in root.iterdir())
    assert names == [f"{k:02d}" for k in range(12)] + ["meta.json", "zstd_dict.bin"]
    text = (root / "meta.json").read_text()
    assert text == json.dumps(
        {"version": 1, "shard_sizes": [20] * 11 + [10], "compression_strategy": 2}, indent=4
    )
    for k in range(12):
        shard = root / f"{k:02d}"
        assert sorted(p.name for p in shard.iterdir()) == ["data.bin", "index.npy", "meta.json"]
        meta = json.loads((shard / "meta.json").read_text())
        assert list(meta) == [
            "version",
            "block_size",
            "stored_examples",
            "compression_strategy",
            "compression_level",
            "compression_dict_size",
        ]
        assert meta["compression_strategy"] == 2
        index = np.load(shard / "index.npy")
        assert index[0] == 0 and index[-1] == (shard / "data.bin").stat().st_size
        assert len(index) == -(-meta["stored_examples"] // 2) + 1


@pytest.mark.parametrize(
    ("total", "dtype"),
    [(255, np.uint8), (256, np.uint16), (65535, np.uint16), (65536, np.uint32), (2**32, np.uint64)],
)
def test_index_dtype_rule(total, dtype):
    from atlas_fast._format import index_dtype

    assert index_dtype(total) == np.dtype(dtype)


def test_index_dtype_on_disk(tmp_path):
    small = write(tmp_path / "small", [b"x"] * 3, 10, 1, 0)
    assert np.load(small / "0" / "index.npy").dtype == np.uint8
    big = write(tmp_path / "big", [b"x" * 300] * 3, 10, 1, 0)
    assert np.load(big / "0" / "index.npy").dtype == np.uint16


def test_strategy_3_falls_back_to_1_below_7_blocks(atlas, tmp_path):
    root = write(tmp_path / "ds", make_examples(12), 6, 1, 3)  # 6 blocks per shard
    for shard in ("0", "1"):
        assert json.loads((root / shard / "meta.json").read_text())["compression_strategy"] == 1
        assert not (root / shard / "zstd_dict.bin").exists()
    assert [atlas.AtlasDataset(root)[i]["id"] for i in (0, 4, 8)] == [0, 4, 8]


def test_strategy_2_falls_back_to_1_when_the_first_shard_is_small(atlas, tmp_path):
    root = write(tmp_path / "ds", make_examples(40), 6, 2, 2)  # 3 blocks in shard 0
    assert json.loads((root / "meta.json").read_text())["compression_strategy"] == 1
    assert not (root / "zstd_dict.bin").exists()
    for shard in sorted(p for p in root.iterdir() if p.is_dir()):
        assert json.loads((shard / "meta.json").read_text())["compression_strategy"] == 1
    ds = atlas.AtlasDataset(root)
    assert_same(ds[39], make_examples(40)[39])


def test_zero_examples_make_an_empty_dataset(atlas, tmp_path):
    """As the reference writes it: one empty shard (ours has a zero-byte data.bin)."""
    root = write(tmp_path / "ds", [], 10, 2, 2)
    assert json.loads((root / "meta.json").read_text()) == {
        "version": 1,
        "shard_sizes": [0],
        "compression_strategy": 1,
    }
    assert (root / "0" / "data.bin").read_bytes() == b""
    ds = atlas.AtlasDataset(root)
    assert len(ds) == 0
    with pytest.raises(IndexError):
        ds[0]


def test_shard_writer_attributes_and_len(tmp_path):
    w = AtlasDatasetShardWriter(tmp_path / "s", 3, compression_strategy=1)
    for i in range(7):
        w.add_example(i)
    assert len(w) == w.stored_examples == 7
    w.close()
    w.close()  # closing twice is harmless
    assert w.metadata.stored_examples == 7 and w.metadata.compression_strategy == 1
    with pytest.raises(ValueError, match="closed"):
        w.add_example(8)


def test_shard_writer_with_a_given_dictionary(atlas, tmp_path):
    import zstandard

    samples = [(b"sample %d " % i) * 40 for i in range(200)]
    zdict = zstandard.train_dictionary(2048, samples)
    with AtlasDatasetShardWriter(
        tmp_path / "s", 4, compression_strategy=2, compression_dict=zdict
    ) as w:
        for i in range(30):
            w.add_example(f"value {i}")
    shard = atlas.AtlasDatasetShard(tmp_path / "s", compression_dict_bytes=zdict.as_bytes())
    assert [shard[i] for i in range(30)] == [f"value {i}" for i in range(30)]
    with pytest.raises(atlas_fast.AtlasFormatError, match="compression_dict_bytes"):
        atlas.AtlasDatasetShard(tmp_path / "s")


def _params_of(case):
    root = case_dataset(case)
    meta = json.loads((root / "meta.json").read_text())
    first = sorted(p for p in root.iterdir() if p.is_dir())[0]
    smeta = json.loads((first / "meta.json").read_text())
    return root, meta, smeta


def test_rewriting_a_reference_dataset_gives_the_same_files(tmp_path, reference_case):
    """Same examples, same parameters: the same file names, meta.json texts and index dtypes;
    for the deterministic strategies 0 and 1 the very same bytes."""
    root, meta, smeta = _params_of(reference_case)
    expected = load_expected(reference_case)
    ours = write(
        tmp_path / "ds",
        expected,
        meta["shard_sizes"][0],
        smeta["block_size"],
        meta["compression_strategy"] if meta["compression_strategy"] != 2 else 2,
        level=smeta["compression_level"],
        dict_size=smeta["compression_dict_size"],
    )
    theirs = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    mine = sorted(str(p.relative_to(ours)) for p in ours.rglob("*"))
    assert mine == theirs
    for rel in theirs:
        a, b = root / rel, ours / rel
        if a.name == "meta.json":
            assert b.read_text() == a.read_text(), rel
        elif a.name == "index.npy":
            assert np.load(b).dtype == np.load(a).dtype, rel
        if meta["compression_strategy"] in (0, 1) and a.is_file():
            assert b.read_bytes() == a.read_bytes(), rel
    shutil.rmtree(ours)
