"""A small HTTP/1.1 proxy (standard library asyncio) that stands between a client and a server
on 127.0.0.1 and makes the network worse on purpose: latency per request, a bandwidth cap, and
faults injected at a chosen rate (connection resets, truncated bodies, 503 SlowDown). It counts
requests and bytes. Used by the remote-reading tests and by benchmarks/ (the kernel's netem is
not available on these machines).

    with FaultProxy("127.0.0.1", upstream_port, latency=0.05, fault_rate=0.05) as proxy:
        url = proxy.url            # point the client here
        ...
        proxy.stats()              # {"requests": ..., "faults": {...}, "body_bytes": ...}
        round_trips(proxy.log())   # [(path, round trip it waited for)]: requests in turn

The proxy runs its own event loop on a daemon thread; ``close()`` stops it. It is a reverse
proxy: the client talks to it as it would to the server (the Host header is passed on as is,
so path-style S3 and signed requests keep working). Each client connection gets its own
upstream connection. A fault is decided per request, from a seeded random generator.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
import time

__all__ = ["FaultProxy", "FAULTS", "round_trips"]

FAULTS = ("reset", "truncate", "503")

_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


class _Closed(Exception):
    """The peer closed the connection between requests."""


async def _read_head(reader: asyncio.StreamReader) -> tuple:
    """``(first line, [(name, value)], raw head bytes)`` of the next message."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise _Closed() from None
        raise
    lines = raw[:-4].split(b"\r\n")
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers.append((name.strip().lower(), value.strip()))
    return lines[0], headers, raw


def _header(headers: list, name: bytes):
    for key, value in headers:
        if key == name:
            return value
    return None


