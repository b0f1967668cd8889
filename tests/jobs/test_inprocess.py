"""The embedded default: uploads compile on the in-process worker; builds are durable rows."""

from __future__ import annotations

import hashlib
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from server.app import create_app
from server.compile import Pipeline
from server.compile.errors import TransientCompileError
from server.compile.sandbox import SandboxPolicy, pipeline_factory
from server.db.models import Build, BuildState, ModelVersion, VersionState
from server.db.session import make_engine, make_session_factory
from server.db.types import utcnow
from server.jobs.inprocess import InProcessJobQueue
from server.jobs.interface import NullJobQueue
from server.jobs.lease import public_worker_name
from server.jobs.runner import BuildRunner, RetryPolicy, _JobLog, wait_for
from server.observability.metrics import BUILD_JOBS
from tests.jobs.jobs_helpers import make_settings, publish_token, uploader
from tests.support.clock import UtcClock

# Builds as a deployment runs them by default: in the compile sandbox.
SANDBOXED = pipeline_factory(SandboxPolicy())

CONV_INPUTS = [{"name": "image", "dtype": "float32", "shape": [1, 3, 16, 16]}]


def wait_state(client: TestClient, model: str, version: str, timeout: float = 180) -> str:
    states = ("ready", "failed")
    assert wait_for(lambda: client.get(f"/v1/models/{model}/versions/{version}")
                    .json()["state"] in states, timeout, 0.5)
    return str(client.get(f"/v1/models/{model}/versions/{version}").json()["state"])


@pytest.mark.slow
def test_upload_reaches_ready_with_one_build_per_platform_and_gates(convnet_files, tmp_path):
    settings = make_settings(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "data")
    app = create_app(settings)  # job_backend=inprocess: the factory starts the worker
    assert isinstance(app.state.job_queue, InProcessJobQueue)
    with TestClient(app) as client:
        upload = uploader(client, publish_token(settings))
        v = upload("conv", "1.0.0", convnet_files.onnx, CONV_INPUTS,
                   ["onnx", "coreml", "qnn"], reference=convnet_files.reference)
        assert v["state"] in ("uploaded", "compiling")
        assert wait_state(client, "conv", "1.0.0") == "ready"
        state = client.get("/v1/models/conv/versions/1.0.0").json()["state"]
        body = client.get("/v1/models/conv/versions/1.0.0/builds").json()
    app.state.job_queue.close()

    assert state == "ready"
    builds = {b["platform"]: b for b in body}
    assert sorted(builds) == ["coreml", "onnx", "qnn"]
    store = app.state.blob_store
    for b in builds.values():
        assert b["state"] == "succeeded" and b["variant"] == "default" and b["attempts"] == 1
        art = b["artifact"]
        assert len(art["sha256"]) == 64 and art["length"] > 0
        assert "attempt started" in b["log"] and "numeric gate" in b["log"]
        # The stored blob is exactly what the build reports, at its read key.
        with store.open(f"v1/artifacts/{art['sha256']}") as f:
            data = f.read()
        assert hashlib.sha256(data).hexdigest() == art["sha256"] and len(data) == art["length"]
    assert builds["onnx"]["gates"]["numeric"]["status"] == "passed"
    assert builds["qnn"]["gates"]["numeric"]["status"] == "passed"
    assert builds["qnn"]["artifact"]["target"]["soc"] == "SM8650"
    # Core ML's package ran here through the MIL reference executor, and says so.
    assert builds["coreml"]["gates"]["numeric"]["status"] == "passed"
    assert builds["coreml"]["gates"]["numeric"]["runner"] == "mil reference executor (numpy, fp16)"
    assert builds["coreml"]["artifact"]["format"] == "mlpackage"


