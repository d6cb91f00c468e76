"""The test tree's fault-injecting proxy does what the remote tests rely on."""

from __future__ import annotations

import pytest
import requests
from faultproxy import FaultProxy


def test_counts_requests_and_bytes_through_to_nginx(nginx):
    root, proxy = nginx
    (root / "blob").write_bytes(bytes(range(256)) * 1000)
    with requests.Session() as session:
        whole = session.get(proxy.url + "/blob", timeout=10)
        part = session.get(proxy.url + "/blob", headers={"Range": "bytes=10-19"}, timeout=10)
    assert whole.content == bytes(range(256)) * 1000
    assert part.status_code == 206 and part.content == bytes(range(10, 20))
    stats = proxy.stats()
    assert stats["requests"] == 2
    assert stats["body_bytes"] == 256_000 + 10
    assert stats["paths"] == {"/blob": 2}


def test_injects_each_fault(nginx):
    root, proxy = nginx
    (root / "blob").write_bytes(b"x" * 100_000)
    proxy.set(fault_rate=1.0, faults=("503",))
    answer = requests.get(proxy.url + "/blob", timeout=10)
    assert answer.status_code == 503 and b"SlowDown" in answer.content
    proxy.set(faults=("reset",))
    with pytest.raises(requests.ConnectionError):
        requests.get(proxy.url + "/blob", timeout=10)
    proxy.set(faults=("truncate",))
    with pytest.raises(requests.RequestException):
        _ = requests.get(proxy.url + "/blob", timeout=10).content
    proxy.set(fault_rate=0.0)
    assert requests.get(proxy.url + "/blob", timeout=10).content == b"x" * 100_000
    assert proxy.stats()["faults"] == {"reset": 1, "truncate": 1, "503": 1}


def test_fault_rate_is_about_what_was_asked(nginx):
    root, proxy = nginx
    (root / "blob").write_bytes(b"y" * 10)
    proxy.set(fault_rate=0.2, faults=("503",))
    codes = [requests.get(proxy.url + "/blob", timeout=10).status_code for _ in range(200)]
    assert 20 <= codes.count(503) <= 60
    assert codes.count(200) == 200 - codes.count(503)


def test_latency_is_added_per_request(nginx):
    import time

    root, proxy = nginx
    (root / "blob").write_bytes(b"z")
    proxy.set(latency=0.1)
    with requests.Session() as session:
        start = time.monotonic()
        for _ in range(3):
            session.get(proxy.url + "/blob", timeout=10)
        elapsed = time.monotonic() - start
    # A floor, not a timing bound: three requests each wait at least the added latency.
    assert elapsed >= 0.3


def test_moto_through_the_proxy(s3):
    s3.client.put_object(Bucket=s3.bucket, Key="k", Body=b"hello world")
    import boto3

    signer = boto3.client("s3", endpoint_url=s3.proxy.url, region_name="us-east-1")
    url = signer.generate_presigned_url("get_object", Params={"Bucket": s3.bucket, "Key": "k"})
    answer = requests.get(url, headers={"Range": "bytes=6-10"}, timeout=10)
    assert answer.status_code == 206 and answer.content == b"world"
    assert answer.headers["ETag"]
    assert s3.proxy.stats()["requests"] == 1


def test_unknown_fault_is_refused():
    with pytest.raises(ValueError, match="unknown fault"):
        FaultProxy("127.0.0.1", 9, faults=("teleport",))


def test_an_upstream_that_idles_out_a_kept_connection_is_asked_again():
    """An upstream that closes a kept-alive connection between requests (as nginx does after
    its keepalive_timeout) costs the client nothing: the proxy sends the request again on a
    new connection, and the client's own connection goes on."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    connections = []

    def upstream():  # answers one request per connection, then closes it without saying so
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            connections.append(conn)
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    head += chunk
                if head:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    thread = threading.Thread(target=upstream, daemon=True)
    thread.start()
    try:
        with FaultProxy("127.0.0.1", listener.getsockname()[1]) as proxy:
            with requests.Session() as session:
                answers = [session.get(proxy.url + "/x", timeout=10) for _ in range(3)]
            assert [a.content for a in answers] == [b"ok"] * 3
            assert proxy.stats()["requests"] == 3
    finally:
        listener.close()
    assert len(connections) >= 3  # each request after the first needed a new connection
