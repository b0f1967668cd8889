"""Production queue: compile builds on procrastinate workers backed by PostgreSQL.

- `ProcrastinateJobQueue.enqueue_compile(version_id)` (API side) defers one
  `modelfleet.compile_build` job per due build of the version, with a queueing lock per build
  so a repeated enqueue does not stack duplicates.
- `run_worker(settings, ...)` (`modelfleet worker`) runs jobs; each job hands the build to
  `BuildRunner`, whose database claim makes a duplicate delivery harmless.
- A killed worker stops heartbeating. Every worker periodically asks procrastinate for jobs of
  stalled workers and retries them, and re-defers builds the database still holds as queued
  (delayed retries after transient failures, or builds whose job was never deferred because
  the database write succeeded and the defer did not) — so no build is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

import procrastinate
from procrastinate import exceptions as pexc

from server.jobs.runner import BuildRunner

log = logging.getLogger(__name__)
TASK_NAME = "modelfleet.compile_build"
QUEUE = "compile"

# Set by the worker process before it starts taking jobs (one runner per process).
_RUNNER: BuildRunner | None = None


def compile_build(build_id: int) -> None:
    if _RUNNER is None:
        raise RuntimeError("compile worker not initialised (use `modelfleet worker`)")
    ran = _RUNNER.process(build_id)
    # A transient failure leaves the build queued with a due time; the rescue loop of any
    # worker re-defers it once due, so nothing is scheduled from inside the job.
    log.info("build %s %s", build_id, "done" if ran else "not claimable (owned or not due)")


def conninfo(database_url: str) -> str:
    """SQLAlchemy URL (postgresql+psycopg://…) → libpq conninfo for procrastinate."""
    if not database_url.startswith(("postgresql", "postgres")):
        raise ValueError("job_backend=procrastinate needs a PostgreSQL database_url, "
                         f"not {database_url.split(':', 1)[0]}")
    _scheme, rest = database_url.split("://", 1)
    return f"postgresql://{rest}"


def ensure_schema(app: procrastinate.App, dsn: str) -> None:
    """Applies procrastinate's tables once; `app` must be open with a sync connector."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()
    if row is None or row[0] is None:
        app.schema_manager.apply_schema()


def _register(app: procrastinate.App) -> procrastinate.App:
    # Registered per app (not via a shared Blueprint, which binds to the first app only).
    app.task(name=TASK_NAME, queue=QUEUE, pass_context=False)(compile_build)
    return app


def make_sync_app(database_url: str) -> procrastinate.App:
    return _register(procrastinate.App(connector=procrastinate.SyncPsycopgConnector(
        conninfo=conninfo(database_url))))


class ProcrastinateJobQueue:
    """API-side: defers jobs; never runs them."""

    def __init__(self, database_url: str, runner_ids: Callable[[int], list[int]]) -> None:
        self._url = database_url
        self._ids = runner_ids  # version_id -> ids of its queued builds
        self._app = make_sync_app(database_url)
        self._opened = False

    def _open(self) -> procrastinate.App:
        if not self._opened:
            self._app.open()
            ensure_schema(self._app, conninfo(self._url))
            self._opened = True
        return self._app

    def enqueue_compile(self, version_id: int) -> None:
        app = self._open()
        task = app.tasks[TASK_NAME]
        for build_id in self._ids(version_id):
            with contextlib.suppress(pexc.AlreadyEnqueued):
                task.configure(queueing_lock=f"build-{build_id}").defer(build_id=build_id)

    def close(self) -> None:
        if self._opened:
            self._app.close()
            self._opened = False


def queued_build_ids(session_factory: Any) -> Callable[[int], list[int]]:
    from sqlalchemy import select

    from server.db.models import Build, BuildState

    def ids(version_id: int) -> list[int]:
        with session_factory() as s:
            return list(s.scalars(select(Build.id).where(
                Build.version_id == version_id,
                Build.state.in_([BuildState.queued, BuildState.running]))))
    return ids


async def _rescue_loop(app: procrastinate.App, runner: BuildRunner, every_s: float,
                       stalled_after_s: float) -> None:
    """Retries jobs of dead workers and re-defers queued builds nobody has a job for."""
    task = app.tasks[TASK_NAME]
    while True:
        try:
            for job in await app.job_manager.get_stalled_jobs(
                    seconds_since_heartbeat=stalled_after_s):
                log.warning("retrying job %s of a stalled worker", job.id)
                await app.job_manager.retry_job(job)
            await app.job_manager.prune_stalled_workers(stalled_after_s)
            for build_id in await asyncio.to_thread(runner.claimable_ids, 50):
                with contextlib.suppress(pexc.AlreadyEnqueued):
                    await task.configure(queueing_lock=f"build-{build_id}").defer_async(
                        build_id=build_id)
        except Exception:
            log.warning("rescue pass failed; will retry", exc_info=True)
        await asyncio.sleep(every_s)


def run_worker(settings: Any, *, concurrency: int = 1, heartbeat_s: float = 10.0,
               stalled_after_s: float = 30.0, runner: BuildRunner | None = None) -> None:
    """Blocks running compile jobs until SIGINT/SIGTERM (graceful: the current build ends)."""
    global _RUNNER
    from server.blobstore import make_blob_store
    from server.db.session import make_engine, make_session_factory

    url = settings.resolved_database_url
    if runner is None:
        engine = make_engine(url)
        runner = BuildRunner(
            make_session_factory(engine), make_blob_store(settings),
            worker_id=f"worker:{socket.gethostname()}:{os.getpid()}",
            heartbeat_s=heartbeat_s, stale_after_s=stalled_after_s)
    _RUNNER = runner
    app = _register(procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=conninfo(url))))

    async def main() -> None:
        async with app.open_async():
            with app.replace_connector(procrastinate.SyncPsycopgConnector(
                    conninfo=conninfo(url))) as sync_app:
                sync_app.open()
                try:
                    ensure_schema(sync_app, conninfo(url))
                finally:
                    sync_app.close()
            rescue = asyncio.create_task(_rescue_loop(app, runner, max(stalled_after_s / 3, 1),
                                                      stalled_after_s))
            try:
                await app.run_worker_async(
                    queues=[QUEUE], concurrency=concurrency, name=runner.worker_id,
                    update_heartbeat_interval=heartbeat_s,
                    stalled_worker_timeout=stalled_after_s, delete_jobs="successful")
            finally:
                rescue.cancel()

    asyncio.run(main())