@pytest.mark.slow
def test_transformer_block_uploaded_as_exported_program_gets_int8_qnn(transformer_files,
                                                                      tmp_path):
    settings = make_settings(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "data")
    app = create_app(settings)
    with TestClient(app) as client:
        upload = uploader(client, publish_token(settings))
        upload("block", "1.0.0", transformer_files.pt2,
               [{"name": "tokens", "dtype": "float32", "shape": [1, 16, 32]}],
               {"onnx": {}, "coreml": {"precision": "fp16"},
                "qnn": {"soc": "SM8550", "soc_model": "43", "htp_arch": "73"}},
               reference=transformer_files.reference, calibration=transformer_files.calibration)
        assert wait_state(client, "block", "1.0.0") == "ready"
        body = client.get("/v1/models/block/versions/1.0.0/builds").json()
    app.state.job_queue.close()
    builds = {b["platform"]: b for b in body}
    assert {p: b["state"] for p, b in builds.items()} == {
        "onnx": "succeeded", "coreml": "succeeded", "qnn": "succeeded"}
    qnn = builds["qnn"]["artifact"]
    assert qnn["variant"] == "w8a16-sm8550" and qnn["format"] == "onnx-epcontext"
    assert qnn["target"]["soc"] == "SM8550" and qnn["target"]["arch"] == "v73"
    assert builds["qnn"]["gates"]["numeric"]["precision"] == "int8"
    assert builds["qnn"]["gates"]["numeric"]["status"] == "passed"


def test_nms_upload_fails_and_the_builds_name_the_operator(nms_file, tmp_path):
    settings = make_settings(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "data")
    app = create_app(settings)
    with TestClient(app) as client:
        upload = uploader(client, publish_token(settings))
        upload("det", "1.0.0", nms_file, [
            {"name": "boxes", "dtype": "float32", "shape": [1, 8, 4]},
            {"name": "scores", "dtype": "float32", "shape": [1, 1, 8]}], ["onnx", "qnn"])
        assert wait_state(client, "det", "1.0.0") == "failed"
        version = client.get("/v1/models/det/versions/1.0.0").json()
        body = client.get("/v1/models/det/versions/1.0.0/builds").json()
    app.state.job_queue.close()
    assert "NonMaxSuppression" in version["error"]
    assert body
    for b in body:
        assert b["state"] == "failed" and b["artifact"] is None
        finding = b["gates"]["operators"][0]["findings"][0]
        assert finding["name"] == "NonMaxSuppression" and "nms_tail" in finding["where"]


@pytest.fixture
def registry_with_upload(convnet_files, database_url, tmp_path):  # type: ignore[no-untyped-def]
    """A version uploaded through the API with a NullJobQueue: builds queued, nothing run."""
    settings = make_settings(database_url, tmp_path / "data")
    app = create_app(settings, job_queue=NullJobQueue())
    with TestClient(app) as client:
        uploader(client, publish_token(settings))(
            "conv", "1.0.0", convnet_files.onnx, CONV_INPUTS, ["onnx"],
            reference=convnet_files.reference)
    engine = make_engine(settings.resolved_database_url)
    yield make_session_factory(engine), app.state.blob_store
    engine.dispose()


class FlakyPipeline(Pipeline):
    """The real pipeline behind a remote service that is down for the first `failures` calls."""

    calls = 0

    def __init__(self, log: Any, failures: int) -> None:
        super().__init__(log=log)
        self._failures = failures

    def build(self, spec: Any, workdir: Path) -> Any:
        FlakyPipeline.calls += 1
        if FlakyPipeline.calls <= self._failures:
            raise TransientCompileError("AI Hub unavailable (RateLimitedError); will retry")
        return super().build(spec, workdir)


def _build(sf: Any) -> Build:
    with sf() as s:
        return s.scalars(select(Build)).one()


def _version_state(sf: Any) -> VersionState:
    with sf() as s:
        return s.scalars(select(ModelVersion.state)).one()


def build_job_counts() -> dict[str, float]:
    """modelfleet_build_jobs_total by outcome, as GET /metrics exports it."""
    return {o: BUILD_JOBS.labels(o)._value.get() for o in ("retried", "succeeded", "failed")}


