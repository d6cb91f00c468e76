"""``atlas-fast export``: one summary line, exit 1 naming the path and problem, nothing
written; ``atlas-fast convert --unpickle`` reads back what ``--pickle`` stored."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from export_helpers import assert_absent, read_back, write
from helpers import same

from atlas_fast import cli
from atlas_fast.cli.export import TARGET_NAMES
from atlas_fast.export import TARGETS

pytest.importorskip("pyarrow")


def test_names_match_the_registry():
    assert TARGET_NAMES == tuple(TARGETS)
    assert "export" in cli.COMMANDS


def test_main_exports_and_prints_one_summary_line(tmp_path, capsys, exporting):
    rows = [{"id": i, "text": f"t{i}"} for i in range(500)]
    src = write(tmp_path / "src", rows, shard_size=200)
    argv = ["export", str(src), str(tmp_path / "out"), "--to", "parquet", "--workers", "2"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("exported 500 examples (3 shards) to parquet")
    argv = ["convert", str(tmp_path / "out"), str(tmp_path / "back"), "--from", "parquet"]
    assert cli.main(argv) == 0
    assert read_back(exporting, tmp_path / "back") == rows


def test_errors_exit_1_naming_the_path_and_problem(tmp_path, capsys, exporting):
    src = write(tmp_path / "src", [{"a": 1}, {"a": (1,)}])
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "x").write_text("x")
    cases = [
        ([str(src), str(dst), "--to", "jsonl"], f"{dst}: already exists"),
        ([str(src), str(tmp_path / "o1"), "--to", "jsonl"], "example 1 (shard 0"),
        ([str(tmp_path), str(tmp_path / "o2"), "--to", "jsonl"], "meta.json"),
        ([str(src), str(tmp_path / "o3"), "--to", "jsonl", "--workers", "0"], "--workers"),
        (
            [str(src), str(tmp_path / "o5"), "--to", "jsonl", "--staging-dir", str(tmp_path / "s")],
            f"--staging-dir: for a DST in object storage (a URL), not {tmp_path / 'o5'}",
        ),
    ]
    for argv, message in cases:
        assert cli.main(["export", *argv]) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith("atlas-fast export: error: ") and message in err, err
    assert os.listdir(dst) == ["x"]
    for name in ("o1", "o2", "o3", "o5"):
        assert_absent(tmp_path / name)
    assert not (tmp_path / "s").exists()
    with pytest.raises(SystemExit) as info:
        cli.main(["export", str(src), str(tmp_path / "o4"), "--to", "csv"])
    assert info.value.code == 2 and "invalid choice: 'csv'" in capsys.readouterr().err
    assert_absent(tmp_path / "o4")


def _help_section(capsys, command: str, title: str) -> str:
    """The section ``title`` of ``atlas-fast COMMAND --help``, its white space folded."""
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    assert info.value.code == 0
    sections = capsys.readouterr().out.split("\n\n")
    (section,) = [s for s in sections if s.startswith(f"{title}:")]
    return " ".join(section.split())


def test_object_storage_flags_are_documented_as_convert_documents_them(capsys):
    """export takes --staging-dir (its --overwrite is its own: a local DST too) from the flags
    convert and tokenize share, under the same heading, in the same words."""
    title = "object storage (DST a URL)"
    export_section = _help_section(capsys, "export", title)
    assert "--staging-dir DIR" in export_section and "--overwrite" not in export_section
    flags = export_section.removeprefix(f"{title}:")
    for command in ("convert", "tokenize"):
        assert flags in _help_section(capsys, command, title)


def test_pickle_and_unpickle_in_a_subprocess(tmp_path, exporting):
    examples = [{"a": i} if i % 3 else {"a": (i,)} for i in range(300)]
    src = write(tmp_path / "src", examples)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = [sys.executable, "-m", "atlas_fast"]
    done = subprocess.run(
        [*run, "export", str(src), str(tmp_path / "out"), "--to", "jsonl", "--pickle"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert "100 examples pickled" in done.stdout
    subprocess.run(
        [
            *run,
            "convert",
            str(tmp_path / "out"),
            str(tmp_path / "back"),
            "--from",
            "jsonl",
            "--unpickle",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    got = read_back(exporting, tmp_path / "back")
    assert all(same(a, b) for a, b in zip(got, examples)) and len(got) == 300
