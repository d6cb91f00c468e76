"""The ``atlas-fast`` command as a whole: what every command shares."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from corrupt import write_dataset

import atlas_fast
from atlas_fast import cli


def _atlas_fast(argv, backend, stdout, code: str | None = None, unbuffered: bool = True):
    """Run ``python -m atlas_fast argv`` (or ``code``) with the atlas_fast this suite
    imports, on ``backend`` (None: as selected here), its standard output on ``stdout``
    (``unbuffered``: each write goes straight to it, as under PYTHONUNBUFFERED; else written
    when the buffer fills or at exit)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(atlas_fast.__file__).parents[1]), *filter(None, [env.get("PYTHONPATH")])]
    )
    if backend is not None:
        env.pop("ATLAS_FAST_NO_EXTENSIONS", None)
    if backend == "python":
        env["ATLAS_FAST_NO_EXTENSIONS"] = "1"
    env["ATLAS_FAST_NO_TORCH"] = "1"  # not needed here; a fifth of the start-up time
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    command = ["-c", code, *argv] if code else ["-m", "atlas_fast", *argv]
    return subprocess.run(
        [sys.executable, *command],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        timeout=120,
    )


def _closed_pipe():
    """The writing end of a pipe whose reading end is already closed (``... | head`` once
    head has exited): every write to it fails with EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    return write_end


BUFFERING = pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])


def _run_into_closed_pipe(argv, backend, unbuffered):
    write_end = _closed_pipe()
    try:
        return _atlas_fast(argv, backend, write_end, unbuffered=unbuffered)
    finally:
        os.close(write_end)


@BUFFERING
@pytest.mark.parametrize(
    "argv",
    [["info", "--json"], ["info"], ["verify", "--json"], ["verify"]],
    ids=" ".join,
)
def test_a_closed_stdout_ends_quietly(tmp_path, backend, argv, unbuffered):
    """``atlas-fast info --json DS | head``: no BrokenPipeError traceback, exit status 141
    (128 + SIGPIPE, as a shell reports for a command SIGPIPE ended)."""
    write_dataset(tmp_path / "ds", 1)
    done = _run_into_closed_pipe([*argv, str(tmp_path / "ds")], backend, unbuffered)
    assert done.stderr == ""
    assert done.returncode == cli.EXIT_CLOSED_PIPE == 141


@BUFFERING
@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["info", "--help"]], ids=" ".join)
def test_help_into_a_closed_stdout_ends_quietly(argv, unbuffered):
    done = _run_into_closed_pipe(argv, None, unbuffered)  # no dataset read: any backend
    assert done.stderr == ""
    # argparse ignores a failed write of its help or version text itself (and exits 0);
    # buffered, the text is still waiting in the buffer, which main() flushes.
    assert done.returncode == (0 if unbuffered else cli.EXIT_CLOSED_PIPE)


def test_stdout_closed_from_the_start(tmp_path, backend):
    """Started with file descriptor 1 closed (``>&-``): sys.stdout is None, nothing to flush,
    the command runs as usual."""
    write_dataset(tmp_path / "ds", 1)
    code = "import os, runpy, sys; os.close(1); sys.stdout = None; sys.argv[0] = 'atlas-fast'\n"
    code += "runpy.run_module('atlas_fast', run_name='__main__')\n"
    done = _atlas_fast(["info", str(tmp_path / "ds")], backend, subprocess.DEVNULL, code=code)
    assert done.stderr == "" and done.returncode == 0


def test_another_broken_pipe_is_not_hidden():
    """A BrokenPipeError that is not about standard output stays an error."""
    code = (
        "import sys\n"
        "from atlas_fast import cli\n"
        "def run(args):\n"
        "    raise BrokenPipeError(32, 'Broken pipe: a worker')\n"
        "cli._run = run\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    done = _atlas_fast(["info", "x"], None, subprocess.PIPE, code=code)
    assert done.returncode == 1
    assert "BrokenPipeError: [Errno 32] Broken pipe: a worker" in done.stderr
