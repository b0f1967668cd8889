"""Request ids and structured logs: the id is taken from a sane X-Request-Id or made, echoed,
and carried by every record emitted while the request runs; JSON lines have the documented
fields; hostile ids and secrets never reach a log line."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.api.observe import RequestObserver
from server.observability.logs import (
    REQUEST_ID,
    JsonFormatter,
    RequestIdFilter,
    TextFormatter,
    redact,
    request_id_from,
)

HEX32 = set("0123456789abcdef")


class Captured:
    def __init__(self, stream: io.StringIO) -> None:
        self.stream = stream

    def lines(self) -> list[str]:
        return self.stream.getvalue().splitlines()

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines()]


@pytest.fixture
def json_logs() -> Iterator[Captured]:
    """Every record at INFO and up, as the JSON lines `--log-format json` writes."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield Captured(stream)
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def access(records: list[dict[str, Any]], path: str) -> dict[str, Any]:
    found = [r for r in records if r["logger"] == "modelfleet.access" and r["path"] == path]
    assert len(found) == 1, records
    return found[0]


def test_a_sane_request_id_is_echoed_and_logged_with_the_documented_fields(
        client: TestClient, json_logs: Captured) -> None:
    r = client.get("/v1/models", headers={"X-Request-Id": "lb-7f3a:01.x_y"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "lb-7f3a:01.x_y"
    line = access(json_logs.records(), "/v1/models")
    assert line["request_id"] == "lb-7f3a:01.x_y"
    assert {"ts", "level", "logger", "msg", "request_id", "method", "route", "status",
            "duration_ms"} <= line.keys()
    assert (line["method"], line["route"], line["status"], line["level"]) == (
        "GET", "/v1/models", 200, "info")
    assert isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0
    assert line["ts"].endswith("Z")


def test_without_a_request_id_one_is_made_per_request(client: TestClient) -> None:
    ids = {client.get("/healthz").headers["x-request-id"] for _ in range(3)}
    assert len(ids) == 3 and all(len(i) == 32 and set(i) <= HEX32 for i in ids)


def test_records_emitted_inside_a_route_carry_the_request_id(
        client: TestClient, json_logs: Captured) -> None:
    app = client.app

    def shout() -> dict[str, str]:  # a sync route: runs in the threadpool
        logging.getLogger("modelfleet.test").warning("inside the route")
        return {"ok": "yes"}

    app.router.add_api_route("/test-only/shout", shout, methods=["GET"])  # type: ignore[attr-defined]
    r = client.get("/test-only/shout", headers={"X-Request-Id": "req-42"})
    assert r.status_code == 200
    inside = [x for x in json_logs.records() if x["msg"] == "inside the route"]
    assert [x["request_id"] for x in inside] == ["req-42"]
    assert access(json_logs.records(), "/test-only/shout")["route"] == "/test-only/shout"
    assert REQUEST_ID.get() is None  # reset once the request is over


@pytest.mark.parametrize("hostile", [
    b'x\n{"ts":"2026","level":"error","msg":"forged admin login"}',
    b"x\r\nINFO forged line",
    b"\x1b[2J\x1b[31mred",
    b'quote"and space',
    b"a" * 129,
    b"",
])
def test_hostile_request_id_header_cannot_inject_log_lines(hostile: bytes) -> None:
    """Behind a proxy that passes header bytes through, the id lands in the ASGI scope as
    sent: it is replaced, never logged or echoed."""
    import asyncio

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter())
    handler.addFilter(RequestIdFilter())
    log = logging.getLogger("modelfleet.access")
    old_level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Callable[..., Any]) -> None:
        logging.getLogger("modelfleet.access").info("handled")
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/x\n/forged", "query_string": b"",
             "headers": [(b"x-request-id", hostile)], "client": ("10.0.0.1", 5),
             "http_version": "1.1"}
    try:
        asyncio.run(RequestObserver(app)(scope, receive, send))
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
    echoed = dict(sent[0]["headers"])[b"x-request-id"].decode()
    assert len(echoed) == 32 and set(echoed) <= HEX32  # a fresh id, not the header
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2  # "handled" and the access line: nothing injected
    assert all("forged" not in line or "%0A" in line for line in lines)
    assert not any("\x1b" in line or '"level"' in line for line in lines)
    assert all(line.endswith(f"[{echoed}]") for line in lines)


def test_request_id_rules() -> None:
    assert request_id_from(b"abc-DEF_1.2:3") == "abc-DEF_1.2:3"
    assert request_id_from("a" * 128) == "a" * 128
    for bad in (b"a" * 129, b"a b", b"a/b", "é".encode(), None):
        made = request_id_from(bad)
        assert len(made) == 32 and set(made) <= HEX32


def test_tokens_and_signatures_never_reach_the_log(
        client: TestClient, json_logs: Captured, make_token: Callable[..., str]) -> None:
    secret = make_token("publish")
    wrong = "mf_" + "Q" * 43
    signature = "c2lnbmF0dXJlLW9mLWEtZGV2aWNlLXRoYXQtbXVzdC1zdGF5LXNlY3JldA=="
    auth = {"Authorization": f"Bearer {secret}"}
    assert client.post("/v1/models", json={"name": "clf"}, headers=auth).status_code == 201
    assert client.post("/v1/models", json={"name": "x"},
                       headers={"Authorization": f"Bearer {wrong}"}).status_code == 401
    # A careless client putting secrets in the query string: the access line keeps the
    # query (operators read it) but not the secrets.
    client.get(f"/v1/models?token={secret}&sig={signature}")
    client.post("/v1/telemetry", content=b'{"reports": []}',
                headers={"X-Device-Id": "dev-1", "X-Device-Signature": signature,
                         "Content-Type": "application/json"})
    # A record that quotes a header, as an error message might.
    logging.getLogger("modelfleet.test").error("refused Authorization: Bearer %s", secret)
    text = json_logs.stream.getvalue()
    assert "/v1/models" in text and "/v1/telemetry" in text  # the requests were logged…
    for leaked in (secret, secret[3:], wrong, signature):
        assert leaked not in text  # …without a secret


def test_redact_scrubs_bearer_tokens_token_secrets_and_signature_parameters() -> None:
    assert redact("Authorization: Bearer abc.def") == "Authorization: Bearer [redacted]"
    assert redact("token mf_abcdefghij leaked") == "token mf_[redacted] leaked"
    assert redact("/x?sig=AAAA%2B&limit=2") == "/x?sig=[redacted]&limit=2"
    assert redact("plain message") == "plain message"
