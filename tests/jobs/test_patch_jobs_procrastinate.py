"""Patch jobs on the production path (real PostgreSQL): the API defers a procrastinate job,
`modelfleet worker` makes the patch and re-signs the channel; a worker SIGKILLed in the
middle of making a patch loses nothing; enqueueing twice defers one job."""

from __future__ import annotations

import os
import signal
import sys

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

import manifests
from server.app import create_app
from server.blobstore import LocalBlobStore
from server.db import models as db
from server.jobs.procrastinate_queue import PATCH_TASK_NAME, ProcrastinateJobQueue
from server.jobs.runner import wait_for
from tests.jobs.jobs_helpers import procrastinate_jobs
from tests.jobs.patch_helpers import (
    add_ready_version,
    check_patch_applies,
    edited_series,
    job_row,
    manifest_patches,
    patch_rows,
    patch_settings,
)
from tests.jobs.test_patch_jobs import _headers
from tests.jobs.test_procrastinate import ROOT, _env, _spawn, _stop

pytestmark = pytest.mark.postgres


def _rollout(client, headers, version: str) -> None:  # type: ignore[no-untyped-def]
    r = client.post("/v1/channels/prod/rollouts", headers=headers, json={
        "model": "clf", "version": version, "percentage": 100, "mode": "active", "filters": {}})
    assert r.status_code == 201, r.text


def _patch_jobs_in_procrastinate(postgres_url: str) -> list[tuple[str, str]]:
    return procrastinate_jobs(postgres_url, PATCH_TASK_NAME, "version_id")


def test_enqueue_patches_twice_defers_one_job_and_records_one_row(postgres_url, tmp_path):
    settings = patch_settings(postgres_url, tmp_path / "data", job_backend="procrastinate")
    app = create_app(settings)
    queue = app.state.job_queue
    assert isinstance(queue, ProcrastinateJobQueue)
    store = LocalBlobStore(settings.resolved_blob_dir)
    version = add_ready_version(app.state.session_factory, store, "1.0.0", b"x" * 1000)
    queue.enqueue_patches(version)
    queue.enqueue_patches(version)  # a retried request
    queue.close()
    assert _patch_jobs_in_procrastinate(postgres_url) == [(str(version), "todo")]
    job = job_row(app.state.session_factory, version)
    assert (job.state, job.requests) == (db.PatchJobState.queued, 2)
    app.state.engine.dispose()


@pytest.mark.slow
def test_worker_killed_mid_patch_loses_nothing_and_the_manifest_gets_the_patch(
        postgres_url, tmp_path):
    settings = patch_settings(postgres_url, tmp_path / "data", job_backend="procrastinate")
    app = create_app(settings)
    env = _env(settings)
    marker = tmp_path / "hang-marker"
    slow = _spawn([sys.executable, str(ROOT / "tests/jobs/slow_patch_worker.py"), str(marker)],
                  env, tmp_path / "slow.log")
    healthy = None
    v1, v2 = edited_series(2)
    try:
        with TestClient(app) as client:
            headers = _headers(app)
            factory = app.state.session_factory
            store = LocalBlobStore(settings.resolved_blob_dir)
            root = manifests.load_trusted_root(client.get("/v1/root/1.json").content)
            add_ready_version(factory, store, "1.0.0", v1)
            add_ready_version(factory, store, "2.0.0", v2)
            _rollout(client, headers, "1.0.0")
            _rollout(client, headers, "2.0.0")
            # The slow worker takes a patch job and hangs inside patch creation: kill it.
            assert wait_for(marker.exists, 60), (tmp_path / "slow.log").read_text()[-3000:]
            os.killpg(slow.pid, signal.SIGKILL)
            slow.wait()
            assert manifest_patches(client, root) == []
            healthy = _spawn([str(ROOT / ".venv/bin/modelfleet"), "worker", "--heartbeat",
                              "0.5", "--stalled-after", "3"], env, tmp_path / "healthy.log")
            def all_done() -> bool:
                with factory() as s:
                    states = s.scalars(select(db.PatchJob.state)).all()
                return len(states) == 2 and set(states) == {db.PatchJobState.done}

            ok = wait_for(lambda: all_done() and manifest_patches(client, root) != [], 90, 0.5)
            assert ok, (tmp_path / "healthy.log").read_text()[-3000:]
            (patch,) = manifest_patches(client, root)
            check_patch_applies(client, patch, v1, v2, tmp_path)
            rows = patch_rows(factory)
            assert len(rows) == len(set(rows))
            with factory() as s:  # the killed worker's job was taken over, not redone anew
                jobs = s.query(db.PatchJob).all()
                assert all(j.state == db.PatchJobState.done for j in jobs)
                assert max(j.attempts for j in jobs) == 2
        app.state.job_queue.close()
    finally:
        _stop(slow)
        if healthy is not None:
            _stop(healthy)
