"""The closed loop with a real fleet: the real server on loopback (uvicorn, PostgreSQL, the
in-process compile queue running the real ONNX pipeline and gates) and 50 SDK instances, each
its own data directory, device id, key and profile, talking HTTP.

A good release passes shadow on the devices, is promoted by the guard (auto_promote) and
ramped to 100% by its ramp schedule (50 → 100%, the server's clock moved past the interval);
a bad release (outputs diverge) fails shadow on the devices, the server halts
it in the very request that brought the failed share to the guard's threshold, no device
ever served an output of the bad model, and every device ends on the good version. Prints
the timeline and the figures (docs/benchmarks.md).

The same loop again with liars (issue 20, tests/fleet/fleet_liars.py): 21 more enrolled
devices — 30% of the 71 — that are not offered, replay honest reports, contradict their own
figures, or lie consistently and are revoked mid-way. The outcomes must not move: the good
release reaches 100% by its schedule after as many honest devices as without liars, the bad
one is halted at the same honest threshold, and neither flips afterwards. One run serves
the outcome test and one test per attack, each checking what was stored."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import uvicorn

from client_sdk import (
    DeviceProfile,
    ModelRuntime,
    SystemClock,
    Updater,
    UpdaterConfig,
    UrllibTransport,
)
from client_sdk.telemetry import Reporter
from server.app import create_app
from server.auth import create_token
from server.db.migrate import upgrade
from server.settings import Settings
from tests.client.onnx_models import check_whole, scaled_model
from tests.fleet.fleet_liars import Hooks, Liars
from tests.support.served import free_port
from tests.support.server_keys import init_test_keys

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

DEVICES = 50
MIN_DEVICES = 10
RAMP_INTERVAL_S = 3600
SHADOW = {"max_kl_micro": 2_000, "max_latency_p99_us": 5_000_000, "min_samples": 5}
META = {"platforms": {"onnx": {}}, "inputs": [{"name": "x", "dtype": "float32",
                                               "shape": [1, 4]}]}
PROFILES = [("x86_64", "12"), ("arm64", "13"), ("arm64", "14"), ("x86_64", "17.2"),
            ("arm64", "15.1")]


@dataclass
class Device:
    index: int
    data_dir: Path
    profile: DeviceProfile
    url: str
    root: bytes
    reporter: Reporter
    served: list[str] = field(default_factory=list)  # version of every prediction

    def cycle(self, rng: np.random.Generator, predictions: int = 7) -> None:
        """One poll, as an app process would run it: update, serve the app's predictions
        (the candidate shadows them), persist the statistics, send the telemetry."""
        runtime = ModelRuntime(self.data_dir, shadow_budget=None)  # each prediction a sample
        try:
            Updater(UpdaterConfig(base_url=self.url, channel="prod", pinned_root=self.root,
                                  device=self.profile, data_dir=self.data_dir,
                                  runtime=runtime)).check_once()
            for _ in range(predictions):
                x = rng.standard_normal((1, 4)).astype(np.float32)
                p = runtime.predict("clf", {"x": x})
                check_whole(p.outputs, x)  # both outputs came from the bundle that answered
                self.served.append(p.version)
                runtime.flush_shadow()
        finally:
            runtime.close()
        self.reporter.collect()
        sent = self.reporter.flush()
        # Every report must reach the server in its own cycle: the health counts below read
        # them. A refusal or a retry here is a server answer to explain, not to wait out.
        backoff = self.data_dir / "telemetry" / "backoff.json"
        assert (sent.status, sent.pending) == ("ok", 0), (
            self.profile.device_id, sent, backoff.read_text() if backoff.exists() else None)

    def active(self) -> str | None:
        runtime = ModelRuntime(self.data_dir)
        try:
            bundle = runtime.store.active("clf")
        finally:
            runtime.close()
        return None if bundle is None else bundle.version


class Server:
    def __init__(self, settings: Settings) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(settings)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.server.started
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def serve_fleet(database_url: str, tmp_path: Path) -> Iterator[tuple[Server, str, str]]:
    upgrade(database_url)
    data = tmp_path / "server"
    init_test_keys(data)
    settings = Settings(env="development", data_dir=data, database_url=database_url,
                        manifest_lifetime_seconds=86_400, ramp_check_seconds=0.2)
    with Server(settings) as server:
        with server.app.state.session_factory() as s:
            _, ops = create_token(s, ["publish", "rollout"], name="release-engineer")
            _, enroll = create_token(s, ["enroll"], name="fleet")
            s.commit()
        yield server, ops, enroll


@pytest.fixture
def fleet_server(postgres_url: str, tmp_path: Path) -> Iterator[tuple[Server, str, str]]:
    yield from serve_fleet(postgres_url, tmp_path)


class Api:
    def __init__(self, url: str, token: str) -> None:
        self.url, self.http = url, requests.Session()
        self.http.headers["Authorization"] = f"Bearer {token}"

    def __call__(self, method: str, path: str, **kw: Any) -> Any:
        r = self.http.request(method, self.url + path, timeout=60, **kw)
        assert r.status_code < 300, (method, path, r.status_code, r.text)
        return r.json()

    def publish(self, version: str, k: float) -> None:
        self("POST", "/v1/models/clf/versions",
             files={"model": ("m.onnx", scaled_model(k), "application/octet-stream")},
             data={"metadata": json.dumps({**META, "version": version})})
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            state = self("GET", f"/v1/models/clf/versions/{version}")["state"]
            if state in ("ready", "failed"):
                assert state == "ready"
                return
            time.sleep(0.5)
        pytest.fail(f"version {version} did not build in time")


def make_devices(server: Server, root: bytes, enroll: str, base: Path) -> list[Device]:
    devices = []
    for i in range(DEVICES):
        arch, os_version = PROFILES[i % len(PROFILES)]
        profile = DeviceProfile(f"sim-{i:03d}", "onnx", arch=arch, os_version=os_version,
                                app_version=f"3.{i % 3}.0")
        data = base / profile.device_id
        reporter = Reporter(data, server.url, UrllibTransport(), profile, SystemClock(),
                            channel="prod")
        assert reporter.enroll(enroll)
        devices.append(Device(i, data, profile, server.url, root, reporter))
    return devices


def not_active(server: Server, release_id: int, devices: list[Device]) -> dict[str, Any]:
    """What the server stored for each device it does not count active on the release:
    the standing row and every report, to tell a lost report from a misjudged one."""
    from sqlalchemy import select

    from server.db import models as db

    out: dict[str, Any] = {}
    with server.app.state.session_factory() as s:
        for d in devices:
            dev = d.profile.device_id
            row = s.get(db.DeviceRelease, (dev, release_id))
            if row is not None and row.event == "activated":
                continue
            events = s.execute(select(
                db.TelemetryEvent.kind, db.TelemetryEvent.standing, db.TelemetryEvent.payload,
                db.TelemetryEvent.received_at).where(
                db.TelemetryEvent.device_id == dev, db.TelemetryEvent.release_id == release_id)
                .order_by(db.TelemetryEvent.id)).all()
            out[dev] = {"row": None if row is None else (row.event, row.event_at, row.verdict),
                        "reports": [(k, st, p.get("event"), p.get("at"), str(at))
                                    for k, st, p, at in events]}
    return out


@dataclass
class Figures:
    """What a run measured (docs/benchmarks.md "Fleet simulation")."""

    promoted_after: int  # honest devices that had cycled when the guard promoted 2.0.0
    promoted_s: float  # wall seconds from the good rollout's start to its promotion
    step_late_s: float  # wall seconds the 100% step came after it was due
    halted_after: int  # honest devices that had cycled when the guard halted 3.0.0
    halted_s: float  # wall seconds from the bad rollout's start to its halt
    timeline: list[str]
    good_id: int = 0
    bad_id: int = 0


def run_fleet(server: Server, ops: str, enroll: str, base: Path,
              hooks: Hooks | None = None) -> Figures:
    """The whole loop (module docstring); `hooks` plays the liars between honest cycles."""
    hooks = hooks or Hooks()
    api = Api(server.url, ops)
    rng = np.random.default_rng(12)
    timeline: list[str] = []
    t0 = time.monotonic()

    def log(event: str) -> None:
        timeline.append(f"{time.monotonic() - t0:7.1f}s  {event}")

    api("POST", "/v1/models", json={"name": "clf", "task": "classification"})
    for version, k in (("1.0.0", 1.0), ("2.0.0", 1.001), ("3.0.0", 3.0)):
        api.publish(version, k)
    log("1.0.0, 2.0.0 (same outputs ±0.1%) and 3.0.0 (outputs ×3) built")
    api("POST", "/v1/channels/prod/rollouts", json={"model": "clf", "version": "1.0.0",
                                                     "percentage": 100})
    root = requests.get(server.url + "/v1/root/1.json", timeout=30).content
    devices = make_devices(server, root, enroll, base)
    for d in devices:
        d.cycle(rng)
    assert {d.active() for d in devices} == {"1.0.0"}
    hooks.enrolled(server, enroll)
    log(f"{DEVICES} devices enrolled and on 1.0.0" + hooks.describe())

    # The good release: shadow on half the fleet, promoted by the guard, then ramped to 100%
    # by its schedule once a ramp interval has passed since the promotion.
    good = api("POST", "/v1/channels/prod/rollouts", json={
        "model": "clf", "version": "2.0.0", "mode": "shadow",
        "ramp": {"steps": [50, 100], "interval_seconds": RAMP_INTERVAL_S},
        "shadow": SHADOW, "auto_promote": True,
        "guard": {"min_devices": MIN_DEVICES, "max_fail_share": 0.2}})
    assert good["percentage"] == 50
    good_t0 = time.monotonic()
    hooks.good_started(good["id"])
    promoted_after, promoted_s = None, 0.0
    for d in devices:
        d.cycle(rng)
        hooks.honest_cycled("good", d.profile.device_id, d.index)
        if promoted_after is None and api("GET", f"/v1/rollouts/{good['id']}")["mode"] == "active":
            promoted_after, promoted_s = d.index + 1, time.monotonic() - good_t0
    health = api("GET", f"/v1/rollouts/{good['id']}")["health"]
    assert promoted_after is not None, health
    assert health["devices"]["passed"] >= MIN_DEVICES and health["devices"]["failed"] == 0
    log(f"2.0.0 promoted by the guard after {promoted_after} devices had cycled "
        f"({health['devices']['passed']} passed, offered {health['devices']['offered']})")
    ramp = api("GET", f"/v1/rollouts/{good['id']}")["ramp"]
    assert (ramp["state"], ramp["step"]) == ("scheduled", 1), ramp
    # The server's clock jumps one interval ahead (a test cannot wait an hour); its ramp
    # loop takes the step by itself — the rollout is healthy.
    publisher = server.app.state.services.publisher
    publisher.clock = lambda: int(time.time()) + RAMP_INTERVAL_S
    due = time.monotonic()
    deadline = due + 30
    while api("GET", f"/v1/rollouts/{good['id']}")["percentage"] != 100:
        assert time.monotonic() < deadline, "the ramp schedule never took its step"
        time.sleep(0.1)
    step_late_s = time.monotonic() - due
    steps = api("GET", "/v1/audit", params={"action": "rollout.ramp"})["events"]
    assert [(e["actor"], e["details"]["share_ppm"]) for e in steps] == [("system", 1_000_000)]
    log(f"2.0.0 stepped to 100% by its ramp schedule {step_late_s:.1f} s after the step was "
        f"due: {steps[0]['details']['reason']}")
    for _ in range(2):  # holders swap the candidate in; the other half downloads 2.0
        for d in devices:
            d.cycle(rng)
    assert {d.active() for d in devices} == {"2.0.0"}
    health = api("GET", f"/v1/rollouts/{good['id']}")["health"]
    assert health["devices"]["failed"] == 0 and health["devices"]["rolled_back"] == 0
    assert health["devices"]["active"] == DEVICES, not_active(server, good["id"], devices)
    log(f"2.0.0 ramped to 100%: all {DEVICES} devices active on it (health: "
        f"{health['devices']})")

    # The bad release: shadow everywhere; the guard halts it at the threshold.
    bad = api("POST", "/v1/channels/prod/rollouts", json={
        "model": "clf", "version": "3.0.0", "percentage": 100, "mode": "shadow",
        "shadow": SHADOW, "guard": {"min_devices": MIN_DEVICES, "max_fail_share": 0.2}})
    serial_before = bad["serial"]
    bad_t0 = time.monotonic()
    hooks.bad_started(bad["id"])
    halted_after, halted_s = None, 0.0
    for d in devices:
        d.cycle(rng)
        hooks.honest_cycled("bad", d.profile.device_id, d.index)
        state = api("GET", f"/v1/rollouts/{bad['id']}")
        if halted_after is None and state["state"] == "halted":
            halted_after, halted_s = d.index + 1, time.monotonic() - bad_t0
            log(f"3.0.0 halted by the guard after device {halted_after}: "
                f"{state['state_reason']}")
    state = api("GET", f"/v1/rollouts/{bad['id']}")
    # The threshold: MIN_DEVICES reporting devices, every one failed; halted in that request.
    assert halted_after == MIN_DEVICES, (halted_after, state["health"])
    assert state["health"]["devices"]["failed"] == MIN_DEVICES
    assert state["health"]["devices"]["downloaded"] == MIN_DEVICES  # no one after saw it
    channels = api("GET", "/v1/channels")
    assert next(c["serial"] for c in channels if c["name"] == "prod") > serial_before
    halts = api("GET", "/v1/audit", params={"action": "rollout.halt"})["events"]
    assert [e["actor"] for e in halts] == ["system"]
    log(f"3.0.0 seen by {state['health']['devices']['downloaded']} of {DEVICES} devices, "
        f"failed on {state['health']['devices']['failed']}")

    for d in devices:
        d.cycle(rng)
    hooks.finished(good["id"], bad["id"])
    served = [v for d in devices for v in d.served]
    assert "3.0.0" not in served  # no device ever served the bad model
    assert {d.active() for d in devices} == {"2.0.0"}
    log(f"every device on 2.0.0; {len(served)} predictions served, none by 3.0.0")
    # Neither outcome flips, whatever was sent after.
    good_now, bad_now = (api("GET", f"/v1/rollouts/{i}") for i in (good["id"], bad["id"]))
    assert (good_now["state"], good_now["mode"], good_now["percentage"]) == (
        "active", "active", 100)
    assert bad_now["state"] == "halted"
    print("\nfleet timeline:\n" + "\n".join(timeline))
    figures = Figures(promoted_after, promoted_s, step_late_s, halted_after, halted_s,
                      timeline, good["id"], bad["id"])
    print(f"figures: {figures.promoted_after} honest devices to promotion "
          f"({figures.promoted_s:.1f} s), 100% step {figures.step_late_s:.1f} s after due; "
          f"{figures.halted_after} honest devices to halt ({figures.halted_s:.1f} s)")
    return figures


def test_fleet_of_50_devices_promotes_a_good_release_and_halts_a_bad_one(
        fleet_server: tuple[Server, str, str], tmp_path: Path) -> None:
    server, ops, enroll = fleet_server
    run_fleet(server, ops, enroll, tmp_path / "devices")


# ---------------------------------------------------------------- the same fleet with liars


@dataclass
class LiarsRun:
    figures: Figures
    liars: Liars


@pytest.fixture(scope="module")
def liars_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiarsRun]:
    from tests.conftest import postgres_database

    base = tmp_path_factory.mktemp("liars")
    with postgres_database() as url:
        for server, ops, enroll in serve_fleet(url, base):
            liars = Liars(server.url, server.app.state.session_factory, ops,
                          honest=DEVICES, share=0.3)
            yield LiarsRun(run_fleet(server, ops, enroll, base / "devices", liars), liars)


def test_fleet_with_30_percent_liars_reaches_100_percent_and_halts_at_the_honest_threshold(
        liars_run: LiarsRun) -> None:
    figures, liars = liars_run.figures, liars_run.liars
    assert round(len(liars.all()) / (len(liars.all()) + DEVICES), 2) == 0.3  # of enrolled
    # run_fleet asserted the outcomes; the liars moved neither threshold.
    assert figures.halted_after == MIN_DEVICES
    assert figures.promoted_after is not None
    health = liars.health(figures.good_id)
    assert (health["failed"], health["rolled_back"], health["active"]) == (0, 0, DEVICES)


def test_fleet_liars_not_offered_are_stored_apart_and_never_counted(
        liars_run: LiarsRun) -> None:
    liars, figures = liars_run.liars, liars_run.figures
    group = liars.groups["not_offered"]
    for rollout_id in (figures.good_id, figures.bad_id):
        assert liars.standings_of(group, rollout_id) == {"not_offered"}
        assert liars.votes_of(group, rollout_id) == 0
    assert liars.health(figures.good_id)["not_offered"] == len(group)
    assert liars.health(figures.bad_id)["not_offered"] == len(group)


def test_fleet_liars_replaying_honest_reports_store_nothing(liars_run: LiarsRun) -> None:
    liars, figures = liars_run.liars, liars_run.figures
    group = liars.groups["replaying"]
    assert liars.replays["sent"] > 0 and liars.replays["refused"] == liars.replays["sent"]
    assert liars.replays["duplicates"] > 0 and liars.replays["accepted"] == 0
    for rollout_id in (figures.good_id, figures.bad_id):
        assert liars.standings_of(group, rollout_id) == set()
        assert liars.votes_of(group, rollout_id) == 0


def test_fleet_liars_contradicting_their_figures_are_stored_as_forged(
        liars_run: LiarsRun) -> None:
    liars, figures = liars_run.liars, liars_run.figures
    group = liars.groups["contradicting"]
    for rollout_id in (figures.good_id, figures.bad_id):
        assert liars.standings_of(group, rollout_id) == {"forged"}
        assert liars.votes_of(group, rollout_id) == 0
        assert liars.health(rollout_id)["forged"] == len(group)


def test_fleet_liars_revoked_mid_way_lose_their_votes_and_are_refused_after(
        liars_run: LiarsRun) -> None:
    liars, figures = liars_run.liars, liars_run.figures
    group = liars.groups["revoked"]
    # Their failures on the good release were counted when sent, and removed by revocation.
    assert liars.standings_of(group, figures.good_id) == {"counted"}
    assert liars.votes_of(group, figures.good_id) == len(group)
    assert liars.health(figures.good_id)["revoked"] == len(group)
    assert liars.revoked_refusals == len(group)  # their reports on 3.0.0: 401, nothing stored
    assert liars.standings_of(group, figures.bad_id) == set()
