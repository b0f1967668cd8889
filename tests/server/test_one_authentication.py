"""One authentication per request: the token is looked up once — by the request guard for a
write (before its body is read), by the route's token dependency for a read — and the route
gets that principal (server/api/deps.py `principal_of`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, select
from sqlalchemy.orm import Session, sessionmaker

from server.db.models import ApiToken, AuditEvent
from tests.server.test_registry_api import create_model, upload


@pytest.fixture
def token_lookups(client: TestClient) -> Iterator[list[str]]:
    """Every SQL statement the app sends that reads the token table."""
    engine = client.app.state.engine  # type: ignore[attr-defined]
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "api_tokens" in statement:
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    yield seen
    event.remove(engine, "before_cursor_execute", record)


def test_a_json_write_looks_its_token_up_once(client: TestClient, publish_headers: dict[str, str],
                                              token_lookups: list[str]) -> None:
    r = client.post("/v1/models", json={"name": "resnet", "task": "classification"},
                    headers=publish_headers)
    assert r.status_code == 201, r.text
    assert len(token_lookups) == 1


def test_an_upload_looks_its_token_up_once(client: TestClient, publish_headers: dict[str, str],
                                           onnx_bytes: bytes,
                                           token_lookups: list[str]) -> None:
    create_model(client, publish_headers)
    token_lookups.clear()
    r = upload(client, publish_headers, onnx_bytes,
               '{"version": "1.0.0", "platforms": ["onnx"], '
               '"inputs": [{"name": "x", "dtype": "float32", "shape": [1, 3, 8, 8]}]}')
    assert r.status_code in (201, 422), r.text  # either way the guard let it in
    assert len(token_lookups) == 1


def test_a_read_looks_its_token_up_once(client: TestClient, publish_headers: dict[str, str],
                                        token_lookups: list[str]) -> None:
    r = client.get("/v1/audit", headers=publish_headers)
    assert r.status_code == 200, r.text
    assert len(token_lookups) == 1


def test_a_write_with_the_wrong_scope_is_refused_after_one_lookup(
        client: TestClient, make_token: Callable[..., str], token_lookups: list[str]) -> None:
    headers = {"Authorization": f"Bearer {make_token('rollout')}"}
    r = client.post("/v1/models", json={"name": "resnet", "task": "classification"},
                    headers=headers)
    assert r.status_code == 403, r.text
    assert len(token_lookups) == 1


def test_the_route_acts_as_the_principal_the_guard_authenticated(
        client: TestClient, make_token: Callable[..., str],
        session_factory: sessionmaker[Session]) -> None:
    """The audit log names the guard's principal, and its last use is recorded once the write
    was let in (the guard commits it; no dependency looks the token up again)."""
    headers = {"Authorization": f"Bearer {make_token('publish', name='ci-bot')}"}
    r = client.post("/v1/models", json={"name": "resnet", "task": "classification"},
                    headers=headers)
    assert r.status_code == 201, r.text
    with session_factory() as s:
        token = s.scalars(select(ApiToken).where(ApiToken.name == "ci-bot")).one()
        assert token.last_used_at is not None
        actors = set(s.scalars(select(AuditEvent.actor)))
    assert f"token:{token.id}:ci-bot" in actors
