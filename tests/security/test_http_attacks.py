"""A hostile client against a real `modelfleet serve` over raw sockets: what the HTTP server
(granian, server/http_server.py) and the app's edge (server/api/body_limits.py, observe.py) do with
pipelining, `Expect: 100-continue`, chunked trailers, huge or unfinished request heads, a
client that goes away mid-body, and Host headers. Each test is named after the attack."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient

from server.app import create_app
from tests.fleet.conftest import Fleet, fleet_settings, open_fleet
from tests.support.fleet_devices import shadow_report
from tests.support.metrics import sample
from tests.support.served import free_port
from tests.support.served_fleet import (
    ServedFleet,
    chunked,
    parse,
    read_all,
    read_responses,
    request,
    served_fleet,
)

HEADER_TIMEOUT_SECONDS = 2.0
POLL = b"GET /v1/channels/prod/manifest HTTP/1.1\r\nHost: t\r\n\r\n"
MODEL = json.dumps({"name": "trailer-made", "task": "classification"}).encode()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedFleet]:
    root = tmp_path_factory.mktemp("http-attacks")
    with served_fleet(root, f"sqlite:///{root}/fleet.db",
                      header_read_timeout_seconds=HEADER_TIMEOUT_SECONDS) as served:
        yield served


def _model_exists(srv: ServedFleet, name: str) -> bool:
    r, _ = parse(srv.raw(request("GET", f"/v1/models/{name}")))
    return r.status == 200


def test_request_pipelined_behind_a_poll_does_not_inherit_its_keep_alive_timer(
        srv: ServedFleet) -> None:
    srv.raw(POLL)  # the manifest in the worker's cache
    head = request("POST", "/v1/models", MODEL, {**srv.publish,
                                                  "Content-Type": "application/json"})
    with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as s:
        s.sendall(POLL + head[:-len(MODEL)])  # the poll, then the write's head at once
        time.sleep(6.5)  # longer than any keep-alive timer (uvicorn's was 5 s)
        s.sendall(MODEL)
        data = read_responses(s, 2, timeout=10)
    poll, rest = parse(data)
    created, _ = parse(rest)
    assert poll.status == 200 and created.status == 201, created.body
    assert _model_exists(srv, "trailer-made")


def test_expect_100_continue_poll_is_answered(srv: ServedFleet) -> None:
    srv.raw(POLL)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(b"GET /v1/channels/prod/manifest HTTP/1.1\r\nHost: t\r\n"
                  b"Expect: 100-continue\r\nContent-Length: 5\r\n\r\n")
        data = read_responses(s, 1, timeout=5)
    if data.startswith(b"HTTP/1.1 100"):  # an interim answer first is fine too
        data = data.partition(b"\r\n\r\n")[2]
    r, _ = parse(data)
    assert r.status == 200 and json.loads(r.body)["payloadType"]


def test_authorization_in_a_chunked_trailer_does_not_authenticate_a_write(
        srv: ServedFleet) -> None:
    name = "trailer-auth"
    body = json.dumps({"name": name, "task": "classification"}).encode()
    r, _ = parse(srv.raw(chunked("POST", "/v1/models", body,
                                 {"Content-Type": "application/json"}, srv.publish),
                         until_close=True))
    assert r.status in (401, 411), r.body
    assert not _model_exists(srv, name)


def test_device_signature_in_a_chunked_trailer_does_not_authenticate_telemetry(
        srv: ServedFleet) -> None:
    device = srv.devices["served-00"]
    body = device.batch([shadow_report("clf", "1.0", "pending")])
    before = sample(srv.metrics(), "modelfleet_telemetry_reports_total", result="accepted")
    r, _ = parse(srv.raw(chunked("POST", "/v1/telemetry", body, {}, device.headers(body)),
                         until_close=True))
    assert r.status in (401, 411), r.body
    assert sample(srv.metrics(), "modelfleet_telemetry_reports_total",
                  result="accepted") == before


def test_16_mib_header_is_refused(srv: ServedFleet) -> None:
    big = b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * (16 << 20) + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        try:
            s.sendall(big)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed on us before we finished: refused
        data = read_all(s)
    assert not data.startswith(b"HTTP/1.1 200"), data[:200]
    if data:
        assert parse(data)[0].status == 431


def _unfinished_head(port: int, size: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: ")
    block = b"a" * (1 << 20)
    try:
        for _ in range(size >> 20):
            s.sendall(block)
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused once past the head limit
    return s


def test_unfinished_32_mib_headers_do_not_grow_server_memory(srv: ServedFleet) -> None:
    before = srv.rss_kib()
    socks = [_unfinished_head(srv.port, 32 << 20) for _ in range(3)]
    try:
        grown = srv.rss_kib() - before
    finally:
        for s in socks:
            s.close()
    assert grown < 16 * 1024, f"server grew by {grown} KiB holding three unfinished heads"


def test_unfinished_request_head_is_closed_after_the_header_timeout(srv: ServedFleet) -> None:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=15) as s:
        start = time.monotonic()
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")  # never finished
        data = read_all(s, timeout=HEADER_TIMEOUT_SECONDS + 8)
        waited = time.monotonic() - start
    assert not data.startswith(b"HTTP/1.1 200")
    assert waited < HEADER_TIMEOUT_SECONDS + 5, f"connection held {waited:.1f} s"


def test_client_disconnecting_mid_body_is_counted_and_logged_as_499_not_500(
        srv: ServedFleet) -> None:
    def count(text: str, status: str) -> float:
        return sample(text, "modelfleet_http_requests_total", method="POST",
                      route="/v1/telemetry", status=status)

    before = srv.metrics()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(b"POST /v1/telemetry HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n"
                  b'{"device_id"')
        time.sleep(0.3)
    deadline = time.monotonic() + 10
    while count(srv.metrics(), "499") == count(before, "499"):
        assert time.monotonic() < deadline, "the disconnect was never counted"
        time.sleep(0.2)
    after = srv.metrics()
    assert count(after, "499") - count(before, "499") == 1
    assert count(after, "500") == count(before, "500")
    log = srv.log.read_text()
    assert re.search(r'"POST /v1/telemetry HTTP/1.1" 499', log), log[-2000:]
    assert not re.search(r'"POST /v1/telemetry HTTP/1.1" 500', log)


@pytest.mark.parametrize("path", ["/ui", "/v1/models/", "/v1/channels/"])
def test_host_header_cannot_redirect_to_another_site(srv: ServedFleet, path: str) -> None:
    raw = f"GET {path} HTTP/1.1\r\nHost: evil.example\r\n\r\n".encode()
    r, _ = parse(srv.raw(raw))
    assert "evil.example" not in (r.header("location") or "")
    if r.status in (301, 302, 307, 308):
        assert (r.header("location") or "").startswith("/")


# ------------------------------------------------ the edge holds under uvicorn's httptools too


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    yield from open_fleet(fleet_settings(f"sqlite:///{tmp_path}/fleet.db", tmp_path))


def _uvicorn(app: Any) -> tuple[uvicorn.Server, threading.Thread, int]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, http="httptools",
                                           lifespan="on", log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    return server, thread, port


def test_authorization_in_a_chunked_trailer_is_refused_under_uvicorn_httptools_too(
        fleet: Fleet) -> None:
    """uvicorn's httptools protocol appends trailer fields to the header list the app reads;
    the guard refuses chunked writes before authentication, so it never matters."""
    from server.auth import create_token

    with fleet.client.app.state.session_factory() as s:  # type: ignore[attr-defined]
        _, token = create_token(s, ["publish"], name="p")
        s.commit()
    server, thread, port = _uvicorn(create_app(fleet.settings))
    try:
        body = json.dumps({"name": "via-httptools", "task": "classification"}).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(chunked("POST", "/v1/models", body, {"Content-Type": "application/json"},
                              {"Authorization": f"Bearer {token}"}))
            r, _ = parse(read_responses(s, 1))
        assert r.status == 411 and json.loads(r.body)["code"] == "length_required"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    assert fleet.client.get("/v1/models/via-httptools").status_code == 404


def test_docs_page_loads_nothing_from_another_origin(fleet: Fleet) -> None:
    client: TestClient = fleet.client
    page = client.get("/docs")
    assert page.status_code == 200
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sources and all(s.startswith("/docs/") for s in sources), sources
    assert "<script>" not in page.text  # no inline script (the CSP would refuse it anyway)
    for src in sources:
        asset = client.get(src)
        assert asset.status_code == 200 and len(asset.content) > 0
    assert client.get("/openapi.json").status_code == 200
