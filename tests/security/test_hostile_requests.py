"""Hostile requests against a real `modelfleet serve`: bodies are refused before they are read
when the token is missing or wrong, JSON bodies are small and shallow, uploads are streamed
only after authentication and only a few at a time.

Each attack streams its body from a generator over a raw socket and measures what the server
took: the body bytes the client could push before the answer, the server's resident memory,
and the files its multipart parser spooled (the server's TMPDIR is private to the test)."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.auth import create_token
from server.commands.common import migrated_settings
from server.db.session import make_engine, make_session_factory
from tests.security.net_server import Server, running_server, stream_request, zeros

GIB = 1024**3
# The kernel buffers a little on both ends of the loopback connection; the server reading
# the body itself would take it all (1 GiB within the budget, or no answer at all).
MAX_BODY_BYTES_TAKEN = 8 * 1024 * 1024
MAX_RSS_GROWTH_KIB = 8 * 1024
BOUNDARY = "mfattack"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("hostile")
    with running_server(root) as srv:
        yield srv


@pytest.fixture(scope="module")
def tokens(server: Server) -> dict[str, str]:
    settings = migrated_settings(server.data_dir)
    engine = make_engine(settings.resolved_database_url)
    try:
        with make_session_factory(engine)() as session:
            out = {scope: create_token(session, [scope], name=scope,
                                       pepper=settings.token_pepper)[1]
                   for scope in ("publish", "rollout")}
            session.commit()
    finally:
        engine.dispose()
    return out


def _head(method: str, path: str, length: int, content_type: str,
          authorization: str | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Type: {content_type}",
             f"Content-Length: {length}"]
    if authorization:
        lines.append(f"Authorization: {authorization}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _multipart(total: int) -> Iterator[bytes]:
    """A model upload of `total` bytes: the metadata field, then a model file of zeros."""
    yield (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n"
           '{"version": "1.0.0", "platforms": ["onnx"], "inputs": []}\r\n'
           f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"model\"; "
           "filename=\"m.onnx\"\r\nContent-Type: application/octet-stream\r\n\r\n").encode()
    yield from zeros(total)


def _blob_files(server: Server) -> set[Path]:
    return {p for p in (server.data_dir / "blobs").rglob("*") if p.is_file()}


def _request(server: Server, method: str, path: str, body: bytes, token: str,
             content_type: str = "application/json") -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{server.port}{path}", data=body, method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_unauthenticated_gigabyte_json_is_refused_before_reading(server: Server) -> None:
    rss_before, peak_before = server.rss_kib(), server.peak_rss_kib()
    answer = stream_request(server.port, _head("POST", "/v1/channels", GIB, "application/json"),
                            zeros(GIB))
    assert answer.status == 401, answer
    assert b"missing API token" in answer.body
    assert answer.sent < MAX_BODY_BYTES_TAKEN, f"server took {answer.sent} body bytes first"
    assert answer.seconds < 2.0
    assert server.peak_rss_kib() - peak_before < MAX_RSS_GROWTH_KIB
    assert server.rss_kib() - rss_before < MAX_RSS_GROWTH_KIB


def test_wrong_token_gigabyte_json_is_refused_before_reading(server: Server) -> None:
    answer = stream_request(server.port, _head("POST", "/v1/channels", GIB, "application/json",
                                               "Bearer mf_not-a-real-token"), zeros(GIB))
    assert answer.status == 401 and b"unknown API token" in answer.body
    assert answer.sent < MAX_BODY_BYTES_TAKEN


def test_unauthenticated_multipart_upload_is_refused_before_spooling(server: Server) -> None:
    total = 1_500_000_000
    blobs_before, peak_before = _blob_files(server), server.peak_rss_kib()
    answer = stream_request(
        server.port, _head("POST", "/v1/models/victim/versions", total,
                           f"multipart/form-data; boundary={BOUNDARY}"), _multipart(total))
    assert answer.status == 401, answer
    assert answer.sent < MAX_BODY_BYTES_TAKEN, f"server took {answer.sent} body bytes first"
    assert server.files_under_spool() == [], "multipart parts were spooled before the 401"
    assert _blob_files(server) == blobs_before
    assert server.peak_rss_kib() - peak_before < MAX_RSS_GROWTH_KIB


def test_rollout_token_cannot_stream_a_model_upload(server: Server,
                                                    tokens: dict[str, str]) -> None:
    """A valid token without the `publish` scope is a 403 before the upload is read."""
    total = 1_500_000_000
    answer = stream_request(
        server.port, _head("POST", "/v1/models/victim/versions", total,
                           f"multipart/form-data; boundary={BOUNDARY}",
                           f"Bearer {tokens['rollout']}"), _multipart(total))
    assert answer.status == 403, answer
    assert answer.sent < MAX_BODY_BYTES_TAKEN
    assert server.files_under_spool() == []


def test_authenticated_json_body_over_one_mib_is_413_unread(server: Server,
                                                            tokens: dict[str, str]) -> None:
    answer = stream_request(server.port, _head("POST", "/v1/channels", GIB, "application/json",
                                               f"Bearer {tokens['rollout']}"), zeros(GIB))
    assert answer.status == 413, answer
    assert answer.sent < MAX_BODY_BYTES_TAKEN


def test_json_body_nested_60000_deep_is_422_not_500(server: Server,
                                                    tokens: dict[str, str]) -> None:
    status, body = _request(server, "POST", "/v1/channels", b"[" * 60_000 + b"]" * 60_000,
                            tokens["rollout"])
    assert status == 422 and body["field"] == "body", body
    assert "deeper than 16" in str(body["detail"])


def test_metadata_nested_60000_deep_is_422_not_500(server: Server,
                                                   tokens: dict[str, str]) -> None:
    status, _ = _request(server, "POST", "/v1/models", json.dumps({"name": "deep"}).encode(),
                         tokens["publish"])
    assert status in (200, 201)
    for metadata in ("[" * 60_000,  # what the attacker sent: 60 000 bytes, under the field cap
                     "[" * 30_000 + "]" * 30_000):  # and a well-formed one
        form = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n"
                f"{metadata}\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"model\"; "
                f"filename=\"m.onnx\"\r\n\r\nnot-a-model\r\n--{BOUNDARY}--\r\n").encode()
        status, body = _request(server, "POST", "/v1/models/deep/versions", form,
                                tokens["publish"], f"multipart/form-data; boundary={BOUNDARY}")
        assert status == 422 and body["field"] == "metadata", body
        assert "deeper than 16" in str(body["detail"])


def test_fifth_concurrent_upload_is_503_with_retry_after(server: Server,
                                                         tokens: dict[str, str]) -> None:
    auth = f"Bearer {tokens['publish']}"
    head = _head("POST", "/v1/models/victim/versions", 10_000_000,
                 f"multipart/form-data; boundary={BOUNDARY}", auth)
    held = []
    try:
        for _ in range(4):  # four uploads in progress: headers and a first part, then silence
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.sendall(head + next(_multipart(0)) + bytes(1024))
            held.append(sock)
        for _attempt in range(5):  # the four reach the route once their tokens are checked
            time.sleep(0.5)
            answer = stream_request(server.port, head, _multipart(10_000_000),
                                    budget_seconds=3)
            if answer.status == 503:
                break
        assert answer.status == 503, answer
        assert b"retry-after: 5" in answer.head.lower()
        assert answer.sent < MAX_BODY_BYTES_TAKEN
    finally:
        for sock in held:
            sock.close()
    # The slots come back once those clients are gone: a complete upload reaches the route
    # (which answers 404: there is no model `victim`).
    complete = b"".join(_multipart(16)) + f"\r\n--{BOUNDARY}--\r\n".encode()
    status = 503
    deadline = time.monotonic() + 5
    while status == 503 and time.monotonic() < deadline:
        time.sleep(0.2)
        status, _ = _request(server, "POST", "/v1/models/victim/versions", complete,
                             tokens["publish"], f"multipart/form-data; boundary={BOUNDARY}")
    assert status == 404


def test_every_write_route_that_needs_a_token_is_authenticated_before_its_body() -> None:
    """The guard reads the routes' own token dependencies: no write route documenting a 401
    slips past it (a new router appended to `server.api.ROUTERS` is covered by construction)."""
    from server.api import ROUTERS
    from server.api.body_limits import WRITE_METHODS, _api_routes, route_rule

    writes = [r for r in _api_routes(ROUTERS) if r.methods & WRITE_METHODS]
    assert writes
    # Device telemetry and the content-key request document 401 without a bearer token: they
    # are authenticated by the device's signature over the body, capped first (telemetry by
    # its own setting, tests/security/test_device_telemetry_attacks.py; a key request by the
    # JSON cap, then 4096 bytes in the route, tests/security/test_content_key_attacks.py).
    device_signed = {"/v1/telemetry": "max_telemetry_body_bytes",
                     "/v1/devices/content-key": None}
    for route in writes:
        rule = route_rule(route)
        if route.path in device_signed:
            assert not rule.token and rule.cap_setting == device_signed[route.path]
            continue
        assert rule.token == (401 in route.responses), route.path
    uploads = {r.path for r in writes if route_rule(r).upload}
    assert uploads == {"/v1/models/{name}/versions"}
