"""`GET /v1/rollouts/{id}/timeline` over HTTP with real signed telemetry (SQLite and
PostgreSQL): events, patch vs full bytes and shadow verdicts land in their bucket, adoption
counts each device once, and the size caps answer 422 / 404 / 401."""

from __future__ import annotations

from typing import Any

from tests.fleet.conftest import Fleet
from tests.support.fleet_devices import shadow_report, update_report


def _update(event: str, via: str, n_bytes: int, **kw: Any) -> dict[str, Any]:
    return update_report("clf", "1.0", event, **kw) | {"via": via, "bytes": n_bytes}


def test_timeline_counts_events_bytes_by_via_verdicts_and_adoption(fleet: Fleet,
                                                                   devices: Any) -> None:
    rollout = fleet.rollout("1.0")
    a, b, c = devices(3)
    assert fleet.send(a, [_update("downloaded", "patch", 300),
                          _update("activated", "patch", 0),
                          shadow_report("clf", "1.0", "passed")]).status_code == 200
    assert fleet.send(b, [_update("downloaded", "full", 5_000),
                          _update("activated", "full", 0),
                          _update("activated", "full", 0),  # twice: still one device
                          shadow_report("clf", "1.0", "failed")]).status_code == 200
    assert fleet.send(c, [_update("downloaded", "full", 4_000),
                          _update("rolled_back", "full", 0)]).status_code == 200
    r = fleet.client.get(f"/v1/rollouts/{rollout['id']}/timeline",
                         params={"bucket_seconds": 3600}, headers=fleet.ops)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["rollout_id"] == rollout["id"] and body["bucket_seconds"] == 3600
    assert body["start"] % 3600 == 0 and body["start"] <= body["end"]
    buckets = body["buckets"]
    assert 1 <= len(buckets) <= 2  # the rollout and its reports may straddle an hour
    total = {k: sum(bk["events"][k] for bk in buckets) for k in buckets[0]["events"]}
    assert total == {"downloaded": 3, "verified": 0, "activated": 3, "rolled_back": 1,
                     "failed": 0}
    assert sum(bk["bytes_via"]["patch"] for bk in buckets) == 300
    assert sum(bk["bytes_via"]["full"] for bk in buckets) == 9_000
    assert sum(bk["reports_via"]["full"] for bk in buckets) == 5
    assert sum(bk["shadow"]["passed"] for bk in buckets) == 1
    assert sum(bk["shadow"]["failed"] for bk in buckets) == 1
    assert sum(bk["adopted"] for bk in buckets) == 2
    assert sum(bk["rolled_back"] for bk in buckets) == 1
    assert buckets[-1]["adoption"] == 1  # two devices adopted, one rolled back


def test_timeline_picks_a_round_bucket_and_other_rollouts_do_not_leak_in(
        fleet: Fleet, devices: Any) -> None:
    first = fleet.rollout("1.0")
    second = fleet.rollout("2.0")
    (device,) = devices(1)
    fleet.send(device, [update_report("clf", "2.0", "downloaded")])
    body = fleet.client.get(f"/v1/rollouts/{first['id']}/timeline", headers=fleet.ops).json()
    assert body["bucket_seconds"] == 1  # a rollout seconds old: 1 s buckets
    assert all(sum(bk["events"].values()) == 0 for bk in body["buckets"])
    other = fleet.client.get(f"/v1/rollouts/{second['id']}/timeline", headers=fleet.ops).json()
    assert sum(bk["events"]["downloaded"] for bk in other["buckets"]) == 1


def test_timeline_refuses_too_many_buckets_unknown_rollouts_and_no_token(fleet: Fleet) -> None:
    rollout = fleet.rollout("1.0")
    url = f"/v1/rollouts/{rollout['id']}/timeline"
    with fleet.client.app.state.session_factory() as s:  # type: ignore[attr-defined]
        from datetime import UTC, datetime, timedelta

        from server.db import models as db

        release = s.get(db.Release, rollout["id"])
        assert release is not None
        release.created_at = datetime.now(UTC) - timedelta(days=2)
        s.commit()
    r = fleet.client.get(url, params={"bucket_seconds": 60}, headers=fleet.ops)
    assert r.status_code == 422 and r.json()["field"] == "bucket_seconds"
    assert "bucket_seconds >= 173" in r.json()["fix"]
    assert fleet.client.get(url, headers=fleet.ops).json()["bucket_seconds"] == 3600
    assert fleet.client.get(url, params={"bucket_seconds": 0},
                            headers=fleet.ops).status_code == 422
    assert fleet.client.get("/v1/rollouts/999/timeline", headers=fleet.ops).status_code == 404
    assert fleet.client.get(url).status_code == 401
    assert fleet.client.get(url, params={"bucket": 5}, headers=fleet.ops).status_code == 422
