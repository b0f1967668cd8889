"""Production path on the real PostgreSQL: API defers procrastinate jobs, `modelfleet worker`
processes run them, and a worker SIGKILLed mid-build does not lose the build."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from server.app import create_app
from server.db.models import Build, BuildState
from server.db.session import make_engine, make_session_factory
from server.jobs.procrastinate_queue import ProcrastinateJobQueue
from server.jobs.runner import wait_for
from tests.jobs.jobs_helpers import make_settings, publish_token, uploader

pytestmark = pytest.mark.postgres
ROOT = Path(__file__).resolve().parents[2]
CONV_INPUTS = [{"name": "image", "dtype": "float32", "shape": [1, 3, 16, 16]}]


def _env(settings) -> dict[str, str]:  # type: ignore[no-untyped-def]
    env = dict(os.environ)
    env.update(MODELFLEET_DATABASE_URL=settings.resolved_database_url,
               MODELFLEET_DATA_DIR=str(settings.data_dir), MODELFLEET_JOB_BACKEND="procrastinate",
               MODELFLEET_ENV="development", PYTHONPATH=str(ROOT))
    return env


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, env=env, cwd=ROOT, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_worker_killed_mid_build_loses_nothing(postgres_url, convnet_files, tmp_path):
    settings = make_settings(postgres_url, tmp_path / "data", job_backend="procrastinate")
    app = create_app(settings)
    assert isinstance(app.state.job_queue, ProcrastinateJobQueue)
    env = _env(settings)
    marker = tmp_path / "hang-marker"
    slow = _spawn([sys.executable, str(ROOT / "tests/jobs/slow_worker.py"), str(marker)], env,
                  tmp_path / "slow.log")
    healthy = None
    try:
        with TestClient(app) as client:
            uploader(client, publish_token(settings))(
                "conv", "1.0.0", convnet_files.onnx, CONV_INPUTS, ["onnx"],
                reference=convnet_files.reference)
            # The slow worker takes the job and hangs inside the compile: kill it there.
            assert wait_for(marker.exists, 60), (tmp_path / "slow.log").read_text()[-3000:]
            engine = make_engine(settings.resolved_database_url)
            sf = make_session_factory(engine)
            with sf() as s:
                build = s.scalars(select(Build)).one()
                assert build.state == BuildState.running and build.locked_by.startswith("slow:")
            os.killpg(slow.pid, signal.SIGKILL)
            slow.wait()

            healthy = _spawn([str(ROOT / ".venv/bin/modelfleet"), "worker", "--heartbeat", "0.5",
                              "--stalled-after", "3"], env, tmp_path / "healthy.log")
            ok = wait_for(lambda: client.get("/v1/models/conv/versions/1.0.0").json()["state"]
                          in ("ready", "failed"), 120, 0.5)
            assert ok, (tmp_path / "healthy.log").read_text()[-3000:]
            state = client.get("/v1/models/conv/versions/1.0.0").json()["state"]
            body = client.get("/v1/models/conv/versions/1.0.0/builds").json()
            engine.dispose()
        app.state.job_queue.close()
    finally:
        _stop(slow)
        if healthy is not None:
            _stop(healthy)
    assert state == "ready", body
    (b,) = body
    assert b["state"] == "succeeded" and b["attempts"] == 2
    assert b["artifact"]["length"] > 0 and b["gates"]["numeric"]["status"] == "passed"
    # Open to anyone: the workers are named opaquely, never by host name and pid.
    assert re.search(r"attempt started on worker w-[0-9a-f]{10}\b", b["log"])
    assert socket.gethostname() not in b["log"] and "worker:" not in b["log"]


def test_enqueue_is_idempotent_one_job_per_build(postgres_url, convnet_files, tmp_path):
    import psycopg

    settings = make_settings(postgres_url, tmp_path / "data", job_backend="procrastinate")
    app = create_app(settings)
    with TestClient(app) as client:
        v = uploader(client, publish_token(settings))(
            "conv", "1.0.0", convnet_files.onnx,
            [{"name": "image", "dtype": "float32",
              "shapes": {"a": [1, 3, 16, 16], "b": [1, 3, 16, 16]}}], ["onnx", "qnn"])
    assert len(v["builds"]) == 4
    queue = app.state.job_queue
    version_id = 1
    queue.enqueue_compile(version_id)  # a retried upload enqueues again
    queue.close()
    dsn = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT args->>'build_id', status FROM procrastinate_jobs "
                            "ORDER BY 1").fetchall()
    assert [r[1] for r in rows] == ["todo"] * 4 and len({r[0] for r in rows}) == 4
