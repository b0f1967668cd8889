"""`POST /v1/telemetry` through the ordinary route on a real `modelfleet serve`, over raw
sockets: every answer's status, body and headers, the body caps before a byte is read, the
signature over the exact bytes, order on a pipelined connection, `Expect: 100-continue`,
HTTP/1.0 and `Connection: close`, and what the access log and /metrics see."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from tests.support.fleet_devices import FleetDevice, shadow_report
from tests.support.metrics import sample
from tests.support.served_fleet import (
    ServedFleet,
    parse,
    read_all,
    read_responses,
    request,
    served_fleet,
)

CAP = 4096


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedFleet]:
    root = tmp_path_factory.mktemp("telemetry-served")
    # A burst of 3 at one request per 1000 s: the fourth request of a device is a 429.
    with served_fleet(root, f"sqlite:///{root}/fleet.db", devices=8, telemetry_burst=3,
                      telemetry_rate_per_second=0.001,
                      max_telemetry_body_bytes=CAP) as served:
        yield served


def post(body: bytes, headers: dict[str, str], *extra: str, length: bool = True,
         version: str = "1.1") -> bytes:
    return request("POST", "/v1/telemetry", body, headers, *extra, length=length,
                   version=version)


def signed(device: FleetDevice) -> tuple[bytes, dict[str, str]]:
    body = device.batch([shadow_report("clf", "1.0", "pending")])
    return body, device.headers(body)


def test_every_answer_has_its_status_error_body_and_request_id(srv: ServedFleet) -> None:
    ok, limited = srv.devices["served-00"], srv.devices["served-01"]
    r, _ = parse(srv.raw(request("POST", "/v1/devices/served-02/revoke", b"", srv.ops)))
    assert r.status == 200
    revoked = srv.devices["served-02"]
    body, headers = signed(ok)
    forged = ok.batch([shadow_report("clf", "1.0", "failed")])
    deep = b"[" * 200 + b"]" * 200
    requests = [
        post(body, headers),  # 200
        post(body, headers),  # the same batch again: 200, counted as a duplicate
        post(forged, FleetDevice("served-00").headers(forged)),  # 401: another key
        post(*signed(FleetDevice("nobody"))),  # 401 unknown device
        post(*signed(revoked)),  # 401 revoked
        post(b"{}", {"X-Device-Id": "served-00"}),  # 401 no signature
        post(deep, headers),  # 422 nested too deep
        post(b"{}", {"X-Device-Id": "served-00"}, "Content-Length: 99999",
             length=False),  # 413 declared
        *(post(*signed(limited)) for _ in range(4)),  # 200 x3, then 429 + Retry-After
    ]
    answers = []
    for i, raw in enumerate(requests):
        raw = raw.replace(b"\r\nHost: t\r\n", b"\r\nHost: t\r\nX-Request-Id: tel-%d\r\n" % i)
        answers.append(parse(srv.raw(raw, until_close=b"99999" in raw))[0])
    assert [a.status for a in answers] == [200, 200, 401, 401, 401, 401, 422, 413,
                                           200, 200, 200, 429]
    assert json.loads(answers[0].body) == {"accepted": 1, "duplicates": 0}
    assert json.loads(answers[1].body) == {"accepted": 0, "duplicates": 1}
    codes = [json.loads(a.body).get("code") for a in answers[2:8]]
    assert codes == ["device_signature_invalid", "device_unknown", "device_revoked",
                     "device_signature_invalid", "invalid_request", "payload_too_large"]
    for i, a in enumerate(answers):
        assert a.header("content-type") == "application/json"
        assert a.header("x-request-id") == f"tel-{i}"
    assert answers[7].header("connection") == "close"
    assert int(answers[-1].header("retry-after") or "0") > 0


def test_body_altered_after_signing_is_refused_and_nothing_stored(srv: ServedFleet) -> None:
    body, headers = signed(srv.devices["served-03"])
    before = srv.events()
    # The same JSON with one space more: a parser would see the same batch.
    r, _ = parse(srv.raw(post(body.replace(b",", b", ", 1), headers)))
    assert r.status == 401 and json.loads(r.body)["code"] == "device_signature_invalid"
    assert srv.events() == before


def test_oversize_declared_body_is_refused_before_it_is_read_and_the_connection_closed(
        srv: ServedFleet) -> None:
    device = srv.devices["served-04"]
    body = device.batch([shadow_report("clf", "1.0", "pending") for _ in range(60)])
    assert len(body) > CAP
    before = srv.events()
    # Only the head is sent: the answer comes without the body, then the server closes.
    head = post(body, device.headers(body))[:-len(body)]
    r, _ = parse(srv.raw(head, until_close=True))
    assert r.status == 413 and r.header("connection") == "close"
    assert json.loads(r.body)["code"] == "payload_too_large"
    assert srv.events() == before


def test_requests_pipelined_behind_telemetry_keep_their_order(srv: ServedFleet) -> None:
    first, second = signed(srv.devices["served-05"]), signed(srv.devices["served-06"])
    poll = b"GET /v1/channels/prod/manifest HTTP/1.1\r\nHost: t\r\n\r\n"
    root = b"GET /v1/root HTTP/1.1\r\nHost: t\r\n\r\n"
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(post(*first) + poll + post(*second) + root)
        rest = read_responses(s, 4)
    kinds = []
    for _ in range(4):
        r, rest = parse(rest)
        assert r.status == 200, r.body
        kinds.append(sorted(json.loads(r.body))[0])
    assert kinds == ["accepted", "payload", "accepted", "latest_version"]


def test_expect_continue_and_http10_are_answered(srv: ServedFleet) -> None:
    device = srv.devices["served-07"]
    body, headers = signed(device)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(post(b"", headers, "Expect: 100-continue", f"Content-Length: {len(body)}",
                       length=False))
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue")
        s.sendall(body)
        r, _ = parse(read_responses(s, 1))
    assert r.status == 200
    r, _ = parse(srv.raw(post(*signed(device), version="1.0"), until_close=True))
    assert r.status == 200


def test_connection_close_is_honoured(srv: ServedFleet) -> None:
    """`Connection: close`: the answer, then the server closes (no hang)."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(post(b"{}", {"X-Device-Id": "x"}, "Connection: close"))
        data = read_all(s)
    r, rest = parse(data)
    assert r.status == 401 and rest == b""


