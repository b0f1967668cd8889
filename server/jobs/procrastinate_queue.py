"""Production queue: compile builds on procrastinate workers backed by PostgreSQL.

- `ProcrastinateJobQueue.enqueue_compile(version_id)` (API side) defers one
  `modelfleet.compile_build` job per due build of the version, with a queueing lock per build
  so a repeated enqueue does not stack duplicates.
- `run_worker(url, runner, patch_runner)` (`modelfleet worker`, runners from
  `server.wiring.build_worker`) runs jobs; each job hands the build to `BuildRunner`, whose
  database claim makes a duplicate delivery harmless.
- `enqueue_patches(version_id)` records the version's `patch_jobs` row (`request_patches`)
  and defers one `modelfleet.make_patches` job (queueing lock per version); the worker hands
  it to `PatchRunner`, which makes the patches and re-signs the channels offering the
  version (it needs the release key: mount it into the workers too).
- A killed worker stops heartbeating. Every worker periodically asks procrastinate for jobs of
  stalled workers and retries them, and re-defers builds the database still holds as queued
  (delayed retries after transient failures, or builds whose job was never deferred because
  the database write succeeded and the defer did not), and patch jobs likewise — so no build
  and no patch job is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import procrastinate
from procrastinate import exceptions as pexc
from sqlalchemy.orm import Session, sessionmaker

from server.jobs.interface import JobQueueUnavailableError
from server.jobs.patch_runner import PatchRunner, request_patches
from server.jobs.runner import BuildRunner

log = logging.getLogger(__name__)
TASK_NAME = "modelfleet.compile_build"
QUEUE = "compile"
PATCH_TASK_NAME = "modelfleet.make_patches"
PATCH_QUEUE = "patches"


def compile_task(runner: BuildRunner) -> Callable[[int], None]:
    """The `modelfleet.compile_build` task of a worker: hands the build to its runner."""

    def compile_build(build_id: int) -> None:
        ran = runner.process(build_id)
        # A transient failure leaves the build queued with a due time; the rescue loop of
        # any worker re-defers it once due, so nothing is scheduled from inside the job.
        log.info("build %s %s", build_id, "done" if ran else "not claimable (owned or not due)")

    return compile_build


def patch_task(runner: PatchRunner) -> Callable[[int], None]:
    """The `modelfleet.make_patches` task of a worker: hands the version to its runner."""

    def make_patches(version_id: int) -> None:
        ran = runner.process(version_id)
        # As for builds: a failed attempt leaves the job queued with a due time, and the
        # rescue loop re-defers it then.
        log.info("patches for version %s %s", version_id,
                 "attempted" if ran else "not claimable (owned, not due or done)")

    return make_patches


def _defer_only(task: str) -> Callable[..., None]:
    """The API side's stand-in: it defers the task by name and never runs it."""

    def refuse(**_kwargs: int) -> None:
        raise RuntimeError(f"{task} runs in `modelfleet worker`, not in the API process")

    return refuse


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


def _register(app: procrastinate.App, compile_build: Callable[..., None],
              make_patches: Callable[..., None]) -> procrastinate.App:
    # Registered per app (not via a shared Blueprint, which binds to the first app only).
    app.task(name=TASK_NAME, queue=QUEUE, pass_context=False)(compile_build)
    app.task(name=PATCH_TASK_NAME, queue=PATCH_QUEUE, pass_context=False)(make_patches)
    return app


def make_sync_app(database_url: str) -> procrastinate.App:
    """The API side's app: defers both tasks, runs neither."""
    return _register(procrastinate.App(connector=procrastinate.SyncPsycopgConnector(
        conninfo=conninfo(database_url))), _defer_only(TASK_NAME), _defer_only(PATCH_TASK_NAME))


READY_TIMEOUT_S = 3


