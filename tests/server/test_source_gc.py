"""The source GC (server/services/source_gc.py): uploaded files no version names go once
older than the grace period; files a version names, and files of an upload still in flight,
never go. Real blob store, real database (SQLite and PostgreSQL), the real upload route; the
clock is injected as `now`. The kill test (an upload SIGKILLed at `upload.blobs_written`) is
tests/faults/test_source_gc.py."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from server.blobstore import LocalBlobStore
from server.db import models as db
from server.services import registry
from server.services.source_gc import collect_sources
from tests.client.onnx_models import scaled_model
from tests.support.inprocess_app import inprocess_app

HOUR = 3600.0
META = {"version": "1.0.0", "platforms": ["onnx"],
        "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 4]}]}


def _upload(client: Any) -> Any:
    return client.post("/v1/models/clf/versions",
                       files={"model": ("m.onnx", scaled_model(2.0))},
                       data={"metadata": json.dumps(META)})


def _source_keys(factory: Any) -> set[str]:
    with factory() as s:
        return set(s.scalars(select(db.SourceUpload.blob_key)))


def test_an_orphan_goes_only_once_older_than_the_grace_period(factory, tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    key = "sources/clf/1.0.0/deadbeef/model"
    store.put(key, [b"half an upload"])
    written = store.stat(key).modified
    assert written is not None
    young = collect_sources(factory, store, now=written + HOUR - 1, grace_seconds=HOUR)
    assert (young.deleted, young.young) == ([], [key])
    assert store.exists(key)
    old = collect_sources(factory, store, now=written + HOUR + 1, grace_seconds=HOUR)
    assert old.deleted == [key]
    assert not store.exists(key)
    with factory() as s:
        event = s.scalars(select(db.AuditEvent).where(db.AuditEvent.action == "sources.gc")
                          ).one()
    assert event.details["keys"] == [key]


def test_files_a_version_names_are_never_collected(tmp_path: Path) -> None:
    with inprocess_app(tmp_path) as client:
        assert client.post("/v1/models", json={"name": "clf"}).status_code == 201
        assert _upload(client).status_code == 201
        factory = client.app.state.session_factory
        store = client.app.state.blob_store
        named = _source_keys(factory)
        assert named
        report = collect_sources(factory, store, now=time.time() + 1000 * HOUR,
                                 grace_seconds=HOUR)
        assert report.deleted == [] and report.referenced == len(named)
        assert all(store.exists(k) for k in named)


def test_an_upload_in_flight_keeps_its_files_through_a_gc_pass(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Stop the upload where a crash would orphan its files: stored, the row not committed.
    stored, resume = threading.Event(), threading.Event()
    real_reached = registry.crashpoints.reached

    def pause_at_blobs_written(step: str) -> None:
        if step == "upload.blobs_written":
            stored.set()
            assert resume.wait(60)
        real_reached(step)

    monkeypatch.setattr(registry.crashpoints, "reached", pause_at_blobs_written)
    with inprocess_app(tmp_path) as client:
        assert client.post("/v1/models", json={"name": "clf"}).status_code == 201
        factory = client.app.state.session_factory
        store = client.app.state.blob_store
        answer: list[Any] = []
        upload = threading.Thread(target=lambda: answer.append(_upload(client)))
        upload.start()
        try:
            assert stored.wait(60), "the upload never stored its files"
            in_flight = set(store.list_keys("sources/"))
            assert in_flight and not _source_keys(factory)  # no row names them yet
            report = collect_sources(factory, store, now=time.time(), grace_seconds=HOUR)
            assert report.deleted == [] and set(report.young) == in_flight
        finally:
            resume.set()
            upload.join(60)
        assert answer and answer[0].status_code == 201, answer
        assert _source_keys(factory) == in_flight
        assert all(store.exists(k) for k in in_flight)


def test_the_api_process_collects_orphans_at_start(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    orphan = "sources/clf/1.0.0/0123abcd/model"
    LocalBlobStore(tmp_path / "data" / "blobs").put(orphan, [b"left by a crash"])
    monkeypatch.setenv("MODELFLEET_SOURCE_GC_GRACE_SECONDS", "0")
    with inprocess_app(tmp_path) as client:
        store = client.app.state.blob_store
        deadline = time.monotonic() + 60
        while store.exists(orphan) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not store.exists(orphan), "the start pass did not collect the orphan"


def test_gc_command_dry_run_lists_and_keeps_then_deletes(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from modelfleet.cli import app

    with inprocess_app(tmp_path):
        pass  # a migrated database and keys under tmp_path/data, as `keys init` makes them
    store = LocalBlobStore(tmp_path / "data" / "blobs")
    orphan = "sources/clf/1.0.0/feedface/model"
    store.put(orphan, [b"left by a crash"])
    monkeypatch.setenv("MODELFLEET_DATABASE_URL", f"sqlite:///{tmp_path / 'server.db'}")
    args = ["gc", "--data-dir", str(tmp_path / "data"), "--grace-seconds", "0", "--json"]
    dry = CliRunner().invoke(app, [*args, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output)["deleted"] == [orphan] and store.exists(orphan)
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["deleted"] == [orphan] and not store.exists(orphan)
