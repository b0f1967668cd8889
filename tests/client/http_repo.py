"""The repository simulator served over real loopback HTTP (for UrllibTransport, the kill test,
the device agent and the benchmarks). Blob requests can be answered with a 302 to a
"presigned" URL, as S3-backed servers do."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.client.simulator import BASE, RepositorySimulator


def _handler(sim: RepositorySimulator, redirect_blobs: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            path = self.path
            if redirect_blobs and path.startswith("/blobs/"):
                self.send_response(302)
                self.send_header("Location", "/presigned" + path + "?X-Amz-Signature=abc")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if path.startswith("/presigned/"):
                path = path[len("/presigned"):].split("?", 1)[0]
            headers = {k: v for k, v in (("Range", self.headers.get("Range")),
                                         ("If-None-Match", self.headers.get("If-None-Match")))
                       if v}
            resp, body = sim.fetch_all(path, headers)
            self.send_response(resp.status)
            for k, v in resp.headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            headers = {k: v for k, v in self.headers.items()}
            resp = sim.post(BASE + self.path, body, headers, 30)
            data = b"".join(resp.chunks)
            self.send_response(resp.status)
            for k, v in resp.headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@contextmanager
def serve(sim: RepositorySimulator, *, redirect_blobs: bool = False) -> Iterator[str]:
    """Serve ``sim`` on 127.0.0.1; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(sim, redirect_blobs))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
