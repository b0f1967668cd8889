"""One error renderer (server/api/errors.py `error_body`): every error the API answers — an
HTTP error, request validation, a typed service error, a rate limit, the request guard's
refusals before a body is read (401, 411, 413) and an unexpected exception (500) — has the
same body shape, `ErrorBody`'s fields and nothing else."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.api.errors import ErrorBody
from server.auth import create_token
from tests.support.fleet_devices import FleetDevice

SHAPE = set(ErrorBody.model_fields)  # detail, code, field, fix, errors


@pytest.fixture
def failing_client(client: TestClient) -> Iterator[TestClient]:
    """The app with one route that fails unexpectedly, and a client that gets the 500
    instead of the exception."""

    def broken() -> None:
        raise RuntimeError("internal detail that must not leak")

    client.app.add_api_route("/v1/broken-for-test", broken)  # type: ignore[attr-defined]
    with TestClient(client.app, raise_server_exceptions=False) as c:
        yield c


def _enrol_token(client: TestClient) -> str:
    state = client.app.state  # type: ignore[attr-defined]
    with state.session_factory() as s:
        _, secret = create_token(s, ["enroll"], name="app", enroll_per_hour=1,
                                 pepper=state.settings.token_pepper)
        s.commit()
    return secret


def _errors(client: TestClient, failing: TestClient, publish_headers: dict[str, str]
            ) -> dict[str, Any]:
    """One response of each kind of error, by kind."""
    enrol = {"Authorization": f"Bearer {_enrol_token(client)}"}
    assert client.post("/v1/devices/enroll", json=FleetDevice("d-1").enroll_body(),
                       headers=enrol).status_code == 201
    model = {"name": "resnet", "task": "classification"}
    kinds: dict[str, Callable[[], Any]] = {
        "http 404 (no route)": lambda: client.get("/v1/no-such-thing"),
        "http 405": lambda: client.delete("/v1/root"),
        "validation 422": lambda: client.post("/v1/models", json={"name": 5},
                                              headers=publish_headers),
        "typed 404": lambda: client.get("/v1/models/does-not-exist"),
        "typed 422": lambda: client.get("/v1/audit?limt=5", headers=publish_headers),
        "rate limit 429": lambda: client.post(
            "/v1/devices/enroll", json=FleetDevice("d-2").enroll_body(), headers=enrol),
        "guard 401": lambda: client.post("/v1/models", json=model),
        "guard 411": lambda: client.post(
            "/v1/models", content=iter([b'{"name": "x"}']), headers=publish_headers),
        "guard 413": lambda: client.post("/v1/models", content=b"{" + b" " * (2 << 20) + b"}",
                                         headers={**publish_headers,
                                                  "Content-Type": "application/json"}),
        "unexpected 500": lambda: failing.get("/v1/broken-for-test"),
    }
    return {kind: call() for kind, call in kinds.items()}


def test_every_error_kind_has_the_one_body_shape(client: TestClient, failing_client: TestClient,
                                                 publish_headers: dict[str, str]) -> None:
    responses = _errors(client, failing_client, publish_headers)
    statuses = {kind: r.status_code for kind, r in responses.items()}
    assert statuses == {"http 404 (no route)": 404, "http 405": 405, "validation 422": 422,
                        "typed 404": 404, "typed 422": 422, "rate limit 429": 429,
                        "guard 401": 401, "guard 411": 411, "guard 413": 413,
                        "unexpected 500": 500}, statuses
    for kind, r in responses.items():
        assert r.headers["content-type"] == "application/json", kind
        body = r.json()
        assert set(body) == SHAPE, (kind, body)
        ErrorBody.model_validate(body)  # and the documented types
        assert body["code"] and body["detail"], (kind, body)
    assert responses["rate limit 429"].headers["Retry-After"].isdigit()
    assert responses["validation 422"].json()["errors"]
    assert responses["typed 422"].json()["field"] == "limt"
    internal = responses["unexpected 500"].json()
    assert internal["code"] == "internal_error"
    assert "must not leak" not in responses["unexpected 500"].text