def counts_since(before: dict[str, float]) -> dict[str, float]:
    return {o: n - before[o] for o, n in build_job_counts().items()}


def test_transient_failure_retries_with_backoff_then_succeeds(registry_with_upload):
    sf, store = registry_with_upload
    FlakyPipeline.calls = 0
    now = UtcClock()
    runner = BuildRunner(sf, store, worker_id="w1", retry=RetryPolicy(base_delay_s=0.3),
                         pipeline_factory=lambda log: FlakyPipeline(log, failures=1), now=now)
    queue = InProcessJobQueue(runner)
    before = build_job_counts()

    assert queue.drain() == 1
    b = _build(sf)
    assert b.state == BuildState.queued and b.attempts == 1 and b.next_attempt_at is not None
    assert "retrying in" in b.log and _version_state(sf) == VersionState.compiling
    now.advance(0.29)
    assert queue.drain() == 0  # not due yet: backoff is honoured
    now.advance(0.01)
    assert queue.drain() == 1
    b = _build(sf)
    assert b.state == BuildState.succeeded and b.attempts == 2
    assert _version_state(sf) == VersionState.ready
    assert counts_since(before) == {"retried": 1, "succeeded": 1, "failed": 0}


def test_transient_failures_give_up_after_max_attempts(registry_with_upload):
    sf, store = registry_with_upload
    FlakyPipeline.calls = 0
    runner = BuildRunner(sf, store, worker_id="w1",
                         retry=RetryPolicy(max_attempts=2, base_delay_s=0.0),
                         pipeline_factory=lambda log: FlakyPipeline(log, failures=99))
    before = build_job_counts()
    InProcessJobQueue(runner).drain()
    b = _build(sf)
    assert b.state == BuildState.failed and b.attempts == 2
    assert "gave up after 2 attempts" in b.error
    assert _version_state(sf) == VersionState.failed
    assert counts_since(before) == {"retried": 1, "succeeded": 0, "failed": 1}  # /metrics


def test_build_abandoned_by_a_dead_worker_is_taken_over_and_the_dead_one_cannot_write(
        registry_with_upload):
    sf, store = registry_with_upload
    dead = BuildRunner(sf, store, worker_id="dead", stale_after_s=5,
                       pipeline_factory=SANDBOXED)
    alive = BuildRunner(sf, store, worker_id="alive", stale_after_s=5,
                        pipeline_factory=SANDBOXED)
    build_id = _build(sf).id
    assert dead.claim(build_id)
    assert not alive.claim(build_id)  # fresh heartbeat: still owned
    with sf() as s:  # the dead worker's heartbeat stopped a while ago
        s.execute(update(Build).values(heartbeat_at=utcnow() - timedelta(seconds=60)))
        s.commit()
    assert alive.process(build_id)
    b = _build(sf)
    assert b.state == BuildState.succeeded and b.attempts == 2 and b.locked_by is None
    # The dead worker wakes up and tries to record a result: it no longer owns the build.
    dead._fail(build_id, "zombie", _JobLog())
    assert _build(sf).state == BuildState.succeeded


