"""A hostile mirror on loopback: serves the repository simulator's documents and blobs over
real HTTP, but drips chosen responses at one byte a second (status line and headers, or the
body), answers redirect loops, or sends a TLS client to plain HTTP."""

from __future__ import annotations

import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.client.simulator import RepositorySimulator

# What to do with a request path: "ok", "drip-headers", "drip-body", "loop", or a URL to
# redirect to.
Plan = Callable[[str], str]


@dataclass
class Mirror:
    base: str
    requests: list[str] = field(default_factory=list)


def _read_request(conn: socket.socket) -> tuple[str, dict[str, str]]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            raise ConnectionError("client closed")
        data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in head[1:] if ": " in line)
    return head[0].split(" ")[1], headers


def _drip(conn: socket.socket, data: bytes, stop: threading.Event) -> None:
    for i in range(len(data)):
        if stop.wait(1.0):
            return
        conn.sendall(data[i:i + 1])


def _handler(sim: RepositorySimulator, plan: Plan, mirror: Mirror,
             stop: threading.Event) -> type[socketserver.BaseRequestHandler]:
    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            conn: socket.socket = self.request
            try:
                path, headers = _read_request(conn)
            except (ConnectionError, OSError):
                return
            mirror.requests.append(path)
            what = plan(path)
            try:
                if what == "drip-headers":
                    conn.sendall(b"HTTP/1.1 200 OK\r\n")
                    _drip(conn, b"X-Slow: " + b"a" * 10_000 + b"\r\n", stop)
                    return
                if what == "loop" or what.startswith("http"):
                    target = path if what == "loop" else what
                    conn.sendall(f"HTTP/1.1 302 Found\r\nLocation: {target}\r\n"
                                 "Content-Length: 0\r\n\r\n".encode())
                    return
                status, body, extra = _from_simulator(sim, path, headers)
                head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
                conn.sendall(head.encode())
                if what == "drip-body":
                    _drip(conn, body, stop)
                else:
                    conn.sendall(body)
            except OSError:
                return

    return Handler


def _from_simulator(sim: RepositorySimulator, path: str,
                    headers: dict[str, str]) -> tuple[int, bytes, str]:
    wanted = {k: v for k, v in headers.items() if k.lower() in ("range", "if-none-match")}
    resp, body = sim.fetch_all(path, wanted)
    extra = "".join(f"{k}: {v}\r\n" for k, v in resp.headers.items()
                    if k.lower() != "content-length")
    return resp.status, body, extra


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextmanager
def mirror(sim: RepositorySimulator, plan: Plan, *,
           tls: tuple[Path, Path] | None = None) -> Iterator[Mirror]:
    """Serve on 127.0.0.1 (HTTPS with `tls` = (cert, key)); yields the base URL."""
    stop = threading.Event()
    state = Mirror("")
    server = _Server(("127.0.0.1", 0), _handler(sim, plan, state, stop))
    scheme = "http"
    if tls is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(tls[0]), str(tls[1]))
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    state.base = f"{scheme}://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A throwaway certificate for 127.0.0.1 (cert, key), made with `cryptography`."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def timed(fn: Callable[[], object], limit: float) -> tuple[object, float]:
    """Run `fn` in a thread; (its result or exception, seconds). A call still running after
    `limit` seconds is reported as TimeoutError (the mirror's teardown then frees it)."""
    box: list[object] = []
    start = time.monotonic()

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as e:  # the test inspects what was raised
            box.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    elapsed = time.monotonic() - start
    if not box:
        return TimeoutError(f"still running after {limit} s"), elapsed
    return box[0], elapsed
