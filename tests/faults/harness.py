"""A real `modelfleet serve` to kill: started in a session of its own with
MODELFLEET_CRASH_AT (server/crashpoints.py), driven over HTTP through one release's life —
upload, build, publish, a second version patched from the first, a ramp step, a guard halt,
a re-publish — until it dies, then restarted unarmed and driven to the end again. Each step
of the drive is idempotent (it looks first, then does what is missing), so the same drive
both crashes the server and finishes the work after the restart.

`Rig.seen` keeps the sha256 of every manifest a device was served, by (channel, serial), for
the invariant "a serial never has two contents" (tests/support/invariants.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

import manifests
from server.blobstore import BlobStore, make_blob_store
from server.crashpoints import STEPS
from server.db.migrate import upgrade
from server.db.session import make_engine, make_session_factory
from server.rollouts.rules import release_salt
from server.settings import Settings
from tests.client.onnx_models import scaled_model
from tests.support.fleet_devices import FleetDevice, update_report
from tests.support.invariants import Blobs, manifest_payload, violations
from tests.support.served import free_port
from tests.support.server_keys import init_test_keys

REPO = Path(__file__).resolve().parents[2]
INPUTS = [{"name": "x", "dtype": "float32", "shape": [1, 4]}]
STEPS_PERCENT = [10, 50, 100]
# The crash points a server process passes (the rotate.*/resign.* ones are the CLI's).
SERVE_STEPS = [s for s in STEPS if not s.startswith(("rotate.", "resign."))]


def model_bytes(version: str) -> bytes:
    n = int(version.rsplit(".", 1)[1])
    return scaled_model(float(n), padding=2000, tweak=n)


def offered(version: str, i: int) -> str:
    """A device id of its own (number `i`) inside the version's first ramp share on prod."""
    salt = release_salt("prod", "clf", version)
    ids = (f"dev-{i}-{k}" for k in itertools.count())
    return next(d for d in ids if manifests.bucket(salt, d) < STEPS_PERCENT[0] * 10_000)


class ServerDied(Exception):
    """The server went away mid-drive (the armed crash point fired)."""


