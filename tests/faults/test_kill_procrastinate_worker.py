"""The production queue through the crash hooks: `modelfleet worker` (procrastinate on
PostgreSQL) armed with MODELFLEET_CRASH_AT at `build.artifacts_stored` SIGKILLs itself with
the artifact stored and the build's result not committed; a restarted worker takes the job
back (procrastinate's stalled-job retry, then the build lease's takeover) and finishes it, and
the invariants of tests/support/invariants.py hold."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from server.app import create_app
from server.db import models as db
from server.jobs.procrastinate_queue import TASK_NAME
from server.jobs.runner import wait_for
from tests.client.onnx_models import scaled_model
from tests.jobs.jobs_helpers import make_settings, procrastinate_jobs, publish_token
from tests.jobs.test_procrastinate import ROOT, _env, _spawn, _stop
from tests.support.invariants import violations
from tests.support.server_keys import init_test_keys

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

def _worker(stalled_after: int) -> list[str]:
    return [str(ROOT / ".venv/bin/modelfleet"), "worker", "--heartbeat", "0.5",
            "--stalled-after", str(stalled_after)]


def _jobs(postgres_url: str) -> list[tuple[str, str]]:
    return procrastinate_jobs(postgres_url, TASK_NAME, "build_id")


def test_worker_killed_with_the_artifact_stored_is_taken_back_and_finishes(
        postgres_url: str, tmp_path: Path) -> None:
    settings = make_settings(postgres_url, tmp_path / "data", job_backend="procrastinate")
    init_test_keys(settings.data_dir)
    env = _env(settings) | {"MODELFLEET_SANDBOX": "off"}
    app = create_app(settings)
    armed = healthy = None
    try:
        with TestClient(app) as client:
            headers = {"Authorization": f"Bearer {publish_token(settings)}"}
            assert client.post("/v1/models", json={"name": "clf"},
                               headers=headers).status_code == 201
            meta = {"version": "1.0.0", "platforms": ["onnx"],
                    "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 4]}]}
            r = client.post("/v1/models/clf/versions", headers=headers,
                            files={"model": ("m.onnx", scaled_model(3.0))},
                            data={"metadata": json.dumps(meta)})
            assert r.status_code == 201, r.text
            factory, store = app.state.session_factory, app.state.blob_store

            # A long takeover delay for the armed worker: on a loaded machine its own rescue
            # pass would otherwise take its lagging heartbeat for a stalled worker's.
            armed = _spawn(_worker(60), env | {"MODELFLEET_CRASH_AT": "build.artifacts_stored"},
                           tmp_path / "armed.log")
            try:
                code = armed.wait(timeout=300)
            except subprocess.TimeoutExpired:
                raise AssertionError((tmp_path / "armed.log").read_text()[-3000:]) from None
            assert code == -signal.SIGKILL, (tmp_path / "armed.log").read_text()[-3000:]
            # What the crash left: the artifact stored, the build still held by the dead
            # worker, its procrastinate job still "doing" (beside, maybe, a duplicate the
            # worker's rescue pass deferred while the job was being taken: harmless, the
            # build's claim lets one run).
            with factory() as s:
                build = s.scalars(select(db.Build)).one()
                assert build.state == db.BuildState.running, build.state
                assert build.locked_by is not None and build.locked_by.startswith("worker:")
                assert s.scalars(select(db.Artifact)).first() is None
            assert list(store.list_keys("v1/artifacts/")), "no artifact stored before the crash"
            assert "doing" in [status for _, status in _jobs(postgres_url)]

            healthy = _spawn(_worker(3), env, tmp_path / "healthy.log")
            ok = wait_for(lambda: client.get("/v1/models/clf/versions/1.0.0").json()["state"]
                          in ("ready", "failed"), 300, 0.5)
            assert ok, (tmp_path / "healthy.log").read_text()[-3000:]
            version = client.get("/v1/models/clf/versions/1.0.0").json()
            assert version["state"] == "ready", (tmp_path / "healthy.log").read_text()[-3000:]
            with factory() as s:
                build = s.scalars(select(db.Build)).one()
                assert (build.state, build.attempts, build.locked_by) == (
                    db.BuildState.succeeded, 2, None)
                (artifact,) = s.scalars(select(db.Artifact)).all()
                assert store.exists(artifact.blob_key)
            # The dead worker's job was retried and ran to its end (successful jobs are
            # deleted): none is left "doing" for a dead worker, none waits.
            assert wait_for(lambda: _jobs(postgres_url) == [], 60, 0.5), _jobs(postgres_url)
            assert "retrying job" in (tmp_path / "healthy.log").read_text()
            assert violations(factory, store) == []
        app.state.job_queue.close()
    finally:
        for proc in (armed, healthy):
            if proc is not None:
                _stop(proc)
