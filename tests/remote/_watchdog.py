"""Keep a server alive exactly as long as the process that started it.

``python _watchdog.py SIGNAME command...`` runs ``command`` as its child and stops it (with
SIGNAME, then SIGKILL to the whole process group after 10 s) as soon as either

- its stdin reaches end of file: the starting process closed the pipe (the normal stop,
  servers._stop), or died, whatever killed it (SIGKILL, a cancelled CI job): the kernel
  closes a dead process's descriptors; or
- its parent changed: the starting process died while a child it forked (without exec)
  still holds a copy of the pipe's write end; or
- it receives SIGTERM, SIGINT or SIGHUP (a CI runner stopping every process of a job).

A parent-death signal (Linux's prctl PR_SET_PDEATHSIG) would need no extra process, but it
fires when the *thread* that forked exits, not the process (a server started from a fixture
running in a worker thread would be killed early), exists on Linux only, and the children of
a server (nginx's workers) do not get it. A pipe is per process, portable, and this process
takes the server's whole process group with it.

It exits with the server's status (128 + the signal number when a signal ended it), so the
caller sees an early exit of the server as an exit of this process. The server inherits
stdout and stderr; its stdin is /dev/null.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

GRACE = 10.0  # seconds the server gets to stop before SIGKILL
POLL = 0.2  # seconds between checks of the parent


def _watch_stdin(closed: threading.Event) -> None:
    try:
        while sys.stdin.buffer.read(65536):
            pass
    except OSError:
        pass
    closed.set()


def _kill_group(server: subprocess.Popen) -> None:
    if hasattr(os, "killpg") and os.getpgrp() == os.getpid():  # a group of its own (_spawn)
        os.killpg(os.getpgrp(), signal.SIGKILL)  # the server, its children, and this process
    server.kill()


def main(argv: list) -> int:
    stop = getattr(signal, argv[0])
    parent = os.getppid()
    server = subprocess.Popen(argv[1:], stdin=subprocess.DEVNULL)
    closed = threading.Event()
    for name in ("SIGTERM", "SIGINT", "SIGHUP"):
        if hasattr(signal, name):  # stop the server, not just this process
            signal.signal(getattr(signal, name), lambda *_: closed.set())
    threading.Thread(target=_watch_stdin, args=(closed,), daemon=True).start()
    deadline = None
    while True:
        try:
            code = server.wait(POLL if deadline is None else 0.05)
            break
        except subprocess.TimeoutExpired:
            pass
        if deadline is None and (closed.is_set() or os.getppid() != parent):
            server.send_signal(stop)
            deadline = time.monotonic() + GRACE
        elif deadline is not None and time.monotonic() > deadline:
            _kill_group(server)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    status = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # Not sys.exit: the interpreter's shutdown would wait on the stdin reader's lock, which
    # the daemon thread holds while blocked in read (a pipe still open: stopped by a signal).
    os._exit(status)