def test_failed_builds_can_be_retried_through_the_api(convnet_files, tmp_path):
    settings = make_settings(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "data")
    app = create_app(settings, job_queue=NullJobQueue())
    with TestClient(app) as client:
        token = publish_token(settings)
        uploader(client, token)("conv", "1.0.0", convnet_files.onnx, CONV_INPUTS, ["onnx"])
        sf = app.state.session_factory
        # A first attempt failed for a reason since fixed (e.g. a worker bug).
        runner = BuildRunner(sf, app.state.blob_store, worker_id="w",
                             pipeline_factory=lambda log: FlakyPipeline(log, failures=99),
                             retry=RetryPolicy(max_attempts=1))
        FlakyPipeline.calls = 0
        InProcessJobQueue(runner).drain()
        assert client.get("/v1/models/conv/versions/1.0.0").json()["state"] == "failed"

        headers = {"Authorization": f"Bearer {token}"}
        r = client.post("/v1/models/conv/versions/1.0.0/builds/retry", headers=headers)
        assert r.status_code == 200 and r.json()["state"] == "compiling"
        assert [b["state"] for b in r.json()["builds"]] == ["queued"]
        assert client.post("/v1/models/conv/versions/1.0.0/builds/retry").status_code == 401

        InProcessJobQueue(BuildRunner(sf, app.state.blob_store, worker_id="w2",
                                      pipeline_factory=SANDBOXED)).drain()
        body = client.get("/v1/models/conv/versions/1.0.0/builds?logs=true").json()
        assert client.get("/v1/models/conv/versions/1.0.0").json()["state"] == "ready"
        assert body[0]["attempts"] == 2
        assert "re-queued by" in body[0]["log"]
        assert client.get("/v1/models/conv/versions/1.0.0/builds?lgos=1").status_code == 422


class HangingPipeline(Pipeline):
    """A compile that hangs until the test lets it go."""

    started = threading.Event()
    released = threading.Event()

    def build(self, spec: Any, workdir: Path) -> Any:
        HangingPipeline.started.set()
        assert HangingPipeline.released.wait(300), "the test never released the compile"
        return super().build(spec, workdir)


def _heartbeating(build_id: int) -> bool:
    return any(t.name == f"heartbeat-{Build.__tablename__}-{build_id}" and t.is_alive()
               for t in threading.enumerate())


def test_hung_compile_stops_heartbeating_and_another_worker_takes_over(registry_with_upload):
    # The leases share one injected clock: the test moves it past `stale_after_s` and
    # `max_build_s` and waits for the beats it causes, so load can only make it slower.
    sf, store = registry_with_upload
    clock = UtcClock()
    stale, max_build = 60.0, 300.0
    HangingPipeline.started.clear()
    HangingPipeline.released.clear()
    hung = BuildRunner(sf, store, worker_id="hung", heartbeat_s=0.02, stale_after_s=stale,
                       max_build_s=max_build, now=clock,
                       pipeline_factory=lambda log: HangingPipeline(log=log))
    rescuer = BuildRunner(sf, store, worker_id="rescuer", stale_after_s=stale, now=clock,
                          pipeline_factory=SANDBOXED)
    build_id = _build(sf).id
    t = threading.Thread(target=hung.process, args=(build_id,))
    t.start()
    try:
        assert HangingPipeline.started.wait(120), "the hung worker never started compiling"
        # Heartbeats publish the running attempt's log, visible through the API meanwhile.
        label = public_worker_name("hung")
        assert wait_for(lambda: f"attempt started on worker {label}" in _build(sf).log,
                        120, 0.02)
        # Past the stale window twice over, in steps shorter than it: each beat renews the
        # lease, so the build is never claimable while its compile is within max_build_s.
        for _ in range(4):
            clock.advance(stale * 0.6)
            assert wait_for(lambda: _build(sf).heartbeat_at == clock.at, 120, 0.02)
            assert not rescuer.claim(build_id)  # still beating
        # Hung past max_build_s: the beats stop; once they are stale, the rescuer takes over.
        clock.advance(max_build)
        assert wait_for(lambda: not _heartbeating(build_id), 120, 0.02), "still beating"
        clock.advance(stale + 1)
        assert rescuer.process(build_id)
    finally:
        HangingPipeline.released.set()  # the hung compile ends late and must not settle
        t.join(300)
    assert not t.is_alive()
    b = _build(sf)
    assert b.state == BuildState.succeeded and b.attempts == 2 and b.locked_by is None
    assert public_worker_name("rescuer") in b.log  # the second attempt, by its public name
    assert b.log.count(f"attempt started on worker {label}") == 1
