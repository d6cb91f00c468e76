"""wds, energon and flat-tokens through ``convert()`` and ``atlas-fast convert``, end to end:
sources written by each format's own writer, read back from the Atlas datasets."""

from __future__ import annotations

import numpy as np
import pytest
from convert_helpers import assert_absent, read_back
from helpers import same

from atlas_fast import cli
from atlas_fast.convert import SourceError, convert


@pytest.fixture
def wds():
    return pytest.importorskip("webdataset", reason="webdataset (the `test` extra) writes tars")


@pytest.fixture
def zarr():
    return pytest.importorskip("zarr", reason="zarr (the `test` extra) writes the groups")


def _samples(shard: int, n: int) -> list[dict]:
    rng = np.random.default_rng(shard)
    return [
        {
            "__key__": f"{shard:02d}-{i:04d}",
            "txt": f"caption {shard}/{i}",
            "json": {"i": i, "shard": shard},
            "cls": i % 10,
            "npy": rng.integers(0, 50_000, size=1 + i % 5, dtype=np.uint16),
        }
        for i in range(n)
    ]


def _tars(wds, root, shards: int, n: int) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    written = {}
    for k in range(shards):
        name = f"shards/s_{k:03d}.tar"
        (root / "shards").mkdir(exist_ok=True)
        written[name] = _samples(k, n)
        with wds.TarWriter(str(root / name)) as sink:
            for s in written[name]:
                sink.write(dict(s))
    return written


def _decoded(written: dict, names, dropped=()) -> list:
    return [
        {**s, "__url__": name}
        for name in names
        for s in written[name]
        if f"{name}/{s['__key__']}" not in dropped
    ]


@pytest.mark.parametrize("workers", [1, 2])
def test_wds_decoded_with_workers_and_verify(tmp_path, atlas, wds, workers):
    written = _tars(wds, tmp_path / "src", 4, 30)
    summary = convert(
        tmp_path / "src",
        tmp_path / "out",
        "wds",
        decode=True,
        workers=workers,
        verify=True,
        shard_size=25,
        block_size=4,
    )
    assert summary.examples == 120 and summary.verified
    got = read_back(atlas, tmp_path / "out")
    expected = _decoded(written, list(written))
    assert len(got) == len(expected) == 120
    for g, e in zip(got, expected):
        assert same(g, e), (g, e)


def test_energon_splits_through_the_cli(tmp_path, atlas, wds, capsys):
    root = tmp_path / "src"
    written = _tars(wds, root, 4, 20)
    (root / ".nv-meta").mkdir()
    (root / ".nv-meta" / "split.yaml").write_text(
        "exclude: [shards/s_003.tar, 'shards/s_000.tar/00-000{1..3}']\n"
        "split_parts:\n  train: ['shards/s_{000..001}.tar', shards/s_003.tar]\n"
        "  val: [shards/s_002.tar]\n"
    )
    argv = ["convert", str(root), str(tmp_path / "out"), "--from", "energon", "--decode"]
    assert cli.main([*argv, "--workers", "2", "--verify", "--quiet"]) == 0
    out, _ = capsys.readouterr()
    assert "(2 splits: train, val)" in out and out.rstrip().endswith("verified")
    train = read_back(atlas, tmp_path / "out" / "train")
    dropped = {f"shards/s_000.tar/00-000{k}" for k in (1, 2, 3)}
    expected = _decoded(written, ["shards/s_000.tar", "shards/s_001.tar"], dropped)
    assert len(train) == 37 and same(train, expected)
    assert same(read_back(atlas, tmp_path / "out" / "val"), _decoded(written, ["shards/s_002.tar"]))


def test_energon_needs_its_split_yaml(tmp_path, atlas, wds):
    # --from energon is strict: plain tars without .nv-meta are not silently read as wds.
    _tars(wds, tmp_path / "src", 1, 5)
    split_file = tmp_path / "src" / ".nv-meta" / "split.yaml"
    with pytest.raises(SourceError, match=rf"^{split_file}: not found"):
        convert(tmp_path / "src", tmp_path / "out", "energon")
    assert_absent(tmp_path / "out")
    written = _tars(wds, tmp_path / "plain", 1, 5)
    convert(tmp_path / "plain", tmp_path / "wds", "wds", decode=True)
    assert same(read_back(atlas, tmp_path / "wds"), _decoded(written, ["shards/s_000.tar"]))


def test_truncated_tar_leaves_no_destination(tmp_path, wds, capsys):
    _tars(wds, tmp_path / "src", 3, 20)
    tar = tmp_path / "src" / "shards" / "s_001.tar"
    tar.write_bytes(tar.read_bytes()[:3000])
    with pytest.raises(SourceError, match=rf"^{tar}: "):
        convert(tmp_path / "src", tmp_path / "out", "wds", workers=2)
    assert_absent(tmp_path / "out")
    argv = ["convert", str(tmp_path / "src"), str(tmp_path / "out"), "--from", "wds", "--quiet"]
    assert cli.main(argv) == 1
    assert str(tar) in capsys.readouterr().err
    assert_absent(tmp_path / "out")


def _write_flat_tokens(zarr, path, splits: dict, max_token_id: int):
    g = zarr.open_group(str(path), mode="w")
    for name, seqs in splits.items():
        sub = g.create_group(name)
        starts = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.uint64)
        encoded = np.concatenate(seqs).astype(np.uint32) * 2
        encoded[starts[:-1].astype(np.int64)] += 1
        sub.create_array("encoded_tokens", data=encoded, chunks=(1000,))
        sub.create_array("seq_starts", data=starts, chunks=(64,))
        sub.attrs["max_token_id"] = max_token_id


@pytest.mark.parametrize("workers", [1, 2])
def test_flat_tokens_two_splits(tmp_path, atlas, zarr, workers, monkeypatch):
    from atlas_fast.convert import _flat_tokens

    monkeypatch.setattr(_flat_tokens, "_PART_TOKENS", 2_000)  # several parts to share
    rng = np.random.default_rng(0)
    splits = {
        name: [rng.integers(0, 40_000, size=int(rng.integers(1, 60))) for _ in range(n)]
        for name, n in (("train", 500), ("validation", 70))
    }
    _write_flat_tokens(zarr, tmp_path / "ft.zarr", splits, 40_000)
    summary = convert(
        tmp_path / "ft.zarr", tmp_path / "out", "flat-tokens", workers=workers, verify=True
    )
    assert summary.examples == 570
    for name, seqs in splits.items():
        got = read_back(atlas, tmp_path / "out" / name)
        assert same(got, [s.astype(np.uint16) for s in seqs]), name


def test_flat_tokens_bad_seq_starts_leaves_no_destination(tmp_path, zarr, capsys):
    _write_flat_tokens(zarr, tmp_path / "ft.zarr", {"train": [np.arange(5), np.arange(3)]}, 10)
    g = zarr.open_group(str(tmp_path / "ft.zarr"), mode="r+")
    g["train"]["seq_starts"][2] = 7
    argv = ["convert", str(tmp_path / "ft.zarr"), str(tmp_path / "out"), "--from", "flat-tokens"]
    assert cli.main([*argv, "--quiet"]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'ft.zarr' / 'train'}/seq_starts: index 2: the last entry is 7" in err
    assert_absent(tmp_path / "out")
