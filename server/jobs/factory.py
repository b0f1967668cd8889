"""`make_job_queue(app)`: the queue `create_app` installs, chosen by `settings.job_backend`.

inprocess (embedded default): a worker thread in the API process, started here; it makes
delta patches with the app's publisher and drops the app's cached manifest once re-signed.
procrastinate (production): the API only defers jobs; `modelfleet worker` processes run them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI

from server.jobs.interface import JobQueue

if TYPE_CHECKING:
    from server.publish.publisher import Publisher


def make_job_queue(app: FastAPI) -> JobQueue:
    settings = app.state.settings
    if settings.job_backend == "procrastinate":
        from server.jobs.procrastinate_queue import ProcrastinateJobQueue, queued_build_ids

        return ProcrastinateJobQueue(settings.resolved_database_url,
                                     queued_build_ids(app.state.session_factory),
                                     app.state.session_factory)
    from server.jobs.inprocess import InProcessJobQueue
    from server.jobs.patch_runner import PatchRunner
    from server.jobs.runner import BuildRunner

    worker_id = InProcessJobQueue.worker_name()
    runner = BuildRunner(app.state.session_factory, app.state.blob_store, worker_id=worker_id)
    patches = PatchRunner(app.state.session_factory, lambda: _publisher(app),
                          worker_id=worker_id, on_published=lambda ch: _invalidate(app, ch))
    queue = InProcessJobQueue(runner, patches)
    queue.start()  # picks up builds left queued or abandoned by an earlier process
    return queue


# The API layer owns the app's publisher and manifest cache; looked up at call time so the
# queue can be built before them (create_app makes the queue first).
def _publisher(app: FastAPI) -> Publisher:
    from server.api.serving import publisher

    return publisher(app)


def _invalidate(app: FastAPI, channel: str) -> None:
    from server.api.serving import manifest_cache

    manifest_cache(app).invalidate(channel)
