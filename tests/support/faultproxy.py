"""A TCP proxy on a loopback port in front of a real server (the moto S3 server), that can
fail the next requests on purpose: `reset` closes the connection under the request (what a
refusing or crashing endpoint looks like to the client) and `stall` swallows it, so the
client waits until its read timeout. A test-support tool: no protocol code, bytes are relayed
as they come; a chunk from the client that begins with an HTTP method is a new request.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from tests.support.served import free_port

Fault = Literal["reset", "stall"]
_METHODS = (b"GET ", b"PUT ", b"POST ", b"HEAD ", b"DELETE ")


@dataclass
class FaultProxy:
    upstream: tuple[str, int]
    port: int = field(default_factory=free_port)
    requests: int = 0  # every request seen, failed ones included
    failed: int = 0
    _pending: list[Fault] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail_next(self, count: int, how: Fault) -> None:
        """The next `count` requests fail by `how`; then requests pass again."""
        with self._lock:
            self._pending.extend([how] * count)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def _take(self) -> Fault | None:
        with self._lock:
            self.requests += 1
            if not self._pending:
                return None
            self.failed += 1
            return self._pending.pop(0)

    def clear(self) -> None:
        with self._lock:
            self._pending.clear()

    def serve(self, listener: socket.socket) -> None:
        listener.settimeout(0.2)
        with listener:
            while not self._stop.is_set():
                try:
                    client, _ = listener.accept()
                except TimeoutError:
                    continue
                threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            _reset(client)
            return
        threading.Thread(target=_copy, args=(upstream, client), daemon=True).start()
        stalled = False
        with contextlib.suppress(OSError):
            while chunk := client.recv(65536):
                if chunk.startswith(_METHODS):
                    fault = self._take()
                    if fault == "reset":
                        _reset(client)
                        upstream.close()
                        return
                    stalled = fault == "stall"
                if not stalled:
                    upstream.sendall(chunk)
        with contextlib.suppress(OSError):
            upstream.shutdown(socket.SHUT_WR)

    def stop(self) -> None:
        self._stop.set()


def _copy(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def _reset(sock: socket.socket) -> None:
    # SO_LINGER 0: close sends RST, as a crashing or refusing endpoint does.
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@contextlib.contextmanager
def fault_proxy(upstream_url: str) -> Iterator[FaultProxy]:
    """A running proxy in front of `upstream_url` (http://host:port)."""
    host, port = upstream_url.removeprefix("http://").rsplit(":", 1)
    proxy = FaultProxy((host, int(port)))
    listener = socket.create_server(("127.0.0.1", proxy.port))  # listening before we yield
    thread = threading.Thread(target=proxy.serve, args=(listener,), daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.stop()
        thread.join(5)
