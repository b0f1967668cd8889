"""The blob volume full (docs/architecture.md "Outages"), for real: a 2 MiB tmpfs mounted as
the blob directory. An upload that does not fit is 507 `storage_full` with the reason and
Retry-After; no partial blob is visible (temp file + rename, the temp file removed), no
version row was committed, blobs stored earlier are intact; a publish that cannot store its
manifest publishes nothing; once space returns the same upload and publish succeed.

Mounting needs root (CAP_SYS_ADMIN); elsewhere the test is skipped with that reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from server.app import create_app
from server.auth import create_token
from server.blobstore import BlobStorageFullError, LocalBlobStore
from server.db import models as db
from server.db.migrate import upgrade
from server.jobs.interface import NullJobQueue
from server.rollouts import service as ro
from server.rollouts.channels import create_channel
from server.settings import Settings
from tests.publish.conftest import version_maker
from tests.support.rollouts import start_rollout
from tests.support.server_keys import init_test_keys

TMPFS_BYTES = 2 * 1024 * 1024
SIDE = 200  # float32[1, 3, 200, 200]: a 480 KB initializer


@pytest.fixture
def small_volume() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; the disk-full test runs as root (CI)")
    mount = Path(tempfile.mkdtemp(prefix="mf-full-"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs",
                           str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        mount.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)
        mount.rmdir()


def fill(volume: Path, leave: int) -> Path:
    """A filler file that leaves about `leave` bytes free on the volume."""
    filler = volume / "filler"
    st = os.statvfs(volume)
    size = max(0, st.f_bavail * st.f_frsize - leave)
    with filler.open("wb") as f, contextlib.suppress(OSError):
        f.write(b"\0" * size)
    return filler


def big_onnx() -> bytes:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    shape = [1, 3, SIDE, SIDE]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    b = numpy_helper.from_array(np.random.default_rng(0).random(shape, dtype=np.float32), "b")
    graph = helper.make_graph([helper.make_node("Add", ["x", "b"], ["y"])], "g", [x], [y], [b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]
                             ).SerializeToString()


def test_disk_full_during_upload_is_507_stores_nothing_and_recovers(
        small_volume: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'server.db'}"  # the database is not on the full volume
    upgrade(url)
    settings = Settings(env="development", data_dir=tmp_path / "data", database_url=url,
                        blob_dir=small_volume / "blobs", token_pepper="test-pepper-0123456789")
    model = big_onnx()
    metadata = json.dumps({"version": "1.0.0", "platforms": ["onnx"],
                           "inputs": [{"name": "x", "dtype": "float32",
                                       "shape": [1, 3, SIDE, SIDE]}]})
    files = {"model": ("model.onnx", model, "application/octet-stream")}
    with TestClient(create_app(settings, job_queue=NullJobQueue())) as c:
        with c.app.state.session_factory() as s:  # type: ignore[attr-defined]
            _, secret = create_token(s, ["publish"], name="ops", pepper=settings.token_pepper)
            s.commit()
        auth = {"Authorization": f"Bearer {secret}"}
        assert c.post("/v1/models", json={"name": "big", "task": "other"},
                      headers=auth).status_code == 201
        store: LocalBlobStore = c.app.state.blob_store  # type: ignore[attr-defined]
        earlier = store.put("sources/earlier/model", [b"kept" * 1000])
        filler = fill(small_volume, leave=len(model) // 2)

        r = c.post("/v1/models/big/versions", files=files, data={"metadata": metadata},
                   headers=auth)
        assert r.status_code == 507, r.text
        body = r.json()
        assert body["code"] == "storage_full"
        assert "no space left" in body["detail"] and "nothing was stored" in body["detail"]
        assert "free space" in body["fix"]
        assert int(r.headers["retry-after"]) > 0
        assert list(store.list_keys()) == ["sources/earlier/model"]  # no partial blob
        assert list((store.root / "tmp").iterdir()) == []  # the temp file is gone too
        with c.app.state.session_factory() as s:  # type: ignore[attr-defined]
            assert s.scalar(select(func.count()).select_from(db.ModelVersion)) == 0
            assert s.scalar(select(func.count()).select_from(db.SourceUpload)) == 0
        with store.open("sources/earlier/model") as f:
            assert hashlib.sha256(f.read()).hexdigest() == earlier.sha256

        filler.unlink()  # space returns: the same request succeeds
        r = c.post("/v1/models/big/versions", files=files, data={"metadata": metadata},
                   headers=auth)
        assert r.status_code == 201, r.text
        assert r.json()["uploads"][0]["sha256"] == hashlib.sha256(model).hexdigest()


def test_disk_full_during_publish_publishes_no_manifest_and_recovers(
        small_volume: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'server.db'}"
    upgrade(url)
    data = tmp_path / "data"
    init_test_keys(data)
    settings = Settings(env="development", data_dir=data, database_url=url,
                        blob_dir=small_volume / "blobs", public_base_url="http://t")
    with TestClient(create_app(settings, job_queue=NullJobQueue())) as c:
        factory = c.app.state.session_factory  # type: ignore[attr-defined]
        store: LocalBlobStore = c.app.state.blob_store  # type: ignore[attr-defined]
        pub = c.app.state.services.publisher  # type: ignore[attr-defined]
        version_maker(factory, store)("clf", "1.0", platforms=("android",))
        create_channel(factory, pub, "prod", actor="test")
        before = c.get("/v1/channels/prod/manifest")
        assert before.status_code == 200
        with factory() as s:
            serials = list(s.scalars(select(db.SignedManifest.serial)))
        filler = fill(small_volume, leave=0)

        with pytest.raises(BlobStorageFullError):
            start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "1.0", 50),
                             actor="test")
        with factory() as s:
            assert list(s.scalars(select(db.SignedManifest.serial))) == serials
            assert s.scalar(select(func.count()).select_from(db.Release)) == 0
        assert c.get("/v1/channels/prod/manifest").content == before.content
        assert list((store.root / "tmp").iterdir()) == []

        filler.unlink()
        start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "1.0", 50), actor="test")
        after = c.get("/v1/channels/prod/manifest")
        assert after.status_code == 200 and after.content != before.content


def test_disk_full_under_the_sqlite_database_is_507_and_recovers(
        small_volume: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{small_volume / 'server.db'}"
    upgrade(url)
    settings = Settings(env="development", data_dir=tmp_path / "data", database_url=url,
                        token_pepper="test-pepper-0123456789")
    with TestClient(create_app(settings, job_queue=NullJobQueue())) as c:
        with c.app.state.session_factory() as s:  # type: ignore[attr-defined]
            _, secret = create_token(s, ["publish"], name="ops", pepper=settings.token_pepper)
            s.commit()
        auth = {"Authorization": f"Bearer {secret}"}
        filler = fill(small_volume, leave=0)
        # Long descriptions: the write needs new pages, there is no room for them.
        r = c.post("/v1/models", json={"name": "full", "task": "other",
                                       "description": "d" * 2000}, headers=auth)
        assert r.status_code == 507, r.text
        body = r.json()
        assert body["code"] == "database_full" and "SQLite" in body["detail"]
        assert int(r.headers["retry-after"]) > 0
        filler.unlink()
        r = c.post("/v1/models", json={"name": "full", "task": "other",
                                       "description": "d" * 2000}, headers=auth)
        assert r.status_code == 201, r.text
        assert [m["name"] for m in c.get("/v1/models", headers=auth).json()["models"]] == [
            "full"]
