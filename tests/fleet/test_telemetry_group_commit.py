"""The telemetry route's storing paths: PostgreSQL's group commit
(server/services/fleet/groupcommit.py) stores exactly what the generic path stores, shares
transactions, and lets one revoked device in a group fail alone; replays and bad signatures
store nothing. The route over a real server: tests/fleet/test_telemetry_served.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select

from server.db import models as db
from server.services.fleet.groupcommit import GroupCommitter
from server.services.fleet.ingest import DeviceRevokedAuthError
from server.services.fleet.reports import parse_batch
from server.services.fleet.service import Fleet as FleetService
from server.services.fleet.service import libpq_dsn
from tests.fleet.conftest import Fleet, fleet_settings, open_fleet
from tests.support.fleet_devices import FleetDevice, shadow_report, update_report

SHADOW = {"max_kl_micro": 5_000, "max_latency_p99_us": 20_000, "min_samples": 100}


def _service(fleet: Fleet) -> FleetService:
    service: FleetService = fleet.client.app.state.services.fleet  # type: ignore[attr-defined]
    return service


def test_route_refuses_a_bad_signature_and_stores_nothing(fleet: Fleet) -> None:
    device = fleet.enroll(FleetDevice("sig-01"))
    body = device.batch([shadow_report("clf", "1.0", "failed")])
    forged = FleetDevice("sig-01").headers(body)  # another key, same device id
    r = fleet.client.post("/v1/telemetry", content=body, headers=forged)
    assert r.status_code == 401 and r.json()["code"] == "device_signature_invalid"
    assert fleet.events() == 0


def test_replayed_batch_is_stored_once_and_an_old_one_refused(fleet: Fleet) -> None:
    device = fleet.enroll(FleetDevice("replay-01"))
    body = device.batch([shadow_report("clf", "1.0", "pending")])
    first = fleet.client.post("/v1/telemetry", content=body, headers=device.headers(body))
    again = fleet.client.post("/v1/telemetry", content=body, headers=device.headers(body))
    assert first.json() == {"accepted": 1, "duplicates": 0}
    assert again.json() == {"accepted": 0, "duplicates": 1}
    old = device.batch([shadow_report("clf", "1.0", "pending")], sent_at=1_000_000_000)
    r = fleet.client.post("/v1/telemetry", content=old, headers=device.headers(old))
    assert r.status_code == 401 and r.json()["code"] == "device_report_stale"
    assert fleet.events() == 1


def test_each_database_gets_its_storing_path(fleet: Fleet,
                                             devices: Callable[[int], list[FleetDevice]]
                                             ) -> None:
    service = _service(fleet)
    is_pg = fleet.settings.resolved_database_url.startswith("postgresql")
    assert (service.committer is not None) == is_pg
    (device,) = devices(1)
    r = fleet.send(device, [update_report("clf", "1.0", "activated")])
    assert r.status_code == 200 and r.json()["accepted"] == 1
    with fleet.client.app.state.session_factory() as s:  # type: ignore[attr-defined]
        row = s.get(db.Device, device.device_id)
        assert row is not None and row.active_versions == {"clf": "1.0"}
    if service.committer is not None:
        assert service.committer.stats.batches >= 1


# ---------------------------------------------------------------- group commit (PostgreSQL)


def _batches(fleet: Fleet, group: list[FleetDevice], at: int) -> list[Any]:
    out = []
    for i, d in enumerate(group):
        reports = [update_report("clf", "1.0", "activated", at=at),
                   shadow_report("clf", "1.0", ("pending", "failed")[i % 2], at=at,
                                 kl=90_000),  # a failure its figures show
                   {"id": f"{i:032x}", "kind": "health", "at": at, "model": "clf",
                    "version": "1.0", "channel": "prod", "predictions": 9, "errors": 1,
                    "p99_us": 800, "rolled_back": False}]
        out.append(parse_batch(d.batch(reports)))
    return out


def store_grouped(committer: GroupCommitter, ingest: Any, batch: Any, now: datetime) -> Any:
    """`committer.store` of `batch` with its releases and standings, as Fleet.receive
    passes them."""
    release_of = ingest.load_releases(batch)
    return committer.store(batch, release_of, now,
                           standing=ingest.offers.classify(batch, release_of))


def _stored(fleet: Fleet, device_id: str) -> tuple[list[Any], list[Any], dict[str, str]]:
    with fleet.client.app.state.session_factory() as s:  # type: ignore[attr-defined]
        # The payload key for key, in order (all but the report id, unique per row).
        events = [(e.release_id, e.model, e.version, e.kind, e.kl_micro, e.latency_p99_us,
                   e.samples, [(k, v) for k, v in e.payload.items() if k != "id"],
                   e.received_at, e.standing)
                  for e in s.scalars(select(db.TelemetryEvent)
                                     .where(db.TelemetryEvent.device_id == device_id)
                                     .order_by(db.TelemetryEvent.kind,
                                               db.TelemetryEvent.payload["at"].as_integer()))]
        standings = [(r.release_id, r.event, r.event_at, r.downloaded, r.rolled_back,
                      r.verdict, r.shadow_at, r.samples, r.kl_mean_micro, r.kl_max_micro,
                      r.active_p50_us, r.candidate_p50_us, r.candidate_p99_us, r.passed_at)
                     for r in s.scalars(select(db.DeviceRelease)
                                        .where(db.DeviceRelease.device_id == device_id))]
        device = s.get(db.Device, device_id)
        assert device is not None
        return events, standings, device.active_versions


@pytest.mark.postgres
def test_group_commit_stores_what_the_generic_path_stores(
        postgres_url: str, tmp_path: Any) -> None:
    for fleet in open_fleet(fleet_settings(postgres_url, tmp_path)):
        fleet.rollout("1.0", mode="shadow", guard={"min_devices": 1_000}, shadow=SHADOW)
        generic, grouped = (fleet.enroll(FleetDevice(n)) for n in ("generic-1", "grouped-1"))
        ingest = _service(fleet).ingest
        _, b1 = _batches(fleet, [grouped, generic], 1_700_000_000)  # b1: a failed verdict
        # The same reports from the other device (fresh report ids).
        b2 = parse_batch(grouped.batch([json.loads(r.model_dump_json()) | {"id": f"{i:031x}f"}
                                        for i, r in enumerate(b1.reports)]))
        now = datetime.now(UTC)
        ingest._store(b1, now)  # the generic path (SQLAlchemy, one transaction)

        async def grouped_store() -> Any:
            committer = GroupCommitter(libpq_dsn(postgres_url) or "")
            try:
                return await store_grouped(committer, ingest, b2, now)
            finally:
                await committer.aclose()

        result = asyncio.run(grouped_store())
        assert result.accepted == 3 and result.judged
        assert _stored(fleet, "generic-1") == _stored(fleet, "grouped-1")
        assert _stored(fleet, "grouped-1")[2] == {"clf": "1.0"}


def _every_shape(at: int) -> list[dict[str, Any]]:
    """Reports with every optional field given or left out, free text, names of every
    allowed character, and a version no release is about (release_id NULL)."""
    sha = "ab" * 32
    return [
        update_report("clf", "1.0", "failed", at=at) | {
            "via": None, "bytes": None, "reason": 'disk, full: "x" \\ caf\u00e9 \u2603'},
        update_report("clf", "1.0", "downloaded", at=at + 1, channel=None)
        | {"artifact_sha256": sha, "via": "patch", "bytes": 0},
        shadow_report("clf", "1.0", "passed", at=at + 2, cosine_min_micro=-1_000_000,
                      snr_min_centi_db=-9_007_199_254_740_991, reason="ok, fine"),
        shadow_report("clf", "1.0", "pending", at=at + 3, cosine_min_micro=None,
                      snr_min_centi_db=None),
        {"id": "0" * 32, "kind": "health", "at": at + 4, "model": "clf", "version": "1.0",
         "predictions": 0, "errors": 0, "rolled_back": True},
        {"id": "1" * 32, "kind": "health", "at": at + 5, "model": "A-b.c_d+e",
         "version": "0+a.b-c_d", "channel": "x.y-z_0+1", "predictions": 2**53 - 1,
         "errors": 1, "p99_us": 9, "rolled_back": False},
    ]


@pytest.mark.postgres
def test_group_commit_stores_every_column_and_payload_as_the_generic_path(
        postgres_url: str, tmp_path: Any) -> None:
    for fleet in open_fleet(fleet_settings(postgres_url, tmp_path)):
        fleet.rollout("1.0", mode="shadow", guard={"min_devices": 1_000}, shadow=SHADOW)
        generic, grouped, other = (fleet.enroll(FleetDevice(n))
                                   for n in ("generic-2", "grouped-2", "grouped-3"))
        ingest = _service(fleet).ingest
        reports = _every_shape(1_700_000_000)
        b1 = parse_batch(generic.batch(reports))
        b2, b3 = (parse_batch(d.batch([r | {"id": f"{i:030x}{n}"}
                                       for i, r in enumerate(reports)]))
                  for n, d in (("0f", grouped), ("1f", other)))
        now = datetime.now(UTC)
        assert ingest._store(b1, now).accepted == len(reports)  # the generic path

        async def grouped_store() -> list[Any]:
            committer = GroupCommitter(libpq_dsn(postgres_url) or "")
            try:  # two batches in one group's statement
                return list(await asyncio.gather(
                    *(store_grouped(committer, ingest, b, now) for b in (b2, b3))))
            finally:
                await committer.aclose()

        assert [r.accepted for r in asyncio.run(grouped_store())] == [len(reports)] * 2
        stored = _stored(fleet, "generic-2")
        assert stored == _stored(fleet, "grouped-2") == _stored(fleet, "grouped-3")
        # By kind, then time: health, health of the unknown version, shadow ×2, update ×2.
        assert [e[0] is None for e in stored[0]] == [False, True, False, False, False, False]
        assert ("reason", 'disk, full: "x" \\ caf\u00e9 \u2603') in stored[0][5][7]


@pytest.mark.postgres
def test_concurrent_batches_share_a_transaction_and_a_revoked_device_fails_alone(
        postgres_url: str, tmp_path: Any) -> None:
    for fleet in open_fleet(fleet_settings(postgres_url, tmp_path)):
        fleet.rollout("1.0", mode="shadow", guard={"min_devices": 1_000}, shadow=SHADOW)
        group = [fleet.enroll(FleetDevice(f"grp-{i:02d}")) for i in range(12)]
        r = fleet.client.post("/v1/devices/grp-05/revoke", headers=fleet.ops)
        assert r.status_code == 200
        batches = _batches(fleet, group, 1_700_000_000)
        # grp-00 twice: its second batch must wait for the next group (one row read each).
        batches.append(parse_batch(group[0].batch(
            [update_report("clf", "1.0", "rolled_back", at=1_700_000_001)])))
        ingest = _service(fleet).ingest
        now = datetime.now(UTC)

        async def store_all() -> tuple[list[Any], Any]:
            committer = GroupCommitter(libpq_dsn(postgres_url) or "")
            try:
                out = await asyncio.gather(
                    *(store_grouped(committer, ingest, b, now) for b in batches),
                    return_exceptions=True)
                return list(out), committer.stats
            finally:
                await committer.aclose()

        outcomes, stats = asyncio.run(store_all())
        assert stats.groups == 2 and stats.batches == len(batches)  # 12 at once, then grp-00
        assert isinstance(outcomes[5], DeviceRevokedAuthError)
        assert all(o.accepted == 3 for i, o in enumerate(outcomes[:12]) if i != 5)
        assert outcomes[12].accepted == 1
        assert _stored(fleet, "grp-05") == ([], [], {})  # nothing of the revoked device
        assert fleet.events() == 11 * 3 + 1
        assert _stored(fleet, "grp-00")[2] == {}  # activated, then rolled back in order
        assert _stored(fleet, "grp-01")[2] == {"clf": "1.0"}
