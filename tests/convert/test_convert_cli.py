"""``atlas-fast convert``: end to end, summary line, errors and exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from convert_helpers import assert_absent, documents, read_back, write_jsonl

from atlas_fast import cli
from atlas_fast.cli.convert import FORMAT_NAMES
from atlas_fast.convert import FORMATS


def _src(tmp_path, files=3, per_file=40):
    docs = documents(files * per_file)
    for k in range(files):
        write_jsonl(tmp_path / "src" / f"{k}.jsonl.gz", docs[k * per_file : (k + 1) * per_file])
    return docs


def test_names_match_the_registry():
    assert FORMAT_NAMES == tuple(FORMATS)
    assert "convert" in cli.COMMANDS


def test_main_writes_and_prints_one_summary_line(tmp_path, capsys, atlas):
    docs = _src(tmp_path)
    argv = ["convert", str(tmp_path / "src"), str(tmp_path / "out"), "--from", "jsonl"]
    argv += ["--shard-size", "50", "--block-size", "5", "--strategy", "3", "--level", "5"]
    argv += ["--checksums", "--quiet"]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert err == ""
    (line,) = out.splitlines()
    assert line.startswith(
        f"converted 120 examples (jsonl) into 3 shards (strategy 3) at {tmp_path / 'out'}: "
    )
    assert " in, " in line and " out, " in line and "examples/s)" in line
    assert read_back(atlas, tmp_path / "out") == docs
    assert (tmp_path / "out" / "0" / "checksums.npy").exists()
    assert '"compression_level": 5' in (tmp_path / "out" / "0" / "meta.json").read_text()


def test_subprocess_with_workers_and_verify(tmp_path, atlas):
    docs = _src(tmp_path, files=4)
    argv = [sys.executable, "-m", "atlas_fast", "convert", str(tmp_path / "src")]
    argv += [str(tmp_path / "out"), "--from", "jsonl", "--workers", "2", "--verify"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=os.environ)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # not a terminal: no progress bar
    assert done.stdout.count("\n") == 1
    assert done.stdout.rstrip().endswith(", verified")
    assert read_back(atlas, tmp_path / "out") == docs


def test_errors_exit_1_naming_the_problem(tmp_path, capsys):
    _src(tmp_path, files=1)
    bad = tmp_path / "src" / "1.jsonl"
    bad.write_text('{"ok": 1}\n{oops}\n')
    dst = tmp_path / "out"
    assert cli.main(["convert", str(tmp_path / "src"), str(dst), "--from", "jsonl"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"atlas-fast convert: error: {bad}: line 2: not valid JSON")
    assert f"no dataset was written at {dst}" in err
    assert_absent(dst)

    dst.mkdir()
    (dst / "x").write_text("")
    assert cli.main(["convert", str(tmp_path / "src"), str(dst), "--from", "jsonl"]) == 1
    assert capsys.readouterr().err == (
        f"atlas-fast convert: error: {dst}: already exists and is not empty; convert writes a "
        "new dataset into an absent or empty directory: remove it or choose another path\n"
    )


def test_options_that_do_not_apply(tmp_path, capsys):
    _src(tmp_path, files=1)
    base = ["convert", str(tmp_path / "src"), str(tmp_path / "out")]
    assert cli.main([*base, "--from", "jsonl", "--attributes", "a"]) == 1
    assert "--attributes applies to --from dolma only" in capsys.readouterr().err
    assert cli.main([*base, "--from", "jsonl", "--decode"]) == 1
    assert "--decode applies to" in capsys.readouterr().err
    assert cli.main([*base, "--from", "jsonl", "--allow-unsafe-types"]) == 1
    assert "--allow-unsafe-types applies to --from mds only" in capsys.readouterr().err
    assert cli.main([*base, "--from", "jsonl", "--workers", "0"]) == 1
    assert "--workers must be a positive integer, not 0" in capsys.readouterr().err
    assert cli.main([*base, "--from", "jsonl", "--ray", "--workers", "2"]) == 1
    assert "--ray and --workers exclude each other" in capsys.readouterr().err
    assert cli.main([*base, "--from", "jsonl", "--shard-size", "0"]) == 1
    assert "shard_size must be a positive integer" in capsys.readouterr().err
    assert_absent(tmp_path / "out")


def test_dolma_attributes_from_the_command_line(tmp_path, capsys, atlas):
    docs = documents(20)
    write_jsonl(tmp_path / "d" / "documents" / "a.jsonl.gz", docs)
    attrs = [{"id": d["id"], "attributes": {"len": [[0, 1, len(d["text"])]]}} for d in docs]
    write_jsonl(tmp_path / "d" / "attributes" / "lens" / "a.jsonl.gz", attrs)
    argv = ["convert", str(tmp_path / "d"), str(tmp_path / "out"), "--from", "dolma"]
    assert cli.main([*argv, "--attributes", "lens", "--verify"]) == 0
    got = read_back(atlas, tmp_path / "out")
    assert [g["attributes"] for g in got] == [a["attributes"] for a in attrs]


def test_workers_start_without_torch():
    """ATLAS_FAST_NO_TORCH=1: atlas_fast then imports no torch."""
    code = (
        "import sys, atlas_fast, atlas_fast.convert._run; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert atlas_fast.AtlasDataset.__mro__[-1] is object"
    )
    env = {**os.environ, "ATLAS_FAST_NO_TORCH": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr


def test_workers_default_and_ray(tmp_path, capsys, monkeypatch):
    """--workers not given: convert()'s default (the usable cores); --ray refuses --workers
    only when it is given, whatever its value."""
    import atlas_fast.convert as conv

    seen = []
    monkeypatch.setattr(conv, "convert", lambda *a, workers, **k: seen.append(workers) or "done")
    base = ["convert", str(tmp_path / "src"), str(tmp_path / "out"), "--from", "jsonl"]
    assert cli.main(base) == 0
    assert cli.main([*base, "--workers", "3"]) == 0
    assert cli.main([*base, "--ray"]) == 0
    assert seen == [None, 3, None]
    capsys.readouterr()
    for given in ("1", "2"):
        assert cli.main([*base, "--ray", "--workers", given]) == 1
        assert "--ray and --workers exclude each other" in capsys.readouterr().err
    assert len(seen) == 3


SPAWNED_PROBE = """
import importlib.util, multiprocessing, sys
# At the top, as a script that also reads would: spawn re-runs it, and the reader's lookup
# imports torch (when installed) in any spawned child but ours.
from atlas_fast import AtlasDataset  # noqa: F401
from atlas_fast.convert._workers import Workers


