"""Fixtures of the remote-reading tests: moto's S3 server (one per session, reset for each
test, its bucket made anew), the fault-injecting proxy in front of it, nginx, and
fake-gcs-server (one per session, a bucket made anew for each test, behind the proxy too).

``s3`` sets the standard AWS_* environment variables for the test (AWS_ENDPOINT_URL pointing
at the proxy, so every request is counted) and yields an ``S3`` with the bucket name, the
boto3 client (talking to moto directly: uploads are not counted) and the proxy.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

import pytest
from faultproxy import FaultProxy
from servers import S3_ENV, FakeGcsServer, MotoServer, NginxServer, need_nginx


@dataclass
class S3:
    server: MotoServer
    proxy: FaultProxy
    bucket: str
    client: object

    @property
    def endpoint(self) -> str:
        return self.proxy.url

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"


@pytest.fixture(scope="session")
def moto_server():
    server = MotoServer()
    yield server
    server.close()


@pytest.fixture
def s3(moto_server, monkeypatch):
    moto_server.reset()
    for name, value in S3_ENV.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    with FaultProxy("127.0.0.1", moto_server.port) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        bucket = "atlas-" + uuid.uuid4().hex[:12]
        client = moto_server.client()
        client.create_bucket(Bucket=bucket)
        yield S3(moto_server, proxy, bucket, client)
    moto_server.reset()


@pytest.fixture
def nginx(tmp_path):
    """nginx serving tmp_path/www (created empty), behind a FaultProxy: ``(root, proxy)``."""
    need_nginx()
    root = tmp_path / "www"
    root.mkdir()
    server = NginxServer(root)
    try:
        with FaultProxy("127.0.0.1", server.port) as proxy:
            yield root, proxy
    finally:
        server.close()


@dataclass
class GCS:
    server: FakeGcsServer
    proxy: FaultProxy
    bucket: str

    @property
    def endpoint(self) -> str:
        return self.proxy.url

    @property
    def options(self) -> dict:
        """The storage_options that point gs:// at the emulator (through the proxy)."""
        return {
            "base_url": self.proxy.url,
            "bearer_token": "emulator",
            "client_options": {"allow_http": True},
        }

    def url(self, key: str) -> str:
        return f"gs://{self.bucket}/{key}"


@pytest.fixture(scope="session")
def gcs_server():
    try:
        server = FakeGcsServer()
    except RuntimeError as exc:  # a pip dependency of the test extra: a failure, never a skip
        pytest.fail(str(exc))
    yield server
    server.close()


@pytest.fixture
def gcs(gcs_server, monkeypatch):
    """A fresh bucket on fake-gcs-server behind a FaultProxy. No GOOGLE_*, AZURE_* or
    STORAGE_EMULATOR_HOST variable of the machine reaches the test."""
    for name in list(os.environ):
        if name.startswith(("GOOGLE_", "AZURE_", "AZURITE_")) or name == "STORAGE_EMULATOR_HOST":
            monkeypatch.delenv(name)
    bucket = "atlas-" + uuid.uuid4().hex[:12]
    gcs_server.create_bucket(bucket)
    try:
        with FaultProxy("127.0.0.1", gcs_server.port) as proxy:
            yield GCS(gcs_server, proxy, bucket)
    finally:
        gcs_server.delete_bucket(bucket)
