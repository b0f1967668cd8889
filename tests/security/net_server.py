"""A real `modelfleet serve` in a subprocess (its own data dir and TMPDIR, so spooled uploads
are visible), and a raw-socket client that streams a huge body from a generator while
watching for an early answer — what an attacker's upload looks like to the server."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.served import free_port, tree_status_kib, wait_until_up

REPO = Path(__file__).resolve().parents[2]
CHUNK = 64 * 1024


@dataclass
class Server:
    port: int
    proc: subprocess.Popen[bytes]
    data_dir: Path
    spool_dir: Path  # the server's TMPDIR: multipart parts are spooled here

    def rss_kib(self) -> int:
        """The server's resident memory now (VmRSS, KiB), over its worker processes too."""
        return tree_status_kib(self.proc.pid, "VmRSS")

    def peak_rss_kib(self) -> int:
        """The server's peak resident memory since it started (VmHWM, KiB, each process's
        peak summed)."""
        return tree_status_kib(self.proc.pid, "VmHWM")

    def files_under_spool(self) -> list[Path]:
        return [p for p in self.spool_dir.rglob("*") if p.is_file()]


@contextmanager
def running_server(root: Path) -> Iterator[Server]:
    data_dir, spool = root / "data", root / "spool"
    spool.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELFLEET_")}
    env.update(PYTHONPATH=str(REPO), TMPDIR=str(spool))
    port = free_port()
    log = (root / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "modelfleet", "serve", "--data-dir", str(data_dir),
         "--port", str(port)], cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until_up(f"http://127.0.0.1:{port}/healthz", proc, root / "serve.log", 60)
        yield Server(port, proc, data_dir, spool)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@dataclass
class Exchange:
    status: int | None  # None: no answer within the budget
    head: bytes  # status line and headers as received
    body: bytes
    sent: int  # body bytes the client managed to hand to the kernel before the answer
    seconds: float  # from the first body byte to the answer


def zeros(total: int) -> Iterator[bytes]:
    block = bytes(CHUNK)
    while total > 0:
        yield block[:min(CHUNK, total)]
        total -= CHUNK


def stream_request(port: int, head: bytes, body: Iterator[bytes], *,
                   budget_seconds: float = 6.0) -> Exchange:
    """Send `head`, then stream `body` until the server answers (or closes, or the budget is
    spent). A small send buffer keeps the kernel from hiding how much the server took."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    sock.sendall(head)
    sock.setblocking(False)
    start = time.monotonic()
    sent, pending, answer = 0, b"", b""
    try:
        while time.monotonic() - start < budget_seconds:
            if not pending:
                pending = next(body, b"")
            wlist = [sock] if pending else []
            readable, writable, _ = select.select([sock], wlist, [], 0.05)
            if readable:
                answer = _read_answer(sock, start + budget_seconds)
                break
            if writable:
                try:
                    n = sock.send(pending)
                except (BrokenPipeError, ConnectionResetError):
                    answer = _read_answer(sock, start + budget_seconds)
                    break
                sent += n
                pending = pending[n:]
        seconds = time.monotonic() - start
    finally:
        sock.close()
    return _exchange(answer, sent, seconds)


def _read_answer(sock: socket.socket, deadline: float) -> bytes:
    sock.setblocking(True)
    out = b""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        out += chunk
        if b"\r\n\r\n" in out:
            head, _, rest = out.partition(b"\r\n\r\n")
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), None)
            if length is not None and len(rest) >= length:
                break
    return out


def _exchange(answer: bytes, sent: int, seconds: float) -> Exchange:
    if not answer.startswith(b"HTTP/1."):
        return Exchange(None, b"", b"", sent, seconds)
    head, _, body = answer.partition(b"\r\n\r\n")
    return Exchange(int(head.split()[1]), head, body, sent, seconds)
