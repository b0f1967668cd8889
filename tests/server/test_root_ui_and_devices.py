"""`GET /` sends a browser to the dashboard (`/ui/`, HTML), and `GET /v1/devices` lists the
devices the server has seen, newest first, to any valid token."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from server.db import models as db


def test_root_redirects_to_the_dashboard(client: TestClient) -> None:
    r = client.get("/", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/ui/"
    page = client.get("/")  # followed
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "ModelFleet" in page.text and 'href="/docs"' in page.text


def test_devices_lists_seen_devices_newest_first(
        client: TestClient, session_factory: sessionmaker[Session],
        make_token: Callable[..., str]) -> None:
    now = datetime.now(UTC)
    with session_factory() as session:
        session.add_all([
            db.Device(id="edge-old", profile={"platform": "onnx"},
                      first_seen_at=now - timedelta(days=2), last_seen_at=now - timedelta(days=1)),
            db.Device(id="edge-new", profile={"platform": "qnn", "soc": "SM8650"},
                      first_seen_at=now, last_seen_at=now),
        ])
        session.commit()
    assert client.get("/v1/devices").status_code == 401
    headers = {"Authorization": f"Bearer {make_token('rollout')}"}
    body = client.get("/v1/devices", headers=headers).json()
    assert [d["id"] for d in body["devices"]] == ["edge-new", "edge-old"]
    assert body["devices"][0]["profile"] == {"platform": "qnn", "soc": "SM8650"}
    page = client.get("/v1/devices", params={"limit": 1, "offset": 1}, headers=headers).json()
    assert [d["id"] for d in page["devices"]] == ["edge-old"]
