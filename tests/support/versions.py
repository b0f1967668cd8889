"""A model version made straight in the database and blob store, with no upload or compile:
for tests and benchmarks of what comes after a build (publishing, patches, rollouts)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from server.blobstore import BlobStore
from server.db import models as db


def add_version(factory: sessionmaker[Session], store: BlobStore, model: str, version: str,
                artifacts: Mapping[str, bytes], *, state: str = "ready",
                **artifact_fields: Any) -> tuple[int, dict[str, str]]:
    """Adds `version` of `model` (the model too when new) in `state`, with one ONNX artifact
    per platform of `artifacts` ({platform: bytes}, stored under artifacts/<sha256>);
    `artifact_fields` go to every artifact row (target, compile_settings, ...). Returns the
    version id and {platform: sha256}."""
    shas: dict[str, str] = {}
    with factory() as s:
        m = s.scalars(select(db.Model).where(db.Model.name == model)).first()
        if m is None:
            m = db.Model(name=model)
            s.add(m)
            s.flush()
        v = db.ModelVersion(model_id=m.id, version=version, state=db.VersionState(state),
                            metadata_json={}, source_format="onnx")
        s.add(v)
        s.flush()
        for platform, data in artifacts.items():
            sha = hashlib.sha256(data).hexdigest()
            key = f"artifacts/{sha}"
            store.put(key, [data], expected_sha256=sha)
            s.add(db.Artifact(version_id=v.id, platform=platform, variant="", format="onnx",
                              sha256=sha, length=len(data), blob_key=key, **artifact_fields))
            shas[platform] = sha
        s.commit()
        return v.id, shas
