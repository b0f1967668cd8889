"""`make_job_queue(app)`: the queue `create_app` installs, chosen by `settings.job_backend`.

inprocess (embedded default): a worker thread in the API process, started here.
procrastinate (production): the API only defers jobs; `modelfleet worker` processes run them.
"""

from __future__ import annotations

from typing import Any

from server.jobs.interface import JobQueue


def make_job_queue(app: Any) -> JobQueue:
    settings = app.state.settings
    if settings.job_backend == "procrastinate":
        from server.jobs.procrastinate_queue import ProcrastinateJobQueue, queued_build_ids

        return ProcrastinateJobQueue(settings.resolved_database_url,
                                     queued_build_ids(app.state.session_factory))
    from server.jobs.inprocess import InProcessJobQueue
    from server.jobs.runner import BuildRunner

    runner = BuildRunner(app.state.session_factory, app.state.blob_store,
                         worker_id=InProcessJobQueue.worker_name())
    queue = InProcessJobQueue(runner)
    queue.start()  # picks up builds left queued or abandoned by an earlier process
    return queue