@dataclass
class Rig:
    root: Path
    database_url: str
    s3: Any | None = None  # tests.conftest.S3Bucket, or None: the local blob directory
    seen: dict[tuple[str, int], str] = field(default_factory=dict)
    forker: ForkServer | None = None  # None: each server is a `modelfleet serve`
    s3_prefix: str = ""  # rigs sharing a bucket keep apart under prefixes of their own
    proc: subprocess.Popen[bytes] | None = None
    pid: int | None = None
    port: int = 0
    starts: int = 0
    token: str = ""
    enroll: str = ""
    devices: int = 0  # devices enrolled so far (each report comes from a new one)
    cycles: int = 0  # release cycles driven to their end
    failed_sent: set[str] = field(default_factory=set)  # versions a failed report went to
    # One client (its connections kept alive) for the whole rig: a client per request
    # costs more than the request on a loaded machine.
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    def __post_init__(self) -> None:
        from server.auth import create_token

        upgrade(self.database_url)
        init_test_keys(self.data, root_keys=1)
        engine = make_engine(self.database_url)
        with make_session_factory(engine)() as s:
            _, self.token = create_token(s, ["publish", "rollout"], name="kill-test")
            _, self.enroll = create_token(s, ["enroll"], name="devices")
            s.commit()
        engine.dispose()

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, crash_at: str = "") -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MODELFLEET_")}
        env.update(PYTHONPATH=str(REPO), MODELFLEET_DATABASE_URL=self.database_url,
                   MODELFLEET_SANDBOX="off", MODELFLEET_RAMP_CHECK_SECONDS="0.3",
                   MODELFLEET_CRASH_AT=crash_at)
        if self.s3 is not None:
            env.update(MODELFLEET_BLOB_STORE="s3", MODELFLEET_S3_BUCKET=self.s3.bucket,
                       MODELFLEET_S3_ENDPOINT_URL=self.s3.endpoint_url,
                       MODELFLEET_S3_ACCESS_KEY_ID=self.s3.access_key,
                       MODELFLEET_S3_SECRET_ACCESS_KEY=self.s3.secret_key,
                       MODELFLEET_S3_PREFIX=self.s3_prefix)
        return env

    def settings(self) -> Settings:
        env = self.env()
        return Settings(data_dir=self.data, database_url=self.database_url,
                        blob_store="s3" if self.s3 else "local",
                        s3_bucket=env.get("MODELFLEET_S3_BUCKET", ""),
                        s3_endpoint_url=env.get("MODELFLEET_S3_ENDPOINT_URL", ""),
                        s3_access_key_id=env.get("MODELFLEET_S3_ACCESS_KEY_ID", ""),
                        s3_secret_access_key=env.get("MODELFLEET_S3_SECRET_ACCESS_KEY", ""),
                        s3_prefix=self.s3_prefix)

    def store(self) -> BlobStore:
        return make_blob_store(self.settings())

    # ---- the server process ---------------------------------------------------------------

    def start(self, crash_at: str = "") -> None:
        """`modelfleet serve` in a session of its own, or (with a fork server) a forked
        server process; returns once it answers."""
        self.port = free_port()
        self.starts += 1
        log = self.root / f"serve-{self.starts}.log"
        env = self.env(crash_at) | {"MODELFLEET_PUBLIC_BASE_URL": self.base}
        if self.forker is not None:
            self.proc = None
            self.pid = self.forker.spawn(env | {"MODELFLEET_DATA_DIR": str(self.data)},
                                         self.port, log)
        else:
            with log.open("wb") as out:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "modelfleet", "serve", "--data-dir",
                     str(self.data), "--port", str(self.port)], cwd=REPO, env=env,
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            self.pid = self.proc.pid
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServerDied(f"at start: {self.log()}")
            try:
                if self.http.get(f"{self.base}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise AssertionError(f"the server did not come up: {self.log()}")

    def log(self) -> str:
        return (self.root / f"serve-{self.starts}.log").read_text(errors="replace")[-3000:]

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        if self.pid is None:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def stop(self) -> None:
        """SIGKILL the whole group (what is left of it after a crash, or all of it)."""
        if self.pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        self.proc = self.pid = None

    # ---- HTTP -----------------------------------------------------------------------------

    def call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = kw.pop("headers", {"Authorization": f"Bearer {self.token}"})
        try:
            return self.http.request(method, self.base + path, headers=headers, **kw)
        except httpx.TransportError as e:
            deadline = time.monotonic() + 3  # a killed group is reaped a moment later
            while time.monotonic() < deadline:
                if not self.alive():
                    raise ServerDied(f"{method} {path}") from e
                time.sleep(0.05)
            raise

    def observe(self) -> None:
        """Poll the channel's manifest as a device would and remember its bytes' sha256."""
        r = self.call("GET", "/v1/channels/prod/manifest", headers={})
        if r.status_code == 200:
            doc = manifest_payload(r.content)
            self.seen.setdefault(("prod", doc.serial), hashlib.sha256(r.content).hexdigest())

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if not self.alive():
                raise ServerDied(what)
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}: {self.log()}")

    # ---- the drive ------------------------------------------------------------------------

    def version_state(self, version: str) -> str:
        r = self.call("GET", f"/v1/models/clf/versions/{version}")
        return str(r.json()["state"]) if r.status_code == 200 else "absent"

    def upload(self, version: str) -> dict[str, Any]:
        """Upload (or retry the upload of) a version: 201 the first time, 200 after."""
        meta = {"version": version, "platforms": ["onnx"], "inputs": INPUTS}
        r = self.call("POST", "/v1/models/clf/versions",
                      files={"model": ("m.onnx", model_bytes(version))},
                      data={"metadata": json.dumps(meta)})
        assert r.status_code in (200, 201), r.text
        out: dict[str, Any] = r.json()
        return out

    def rollout(self, version: str) -> dict[str, Any] | None:
        """The rollout of `version` on prod, or None."""
        r = self.call("GET", "/v1/channels/prod/rollouts")
        assert r.status_code == 200, r.text
        body = r.json()
        rows = body["rollouts"] if isinstance(body, dict) else body
        return next((x for x in rows if x["version"] == version), None)

    def drive(self, new_cycles: int = 2) -> None:
        """Release versions 1.0.1, 1.0.2, … one cycle each (see `cycle`), each step only if
        not done yet: the cycles done before (whatever a crash left of them), then
        `new_cycles` more. Raises ServerDied."""
        r = self.call("POST", "/v1/models", json={"name": "clf"})
        assert r.status_code in (200, 201, 409), r.text
        r = self.call("POST", "/v1/channels", json={"name": "prod"})
        assert r.status_code in (200, 201, 409), r.text
        # Cycles done are done (the invariants cover what they left); the one a crash cut
        # short is the first of the next ones.
        for n in range(self.cycles + 1, self.cycles + new_cycles + 1):
            self.cycle(n)
            self.cycles = max(self.cycles, n)

    def cycle(self, n: int) -> None:
        """Version 1.0.n: uploaded (a retried upload answers 200 with the same version),
        built, patched from the versions before it; the first is rolled out to 100%, each
        later one on a ramp whose first step a healthy device lets it take, then halted by
        the guard on a failed device."""
        version = f"1.0.{n}"
        self.upload(version)
        self.wait(f"{version} built", lambda: self.version_state(version) == "ready")
        self.observe()
        if self.rollout(version) is None:
            body: dict[str, Any] = {"model": "clf", "version": version, "percentage": 100}
            if n > 1:
                body.update(percentage=None,
                            ramp={"steps": STEPS_PERCENT, "interval_seconds": 3600},
                            guard={"min_devices": 1, "max_fail_share": 0.3})
            r = self.call("POST", "/v1/channels/prod/rollouts", json=body)
            assert r.status_code == 201, r.text
        self.observe()
        if n == 1:
            return
        if not self._ramped(version) and not self._halted(version):
            self.report(version, "activated")  # one healthy device: the guard's "pass"
            self.step_due()
            self.wait("a ramp step", lambda: self._ramped(version) or self._halted(version))
        self.observe()
        if not self._halted(version) and version not in self.failed_sent:
            self.failed_sent.add(version)  # before: the report may be stored as it dies
            self.report(version, "failed")  # a failed device: over max_fail_share, halted
        # Also after a restart: the stored failure halts it at start (guard.decided).
        self.wait("the guard's halt", lambda: self._halted(version), 20)
        self.observe()

    def report(self, version: str, event: str) -> None:
        """A new device inside the version's first ramp share enrols and sends one update
        report (its report counts: the rule offered it the version)."""
        self.devices += 1
        device = FleetDevice(offered(version, self.devices), platform="onnx")
        r = self.call("POST", "/v1/devices/enroll", json=device.enroll_body(),
                      headers={"Authorization": f"Bearer {self.enroll}"})
        assert r.status_code in (200, 201), r.text
        body = device.batch([update_report("clf", version, event)])
        r = self.call("POST", "/v1/telemetry", content=body, headers=device.headers(body))
        assert r.status_code in (200, 202), r.text

    def step_due(self) -> None:
        """Fast-forward the ramp schedule: the next step of 2.0.0 is due now (the interval
        is an hour at least), so the server's ramp loop takes it within its check period."""
        from sqlalchemy import update

        from server.db import models as db

        engine = make_engine(self.database_url)
        try:
            with make_session_factory(engine)() as s:
                s.execute(update(db.Release).where(db.Release.ramp_next_at.is_not(None))
                          .values(ramp_next_at=0))
                s.commit()
        finally:
            engine.dispose()

    def _ramped(self, version: str) -> bool:
        row = self.rollout(version)
        return row is not None and row["percentage"] > STEPS_PERCENT[0]

    def _halted(self, version: str) -> bool:
        row = self.rollout(version)
        return row is not None and row["state"] == "halted"

    def idle(self) -> bool:
        """No build or patch job left to run (what the restarted server repairs, done)."""
        from sqlalchemy import select

        from server.db import models as db

        engine = make_engine(self.database_url)
        try:
            with make_session_factory(engine)() as s:
                busy = s.scalars(select(db.ModelVersion.id).where(db.ModelVersion.state.in_(
                    [db.VersionState.uploaded, db.VersionState.compiling,
                     db.VersionState.patching]))).first()
                return busy is None
        finally:
            engine.dispose()

    def serves_newest(self) -> bool:
        from sqlalchemy import func, select

        from server.db import models as db

        engine = make_engine(self.database_url)
        try:
            with make_session_factory(engine)() as s:
                newest = s.scalar(select(func.max(db.SignedManifest.serial)))
        finally:
            engine.dispose()
        data = Blobs(self.store()).read("v1/channels/prod/manifest")
        return data is not None and manifest_payload(data).serial == newest

    def violations(self) -> list[str]:
        engine = make_engine(self.database_url)
        try:
            return violations(make_session_factory(engine), self.store(), self.seen)
        finally:
            engine.dispose()