def probe(job, worker):
    return "torch" in sys.modules, multiprocessing.current_process().name


if __name__ == "__main__":
    pool = Workers(2, 2)  # ATLAS_FAST_CONVERT_START=spawn
    try:
        ours = pool.run([None, (probe, None)], lambda examples, nbytes: None)[1]
    finally:
        pool.close(kill=False)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as other:  # a process of anyone else's, for comparison
        theirs = other.apply(probe, (None, None))
    print(ours[0], theirs[0], importlib.util.find_spec("torch") is not None, ours[1])
"""


def test_spawned_workers_start_without_torch(tmp_path):
    """A spawned worker imports atlas_fast without torch although the parent's main script
    (which it re-runs first) looks up atlas_fast's reader: its name says so before anything is
    imported, and nothing is set in the environment."""
    script = tmp_path / "probe.py"
    script.write_text(SPAWNED_PROBE)
    env = {**os.environ, "ATLAS_FAST_CONVERT_START": "spawn"}
    env.pop("ATLAS_FAST_NO_TORCH", None)
    root = str(Path(__file__).resolve().parents[2])  # this checkout's atlas_fast
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    ours, theirs, installed, name = done.stdout.split()
    assert ours == "False"
    assert theirs == installed  # anyone else's spawned process imports torch, if installed
    assert name.startswith("atlas-fast-no-torch:")
