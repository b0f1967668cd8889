"""Fleet fixtures: the real app over TestClient (SQLite and PostgreSQL), tokens, a ready
model version with two releases to judge, and enrolled devices that sign their reports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from server.app import create_app
from server.auth import create_token
from server.blobstore import LocalBlobStore
from server.db import models as db
from server.db.migrate import upgrade
from server.settings import Settings
from tests.publish.conftest import version_maker
from tests.support.fleet_devices import FleetDevice
from tests.support.server_keys import init_test_keys


@dataclass
class Fleet:
    client: TestClient
    ops: dict[str, str]  # rollout token headers
    enroll_token: str
    settings: Settings

    def enroll(self, device: FleetDevice) -> FleetDevice:
        r = self.client.post("/v1/devices/enroll", json=device.enroll_body(),
                             headers={"Authorization": f"Bearer {self.enroll_token}"})
        assert r.status_code == 201, r.text
        return device

    def send(self, device: FleetDevice, reports: list[dict[str, Any]], **kw: Any) -> Any:
        body = device.batch(reports)
        return self.client.post("/v1/telemetry", content=body, headers=device.headers(body),
                                **kw)

    def events(self) -> int:
        with self.client.app.state.session_factory() as s:  # type: ignore[attr-defined]
            return int(s.scalar(select(func.count()).select_from(db.TelemetryEvent)) or 0)

    def rollout(self, version: str, **body: Any) -> dict[str, Any]:
        r = self.client.post("/v1/channels/prod/rollouts", headers=self.ops,
                             json={"model": "clf", "version": version, "percentage": 100,
                                   **body})
        assert r.status_code == 201, r.text
        out: dict[str, Any] = r.json()
        return out


def fleet_settings(database_url: str, tmp_path: Any, **extra: Any) -> Settings:
    upgrade(database_url)
    data = tmp_path / "data"
    init_test_keys(data, root_keys=2)
    return Settings(env="development", data_dir=data, database_url=database_url,
                    public_base_url="http://testserver", manifest_lifetime_seconds=86_400,
                    **extra)


def open_fleet(settings: Settings) -> Iterator[Fleet]:
    with TestClient(create_app(settings)) as client:
        with client.app.state.session_factory() as s:  # type: ignore[attr-defined]
            _, ops = create_token(s, ["rollout"], name="ops")
            _, enroll = create_token(s, ["enroll"], name="devices")
            s.commit()
        make = version_maker(client.app.state.session_factory,  # type: ignore[attr-defined]
                             LocalBlobStore(settings.resolved_blob_dir))
        make("clf", "1.0", platforms=("android", "ios"))
        make("clf", "2.0", platforms=("android", "ios"))
        yield Fleet(client, {"Authorization": f"Bearer {ops}"}, enroll, settings)


@pytest.fixture
def fleet(database_url: str, tmp_path: Any) -> Iterator[Fleet]:
    yield from open_fleet(fleet_settings(database_url, tmp_path))


@pytest.fixture
def devices(fleet: Fleet) -> Callable[[int], list[FleetDevice]]:
    def make(n: int, prefix: str = "dev") -> list[FleetDevice]:
        return [fleet.enroll(FleetDevice(f"{prefix}-{i:03d}",
                                         platform=("android", "ios")[i % 2]))
                for i in range(n)]

    return make