class ForkServer:
    """tests/faults/forkserve.py running: real server processes forked warm."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.faults.forkserve"],
                                     cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and json.loads(self.proc.stdout.readline())["ready"]

    def spawn(self, env: dict[str, str], port: int, log: Path) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"env": env, "port": port, "log": str(log)}) + "\n")
        self.proc.stdin.flush()
        return int(json.loads(self.proc.stdout.readline())["pid"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@contextmanager
def rig(root: Path, database_url: str, s3: Any | None,
        forker: ForkServer | None = None, s3_prefix: str = "") -> Iterator[Rig]:
    made = Rig(root, database_url, s3, forker=forker, s3_prefix=s3_prefix)
    try:
        yield made
    finally:
        made.stop()
        made.http.close()


def life(r: Rig, crash_at: str) -> bool:
    """One server life armed at `crash_at`: it first finishes what the previous life left
    (the invariants must then hold), then drives the release's life on. True when it died
    at the crash point, False when it got to the end (the server is then stopped)."""
    try:
        r.start(crash_at)
        r.wait("the restarted server idle", r.idle, 60)
        found = r.violations()
        assert found == [], f"after a crash ({r.root}): {found}"
        r.drive()
    except ServerDied:
        time.sleep(0.05)
        r.stop()
        return True
    r.stop()
    return False


def finish(r: Rig) -> None:
    """A last, unarmed life: it repairs what the previous one left and drives on to the end;
    then everything must hold, and the bucket must serve the newest serial."""
    r.start()
    try:
        r.wait("the restarted server idle", r.idle, 60)
        r.drive()
        r.wait("the newest manifest served", r.serves_newest, 30)
        found = r.violations()
        assert found == [], f"at the end ({r.root}): {found}"
    finally:
        r.stop()
