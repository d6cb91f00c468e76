"""``--ray``: the same conversion written through atlas_fast.ray.write_atlas on Ray Data."""

from __future__ import annotations

import pytest
from convert_helpers import assert_absent, documents, read_back, write_jsonl

from atlas_fast import cli
from atlas_fast.convert import convert

pytestmark = pytest.mark.usefixtures("ray")  # a local Ray cluster for this module


def test_ray_gives_the_examples_in_order(tmp_path, atlas, capsys):
    docs = documents(900)
    for k in range(3):
        write_jsonl(tmp_path / "src" / f"{k}.jsonl.gz", docs[k * 300 : (k + 1) * 300])
    summary = convert(tmp_path / "src", tmp_path / "out", "jsonl", ray=True, shard_size=200)
    assert read_back(atlas, tmp_path / "out") == docs
    assert summary.examples == 900
    argv = ["convert", str(tmp_path / "src"), str(tmp_path / "cli"), "--from", "jsonl"]
    assert cli.main([*argv, "--ray", "--verify", "--strategy", "1", "--quiet"]) == 0
    assert capsys.readouterr().out.rstrip().endswith(", verified")
    assert read_back(atlas, tmp_path / "cli") == docs


def test_ray_failure_leaves_nothing(tmp_path):
    write_jsonl(tmp_path / "src" / "0.jsonl", documents(50))
    (tmp_path / "src" / "1.jsonl").write_text('{"ok": 1}\n{broken\n')
    # A task's SourceError reaches the caller inside Ray's task error, its text kept.
    with pytest.raises(Exception, match=r"1\.jsonl: line 2: not valid JSON"):
        convert(tmp_path / "src", tmp_path / "out", "jsonl", ray=True, shard_size=20)
    assert_absent(tmp_path / "out")
    with pytest.raises(ValueError, match="checksums are not written on Ray"):
        convert(tmp_path / "src", tmp_path / "out", "jsonl", ray=True, checksums=True)