class FaultProxy:
    """A fault-injecting HTTP proxy to ``upstream_host:upstream_port`` (see the module docs).

    ``latency``: seconds added before each request is forwarded. ``bandwidth``: bytes per
    second shared by all connections (None: no cap). ``fault_rate``: the probability that a
    request is faulted, with one of ``faults`` chosen at random: "reset" (the client
    connection is reset without an answer), "truncate" (the answer's body is cut in half and
    the connection reset), "503" (a 503 SlowDown answer, the request never forwarded).
    ``fault_methods``: the methods that may be faulted. ``seed``: the generator's seed.
    """

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        latency: float = 0.0,
        bandwidth: float | None = None,
        fault_rate: float = 0.0,
        faults: tuple = FAULTS,
        fault_methods: tuple = ("GET",),
        seed: int = 0,
        host: str = "127.0.0.1",
    ) -> None:
        for fault in faults:
            if fault not in FAULTS:
                raise ValueError(f"unknown fault {fault!r}: expected one of {FAULTS}")
        self.upstream = (upstream_host, upstream_port)
        self.latency = latency
        self.bandwidth = bandwidth
        self.fault_rate = fault_rate
        self.faults = tuple(faults)
        self.fault_methods = tuple(m.encode() for m in fault_methods)
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._counts = {"requests": 0, "body_bytes": 0, "faults": dict.fromkeys(FAULTS, 0)}
        self._copies = 0  # S3 CopyObject requests (a PUT naming its x-amz-copy-source)
        self._methods: dict = {}
        self._paths: dict = {}
        self._log: list = []  # [method, path, arrived, answered] of each request, in order
        self._next_send = 0.0  # the bandwidth cap's clock (loop time)
        self._loop = asyncio.new_event_loop()
        self._server = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(host,), daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._server is None:
            raise RuntimeError("the proxy did not start")
        self.port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://{host}:{self.port}"

    # -- control -----------------------------------------------------------------------------

    def set(self, **settings) -> None:
        """Change ``latency``, ``bandwidth``, ``fault_rate`` or ``faults`` from now on."""
        with self._lock:
            for name, value in settings.items():
                if name not in ("latency", "bandwidth", "fault_rate", "faults"):
                    raise TypeError(f"unknown setting {name!r}")
                setattr(self, name, tuple(value) if name == "faults" else value)

    def stats(self) -> dict:
        """Requests received, bytes of answer bodies sent, faults injected, per method/path."""
        with self._lock:
            return {
                "requests": self._counts["requests"],
                "body_bytes": self._counts["body_bytes"],
                "faults": dict(self._counts["faults"]),
                "methods": dict(self._methods),
                "paths": dict(self._paths),
                "copies": self._copies,
            }

    def log(self) -> list:
        """``(method, path, arrived, answered)`` of each request since the last reset, in the
        order they arrived (seconds of the proxy's clock; answered: when the answer's last
        byte was sent, None for one not answered)."""
        with self._lock:
            return [tuple(entry) for entry in self._log]

    def reset_stats(self) -> None:
        with self._lock:
            self._counts = {"requests": 0, "body_bytes": 0, "faults": dict.fromkeys(FAULTS, 0)}
            self._methods = {}
            self._paths = {}
            self._log = []
            self._copies = 0

    def close(self) -> None:
        if self._loop.is_closed():
            return

        async def stop():
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        except Exception:
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the loop ------------------------------------------------------------------------------

    def _run(self, host: str) -> None:
        asyncio.set_event_loop(self._loop)

        async def start():
            self._server = await asyncio.start_server(self._serve, host, 0)

        try:
            self._loop.run_until_complete(start())
        finally:
            self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    def _decide(self, method: bytes):
        with self._lock:
            if method in self.fault_methods and self._random.random() < self.fault_rate:
                fault = self._random.choice(self.faults)
                self._counts["faults"][fault] += 1
                return fault
            return None

    async def _pace(self, nbytes: int) -> None:
        """Wait until ``nbytes`` more fit under the bandwidth cap."""
        bandwidth = self.bandwidth
        if not bandwidth:
            return
        now = self._loop.time()
        start = max(now, self._next_send)
        self._next_send = start + nbytes / bandwidth
        if self._next_send > now:
            await asyncio.sleep(self._next_send - now)

    async def _serve(self, creader, cwriter) -> None:
        upstream = None
        try:
            while True:
                try:
                    line, headers, raw = await _read_head(creader)
                except _Closed:
                    return
                method, _, rest = line.partition(b" ")
                path = rest.rsplit(b" ", 1)[0].split(b"?")[0].decode("latin-1")
                length = int(_header(headers, b"content-length") or 0)
                body = await creader.readexactly(length) if length else b""
                entry = [method.decode(), path, self._loop.time(), None]
                with self._lock:
                    self._counts["requests"] += 1
                    key = method.decode()
                    self._methods[key] = self._methods.get(key, 0) + 1
                    self._paths[path] = self._paths.get(path, 0) + 1
                    self._log.append(entry)
                    if _header(headers, b"x-amz-copy-source") is not None:
                        self._copies += 1
                if self.latency:
                    await asyncio.sleep(self.latency)
                fault = self._decide(method)
                if fault == "reset":
                    _reset(cwriter)
                    return
                if fault == "503":
                    cwriter.write(
                        b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                        b"Content-Length: %d\r\n\r\n" % len(_SLOWDOWN) + _SLOWDOWN
                    )
                    await cwriter.drain()
                    entry[3] = self._loop.time()
                    continue
                for fresh in (upstream is None, True):
                    if fresh:  # a new connection, or the kept one was closed by upstream
                        if upstream is not None:
                            upstream[1].close()
                        upstream = await asyncio.open_connection(*self.upstream)
                    ureader, uwriter = upstream
                    try:
                        uwriter.write(raw + body)
                        await uwriter.drain()
                        keep = await self._relay(method, ureader, cwriter, fault == "truncate")
                        break
                    except (_Closed, ConnectionError):
                        # Upstream closed a kept-alive connection it had idled out before
                        # answering (nothing reached the client yet): send it once more on a
                        # new connection, as an HTTP client or proxy does.
                        if fresh:
                            raise
                entry[3] = self._loop.time()
                if not keep:
                    return
        except (
            _Closed,
            ConnectionError,
            asyncio.IncompleteReadError,
            OSError,
            asyncio.CancelledError,
        ):
            return
        finally:
            if upstream is not None:
                upstream[1].close()
            if not cwriter.is_closing():
                cwriter.close()

    async def _relay(self, method: bytes, ureader, cwriter, truncate: bool) -> bool:
        """Pass one answer from upstream to the client; whether the connection goes on."""
        line, headers, raw = await _read_head(ureader)
        status = int(line.split(b" ")[1])
        closing = (_header(headers, b"connection") or b"").lower() == b"close"
        chunked = (_header(headers, b"transfer-encoding") or b"").lower() == b"chunked"
        no_body = method == b"HEAD" or status in (204, 304) or 100 <= status < 200
        cwriter.write(raw)
        if no_body:
            await cwriter.drain()
            return not closing
        if chunked:
            body = await _read_chunked(ureader)
        elif _header(headers, b"content-length") is not None:
            body = await ureader.readexactly(int(_header(headers, b"content-length")))
        else:
            body = await ureader.read()
            closing = True
        if truncate:
            cut = len(body) // 2
            await self._send(cwriter, body[:cut])
            _reset(cwriter)
            return False
        await self._send(cwriter, body)
        return not closing

    async def _send(self, cwriter, body: bytes) -> None:
        step = 64 << 10
        for pos in range(0, len(body), step):
            part = body[pos : pos + step]
            await self._pace(len(part))
            with self._lock:  # counted before the client can see them
                self._counts["body_bytes"] += len(part)
            cwriter.write(part)
            await cwriter.drain()
        if not body:
            await cwriter.drain()


