"""The server side of per-cohort watermarks (docs/security.md "Per-cohort watermarks"):
identifying a leaked file. (The secret — `watermark.key` in the keys directory, made like
`content.kek` — is server/publish/protection.py's `WatermarkSecret`; a build's sandbox gets
only its release's key derived from it; the unmarked artifacts rest privately at
`unmarked/<sha256>`, sealed when the version is protected.) Identification reads the leaked file's
weights (server/compile/weights.py: ONNX, Core ML .mlpackage as a directory, tar or zip),
and compares them with the unmarked artifact of every watermarked artifact whose tensors it
shares (same name and size), cohort by cohort; the best match is named only when its
false-positive bound — over every cohort of every artifact compared — is ≤ 1e-9, else
"none".
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from server import watermark as wm
from server.blobstore import BlobStore
from server.compile import weights
from server.db import models as db
from server.publish.protection import ContentKeys, WatermarkSecret, unseal_path


@dataclass(frozen=True)
class Finding:
    """The best match of a leaked file: which artifact, which cohort (None: "none")."""

    cohort: int | None
    false_positive: float
    z: float
    weights: int
    model: str = ""
    version: str = ""
    platform: str = ""
    variant: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"cohort": self.cohort, "false_positive": self.false_positive,
                "z": round(self.z, 3), "weights_compared": self.weights, "model": self.model,
                "version": self.version, "platform": self.platform, "variant": self.variant}


NONE = Finding(None, 1.0, 0.0, 0)


def identify(session: Session, store: BlobStore, secret: WatermarkSecret,
             content_keys: ContentKeys | None, leaked: Path) -> Finding:
    """The cohort whose watermark `leaked` carries, over every watermarked artifact; raises
    weights.WeightsError when the file's weights cannot be read."""
    copy = weights.by_name(weights.read(leaked))
    best = NONE
    rows = session.execute(
        select(db.Artifact, db.ModelVersion.version, db.Model.name)
        .join(db.ModelVersion, db.ModelVersion.id == db.Artifact.version_id)
        .join(db.Model, db.Model.id == db.ModelVersion.model_id)
        .where(db.Artifact.unmarked_blob_key.is_not(None))
        .order_by(db.Artifact.id)).all()
    tmp = Path(tempfile.mkdtemp(prefix="mf-identify-"))
    compared = 0
    try:
        for art, version, model in rows:
            original = _unmarked(session, store, content_keys, art, tmp)
            tensors = [(t.name, t.values) for t in original if t.markable]
            if not any(name in copy for name, _ in tensors):
                continue  # another model: nothing in common
            got = wm.identify_tensors(copy, tensors, secret.release_key(model, version),
                                      len(art.cohorts))
            compared += 1
            if got.z > best.z:
                best = Finding(got.cohort, got.false_positive, got.z, got.weights, model,
                               version, art.platform, art.variant)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # The union bound over every artifact compared, too: each was a chance to match.
    bound = min(1.0, best.false_positive * max(compared, 1))
    cohort = best.cohort if bound <= wm.MAX_FALSE_POSITIVE else None
    return replace(best, cohort=cohort, false_positive=bound)


def _unmarked(session: Session, store: BlobStore, content_keys: ContentKeys | None,
              art: db.Artifact, tmp: Path) -> list[weights.Tensor]:
    assert art.unmarked_blob_key is not None
    path = tmp / f"unmarked-{art.id}"
    with store.open(art.unmarked_blob_key) as src, path.open("wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    if art.plain_sha256 is not None:  # a protected version's: sealed at rest
        if content_keys is None:
            raise weights.WeightsError("a protected version's unmarked artifact is sealed; "
                                       "give this process the keys directory's content.kek")
        key = content_keys.key_for(session, art.version_id)
        path = unseal_path(key, path, tmp / f"plain-{art.id}")
    try:
        return weights.read(path)
    finally:
        path.unlink(missing_ok=True)
