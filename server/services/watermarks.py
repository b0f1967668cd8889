"""The server side of per-cohort watermarks (docs/security.md "Per-cohort watermarks"):
identifying a leaked file. (The secret — `watermark.key` in the keys directory, made like
`content.kek` — is server/publish/protection.py's `WatermarkSecret`; a build's sandbox gets
only its release's key derived from it; the unmarked artifacts rest privately at
`unmarked/<sha256>`, sealed when the version is protected.)

Identification reads the leaked file's weights (server/compile/weights.py: ONNX, Core ML
.mlpackage as a directory, tar or zip) and compares them with the unmarked artifact of every
watermarked artifact whose tensors it shares (same name and size), cohort by cohort. A QNN
leak (an EPContext file, or its bare context binary) is compared with every watermarked QNN
artifact whose context binary has its length, through that artifact's unmarked and cohort
binaries (server/compile/qnn_marks.py). Only the positions a mark moved are scored (read off
the artifact's first cohort copy: the same positions in every cohort). The best match is
named only when its false-positive bound — over every cohort of every artifact compared —
is ≤ 1e-9, else "none".
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from client_sdk import compression
from server import watermark as wm
from server.blobstore import BlobStore
from server.compile import qnn_marks, requantized, weights
from server.db import models as db
from server.hashing import file_sha256
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
    tmp = Path(tempfile.mkdtemp(prefix="mf-identify-"))
    try:
        return _identify(session, store, secret, content_keys,
                         _inflated(leaked, tmp, lambda: _codec_of(session, leaked)), tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _codec_of(session: Session, leaked: Path) -> str:
    """The codec of the compressed copy `leaked` is, by its sha256 (a shuffled copy inflates
    to shuffled bytes with plain zstd); plain zstd for a file no copy has."""
    sha = file_sha256(leaked)[0]
    for table in (db.CohortArtifact, db.Artifact):
        codec = session.scalar(select(table.compressed_codec).where(
            table.compressed_sha256 == sha).limit(1))
        if codec in compression.CODECS:
            return str(codec)
    return compression.CODEC


def _inflated(leaked: Path, tmp: Path,
              codec_of: Callable[[], str] = lambda: compression.CODEC) -> Path:
    """A leaked compressed copy (what v1/artifacts serves newer SDKs) inflated into `tmp`
    with the codec `codec_of` names (asked only of a zstd frame: looking it up hashes the
    file), capped like any unpacked leak at weights.MAX_WEIGHT_FILE_BYTES (a bomb is refused
    from its header or mid-stream); any other file as it is."""
    if not leaked.is_file():
        return leaked
    with leaked.open("rb") as f:
        head = f.read(compression.FRAME_HEADER_MAX)
    if not compression.is_compressed(head):
        return leaked
    out = tmp / (leaked.name.removesuffix(".zst") if leaked.name.endswith(".zst")
                 else "inflated-" + leaked.name)
    try:
        size = compression.declared_length(head)
        if size > weights.MAX_WEIGHT_FILE_BYTES:
            raise compression.DecompressionError(
                f"declares {size} bytes, over the {weights.MAX_WEIGHT_FILE_BYTES}-byte cap "
                "for a leaked file")
        with leaked.open("rb") as src, out.open("wb") as dst:
            compression.decompress(src, dst, size, codec_of())
    except compression.DecompressionError as e:
        out.unlink(missing_ok=True)
        raise weights.WeightsError(f"{leaked.name} is a compressed copy that does not "
                                   f"inflate: {e}") from None
    return out


def _identify(session: Session, store: BlobStore, secret: WatermarkSecret,
              content_keys: ContentKeys | None, leaked: Path, tmp: Path) -> Finding:
    binary = qnn_marks.context_binary(leaked) if _is_qnn(leaked) else None
    copy, grids = requantized.leaked_copy(leaked) if binary is None else ({}, {})
    best = NONE
    rows = session.execute(
        select(db.Artifact, db.ModelVersion.version, db.Model.name)
        .join(db.ModelVersion, db.ModelVersion.id == db.Artifact.version_id)
        .join(db.Model, db.Model.id == db.ModelVersion.model_id)
        .where(db.Artifact.unmarked_blob_key.is_not(None))
        .order_by(db.Artifact.id)).all()
    compared = 0
    for art, version, model in rows:
        if (binary is not None) != (art.format == qnn_marks.EPCONTEXT_FORMAT):
            continue  # a QNN leak is compared with QNN artifacts only, and vice versa
        if binary is not None:
            got = _identify_qnn(session, store, content_keys, art, binary, tmp)
        else:
            path = _unmarked(session, store, content_keys, art, tmp)
            original = weights.read(path)
            path.unlink()
            tensors = [(t.name, t.values) for t in original if t.markable]
            if not any(name in copy for name, _ in tensors):
                continue  # another model: nothing in common
            got = wm.identify_tensors(copy, tensors, secret.release_key(model, version),
                                      len(art.cohorts), grids=grids,
                                      moved=_moved(session, store, content_keys, art,
                                                   tensors, tmp))
        if got is None:
            continue
        compared += 1
        if got.z > best.z:
            best = Finding(got.cohort, got.false_positive, got.z, got.weights, model,
                           version, art.platform, art.variant)
    # The union bound over every artifact compared, too: each was a chance to match.
    bound = min(1.0, best.false_positive * max(compared, 1))
    cohort = best.cohort if bound <= wm.MAX_FALSE_POSITIVE else None
    return replace(best, cohort=cohort, false_positive=bound)


def _moved(session: Session, store: BlobStore, content_keys: ContentKeys | None,
           art: db.Artifact, tensors: list[tuple[str, wm.Array]], tmp: Path
           ) -> dict[str, wm.Array] | None:
    """Where the artifact's marks sit (`watermark.moved_positions`), from its first cohort's
    copy; None (every masked position scored) when it has none."""
    if not art.cohorts:
        return None
    first = art.cohorts[0]
    path = _plain(session, store, content_keys, art.version_id, first.blob_key,
                  first.plain_sha256 is not None, tmp / f"cohort-{first.id}")
    try:
        return wm.moved_positions(tensors, weights.by_name(weights.read(path)))
    finally:
        path.unlink(missing_ok=True)


def _is_qnn(path: Path) -> bool:
    return path.is_file() and (path.suffix in (".bin", ".dlc") or qnn_marks.is_epcontext(path))


def _identify_qnn(session: Session, store: BlobStore, content_keys: ContentKeys | None,
                  art: db.Artifact, leaked: bytes, tmp: Path) -> wm.Identified | None:
    """A QNN leak against one QNN artifact: its unmarked and every cohort's context binary
    (server/compile/qnn_marks.py); None when the binaries differ in length (another
    model or build)."""
    unmarked = _binary(_unmarked(session, store, content_keys, art, tmp))
    if len(unmarked) != len(leaked):
        return None
    copies = (_binary(_plain(session, store, content_keys, art.version_id, c.blob_key,
                             c.plain_sha256 is not None, tmp / f"cohort-{c.id}"))
              for c in art.cohorts)  # one at a time: a cohort's binary is read, then freed
    word = qnn_marks.word_bytes(str(art.compile_settings.get("precision", "")))
    return qnn_marks.identify_binary(leaked, unmarked, copies, word)


def _binary(path: Path) -> bytes:
    try:
        return qnn_marks.context_binary(path)
    finally:
        path.unlink(missing_ok=True)


def _unmarked(session: Session, store: BlobStore, content_keys: ContentKeys | None,
              art: db.Artifact, tmp: Path) -> Path:
    assert art.unmarked_blob_key is not None
    return _plain(session, store, content_keys, art.version_id, art.unmarked_blob_key,
                  art.plain_sha256 is not None, tmp / f"unmarked-{art.id}")


def _plain(session: Session, store: BlobStore, content_keys: ContentKeys | None,
           version_id: int, blob_key: str, sealed: bool, path: Path) -> Path:
    """The blob at `path` in plaintext (unsealed when its version is protected)."""
    with store.open(blob_key) as src, path.open("wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    if not sealed:
        return path
    if content_keys is None:
        raise weights.WeightsError("a protected version's unmarked artifact is sealed; "
                                   "give this process the keys directory's content.kek")
    plain = unseal_path(content_keys.key_for(session, version_id), path,
                        path.with_name(path.name + ".plain"))
    path.unlink(missing_ok=True)
    return plain
