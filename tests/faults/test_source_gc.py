"""An upload SIGKILLed after storing its files and before committing its row (crash point
`upload.blobs_written`) leaves source blobs no row names; `modelfleet gc` deletes them once
past the grace period and keeps the files of the retried upload, which a version names — on
SQLite with the local blob directory and on PostgreSQL with S3 over HTTP (moto)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from server.db import models as db
from server.db.session import make_engine, make_session_factory
from server.services.source_gc import collect_sources
from tests.faults.harness import REPO, ForkServer, ServerDied, rig


@pytest.mark.slow
def test_blobs_of_an_upload_killed_before_its_commit_are_collected(
        backend: tuple[str, Any], forker: ForkServer, tmp_path: Path) -> None:
    url, s3 = backend
    with rig(tmp_path, url, s3, forker) as r:
        r.start("upload.blobs_written")
        assert r.call("POST", "/v1/models", json={"name": "clf"}).status_code == 201
        with pytest.raises(ServerDied):
            r.upload("1.0.1")
        r.stop()
        store = r.store()
        orphans = set(store.list_keys("sources/"))
        assert orphans, "the killed upload stored no file"

        r.start()
        assert r.upload("1.0.1")["version"] == "1.0.1"  # the client's retry: new keys
        r.wait("1.0.1 built", lambda: r.version_state("1.0.1") == "ready")
        engine = make_engine(url)
        try:
            factory = make_session_factory(engine)
            with factory() as s:
                named = set(s.scalars(select(db.SourceUpload.blob_key)))
            assert named and not named & orphans
            # The restarted server's own pass (a day's grace) kept them: they are young.
            young = collect_sources(factory, store, now=time.time(), grace_seconds=3600)
            assert young.deleted == [] and set(young.young) == orphans
        finally:
            engine.dispose()
        r.stop()

        gc = subprocess.run(
            [sys.executable, "-m", "modelfleet", "gc", "--data-dir", str(r.data),
             "--grace-seconds", "0", "--json"],
            cwd=REPO, env=r.env(), capture_output=True, text=True, timeout=180)
        assert gc.returncode == 0, gc.stderr
        assert set(json.loads(gc.stdout)["deleted"]) == orphans
        assert set(store.list_keys("sources/")) == named
        assert r.violations() == []
