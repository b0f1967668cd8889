"""Signing keys only where signing happens: on the real PostgreSQL queue, a
`modelfleet worker --role compile` with no key mount compiles the build and never takes the
delta-patch / re-sign job; only a `--role publish` worker (which has the key) runs it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from server.app import create_app
from server.db.models import PatchJob, PatchJobState
from server.db.session import make_engine, make_session_factory
from server.jobs.runner import wait_for
from server.publish.keys import KeyPaths, init_keys
from tests.jobs.jobs_helpers import make_settings, publish_token, uploader
from tests.jobs.test_procrastinate import CONV_INPUTS, _env, _spawn, _stop

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def _patch_state(settings) -> PatchJobState | None:  # type: ignore[no-untyped-def]
    engine = make_engine(settings.resolved_database_url)
    try:
        with make_session_factory(engine)() as s:
            job = s.scalars(select(PatchJob)).first()
            return None if job is None else job.state
    finally:
        engine.dispose()


def test_compile_role_worker_without_keys_never_takes_signing_jobs(
        postgres_url, convnet_files, tmp_path: Path) -> None:
    settings = make_settings(postgres_url, tmp_path / "data", job_backend="procrastinate")
    init_keys(KeyPaths.for_data_dir(settings.data_dir), now=int(time.time()), root_keys=1,
              threshold=1)
    app = create_app(settings)
    env = _env(settings)
    compile_env = {**env, "MODELFLEET_KEYS_DIR": str(tmp_path / "no-keys")}  # no key mount
    workers = []
    try:
        with TestClient(app) as client:
            v = uploader(client, publish_token(settings))(
                "conv", "1.0.0", convnet_files.onnx, CONV_INPUTS, ["onnx"])
            assert v["version"] == "1.0.0"
            app.state.job_queue.enqueue_patches(1)  # the first version of a fresh database
            workers.append(_spawn([sys.executable, "-m", "modelfleet", "worker", "--role",
                                   "compile", "--heartbeat", "0.5", "--stalled-after", "3"],
                                  compile_env, tmp_path / "compile.log"))
            ready = wait_for(lambda: client.get("/v1/models/conv/versions/1.0.0").json()[
                "state"] in ("ready", "failed"), 240, 0.5)
            assert ready, (tmp_path / "compile.log").read_text()[-3000:]
            assert client.get("/v1/models/conv/versions/1.0.0").json()["state"] == "ready"
            time.sleep(3)  # a compile worker that took patch jobs would have run it by now
            assert _patch_state(settings) == PatchJobState.queued

            workers.append(_spawn([sys.executable, "-m", "modelfleet", "worker", "--role",
                                   "publish", "--heartbeat", "0.5", "--stalled-after", "3"],
                                  env, tmp_path / "publish.log"))
            done = wait_for(lambda: _patch_state(settings) == PatchJobState.done, 120, 0.5)
            assert done, (tmp_path / "publish.log").read_text()[-3000:]
        app.state.job_queue.close()
    finally:
        for w in workers:
            _stop(w)
    compile_log = (tmp_path / "compile.log").read_text()
    assert "compile worker" in compile_log and "can see the release key" not in compile_log