def test_accepted_telemetry_is_counted_but_not_access_logged_and_refusals_are_logged(
        srv: ServedFleet) -> None:
    def accepted(text: str) -> float:
        return sample(text, "modelfleet_http_requests_total", method="POST",
                      route="/v1/telemetry", status="200")

    before = accepted(srv.metrics())
    device = FleetDevice("served-log")
    r, _ = parse(srv.raw(request("POST", "/v1/devices/enroll",
                                 json.dumps(device.enroll_body()).encode(),
                                 {"Authorization": _enroll_token(srv),
                                  "Content-Type": "application/json"})))
    assert r.status == 201, r.body
    r, _ = parse(srv.raw(post(*signed(device), "X-Request-Id: quiet-200")))
    assert r.status == 200
    r, _ = parse(srv.raw(post(b"{}", {"X-Device-Id": "x"}, "X-Request-Id: loud-401")))
    assert r.status == 401
    assert accepted(srv.metrics()) - before == 1
    log = srv.log.read_text()
    assert "loud-401" in log and "quiet-200" not in log


def _enroll_token(srv: ServedFleet) -> str:
    from server.auth import create_token
    from server.db.session import make_engine, make_session_factory

    engine = make_engine(srv.settings.resolved_database_url)
    try:
        with make_session_factory(engine)() as session:
            _, token = create_token(session, ["enroll"], name="late-enroll",
                                    pepper=srv.settings.token_pepper)
            session.commit()
    finally:
        engine.dispose()
    return f"Bearer {token}"
