"""The test servers (servers.py) live no longer than the process that started them: stopped
by their close() in the normal path, and gone too when that process is killed (SIGKILL, a
cancelled CI job) before any teardown runs. Nginx's workers included.

Processes are found through /proc: every process of a server's session (the watchdog, the
server, its children) has the watchdog's pid as its session id.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from servers import FakeGcsServer, MotoProcess, NginxServer, need_nginx

HERE = Path(__file__).resolve().parent


def _session_members(sid: int) -> list:
    """The live (not zombie) processes whose session id is ``sid``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        state, session = fields[0], int(fields[3])
        if session == sid and state not in ("Z", "X"):
            members.append(int(entry))
    return members


def _wait_gone(sid: int, timeout: float = 30.0) -> list:
    """Poll until no live process of session ``sid`` is left or ``timeout`` passed: those left."""
    deadline = time.monotonic() + timeout
    while True:
        left = _session_members(sid)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _describe(pids: list) -> str:
    out = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            out.append(f"{pid}: {cmdline.decode(errors='replace')}")
        except OSError:
            out.append(f"{pid}: (gone)")
    return "; ".join(out)


# Each server: how the inner pytest session starts it (source), and how this one does.
SERVERS = {
    "moto": ("MotoProcess()", lambda tmp_path: MotoProcess()),
    "nginx": ("NginxServer(tmp_path)", NginxServer),
    "fake-gcs-server": ("FakeGcsServer()", lambda tmp_path: FakeGcsServer()),
}

# What the command lines of a running server's processes show (nginx: its master and worker).
SHOWS = {
    "moto": ("moto.server",),
    "nginx": ("nginx: master", "nginx: worker"),
    "fake-gcs-server": ("fake-gcs-server",),
}


def _assert_running(name: str, sid: int) -> None:
    described = _describe(_session_members(sid))
    for part in SHOWS[name]:
        assert part in described, f"no {part!r} among the processes of {name}: {described}"


HOLD = """
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, {here!r})
from servers import FakeGcsServer, MotoProcess, NginxServer


def test_hold(tmp_path):
    server = {make}
    forked = None
    if {fork!r}:  # a child forked without exec: it holds every descriptor of this process
        forked = os.fork()
        if forked == 0:
            time.sleep(300)
            os._exit(0)
    info = {{"sid": server._proc.pid, "url": server.url, "forked": forked}}
    Path({ready!r} + ".part").write_text(json.dumps(info))
    os.replace({ready!r} + ".part", {ready!r})
    threading.Event().wait(300)  # killed long before
    server.close()
"""


@pytest.mark.parametrize("name, fork", [*((name, False) for name in SERVERS), ("nginx", True)])
def test_server_dies_with_killed_pytest(tmp_path, name, fork):
    """A pytest session starts a server through servers.py, then is killed with SIGKILL (no
    teardown runs): every process of the server's session goes, within a deadline. Also
    when a child the session forked (holding its end of the watchdog's pipe) lives on."""
    if name == "nginx":
        need_nginx()
    ready = tmp_path / "ready.json"
    script = tmp_path / "test_hold.py"
    script.write_text(
        HOLD.format(here=str(HERE), make=SERVERS[name][0], ready=str(ready), fork=fork)
    )
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(script)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    sid = forked = None
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if child.poll() is not None:
                pytest.fail(f"the inner pytest exited ({child.returncode}): {child.stdout.read()}")
            assert time.monotonic() < deadline, "the inner pytest never started its server"
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        sid, forked = info["sid"], info["forked"]
        requests.get(info["url"], timeout=10)  # it answers (any HTTP status)
        _assert_running(name, sid)

        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        left = _wait_gone(sid)
        assert not left, f"{name} outlived the killed pytest: {_describe(left)}"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        if forked is not None:
            try:
                os.kill(forked, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if sid is not None:  # a failing run leaves nothing behind either
            try:
                os.killpg(sid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("name", SERVERS)
def test_close_stops_every_process(tmp_path, name):
    """The normal path: close() returns once the server and all its children are gone."""
    if name == "nginx":
        need_nginx()
    server = SERVERS[name][1](tmp_path)
    sid = server._proc.pid
    try:
        _assert_running(name, sid)
    finally:
        server.close()
    left = _session_members(sid)
    assert not left, f"{name} left processes behind after close(): {_describe(left)}"
