"""Telemetry answered inside uvicorn's HTTP protocol (server/api/fastingest.py), on a real
uvicorn over a real socket: the same status, headers and JSON as the ASGI route for every
answer, the body caps before and while reading, the signature over the exact bytes, order
behind a pending answer, and the unusual requests left to uvicorn."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from server.api.fastingest import DeviceProtocol
from tests.fleet.conftest import Fleet, fleet_settings, open_fleet
from tests.publish.test_fastpoll import Running, parse, read_all, read_responses, serve
from tests.support.fleet_devices import FleetDevice, shadow_report

TELEMETRY = ("POST", "/v1/telemetry")
CAP = 4096


@pytest.fixture
def fleet(database_url: str, tmp_path: Any) -> Iterator[Fleet]:
    # A burst of 3 at one request per 1000 s: the fourth request of a device is a 429.
    yield from open_fleet(fleet_settings(database_url, tmp_path, telemetry_burst=3,
                                         telemetry_rate_per_second=0.001,
                                         max_telemetry_body_bytes=CAP))


def post(body: bytes, headers: dict[str, str], *extra: str, length: bool = True,
         version: str = "1.1") -> bytes:
    lines = [f"POST /v1/telemetry HTTP/{version}", "Host: t",
             *(f"{k}: {v}" for k, v in headers.items()), *extra]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return "\r\n".join([*lines, "", ""]).encode() + body


def chunked(body: bytes, headers: dict[str, str], size: int = 1000) -> bytes:
    head = post(b"", headers, "Transfer-Encoding: chunked", length=False)
    parts = [b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size])
             for i in range(0, len(body), size)]
    return head + b"".join(parts) + b"0\r\n\r\n"


def signed(device: FleetDevice) -> tuple[bytes, dict[str, str]]:
    body = device.batch([shadow_report("clf", "1.0", "pending")])
    return body, device.headers(body)


def telemetry_calls(srv: Running) -> int:
    return srv.app.calls.count(TELEMETRY)


def test_every_answer_matches_the_asgi_route_byte_for_byte(fleet: Fleet) -> None:
    ok, forged_dev, revoked, limited = (fleet.enroll(FleetDevice(n)) for n in
                                        ("eq-ok", "eq-forged", "eq-revoked", "eq-limited"))
    assert fleet.client.post("/v1/devices/eq-revoked/revoke", headers=fleet.ops).status_code == 200
    deep = b"[" * 200 + b"]" * 200
    answers: dict[str, list[Any]] = {}
    for name, http in (("fast", DeviceProtocol), ("asgi", "httptools")):
        body, headers = signed(ok)
        forged_body = forged_dev.batch([shadow_report("clf", "1.0", "failed")])
        requests = [
            post(body, headers),  # 200
            post(body, headers),  # the same batch again: 200, counted as a duplicate
            post(forged_body, FleetDevice("eq-forged").headers(forged_body)),  # 401 forged
            post(*signed(FleetDevice("eq-nobody"))),  # 401 unknown device
            post(*signed(revoked)),  # 401 revoked
            post(b"{}", {"X-Device-Id": "eq-ok"}),  # 401 no signature
            post(deep, headers),  # 422 nested too deep
            post(b'{"device_id": "eq-ok"}', {"X-Device-Id": "eq-ok"},
                 "Content-Length: 99999", length=False),  # 413 declared
            *(post(*signed(limited)) for _ in range(4)),  # 200 x3, then 429 + Retry-After
        ]
        # The same X-Request-Id on both paths: echoed (server/api/observe.py), so comparable.
        requests = [r.replace(b"\r\nHost: t\r\n", b"\r\nHost: t\r\nX-Request-Id: eq-%d\r\n" % i)
                    for i, r in enumerate(requests)]
        with serve(fleet.settings, http=http) as srv:
            answers[name] = [parse(srv.raw(r))[0] for r in requests]
            assert (telemetry_calls(srv) == 0) == (name == "fast")
    statuses = [r.status for r in answers["fast"]]
    assert statuses == [200, 200, 401, 401, 401, 401, 422, 413, 200, 200, 200, 429]
    assert json.loads(answers["fast"][1].body) == {"accepted": 0, "duplicates": 1}
    for fast, asgi in zip(answers["fast"], answers["asgi"], strict=True):
        assert (fast.status, fast.body) == (asgi.status, asgi.body)
        assert ([(k, v) for k, v in fast.headers if k != "date"]
                == [(k, v) for k, v in asgi.headers if k != "date"])
        assert fast.header("content-type") == "application/json"
        assert (fast.header("x-request-id") or "").startswith("eq-")
    assert answers["fast"][-1].header("retry-after") is not None


def test_body_altered_after_signing_is_refused_and_nothing_stored(fleet: Fleet) -> None:
    device = fleet.enroll(FleetDevice("tamper-01"))
    body, headers = signed(device)
    with serve(fleet.settings, http=DeviceProtocol) as srv:
        # The same JSON with one space more: a parser would see the same batch.
        r, _ = parse(srv.raw(post(body.replace(b",", b", ", 1), headers)))
        assert r.status == 401 and json.loads(r.body)["code"] == "device_signature_invalid"
        assert telemetry_calls(srv) == 0
    assert fleet.events() == 0


def test_oversize_declared_body_is_refused_before_it_is_read_and_the_connection_closed(
        fleet: Fleet) -> None:
    device = fleet.enroll(FleetDevice("big-01"))
    body = device.batch([shadow_report("clf", "1.0", "pending") for _ in range(60)])
    assert len(body) > CAP
    with serve(fleet.settings, http=DeviceProtocol) as srv:
        # Only the head is sent: the answer comes without the body, then the server closes.
        head = post(body, device.headers(body))[:-len(body)]
        r, _ = parse(srv.raw(head, until_close=True))
        assert r.status == 413 and r.header("connection") == "close"
        assert json.loads(r.body)["code"] == "payload_too_large"
        assert telemetry_calls(srv) == 0
    assert fleet.events() == 0


def test_chunked_stream_over_the_cap_is_cut_off_and_a_small_one_stored(fleet: Fleet) -> None:
    device = fleet.enroll(FleetDevice("chunk-01"))
    big = device.batch([shadow_report("clf", "1.0", "pending") for _ in range(60)])
    small, headers = signed(device)
    with serve(fleet.settings, http=DeviceProtocol) as srv:
        r, _ = parse(srv.raw(chunked(big, device.headers(big)), until_close=True))
        assert r.status == 413 and r.header("connection") == "close"
        r, _ = parse(srv.raw(chunked(small, headers)))
        assert r.status == 200 and json.loads(r.body) == {"accepted": 1, "duplicates": 0}
        assert telemetry_calls(srv) == 0
    assert fleet.events() == 1


def test_requests_pipelined_behind_a_pending_answer_keep_their_order(fleet: Fleet) -> None:
    fleet.rollout("1.0")  # a manifest on prod to poll
    devices = [fleet.enroll(FleetDevice(f"pipe-{i}")) for i in range(3)]
    with serve(fleet.settings, http=DeviceProtocol) as srv:
        srv.raw(b"GET /v1/channels/prod/manifest HTTP/1.1\r\nHost: t\r\n\r\n")  # fill the cache
        poll = b"GET /v1/channels/prod/manifest HTTP/1.1\r\nHost: t\r\n\r\n"
        root = b"GET /v1/root HTTP/1.1\r\nHost: t\r\n\r\n"
        batch = [signed(d) for d in devices]
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(post(*batch[0]) + poll + post(*batch[1]) + root + post(*batch[2]))
            rest = read_responses(s, 5)
        kinds = []
        for _ in range(5):
            r, rest = parse(rest)
            assert r.status == 200, r.body
            kinds.append(sorted(json.loads(r.body))[0])
        assert kinds == ["accepted", "payload", "accepted", "latest_version", "accepted"]
    assert fleet.events() == 3


def test_expect_continue_and_http10_still_work(fleet: Fleet) -> None:
    device = fleet.enroll(FleetDevice("odd-01"))
    with serve(fleet.settings, http=DeviceProtocol) as srv:
        body, headers = signed(device)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(post(b"", headers, "Expect: 100-continue",
                           f"Content-Length: {len(body)}", length=False))
            assert s.recv(100).startswith(b"HTTP/1.1 100 Continue")
            s.sendall(body)
            r, _ = parse(read_responses(s, 1))
        assert r.status == 200 and telemetry_calls(srv) == 1  # through uvicorn and the app
        raw = srv.raw(post(*signed(device), version="1.0"), until_close=True)
        r, _ = parse(raw)
        assert r.status == 200 and r.header("connection") == "close"
        assert telemetry_calls(srv) == 1
    assert fleet.events() == 2


def test_device_traffic_goes_through_the_app_when_logged(fleet: Fleet) -> None:
    device = fleet.enroll(FleetDevice("log-01"))
    with serve(fleet.settings.model_copy(update={"log_polls": True}), http=DeviceProtocol,
               access_log=True) as srv:
        r, _ = parse(srv.raw(post(*signed(device))))
        assert r.status == 200 and telemetry_calls(srv) == 1


def test_connection_close_is_honoured(fleet: Fleet) -> None:
    """`Connection: close`: the answer, then the server closes (no hang)."""
    device = fleet.enroll(FleetDevice("close-01"))
    with serve(fleet.settings, http=DeviceProtocol) as srv:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(post(*signed(device), "Connection: close"))
            r, _ = parse(read_all(s))
        assert r.status == 200 and r.header("connection") == "close"


def test_fast_path_requests_are_counted_and_get_a_request_id(fleet: Fleet) -> None:
    from server.observability.metrics import HTTP_REQUESTS

    device = fleet.enroll(FleetDevice("count-01"))
    ok = HTTP_REQUESTS.labels("POST", "/v1/telemetry", "200")
    refused = HTTP_REQUESTS.labels("POST", "/v1/telemetry", "413")
    before = ok._value.get(), refused._value.get()
    with serve(fleet.settings, http=DeviceProtocol) as srv:
        r, _ = parse(srv.raw(post(*signed(device), "X-Request-Id: bad id with spaces")))
        assert r.status == 200 and len(r.header("x-request-id") or "") == 32  # a new one
        r, _ = parse(srv.raw(post(b"{}", {}, "Content-Length: 99999", length=False),
                             until_close=True))
        assert r.status == 413 and len(r.header("x-request-id") or "") == 32
        assert telemetry_calls(srv) == 0
    assert (ok._value.get() - before[0], refused._value.get() - before[1]) == (1, 1)