class ProcrastinateJobQueue:
    """API-side: defers jobs; never runs them."""

    def __init__(self, database_url: str, runner_ids: Callable[[int], list[int]],
                 session_factory: sessionmaker[Session] | None = None) -> None:
        self._url = database_url
        self._ids = runner_ids  # version_id -> ids of its queued builds
        self._sf = session_factory  # for patch_jobs rows; None: enqueue_patches unavailable
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

    def enqueue_patches(self, version_id: int) -> None:
        """Records the patch job, then defers it. A failed defer is only logged: the job is
        in the database, and a worker's rescue pass defers it within `stalled_after_s`."""
        if self._sf is None:
            raise RuntimeError("ProcrastinateJobQueue needs a session_factory for patch jobs")
        request_patches(self._sf, version_id)
        try:
            task = self._open().tasks[PATCH_TASK_NAME]
            with contextlib.suppress(pexc.AlreadyEnqueued):
                task.configure(queueing_lock=f"patches-{version_id}").defer(
                    version_id=version_id)
        except Exception:
            log.warning("deferring the patch job of version %s failed; a worker's rescue "
                        "pass will pick it up", version_id, exc_info=True)

    def check_ready(self) -> None:
        """The queue's PostgreSQL answers within READY_TIMEOUT_S and has procrastinate's
        tables (the API's first enqueue or any worker's start creates them). One short
        connection of its own: the deferring pool waits up to 30 s for a dead server, longer
        than any readiness probe. Raises JobQueueUnavailableError."""
        import psycopg

        try:
            with psycopg.connect(conninfo(self._url), connect_timeout=READY_TIMEOUT_S) as conn:
                row = conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()
        except psycopg.Error as e:
            raise JobQueueUnavailableError(
                f"procrastinate queue database unreachable: {e.__class__.__name__}") from e
        if row is None or row[0] is None:
            raise JobQueueUnavailableError(
                "procrastinate's tables are missing: start `modelfleet worker` once (it "
                "creates them)")

    def close(self) -> None:
        if self._opened:
            self._app.close()
            self._opened = False


def queued_build_ids(session_factory: sessionmaker[Session]) -> Callable[[int], list[int]]:
    from sqlalchemy import select

    from server.db.models import Build, BuildState

    def ids(version_id: int) -> list[int]:
        with session_factory() as s:
            return list(s.scalars(select(Build.id).where(
                Build.version_id == version_id,
                Build.state.in_([BuildState.queued, BuildState.running]))))
    return ids


async def _rescue_loop(app: procrastinate.App, runner: BuildRunner | None, every_s: float,
                       stalled_after_s: float, patches: PatchRunner | None = None) -> None:
    """Retries jobs of dead workers and re-defers queued builds and patch jobs nobody has a
    job for (only the kinds this worker's role runs)."""
    task = app.tasks[TASK_NAME]
    patch_task = app.tasks[PATCH_TASK_NAME]
    while True:
        try:
            for queue in [QUEUE] * (runner is not None) + [PATCH_QUEUE] * (patches is not None):
                for job in await app.job_manager.get_stalled_jobs(
                        seconds_since_heartbeat=stalled_after_s, queue=queue):
                    log.warning("retrying job %s of a stalled worker", job.id)
                    await app.job_manager.retry_job(job)
            await app.job_manager.prune_stalled_workers(stalled_after_s)
            if runner is not None:
                for build_id in await asyncio.to_thread(runner.claimable_ids, 50):
                    with contextlib.suppress(pexc.AlreadyEnqueued):
                        await task.configure(queueing_lock=f"build-{build_id}").defer_async(
                            build_id=build_id)
            if patches is not None:
                for version_id in await asyncio.to_thread(patches.claimable_ids, 50):
                    with contextlib.suppress(pexc.AlreadyEnqueued):
                        await patch_task.configure(
                            queueing_lock=f"patches-{version_id}").defer_async(
                            version_id=version_id)
        except Exception:
            log.warning("rescue pass failed; will retry", exc_info=True)
        await asyncio.sleep(every_s)


def run_worker(database_url: str, runner: BuildRunner | None,
               patch_runner: PatchRunner | None, *, concurrency: int = 1,
               heartbeat_s: float = 10.0, stalled_after_s: float = 30.0) -> None:
    """Blocks running the jobs these runners take until SIGINT/SIGTERM (graceful: the current
    job ends). server/wiring.py builds them for the worker's role: a compile worker has no
    PatchRunner (it never takes a job that signs), a publish worker no BuildRunner."""
    if runner is not None:
        name = runner.worker_id
    elif patch_runner is not None:
        name = patch_runner.worker_id
    else:
        raise ValueError("a worker needs a BuildRunner, a PatchRunner or both")
    url = database_url
    queues = [QUEUE] * (runner is not None) + [PATCH_QUEUE] * (patch_runner is not None)
    app = _register(procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=conninfo(url))),
        compile_task(runner) if runner is not None else _defer_only(TASK_NAME),
        patch_task(patch_runner) if patch_runner is not None else _defer_only(PATCH_TASK_NAME))

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
                                                      stalled_after_s, patch_runner))
            try:
                await app.run_worker_async(
                    queues=queues, concurrency=concurrency, name=name,
                    update_heartbeat_interval=heartbeat_s,
                    stalled_worker_timeout=stalled_after_s, delete_jobs="successful")
            finally:
                rescue.cancel()

    asyncio.run(main())
