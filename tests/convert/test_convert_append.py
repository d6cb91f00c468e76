"""``convert(..., append=True)`` / ``atlas-fast convert --append``: a source converted onto
the end of an existing dataset, with its strategy and shared dictionary, atomically; the
reference package reads every result; bad input leaves the dataset as it was. (To a URL:
tests/remote/test_remote_grow.py.)"""

from __future__ import annotations

import json
import shutil
import types
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from convert_helpers import documents, read_back, write_jsonl
from helpers import reference_examples, same

import atlas_fast
import atlas_fast.convert as conv
from atlas_fast import AtlasFormatError, InvalidArgumentError
from atlas_fast._writing import grow
from atlas_fast.cli import main
from atlas_fast.convert import Part, Source, SourceError, VerifyError, convert


def _jsonl(root: Path, docs: list, files: int = 3) -> Path:
    step = -(-len(docs) // files)
    for k in range(files):
        write_jsonl(root / f"{k:02d}.jsonl", docs[k * step : (k + 1) * step])
    return root


def _meta(path: Path) -> dict:
    return json.loads((path / "meta.json").read_text())


def tree(path: Path) -> dict:
    return {
        p.relative_to(path).as_posix(): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def _beside(root: Path) -> list:
    """What is next to ``root`` once this process's old trees are removed (a private name:
    close() returns before their removal)."""
    grow.wait_for_removals()
    return sorted(p.name for p in root.parent.iterdir() if p != root and p.name != "src")


def _check(atlas, root: Path, docs: list) -> None:
    assert read_back(atlas, root) == docs
    assert same(reference_examples(root), docs)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("strategy", [0, 1, 2, 3])
def test_appending_a_conversion_gives_the_old_examples_then_the_new(
    tmp_path, atlas, strategy, workers
):
    docs = documents(900)
    root = tmp_path / "ds"
    options = {"shard_size": 100, "block_size": 5, "compression_strategy": strategy}
    convert(_jsonl(tmp_path / "a", docs[:300]), root, "jsonl", workers=workers, **options)
    before = tree(root)
    summary = convert(
        _jsonl(tmp_path / "b", docs[300:], files=4),
        root,
        "jsonl",
        append=True,
        workers=workers,
        **options,
    )
    sizes = _meta(root)["shard_sizes"]
    assert (summary.examples, summary.shards) == (600, len(sizes) - 3)
    assert f"appended to {root}" in str(summary)
    _check(atlas, root, docs)
    after = tree(root)
    assert sizes[:3] == [100] * 3 and sum(sizes) == 900  # two runs may each end a shard short
    assert _meta(root)["compression_strategy"] == strategy
    for k in range(3):  # the old shards: their files as they were
        for name in ("data.bin", "index.npy", "meta.json"):
            assert after[f"{k}/{name}"] == before[f"{k}/{name}"]
    if strategy == 2:  # the dataset's dictionary, none trained: every new shard uses it
        assert after["zstd_dict.bin"] == before["zstd_dict.bin"]
        assert {_meta(p)["compression_strategy"] for p in root.iterdir() if p.is_dir()} == {2}
    assert _beside(root) == ["a", "b"]


def test_an_append_that_widens_and_splits(tmp_path, atlas, monkeypatch):
    old = {"train": [{"i": i} for i in range(90)], "test": [{"i": -i} for i in range(5)]}
    for split, rows in old.items():
        with atlas_fast.AtlasDatasetWriter(tmp_path / "ds" / split, 10, 2) as writer:
            for row in rows:
                writer.add_example(row)
    new = {"train": [{"i": 100 + i} for i in range(35)], "test": [{"i": -9}]}
    sources = [Source([Part(f"{s}-part", 10, partial(iter, rows))], s) for s, rows in new.items()]
    module = types.ModuleType("fake")
    module.sources = lambda src: sources
    monkeypatch.setattr(conv, "format_module", lambda fmt: module)
    convert("x", tmp_path / "ds", "fake", append=True, workers=1, shard_size=10, block_size=2)
    for split in old:
        root = tmp_path / "ds" / split
        _check(atlas, root, old[split] + new[split])
    names = sorted(p.name for p in (tmp_path / "ds" / "train").iterdir() if p.is_dir())
    assert names == [f"{k:02d}" for k in range(13)]  # 9 shards, then 13: widened


def test_a_conversion_of_token_sequences_grows_the_token_index(tmp_path, atlas, monkeypatch):
    from token_helpers import Model, assert_rows, make_docs, write_docs

    from atlas_fast import _token_index
    from atlas_fast.tokens import TokenSequences

    docs = make_docs(5, 120, np.uint16, long=1)
    root = write_docs(tmp_path / "ds", docs[:70], shard_size=20, block_size=4)
    module = types.ModuleType("fake")
    module.sources = lambda src: [Source([Part("tokens", 10, partial(iter, docs[70:]))])]
    monkeypatch.setattr(conv, "format_module", lambda fmt: module)
    options = {"shard_size": 20, "block_size": 4, "compression_strategy": 0}
    convert("x", root, "fake", append=True, workers=1, **options)
    once = write_docs(tmp_path / "once", docs[:70], shard_size=20, block_size=4)
    write_docs(once, docs[70:], shard_size=20, block_size=4, append=True)
    assert (root / "tokens.idx").read_bytes() == (once / "tokens.idx").read_bytes()

    def fail(*args, **kwargs):
        raise AssertionError("the token index was built from the shards")

    monkeypatch.setattr(_token_index, "build_entries", fail)  # a private name: see test_grow
    ts = TokenSequences(atlas.AtlasDataset(root), 6, index="require")
    assert_rows(ts.__getitems__(list(range(len(ts)))), Model(docs).windows(6))


@pytest.mark.parametrize(
    "bad", ["strategy", "absent", "empty-dir", "file", "damaged", "no-meta", "source", "verify"]
)
def test_bad_input_leaves_the_dataset_as_it_was(tmp_path, monkeypatch, bad):
    docs = documents(200)
    root = tmp_path / "ds"
    src = _jsonl(tmp_path / "src", docs[100:])
    convert(_jsonl(tmp_path / "old", docs[:100]), root, "jsonl", shard_size=40, block_size=5)
    shutil.rmtree(tmp_path / "old")
    options = {"shard_size": 40, "block_size": 5, "workers": 1}
    error = AtlasFormatError
    if bad == "strategy":
        options["compression_strategy"] = 3
        error = InvalidArgumentError
    elif bad == "absent":
        root = tmp_path / "nothing"
    elif bad == "empty-dir":
        root = tmp_path / "empty"
        root.mkdir()
    elif bad == "file":
        root = tmp_path / "file"
        root.write_text("x")
    elif bad == "damaged":
        with open(root / "1" / "data.bin", "ab") as f:
            f.write(b"more")
    elif bad == "no-meta":
        (root / "1" / "meta.json").unlink()
    elif bad == "source":
        write_jsonl(src / "01.jsonl", [{"ok": 1}])
        (src / "01.jsonl").write_text('{"ok": 1}\n{broken\n')
        error = SourceError
    else:
        real = atlas_fast.atlas.AtlasDataset

        class Tampered(real):
            def __getitem__(self, i):
                example = super().__getitem__(i)
                return dict(example, text="tampered") if i == 7 else example

        monkeypatch.setattr(atlas_fast.atlas, "AtlasDataset", Tampered)
        options["verify"] = True
        error = VerifyError
    before = tree(root) if root.is_dir() else None
    with pytest.raises(error) as info:
        convert(src, root, "jsonl", append=True, **options)
    if bad not in ("source", "verify"):
        assert str(root) in str(info.value)
    assert (tree(root) if root.is_dir() else None) == before
    assert root.is_file() == (bad == "file")
    left = [n for n in _beside(root) if n not in ("src", "ds", "empty", "file")]
    assert left == []


def test_convert_append_from_the_command_line(tmp_path, atlas, capsys):
    docs = documents(120)
    root = tmp_path / "ds"
    a, b = _jsonl(tmp_path / "a", docs[:50]), _jsonl(tmp_path / "b", docs[50:])
    assert main(["convert", str(a), str(root), "--from", "jsonl", "--shard-size", "20"]) == 0
    capsys.readouterr()
    args = ["convert", str(b), str(root), "--from", "jsonl", "--append", "--shard-size", "20"]
    assert main([*args, "--verify", "--quiet"]) == 0
    assert f"appended to {root}" in capsys.readouterr().out
    _check(atlas, root, docs)
    before = tree(root)
    assert main([*args, "--strategy", "0"]) == 1
    err = capsys.readouterr().err
    assert str(root) in err and f"the dataset at {root} is unchanged" in err
    assert main([*args, "--overwrite"]) == 1
    assert "--append" in capsys.readouterr().err
    assert tree(root) == before
    assert main(["convert", str(b), str(tmp_path / "none"), "--from", "jsonl", "--append"]) == 1
    assert "unchanged" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def test_append_arguments(tmp_path):
    with pytest.raises(TypeError):
        convert(tmp_path, tmp_path / "x", "jsonl", append="yes")
    with pytest.raises(ValueError, match="choose one"):
        convert(tmp_path, "s3://b/x", "jsonl", append=True, overwrite=True)
    with pytest.raises(ValueError, match="Ray"):
        convert(tmp_path, tmp_path / "x", "jsonl", append=True, ray=True)