async def _read_chunked(reader) -> bytes:
    """A chunked body, raw (sizes and trailers kept: it is relayed as it came)."""
    parts = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        parts.append(size_line)
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            while True:
                trailer = await reader.readuntil(b"\r\n")
                parts.append(trailer)
                if trailer == b"\r\n":
                    return b"".join(parts)
        parts.append(await reader.readexactly(size + 2))


def round_trips(log: list) -> list:
    """``(path, n)`` of each request of ``log`` (``FaultProxy.log()``): ``n`` is the number
    of requests made in turn that it came after, itself included (1: made before any answer
    arrived; a request made after the answer to a request of round trip ``k`` is at least
    ``k + 1``). With a latency added well above the client's own delays, requests made
    together share a round trip and requests made in turn do not."""
    out: list = []
    depth: list = []
    for _method, path, arrived, _answered in log:
        before = [
            d for (_m, _p, _a, answered), d in zip(log, depth) if answered and answered <= arrived
        ]
        depth.append(1 + max(before, default=0))
        out.append((path, depth[-1]))
    return out


def _reset(writer) -> None:
    """Close the connection with a TCP reset (SO_LINGER 0), not an orderly FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


def wait_port(host: str, port: int, timeout: float = 10.0) -> None:
    """Wait until ``host:port`` accepts connections."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class ProxyProcess:
    """A FaultProxy in a process of its own (benchmarks: its CPU time is not the client's).

    Same arguments as FaultProxy; ``url`` and ``port`` as there, ``stats()`` over a pipe.
    """

    def __init__(self, upstream_host: str, upstream_port: int, **settings) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve_in_child,
            args=(child, upstream_host, upstream_port, settings),
            daemon=True,
        )
        self._proc.start()
        self.port = self._conn.recv()
        self.url = f"http://127.0.0.1:{self.port}"

    def _call(self, *message):
        self._conn.send(message)
        return self._conn.recv()

    def set(self, **settings) -> None:
        self._call("set", settings)

    def stats(self) -> dict:
        return self._call("stats")

    def reset_stats(self) -> None:
        self._call("reset_stats")

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._call("close")
            except (EOFError, OSError):
                pass
            self._proc.join(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _serve_in_child(conn, upstream_host, upstream_port, settings) -> None:
    proxy = FaultProxy(upstream_host, upstream_port, **settings)
    conn.send(proxy.port)
    while True:
        try:
            verb, *args = conn.recv()
        except EOFError:
            verb = "close"
        if verb == "close":
            proxy.close()
            conn.send(None)
            return
        if verb == "set":
            proxy.set(**args[0])
            conn.send(None)
        else:
            conn.send(getattr(proxy, verb)())
