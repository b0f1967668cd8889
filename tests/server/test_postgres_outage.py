"""PostgreSQL stopped and restarted under a running API (docs/architecture.md "Outages"): a
request in flight gets 503 `database_unavailable` with the reason and Retry-After, or its
200 when its statements ran before its connection died; every request while PostgreSQL is
down gets that 503 (never a 500); polls keep being answered from the last good cache
entry or the bucket's copy (a 503 when there is neither); once PostgreSQL is back the same
process serves again by itself (pool pre-ping, the telemetry group commit reconnecting),
and nothing a 503 answered was stored.

The cluster is the test's own (tests/support/private_postgres.py): the machine's shared
PostgreSQL is never stopped.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event as sa_event
from sqlalchemy import select

from server.app import create_app
from server.auth import create_token
from server.blobstore.keys import channel_manifest_key
from server.db import models as db
from server.db.migrate import upgrade
from server.settings import Settings
from tests.publish.test_manifest_polls import MANIFEST, publish_prod
from tests.support.fleet_devices import FleetDevice, update_report
from tests.support.private_postgres import PrivatePostgres, private_postgres
from tests.support.server_keys import init_test_keys

pytestmark = pytest.mark.postgres
RECOVERY_DEADLINE_S = 30


@pytest.fixture
def pg() -> Iterator[PrivatePostgres]:
    with private_postgres() as cluster:
        yield cluster


def libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def assert_database_unavailable(r: httpx.Response) -> None:
    assert r.status_code == 503, (r.status_code, r.text)
    body = r.json()
    assert body["code"] == "database_unavailable", body
    assert "PostgreSQL" in body["detail"] and "nothing was changed" in body["detail"]
    assert "retry" in body["fix"]
    assert int(r.headers["retry-after"]) > 0


def wait_for_waiting_query(dsn: str, table: str) -> None:
    """Until a backend waits on a lock of `table`: the request is inside PostgreSQL."""
    deadline = time.monotonic() + 10
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query ILIKE %s", (f"%{table}%",)).fetchone()
            if row and row[0]:
                return
            time.sleep(0.05)
    raise AssertionError("the request never reached PostgreSQL")


def test_postgres_restart_mid_request_answers_503_with_reason_and_recovers(
        pg: PrivatePostgres, tmp_path: Path) -> None:
    upgrade(pg.url)
    data = tmp_path / "data"
    init_test_keys(data)
    settings = Settings(env="development", data_dir=data, database_url=pg.url,
                        public_base_url="http://t", manifest_lifetime_seconds=86_400,
                        ramp_check_seconds=3600)
    publish_prod(settings, "1.0")
    device = FleetDevice("outage-device-1")
    with TestClient(create_app(settings)) as c:
        with c.app.state.session_factory() as s:  # type: ignore[attr-defined]
            _, secret = create_token(s, ["enroll", "publish"], name="ops")
            s.commit()
        auth = {"Authorization": f"Bearer {secret}"}
        assert c.post("/v1/devices/enroll", json=device.enroll_body(),
                      headers=auth).status_code == 201
        first = device.batch([update_report("clf-1-0", "1.0", "downloaded")])
        r = c.post("/v1/telemetry", content=first, headers=device.headers(first))
        assert r.status_code == 200, r.text  # the device's key is cached from now on
        good = c.get(MANIFEST)
        assert good.status_code == 200
        listed = c.get("/v1/models", headers=auth)
        assert listed.status_code == 200

        # A request in flight: it waits inside PostgreSQL on a lock we hold, and PostgreSQL
        # goes away under it.
        answers: list[httpx.Response] = []
        raised: list[BaseException] = []

        def in_flight_request() -> None:
            try:
                answers.append(c.get("/v1/models", headers=auth))
            except BaseException as e:  # what the app raised: the test reports it below
                raised.append(e)

        locker = psycopg.connect(libpq(pg.url))
        locker.execute("LOCK TABLE models IN ACCESS EXCLUSIVE MODE")
        in_flight = threading.Thread(target=in_flight_request)
        in_flight.start()
        wait_for_waiting_query(libpq(pg.url), "models")
        pg.stop("fast")
        in_flight.join(90)  # a hang guard, not a speed target
        with contextlib.suppress(psycopg.Error):
            locker.close()  # its server is gone too
        # Twice in CI this was "never answered". Most likely the lock fell with the locker's
        # backend, the request's statements ran, and its closing rollback met the dead
        # connection after the response had started (inferred; the test below pins that case).
        assert not raised, f"the in-flight request raised instead of answering: {raised[0]!r}"
        assert answers, "the in-flight request never answered"
        if answers[0].status_code == 200:  # it got its rows before its backend went
            assert answers[0].json() == listed.json()
        else:
            assert_database_unavailable(answers[0])

        # While it is down: clear 503s for reads and writes, polls still served.
        assert_database_unavailable(c.get("/v1/models", headers=auth))
        # A write: its token is checked by the request guard, before the app's handlers.
        assert_database_unavailable(c.post("/v1/models", json={"name": "during", "task": "other"},
                                           headers=auth))
        lost = update_report("clf-1-0", "1.0", "activated")
        body = device.batch([lost])
        assert_database_unavailable(c.post("/v1/telemetry", content=body,
                                           headers=device.headers(body)))
        ready = c.get("/readyz")
        assert ready.status_code == 503 and "database" in ready.json()["detail"]
        time.sleep(1.2)  # past the cache's ttl: reloads meet the outage
        for _ in range(3):
            r = c.get(MANIFEST)
            assert (r.status_code, r.content) == (200, good.content)
        cache = c.app.state.services.manifest_cache  # type: ignore[attr-defined]
        cache.invalidate("prod")  # no entry at all: the bucket's copy answers
        r = c.get(MANIFEST)
        assert (r.status_code, r.content, r.headers["etag"]) == (
            200, good.content, good.headers["etag"])
        # Neither an entry nor the bucket's copy: the poll is a clear 503, not a 500.
        cache.invalidate("prod")
        c.app.state.blob_store.delete(channel_manifest_key("prod"))  # type: ignore[attr-defined]
        assert_database_unavailable(c.get(MANIFEST))

        pg.start()
        deadline = time.monotonic() + RECOVERY_DEADLINE_S
        while (r := c.get("/v1/models", headers=auth)).status_code != 200:
            assert r.status_code == 503, (r.status_code, r.text)
            assert time.monotonic() < deadline, "the API did not recover by itself"
            time.sleep(0.2)
        assert c.get("/readyz").status_code == 200
        kept = update_report("clf-1-0", "1.0", "activated")
        body = device.batch([kept])
        r = c.post("/v1/telemetry", content=body, headers=device.headers(body))
        assert r.status_code == 200 and r.json()["accepted"] == 1, r.text
        with c.app.state.session_factory() as s:  # type: ignore[attr-defined]
            stored = set(s.scalars(select(db.TelemetryEvent.report_id)))
        assert kept["id"] in stored
        assert lost["id"] not in stored  # answered 503: the device sends it again


def test_a_connection_lost_after_the_routes_last_statement_still_answers_200(
        postgres_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """PostgreSQL going away between a read's last statement and the session's closing
    rollback (the response is on its way by then) once broke the ASGI exchange: "response
    already started" instead of the 200, and a traceback. Here the request's own backend is
    terminated right after its last statement — the shared server stays up."""
    upgrade(postgres_url)
    data = tmp_path / "data"
    init_test_keys(data)
    settings = Settings(env="development", data_dir=data, database_url=postgres_url,
                        public_base_url="http://t")
    with TestClient(create_app(settings)) as c:  # raises what the app raises
        with c.app.state.session_factory() as s:  # type: ignore[attr-defined]
            _, secret = create_token(s, ["publish"], name="ops")
            s.commit()
        auth = {"Authorization": f"Bearer {secret}"}
        assert c.post("/v1/models", json={"name": "kept", "task": "other"},
                      headers=auth).status_code == 201
        armed = threading.Event()
        killed: list[int] = []

        def terminate_own_backend(_conn, cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
            if not (armed.is_set() and "count(" in statement.lower()):
                return  # the list's last statement: the versions per model
            armed.clear()
            pid = cursor.connection.info.backend_pid
            with psycopg.connect(libpq(postgres_url), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                                    (pid,)).fetchone():
                    time.sleep(0.01)  # gone before the closing rollback, for certain
            killed.append(pid)

        engine = c.app.state.engine  # type: ignore[attr-defined]
        sa_event.listen(engine, "after_cursor_execute", terminate_own_backend)
        try:
            armed.set()
            with caplog.at_level("WARNING", logger="modelfleet.db"):
                r = c.get("/v1/models", headers=auth)
        finally:
            sa_event.remove(engine, "after_cursor_execute", terminate_own_backend)
        assert killed, "the request's backend was never terminated"
        assert r.status_code == 200, r.text
        assert [m["name"] for m in r.json()["models"]] == ["kept"]
        assert any("lost after its last statement" in rec.getMessage() for rec in caplog.records)
        # The dead connection was dropped, not handed to the next request.
        assert c.get("/v1/models", headers=auth).status_code == 200
