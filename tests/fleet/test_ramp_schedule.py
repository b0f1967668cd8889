"""Ramp schedules over HTTP with real signed reports and an injected publisher clock: a step
is taken only once the interval passed AND the guard judges the rollout healthy, as a new
signed manifest with a higher serial and a `rollout.ramp` audit event by `system`; paused,
halted, shadow and manually ramped rollouts never step; two API replicas on one PostgreSQL
database take each step once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from server.rollouts.ramp import RampTicker
from tests.fleet.conftest import Fleet, fleet_settings, open_fleet
from tests.fleet.test_guard import audit, enrolled, rollout_state, serial, served_release
from tests.support.clock import NOW, Clock
from tests.support.fleet_devices import FleetDevice, shadow_report, update_report

HOUR = 3600
RAMP = {"steps": [1, 5, 25, 100], "interval_seconds": HOUR}
SHADOW = {"max_kl_micro": 5_000, "max_latency_p99_us": 10_000, "min_samples": 100}


# The API process's own ramp loop is tested on its own (quick_loop); elsewhere it must not
# step between a test's clock change and its explicit tick.
NO_LOOP = 3600.0


@pytest.fixture
def fleet(database_url: str, tmp_path: Any) -> Iterator[Fleet]:
    yield from open_fleet(fleet_settings(database_url, tmp_path, ramp_check_seconds=NO_LOOP))


def with_clock(fleet: Fleet) -> Clock:
    clock = Clock()
    fleet.client.app.state.services.publisher.clock = clock  # type: ignore[attr-defined]
    return clock


def ticker(fleet: Fleet) -> RampTicker:
    ramp: RampTicker = fleet.client.app.state.services.fleet.ramp  # type: ignore[attr-defined]
    return ramp


def at(unix: int) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat().replace("+00:00", "Z")


def activated(fleet: Fleet, devices: list[FleetDevice]) -> None:
    for d in devices:
        assert fleet.send(d, [update_report("clf", "2.0", "activated")]).status_code == 200


def share(fleet: Fleet) -> int | None:
    release = served_release(fleet, "2.0")
    return None if release is None else release.rollout.share_ppm


def test_steps_follow_only_after_the_interval_and_once_enough_devices_report_healthy(
        fleet: Fleet) -> None:
    clock = with_clock(fleet)
    rollout = fleet.rollout("2.0", percentage=None, ramp=RAMP, guard={"min_devices": 3})
    rid = rollout["id"]
    assert rollout["percentage"] == 1.0 and share(fleet) == 10_000
    assert rollout["ramp"] == {"steps": [1.0, 5.0, 25.0, 100.0], "interval_seconds": HOUR,
                               "step": 1, "next_step_at": at(NOW + HOUR), "state": "scheduled"}
    devices = enrolled(fleet, 3, share_ppm=10_000)
    activated(fleet, devices[:2])
    clock.now = NOW + HOUR
    before = serial(fleet)
    assert ticker(fleet).tick() == []  # due, but 2 reporting devices < min_devices 3
    assert serial(fleet) == before and share(fleet) == 10_000

    activated(fleet, devices[2:])  # the third report: healthy now
    [step] = ticker(fleet).tick()
    assert (step.step, step.share_ppm, step.serial) == (2, 50_000, before + 1)
    assert serial(fleet) == before + 1 and share(fleet) == 50_000
    state = rollout_state(fleet, rid)
    assert state["percentage"] == 5.0
    assert (state["ramp"]["step"], state["ramp"]["next_step_at"]) == (2, at(NOW + 2 * HOUR))
    [event] = audit(fleet, "rollout.ramp")
    assert event["actor"] == "system" and event["details"]["share_ppm"] == 50_000
    assert event["details"]["reason"].startswith("ramp schedule step 2/4: guard: 0 of 3 ")

    clock.now = NOW + 2 * HOUR - 1
    assert ticker(fleet).tick() == [] and share(fleet) == 50_000  # one second early
    clock.now = NOW + 2 * HOUR
    [step] = ticker(fleet).tick()
    assert (step.step, step.share_ppm, step.serial) == (3, 250_000, before + 2)
    clock.now = NOW + 3 * HOUR
    [step] = ticker(fleet).tick()
    assert (step.step, step.share_ppm) == (4, 1_000_000) and share(fleet) == 1_000_000
    assert rollout_state(fleet, rid)["ramp"] | {"steps": None} == {
        "steps": None, "interval_seconds": HOUR, "step": 4, "next_step_at": None,
        "state": "done"}
    clock.now = NOW + 9 * HOUR
    assert ticker(fleet).tick() == [] and serial(fleet) == before + 3
    assert [e["details"]["reason"][:22] for e in audit(fleet, "rollout.ramp")] == [
        "ramp schedule step 4/4", "ramp schedule step 3/4", "ramp schedule step 2/4"]


def test_a_rollout_the_guard_halts_never_steps_again(fleet: Fleet) -> None:
    clock = with_clock(fleet)
    rollout = fleet.rollout("2.0", percentage=1, ramp=RAMP,
                            guard={"min_devices": 2, "max_fail_share": 0.5})
    ok, bad = enrolled(fleet, 2, share_ppm=10_000)
    activated(fleet, [ok])
    clock.now = NOW + 5 * HOUR
    fleet.send(bad, [update_report("clf", "2.0", "failed")])  # 1 of 2 = 50%: halted
    state = rollout_state(fleet, rollout["id"])
    assert state["state"] == "halted" and state["share_ppm"] == 0
    assert state["ramp"]["state"] == "halted" and state["ramp"]["next_step_at"] is None
    halted_serial = serial(fleet)
    assert ticker(fleet).tick() == []
    assert serial(fleet) == halted_serial and audit(fleet, "rollout.ramp") == []


def test_a_paused_rollout_holds_and_resuming_restarts_the_wait(fleet: Fleet) -> None:
    clock = with_clock(fleet)
    rollout = fleet.rollout("2.0", percentage=None, ramp=RAMP, guard={"min_devices": 1})
    rid = rollout["id"]
    activated(fleet, enrolled(fleet, 1, share_ppm=10_000))
    assert fleet.client.post(f"/v1/rollouts/{rid}/pause", headers=fleet.ops,
                             json={"reason": "looking"}).status_code == 200
    assert rollout_state(fleet, rid)["ramp"]["state"] == "paused"
    clock.now = NOW + 10 * HOUR
    assert ticker(fleet).tick() == [] and share(fleet) == 10_000
    r = fleet.client.post(f"/v1/rollouts/{rid}/resume", headers=fleet.ops)
    assert r.json()["ramp"]["next_step_at"] == at(NOW + 11 * HOUR)
    assert ticker(fleet).tick() == []  # a full interval of reports again first
    clock.now = NOW + 11 * HOUR
    [step] = ticker(fleet).tick()
    assert step.share_ppm == 50_000


def test_a_manual_ramp_takes_over_and_clears_the_remaining_steps(fleet: Fleet) -> None:
    clock = with_clock(fleet)
    rollout = fleet.rollout("2.0", percentage=None, ramp=RAMP, guard={"min_devices": 1})
    rid = rollout["id"]
    activated(fleet, enrolled(fleet, 1, share_ppm=10_000))
    r = fleet.client.patch(f"/v1/rollouts/{rid}", json={"percentage": 50}, headers=fleet.ops)
    assert r.status_code == 200
    assert (r.json()["ramp"]["state"], r.json()["ramp"]["next_step_at"]) == ("taken_over", None)
    [manual] = audit(fleet, "rollout.ramp")
    assert manual["actor"] == "token:1:ops" and manual["details"]["ramp_schedule_cleared"] is True
    clock.now = NOW + 10 * HOUR
    assert ticker(fleet).tick() == [] and share(fleet) == 500_000


def test_a_shadow_rollout_steps_only_once_promoted(fleet: Fleet) -> None:
    clock = with_clock(fleet)
    rollout = fleet.rollout("2.0", percentage=10, mode="shadow", shadow=SHADOW,
                            ramp={"steps": [10, 50, 100], "interval_seconds": 600},
                            guard={"min_devices": 2})
    rid = rollout["id"]
    for d in enrolled(fleet, 2, share_ppm=10_000):
        fleet.send(d, [shadow_report("clf", "2.0", "passed")])
    clock.now = NOW + 600
    assert ticker(fleet).tick() == []
    assert rollout_state(fleet, rid)["ramp"]["state"] == "waiting_for_promotion"
    assert fleet.client.patch(f"/v1/rollouts/{rid}", json={"mode": "active"},
                              headers=fleet.ops).status_code == 200
    assert ticker(fleet).tick() == []  # promotion restarts the wait
    clock.now = NOW + 1200
    [step] = ticker(fleet).tick()
    assert (step.share_ppm, share(fleet)) == (500_000, 500_000)
    assert served_release(fleet, "2.0").rollout.mode == "active"  # type: ignore[union-attr]


def test_a_verdict_batch_steps_a_due_healthy_rollout_in_its_own_request(fleet: Fleet) -> None:
    clock = with_clock(fleet)
    rollout = fleet.rollout("2.0", percentage=None, mode="shadow", shadow=SHADOW,
                            auto_promote=True, ramp={"steps": [10, 50, 100],
                                                     "interval_seconds": 600},
                            guard={"min_devices": 2})
    first, second, third = enrolled(fleet, 3, share_ppm=10_000)
    fleet.send(first, [shadow_report("clf", "2.0", "passed")])
    clock.now = NOW + 300
    fleet.send(second, [shadow_report("clf", "2.0", "passed")])  # fleet pass: promoted
    state = rollout_state(fleet, rollout["id"])
    assert (state["mode"], state["ramp"]["next_step_at"]) == ("active", at(NOW + 900))
    clock.now = NOW + 900
    before = serial(fleet)
    fleet.send(third, [shadow_report("clf", "2.0", "passed")])
    assert serial(fleet) == before + 1 and share(fleet) == 500_000
    [event] = audit(fleet, "rollout.ramp")
    assert event["actor"] == "system" and "step 2/3" in event["details"]["reason"]


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"percentage": 5, "ramp": RAMP}, "percentage", "disagrees with the ramp schedule"),
    ({"ramp": {"steps": [5, 1, 100], "interval_seconds": HOUR}}, "ramp.steps",
     "not strictly increasing"),
    ({"ramp": {"steps": [0, 100], "interval_seconds": HOUR}}, "ramp.steps", "0%"),
    ({"ramp": {"steps": [1, 101], "interval_seconds": HOUR}}, "ramp.steps", "outside 0–100"),
    ({"ramp": {"steps": [100], "interval_seconds": HOUR}}, "ramp.steps", "2 to 10 steps"),
    ({}, "percentage", "needs a percentage"),
])
def test_a_bad_schedule_is_refused_with_422_and_a_fix(fleet: Fleet, body: dict[str, Any],
                                                      field: str, words: str) -> None:
    r = fleet.client.post("/v1/channels/prod/rollouts", headers=fleet.ops,
                          json={"model": "clf", "version": "2.0", **body})
    assert r.status_code == 422, r.text
    error = r.json()
    assert words in error["detail"] and error["field"] == field and error["fix"]


def test_too_short_an_interval_or_too_many_steps_is_refused(fleet: Fleet) -> None:
    for ramp in ({"steps": [1, 100], "interval_seconds": 59},
                 {"steps": list(range(1, 12)), "interval_seconds": HOUR}):
        r = fleet.client.post("/v1/channels/prod/rollouts", headers=fleet.ops,
                              json={"model": "clf", "version": "2.0", "ramp": ramp})
        assert r.status_code == 422, r.text
    # refused before anything was written: not even the channel a first rollout creates
    assert fleet.client.get("/v1/channels/prod/rollouts", headers=fleet.ops).status_code == 404


@pytest.fixture
def quick_loop(database_url: str, tmp_path: Any) -> Iterator[Fleet]:
    yield from open_fleet(fleet_settings(database_url, tmp_path, ramp_check_seconds=0.05))


def test_the_api_process_loop_takes_a_due_step_without_any_telemetry(quick_loop: Fleet) -> None:
    fleet = quick_loop
    clock = with_clock(fleet)
    rollout = fleet.rollout("2.0", percentage=None, ramp=RAMP, guard={"min_devices": 1})
    activated(fleet, enrolled(fleet, 1, share_ppm=10_000))
    clock.now = NOW + HOUR
    deadline = time.monotonic() + 10
    while rollout_state(fleet, rollout["id"])["percentage"] == 1.0:
        assert time.monotonic() < deadline, "the ramp loop never stepped"
        time.sleep(0.05)
    assert rollout_state(fleet, rollout["id"])["percentage"] == 5.0


@pytest.mark.postgres
def test_two_api_replicas_on_postgresql_take_each_step_once(postgres_url: str,
                                                             tmp_path: Any) -> None:
    settings = fleet_settings(postgres_url, tmp_path, ramp_check_seconds=NO_LOOP)
    clock = Clock()
    for fleet in open_fleet(settings):
        with TestClient(create_app(settings)) as other:
            replicas = [ticker(fleet), other.app.state.services.fleet.ramp]  # type: ignore[attr-defined]
            for replica in replicas:
                replica.publisher.clock = clock
            rollout = fleet.rollout("2.0", percentage=None, ramp=RAMP, guard={"min_devices": 1})
            activated(fleet, enrolled(fleet, 1, share_ppm=10_000))
            first = serial(fleet)
            for k in range(1, 4):
                clock.now = NOW + k * HOUR
                start = threading.Barrier(8)
                steps: list[Any] = []

                def race(replica: RampTicker, barrier: threading.Barrier = start,
                         out: list[Any] = steps) -> None:
                    barrier.wait()
                    out.extend(replica.tick())

                threads = [threading.Thread(target=race, args=(replicas[i % 2],))
                           for i in range(8)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                assert len(steps) == 1, steps  # one of eight ticks stepped
                assert serial(fleet) == first + k
            state = rollout_state(fleet, rollout["id"])
            assert (state["percentage"], state["ramp"]["state"]) == (100.0, "done")
            assert len(audit(fleet, "rollout.ramp")) == 3
