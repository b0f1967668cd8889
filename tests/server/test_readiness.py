"""GET /healthz and /readyz: readiness checks the database, the blob store and the job queue
for real, and a 503 names each dependency that failed with its fix."""

from __future__ import annotations

import shutil
import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from server.jobs.inprocess import InProcessJobQueue
from server.jobs.interface import NullJobQueue
from server.jobs.procrastinate_queue import ProcrastinateJobQueue
from server.settings import Settings
from tests.support.served import free_port


def closed_port_pg() -> str:
    return f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nothing"


def test_ready_when_database_blob_store_and_queue_answer(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    r = client.get("/readyz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "checks": {
        "database": "ok", "blob_store": "ok", "job_queue": "ok"}}


def test_a_removed_blob_directory_is_a_503_naming_the_blob_store(
        client: TestClient, settings: Settings) -> None:
    shutil.rmtree(settings.resolved_blob_dir)
    r = client.get("/readyz")
    assert r.status_code == 503
    body = r.json()
    assert body["field"] == "blob_store" and "blob directory" in body["detail"]
    assert "MODELFLEET_BLOB_DIR" in body["fix"]
    assert client.get("/healthz").status_code == 200  # alive, just not ready


def test_an_unreachable_database_is_a_503_naming_the_database(settings: Settings) -> None:
    down = settings.model_copy(update={"database_url": closed_port_pg()})
    client = TestClient(create_app(down, job_queue=NullJobQueue()))  # no lifespan: no DB use
    r = client.get("/readyz")
    assert r.status_code == 503
    body = r.json()
    assert body["field"] == "database" and "database unreachable" in body["detail"]
    assert "MODELFLEET_DATABASE_URL" in body["fix"]


def test_an_unreachable_procrastinate_queue_is_a_503_naming_the_job_queue(
        settings: Settings) -> None:
    queue = ProcrastinateJobQueue(closed_port_pg(), lambda _v: [])
    with TestClient(create_app(settings, job_queue=queue)) as client:
        r = client.get("/readyz")
    assert r.status_code == 503
    body = r.json()
    assert body["field"] == "job_queue" and "procrastinate" in body["detail"]
    assert "MODELFLEET_JOB_BACKEND" in body["fix"]


def test_every_failed_dependency_is_named_not_only_the_first(settings: Settings) -> None:
    queue = ProcrastinateJobQueue(closed_port_pg(), lambda _v: [])
    with TestClient(create_app(settings, job_queue=queue)) as client:
        shutil.rmtree(settings.resolved_blob_dir)
        body = client.get("/readyz").json()
    assert "blob_store:" in body["detail"] and "job_queue:" in body["detail"]


@pytest.mark.postgres
def test_a_procrastinate_queue_is_ready_once_its_tables_exist(postgres_url: str) -> None:
    from server.jobs.interface import JobQueueUnavailableError
    from server.jobs.procrastinate_queue import conninfo, ensure_schema, make_sync_app

    queue = ProcrastinateJobQueue(postgres_url, lambda _v: [])
    with pytest.raises(JobQueueUnavailableError, match="modelfleet worker"):
        queue.check_ready()  # a fresh database: no worker has created the tables yet
    app = make_sync_app(postgres_url)
    app.open()
    try:
        ensure_schema(app, conninfo(postgres_url))  # what a worker does at start
    finally:
        app.close()
    queue.check_ready()


class _DyingRunner:
    """A runner whose loop hits an error the worker thread does not survive."""

    def __init__(self) -> None:
        self.entered = threading.Event()

    def claimable_ids(self) -> list[int]:
        self.entered.set()
        raise SystemExit("simulated fatal error in the worker thread")

    def next_wakeup(self) -> Any:
        return None


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_in_process_worker_thread_is_not_ready(settings: Settings) -> None:
    from server.jobs.interface import JobQueueUnavailableError

    runner = _DyingRunner()
    queue = InProcessJobQueue(runner)  # type: ignore[arg-type]
    queue.check_ready()  # not started yet: nothing has failed
    queue.enqueue_compile(1)
    assert runner.entered.wait(5)
    assert queue._thread is not None
    queue._thread.join(5)
    with pytest.raises(JobQueueUnavailableError, match="worker thread has stopped"):
        queue.check_ready()


def test_a_database_host_that_never_answers_is_a_503_not_a_hang(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host that takes the TCP connection and then says nothing (a black-holed or wedged
    database) must not hang /readyz (or any request) forever: libpq's own default."""
    import socket

    from server.db import session as db_session

    monkeypatch.setattr(db_session, "PG_CONNECT_TIMEOUT_S", 1)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel completes handshakes; nobody ever reads or replies
    url = f"postgresql+psycopg://postgres@127.0.0.1:{silent.getsockname()[1]}/nothing"
    client = TestClient(create_app(settings.model_copy(update={"database_url": url}),
                                   job_queue=NullJobQueue()))
    answer: list[Any] = []
    t = threading.Thread(target=lambda: answer.append(client.get("/readyz")), daemon=True)
    t.start()
    t.join(60)
    silent.close()
    assert answer, "/readyz still waiting for a database that never answers"
    assert answer[0].status_code == 503 and answer[0].json()["field"] == "database"
