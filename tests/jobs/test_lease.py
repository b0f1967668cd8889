"""One lease for every job table: the same claim, takeover, backoff and owner-only settle hold
for builds and patch jobs (SQLite and PostgreSQL), and both runners go through it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from server.blobstore import LocalBlobStore
from server.compile.sandbox import SandboxPolicy, pipeline_factory
from server.db import models as db
from server.db.types import utcnow
from server.jobs.lease import Lease, RetryPolicy
from server.jobs.patch_runner import PatchRunner
from server.jobs.runner import BuildRunner

# Builds as a deployment runs them by default: in the compile sandbox.
SANDBOXED = pipeline_factory(SandboxPolicy())

KINDS = ["build", "patch_job"]


def _job(factory: sessionmaker[Session], kind: str) -> int:
    """A queued job of `kind`; returns the key its lease names it by."""
    with factory() as s:
        model = db.Model(name="m")
        s.add(model)
        s.flush()
        version = db.ModelVersion(model_id=model.id, version="1.0.0", metadata_json={},
                                  source_format="onnx")
        s.add(version)
        s.flush()
        if kind == "build":
            row: Any = db.Build(version_id=version.id, platform="onnx", variant="default")
        else:
            row = db.PatchJob(version_id=version.id, state=db.PatchJobState.queued)
        s.add(row)
        s.commit()
        return int(row.id if kind == "build" else row.version_id)


def _lease(factory: sessionmaker[Session], kind: str, worker: str, **kw: Any) -> Lease[Any, Any]:
    if kind == "build":
        return Lease(factory, db.Build, db.Build.id, queued=db.BuildState.queued,
                     running=db.BuildState.running, worker_id=worker, **kw)
    return Lease(factory, db.PatchJob, db.PatchJob.version_id, queued=db.PatchJobState.queued,
                 running=db.PatchJobState.running, worker_id=worker, **kw)


def _claim(lease: Lease[Any, Any], factory: sessionmaker[Session], key: int) -> bool:
    with factory() as s:
        ok = lease.claim(s, key)
        s.commit()
        return ok


def _row(factory: sessionmaker[Session], lease: Lease[Any, Any], key: int) -> Any:
    with factory() as s:
        return s.scalars(select(lease.model).where(lease.key == key)).one()


@pytest.mark.parametrize("kind", KINDS)
def test_two_workers_cannot_both_claim_a_job(factory, kind) -> None:
    key = _job(factory, kind)
    a, b = _lease(factory, kind, "a"), _lease(factory, kind, "b")
    assert a.claimable_keys() == [key]
    assert _claim(a, factory, key)
    assert not _claim(b, factory, key)
    row = _row(factory, a, key)
    assert row.state == a.running and row.locked_by == "a" and row.attempts == 1
    assert a.claimable_keys() == []


@pytest.mark.parametrize("kind", KINDS)
def test_job_of_a_dead_worker_is_taken_over_and_the_dead_one_cannot_settle(factory,
                                                                           kind) -> None:
    key = _job(factory, kind)
    dead, alive = (_lease(factory, kind, w, stale_after_s=5) for w in ("dead", "alive"))
    assert _claim(dead, factory, key)
    with factory() as s:  # the dead worker's heartbeat stopped a while ago
        s.execute(update(dead.model).values(heartbeat_at=utcnow() - timedelta(seconds=60)))
        s.commit()
    assert _claim(alive, factory, key)
    with factory() as s:
        assert dead.owned(s, key) is None  # it lost the claim: nothing to settle
        job = alive.owned(s, key)
        assert job is not None and job.attempts == 2
        done = db.BuildState.succeeded if kind == "build" else db.PatchJobState.done
        alive.finish(job, done)
        s.commit()
    row = _row(factory, alive, key)
    assert row.state == done and row.locked_by is None and row.finished_at is not None


@pytest.mark.parametrize("kind", KINDS)
def test_backoff_doubles_and_the_job_is_not_due_until_its_delay_passed(factory, kind) -> None:
    key = _job(factory, kind)
    lease = _lease(factory, kind, "w", retry=RetryPolicy(max_attempts=3, base_delay_s=60))
    delays = []
    for attempt in (1, 2):
        with factory() as s:  # make it due now, as if the delay had passed
            s.execute(update(lease.model).values(next_attempt_at=None))
            s.commit()
        assert _claim(lease, factory, key)
        with factory() as s:
            job = lease.owned(s, key)
            assert job is not None and job.attempts == attempt and lease.may_retry(job)
            delays.append(lease.back_off(job, "flaky"))
            s.commit()
        assert lease.claimable_keys() == []  # backing off
        assert not _claim(lease, factory, key)
        wake = lease.next_wakeup()
        assert wake is not None and 0 < wake <= delays[-1]
    assert delays == [60.0, 120.0]
    row = _row(factory, lease, key)
    assert row.state == lease.queued and row.error == "flaky" and row.locked_by is None
    with factory() as s:
        s.execute(update(lease.model).values(next_attempt_at=None))
        s.commit()
    assert _claim(lease, factory, key)
    with factory() as s:
        job = lease.owned(s, key)
        assert job is not None and not lease.may_retry(job)  # third of three attempts


@pytest.mark.parametrize("kind", KINDS)
def test_settling_goes_through_the_checked_transitions(factory, kind) -> None:
    key = _job(factory, kind)
    lease = _lease(factory, kind, "w")
    assert _claim(lease, factory, key)
    with factory() as s:
        job = lease.owned(s, key)
        assert job is not None
        final = db.BuildState.succeeded if kind == "build" else db.PatchJobState.done
        lease.finish(job, final)
        with pytest.raises(db.InvalidTransitionError):
            lease.finish(job, lease.running)  # only a claim may make a job run again


NO_PUBLISHER: Any = object()  # this test runs no patch job


def test_both_runners_lease_their_jobs_through_the_one_mechanism(factory, tmp_path) -> None:
    builds = BuildRunner(factory, LocalBlobStore(tmp_path), worker_id="w", stale_after_s=7,
                         max_build_s=9, pipeline_factory=SANDBOXED)
    patches = PatchRunner(factory, NO_PUBLISHER, worker_id="w", stale_after_s=7, max_job_s=9)
    for lease in (builds.lease, patches.lease):
        assert isinstance(lease, Lease)
        assert (lease.worker_id, lease.stale_after_s, lease.max_run_s) == ("w", 7, 9)
    build_key = _job(factory, "build")
    assert builds.claimable_ids() == [build_key]
    assert builds.claim(build_key) and not BuildRunner(
        factory, LocalBlobStore(tmp_path), worker_id="other",
        pipeline_factory=SANDBOXED).claim(build_key)
    with factory() as s:  # a second version with a patch job
        model = s.scalars(select(db.Model)).one()
        version = db.ModelVersion(model_id=model.id, version="2.0.0", metadata_json={},
                                  source_format="onnx")
        s.add(version)
        s.flush()
        s.add(db.PatchJob(version_id=version.id, state=db.PatchJobState.queued, requests=3))
        s.commit()
        patch_key = version.id
    assert patches.claimable_ids() == [patch_key]
    assert patches.claim(patch_key) and not patches.claim(patch_key)
    row = _row(factory, patches.lease, patch_key)
    assert row.requests_claimed == 3  # the claim snapshots the requests it satisfies
