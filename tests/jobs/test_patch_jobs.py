"""Delta patches as durable jobs: a rollout records a `patch_jobs` row, the in-process worker
makes the patches and re-signs the channel; jobs are idempotent, retried with backoff, and
taken over from a worker that died (SQLite and PostgreSQL)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient

import manifests
from server.app import create_app
from server.auth import create_token
from server.blobstore import BlobBackendError, LocalBlobStore
from server.db import models as db
from server.db.session import make_engine, make_session_factory
from server.delta import DeltaPolicy
from server.jobs.inprocess import InProcessJobQueue
from server.jobs.patch_runner import PatchRunner, request_patches
from server.jobs.runner import RetryPolicy, wait_for
from server.observability.metrics import PATCH_JOBS
from server.publish.patches import generate_patches
from server.rollouts import channels
from server.rollouts import service as ro
from server.wiring import make_publisher
from tests.jobs.patch_helpers import (
    add_ready_version,
    check_patch_applies,
    edited_series,
    job_row,
    manifest_patches,
    patch_rows,
    patch_settings,
)
from tests.support.clock import UtcClock
from tests.support.rollouts import start_rollout


@pytest.fixture
def settings(database_url, tmp_path):
    return patch_settings(database_url, tmp_path / "data")


@pytest.fixture
def factory(settings):
    engine = make_engine(settings.resolved_database_url)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture
def store(settings):
    return LocalBlobStore(settings.resolved_blob_dir)


def _headers(app: Any) -> dict[str, str]:
    with app.state.session_factory() as s:
        _, secret = create_token(s, ["rollout"], name="ops")
        s.commit()
    return {"Authorization": f"Bearer {secret}"}


def test_rollout_of_v2_after_v1_lists_a_verified_patch_made_by_the_in_process_worker(
        settings, store, tmp_path):
    app = create_app(settings)
    assert isinstance(app.state.job_queue, InProcessJobQueue)
    v1, v2 = edited_series(2)
    with TestClient(app) as client:
        headers = _headers(app)
        factory = app.state.session_factory
        root = manifests.load_trusted_root(client.get("/v1/root/1.json").content)
        add_ready_version(factory, store, "1.0.0", v1)
        version2 = add_ready_version(factory, store, "2.0.0", v2)
        for version in ("1.0.0", "2.0.0"):
            r = client.post("/v1/channels/prod/rollouts", headers=headers, json={
                "model": "clf", "version": version, "percentage": 100, "mode": "active",
                "filters": {}})
            assert r.status_code == 201, r.text
        assert wait_for(lambda: manifest_patches(client, root) != [], 30, 0.1), \
            job_row(factory, version2).__dict__
        (patch,) = manifest_patches(client, root)
        check_patch_applies(client, patch, v1, v2, tmp_path)
        # The re-signed manifest is served as soon as it is published (the publisher's event
        # drops the cached one); the job row is settled just after.
        assert wait_for(lambda: job_row(factory, version2).state == db.PatchJobState.done,
                        10, 0.05)
        job = job_row(factory, version2)
        assert (job.state, job.attempts, job.patches_added, job.error) == (
            db.PatchJobState.done, 1, 1, "")
        rows = patch_rows(factory)
        # v1's own job may also make the 2.0.0 -> 1.0.0 patch (for a rollback), never twice.
        assert len(rows) == len(set(rows)) and rows.count((1, 2)) == 1


def _prod_with(factory, pub, store, datas: list[bytes]) -> list[int]:
    """Versions 1.0.0, 2.0.0, … each rolled out on `prod` (patch jobs not run)."""
    channels.create_channel(factory, pub, "prod", actor="t")
    ids = []
    for i, data in enumerate(datas):
        ids.append(add_ready_version(factory, store, f"{i + 1}.0.0", data))
        start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", f"{i + 1}.0.0", 100),
                         actor="t")
    return ids


def _runner(factory, pub, name: str, **kw: Any) -> PatchRunner:
    return PatchRunner(factory, pub, worker_id=name, heartbeat_s=0.1, **kw)



def test_enqueueing_twice_and_rerunning_a_done_job_never_duplicates_a_patch(
        settings, factory, store):
    pub = make_publisher(settings, store)
    ids = _prod_with(factory, pub, store, edited_series(3))
    request_patches(factory, ids[2])
    request_patches(factory, ids[2])  # a retried rollout request
    with factory() as s:
        assert s.query(db.PatchJob).count() == 1
    runner = _runner(factory, pub, "a")
    assert runner.claimable_ids() == [ids[2]]
    assert runner.process(ids[2]) is True
    assert runner.process(ids[2]) is False  # done: nothing to claim
    rows = patch_rows(factory)
    assert len(rows) == 2 and len(set(rows)) == 2  # from 1.0.0 and 2.0.0
    assert job_row(factory, ids[2]).state == db.PatchJobState.done

    request_patches(factory, ids[2])  # asked again later: runs again, adds nothing
    assert job_row(factory, ids[2]).state == db.PatchJobState.queued
    assert runner.process(ids[2]) is True
    assert patch_rows(factory) == rows
    job = job_row(factory, ids[2])
    assert (job.state, job.patches_added) == (db.PatchJobState.done, 2)


@pytest.mark.postgres
def test_two_workers_racing_on_one_version_store_one_row_per_pair(postgres_url, tmp_path):
    settings = patch_settings(postgres_url, tmp_path / "data")
    engine = make_engine(settings.resolved_database_url, pool_size=10)
    factory = make_session_factory(engine)
    store = LocalBlobStore(settings.resolved_blob_dir)
    pub = make_publisher(settings, store)
    ids = _prod_with(factory, pub, store, edited_series(4))
    added: list[int] = []
    start = threading.Barrier(3)

    def work() -> None:
        start.wait()
        added.append(generate_patches(factory, store, ids[3], policy=DeltaPolicy(k=3)))

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    rows = patch_rows(factory)
    engine.dispose()
    assert len(rows) == 3 and len(set(rows)) == 3
    assert sorted(added, reverse=True)[0] >= 1 and sum(added) == 3


class FlakyStore(LocalBlobStore):
    """A local store whose first `fail` puts raise the backend error S3 would on an outage."""

    def __init__(self, root: Any, fail: int) -> None:
        super().__init__(root)
        self.fail = fail

    def put(self, key: str, *args: Any, **kw: Any) -> Any:
        if key.startswith("v1/patches/") and self.fail > 0:
            self.fail -= 1
            raise BlobBackendError("storage unavailable (injected)")
        return super().put(key, *args, **kw)


def test_a_transient_failure_is_retried_after_a_backoff_then_gives_up(settings, factory):
    store = FlakyStore(settings.resolved_blob_dir, fail=1)
    pub = make_publisher(settings, store)
    series = edited_series(3)
    ids = _prod_with(factory, pub, store, series[:2])
    request_patches(factory, ids[1])
    now = UtcClock()
    runner = _runner(factory, pub, "a", retry=RetryPolicy(max_attempts=2, base_delay_s=0.5),
                     now=now)
    outcomes = ("retried", "done", "failed")
    before = {o: PATCH_JOBS.labels(o)._value.get() for o in outcomes}
    assert runner.process(ids[1]) is True
    job = job_row(factory, ids[1])
    assert job.state == db.PatchJobState.queued and "storage unavailable" in job.error
    assert job.next_attempt_at is not None and runner.claimable_ids() == []  # backing off
    assert runner.next_wakeup() == 0.5
    now.advance(0.49)
    assert runner.claimable_ids() == [] and runner.process(ids[1]) is False
    now.advance(0.01)
    assert runner.claimable_ids() == [ids[1]]
    assert runner.process(ids[1]) is True
    job = job_row(factory, ids[1])
    assert (job.state, job.attempts, job.error) == (db.PatchJobState.done, 2, "")
    assert len(patch_rows(factory)) == 1

    # A version whose patches keep failing ends `failed` after max_attempts, with the reason.
    store.fail = 10
    ids.append(add_ready_version(factory, store, "3.0.0", series[2]))
    start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "3.0.0", 100), actor="t")
    request_patches(factory, ids[2])
    assert runner.process(ids[2]) is True
    now.advance(runner.next_wakeup() or 0)
    assert runner.process(ids[2]) is True
    job = job_row(factory, ids[2])
    assert job.state == db.PatchJobState.failed and "gave up after 2 attempts" in job.error
    # GET /metrics counts each settled attempt by outcome (modelfleet_patch_jobs_total).
    assert {o: PATCH_JOBS.labels(o)._value.get() - before[o] for o in outcomes} == {
        "retried": 2, "done": 1, "failed": 1}


def test_a_job_whose_worker_died_after_storing_patches_is_taken_over_and_resigned(
        settings, factory, store):
    pub = make_publisher(settings, store)
    ids = _prod_with(factory, pub, store, edited_series(2))
    request_patches(factory, ids[1])
    now = UtcClock()
    dead = _runner(factory, pub, "dead", now=now)
    assert dead.claim(ids[1])
    # It stored the patch, then died before re-signing (no heartbeat from here on).
    assert generate_patches(factory, store, ids[1]) == 1
    with factory() as s:
        serial = s.query(db.SignedManifest).count()
    taker = _runner(factory, pub, "taker", stale_after_s=0.5, now=now)
    now.advance(0.5)
    assert taker.process(ids[1]) is False  # heartbeat still fresh
    now.advance(0.01)
    assert taker.process(ids[1]) is True
    job = job_row(factory, ids[1])
    assert (job.state, job.attempts, job.locked_by) == (db.PatchJobState.done, 2, None)
    assert len(patch_rows(factory)) == 1
    with factory() as s:  # the takeover re-signed although it made no new patch
        assert s.query(db.SignedManifest).count() == serial + 1


def test_a_patch_job_left_queued_by_a_stopped_api_is_run_by_the_next_one(
        settings, factory, store, tmp_path):
    pub = make_publisher(settings, store)
    v1, v2 = edited_series(2)
    ids = _prod_with(factory, pub, store, [v1, v2])
    request_patches(factory, ids[1])  # recorded, then the process that did it went away
    app = create_app(settings)  # starts the in-process worker, which finds the job
    with TestClient(app) as client:
        root = manifests.load_trusted_root(client.get("/v1/root/1.json").content)
        assert wait_for(lambda: manifest_patches(client, root) != [], 30, 0.1)
        (patch,) = manifest_patches(client, root)
        check_patch_applies(client, patch, v1, v2, tmp_path)
    assert job_row(factory, ids[1]).state == db.PatchJobState.done
