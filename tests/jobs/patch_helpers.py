"""Helpers for the patch-job tests: a server data dir with real keys, ready versions whose
artifacts are small edits of each other (real blobs), and checking a manifest's patches by
applying them with the SDK."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

import manifests
from client_sdk.patching import apply_patch
from server.blobstore import BlobStore
from server.db import models as db
from server.db.migrate import upgrade
from server.settings import Settings
from tests.support.server_keys import init_test_keys
from tests.support.versions import add_version


def patch_settings(database_url: str, data_dir: Path, **kw: Any) -> Settings:
    upgrade(database_url)
    init_test_keys(data_dir)
    return Settings(env="development", data_dir=data_dir, database_url=database_url,
                    public_base_url="http://testserver", **kw)


def edited_series(n: int, size: int = 64 * 1024) -> list[bytes]:
    """`n` artifacts, each the previous one with 50 bytes changed (patches are tiny)."""
    data = bytearray(os.urandom(size))
    out = []
    for i in range(n):
        data[1000 * (i + 1): 1000 * (i + 1) + 50] = os.urandom(50)
        out.append(bytes(data))
    return out


def add_ready_version(factory: sessionmaker[Session], store: BlobStore, version: str,
                      data: bytes, model: str = "clf") -> int:
    return add_version(factory, store, model, version, {"android": data})[0]


def manifest_patches(client: Any, root: manifests.Root, model: str = "clf"
                     ) -> list[Any]:
    """The patches the channel's signed manifest lists for the model's newest release."""
    r = client.get("/v1/channels/prod/manifest")
    assert r.status_code == 200, r.text
    m = manifests.verify_manifest(root, r.content, now=int(time.time()), channel="prod",
                                  trusted=None)
    releases = m.models[model].releases
    newest = max(releases, key=lambda rel: rel.version)
    return list(newest.artifacts[0].patches)


def check_patch_applies(client: Any, patch: Any, base: bytes, target: bytes,
                        tmp: Path) -> None:
    """Fetches the patch through its manifest URL and applies it as a device would."""
    url = patch.url.removeprefix("http://testserver")
    r = client.get(url)
    assert r.status_code == 200, r.text
    assert hashlib.sha256(r.content).hexdigest() == patch.sha256
    (tmp / "base").write_bytes(base)
    (tmp / "patch").write_bytes(r.content)
    apply_patch(patch.algorithm, tmp / "base", tmp / "patch", tmp / "out",
                max_output=len(target))
    assert (tmp / "out").read_bytes() == target


def patch_rows(factory: sessionmaker[Session]) -> list[tuple[int, int]]:
    with factory() as s:
        return [(p.from_artifact_id, p.to_artifact_id)
                for p in s.scalars(select(db.Patch).order_by(db.Patch.id))]


def job_row(factory: sessionmaker[Session], version_id: int) -> db.PatchJob:
    with factory() as s:
        job = s.scalars(select(db.PatchJob).where(db.PatchJob.version_id == version_id)).one()
        s.expunge(job)
        return job
