"""The model registry: models, and versions uploaded with their source files.

An upload is checked completely (metadata, size caps, file types, idempotency) before any
byte reaches the blob store; blobs go under fresh keys and are deleted again if the database
transaction does not commit, so a failed upload leaves nothing behind. The version, its
source uploads, one queued build per platform × shape variant, and the audit row commit
together; the compile queue is told afterwards.
"""

from __future__ import annotations

import logging
import re
import tempfile
from dataclasses import dataclass
from typing import Any, BinaryIO

from sqlalchemy import Select, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload

from manifests import sealed
from server import crashpoints
from server.blobstore import BlobStore
from server.blobstore.keys import source_key
from server.db import audit
from server.db.models import (
    Build,
    Model,
    ModelVersion,
    SourceUpload,
    TaskType,
    UploadKind,
    VersionState,
)
from server.errors import ConflictError, InvalidInputError, NotFoundError
from server.jobs.interface import JobQueue
from server.publish.protection import ContentKeys
from server.services.graph_inputs import (
    check_declared_inputs,
    check_input_names,
    undeclared_inputs_error,
)
from server.services.npzcheck import check_npz_arrays
from server.services.onnx_external import MODEL_DATA_FIELD, inline_external_data
from server.services.sourcefiles import (
    check_onnx_self_contained,
    detect_model_format,
    digest_file,
    onnx_graph_inputs,
    read_onnx,
)
from server.services.version_metadata import (
    UndeclaredInputsError,
    VersionMetadata,
    parse_metadata,
    semver_key,
)

log = logging.getLogger("modelfleet.registry")

MODEL_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
MODEL_NAME_FIX = (
    "use 1-64 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit"
)


@dataclass(frozen=True)
class UploadedFile:
    """One file field of the multipart request, already spooled to a seekable file."""

    field: str  # model | model_data | calibration | reference
    file: BinaryIO
    filename: str


@dataclass(frozen=True)
class Limits:
    max_model_bytes: int
    max_npz_bytes: int
    max_metadata_bytes: int
    max_npz_unpacked_bytes: int = 1024 * 1024 * 1024


# --------------------------------------------------------------------------- models


def check_model_name(name: str) -> str:
    if not MODEL_NAME_RE.fullmatch(name):
        raise InvalidInputError(f"model name {name!r} is not allowed", field="name",
                                fix=MODEL_NAME_FIX)
    return name


def create_model(
    session: Session, actor: str, *, name: str, description: str = "",
    task: TaskType = TaskType.other, owner: str = "",
) -> tuple[Model, bool]:
    """(model, created). Creating an identical model again returns the existing one."""
    check_model_name(name)
    existing = session.scalars(select(Model).where(Model.name == name)).first()
    if existing is None:
        model = Model(name=name, description=description, task=task, owner=owner,
                      created_by=actor)
        session.add(model)
        audit.record(session, actor, "model.create", name, description=description,
                     task=task.value, owner=owner)
        try:
            session.commit()
            return model, True
        except IntegrityError:  # a concurrent create won the race
            session.rollback()
            existing = session.scalars(select(Model).where(Model.name == name)).one()
    if (existing.description, existing.task, existing.owner) != (description, task, owner):
        raise ConflictError(
            f"model {name!r} already exists with a different description, task or owner",
            field="name", fix="choose another name, or send the same fields to get it back",
        )
    return existing, False


def get_model(session: Session, name: str) -> Model:
    model = session.scalars(select(Model).where(Model.name == name)).first()
    if model is None:
        raise NotFoundError(f"model {name!r} does not exist", field="name",
                            fix="create it with POST /v1/models")
    return model


def list_models(session: Session, *, limit: int = 100, offset: int = 0) -> list[Model]:
    return list(session.scalars(select(Model).order_by(Model.name).limit(limit).offset(offset)))


def version_counts(session: Session, model_ids: list[int]) -> dict[int, int]:
    rows = session.execute(
        select(ModelVersion.model_id, func.count()).where(ModelVersion.model_id.in_(model_ids))
        .group_by(ModelVersion.model_id)
    )
    return {model_id: count for model_id, count in rows}


# --------------------------------------------------------------------------- versions


def _version_query(model_id: int) -> Select[ModelVersion]:
    return (
        select(ModelVersion).where(ModelVersion.model_id == model_id)
        .options(selectinload(ModelVersion.uploads), selectinload(ModelVersion.builds))
    )


def get_version(session: Session, model_name: str, version: str) -> ModelVersion:
    model = get_model(session, model_name)
    row: ModelVersion | None = session.scalars(
        _version_query(model.id).where(ModelVersion.version == version)
    ).first()
    if row is None:
        raise NotFoundError(f"model {model_name!r} has no version {version!r}", field="version",
                            fix=f"list versions with GET /v1/models/{model_name}/versions")
    return row


def list_versions(session: Session, model_name: str) -> list[ModelVersion]:
    """Newest semantic version first."""
    model = get_model(session, model_name)
    rows = list(session.scalars(_version_query(model.id)))
    return sorted(rows, key=lambda v: semver_key(v.version), reverse=True)


def _metadata(raw: str, model_file: UploadedFile | None, limits: Limits) -> VersionMetadata:
    """Parsed metadata; without `inputs`, an ONNX model's graph is read (within the model
    size cap) so the 422 lists its inputs and a template to declare them."""
    try:
        return parse_metadata(raw, max_bytes=limits.max_metadata_bytes)
    except UndeclaredInputsError as e:
        if model_file is None:
            raise
        digest_file(model_file.file, field=model_file.field, max_bytes=limits.max_model_bytes)
        if detect_model_format(model_file.file) != "onnx":
            raise
        raise undeclared_inputs_error(onnx_graph_inputs(read_onnx(model_file.file)),
                                      e) from None


def _fingerprint(metadata: dict[str, Any], digests: dict[str, str]) -> dict[str, Any]:
    return {"metadata": metadata, "files": dict(sorted(digests.items()))}


def _existing_fingerprint(version: ModelVersion) -> dict[str, Any]:
    return _fingerprint(version.metadata_json, {u.kind.value: u.sha256 for u in version.uploads})


def upload_version(
    session: Session,
    store: BlobStore,
    queue: JobQueue,
    actor: str,
    *,
    model_name: str,
    metadata_raw: str,
    files: list[UploadedFile],
    limits: Limits,
    content_keys: ContentKeys | None = None,
) -> tuple[ModelVersion, bool]:
    """(version, created). Identical re-upload → (existing, False); a different file or
    metadata under an existing version → ConflictError. Raises InvalidInputError,
    UnsupportedFileError, PayloadTooLargeError, NotFoundError; blob store errors pass up.
    An ONNX model's external-data file (`model_data`) is inlined first: the version's
    source is the single-file model."""
    if any(f.field == MODEL_DATA_FIELD for f in files):
        with tempfile.TemporaryFile() as merged:
            return upload_version(
                session, store, queue, actor, model_name=model_name,
                metadata_raw=metadata_raw, files=_with_data_inlined(files, merged, limits),
                limits=limits, content_keys=content_keys)
    model = get_model(session, model_name)
    by_field = {f.field: f for f in files}
    meta = _metadata(metadata_raw, by_field.get(UploadKind.model.value), limits)
    if UploadKind.model.value not in by_field:
        raise InvalidInputError("file field 'model' is missing", field="model",
                                fix="attach the model file as multipart field 'model'")

    digests: dict[str, str] = {}
    lengths: dict[str, int] = {}
    formats: dict[str, str] = {}
    for f in files:
        cap = limits.max_model_bytes if f.field == UploadKind.model.value else limits.max_npz_bytes
        d = digest_file(f.file, field=f.field, max_bytes=cap)
        if f.field == UploadKind.model.value:
            formats[f.field] = detect_model_format(f.file)
            if formats[f.field] == "onnx":
                parsed = read_onnx(f.file)
                check_onnx_self_contained(parsed)
                graph = onnx_graph_inputs(parsed)
                del parsed  # the size of the file: not kept while the upload is stored
                check_input_names(meta.inputs, graph)
                check_declared_inputs(meta.inputs, graph)
        else:
            check_npz_arrays(f.file, field=f.field, inputs=meta.inputs,
                             max_unpacked_bytes=limits.max_npz_unpacked_bytes)
            formats[f.field] = "npz"
        digests[f.field], lengths[f.field] = d.sha256, d.length
    metadata_json = meta.model_dump()
    wanted = _fingerprint(metadata_json, digests)

    existing = session.scalars(
        _version_query(model.id).where(ModelVersion.version == meta.version)
    ).first()
    if existing is not None:
        return _idempotent(existing, wanted, model_name, queue), False

    seal_key = None
    if meta.protected:  # even the sources rest sealed (docs/security.md)
        if content_keys is None:
            raise InvalidInputError(
                "this server cannot protect versions (no content-key store)",
                field="metadata.protected", fix="upload without \"protected\"")
        seal_key = sealed.new_key()
    keys: list[str] = []
    try:
        for f in files:
            key = source_key(model.name, meta.version, f.field)
            # Key first: if put fails midway the store has published nothing, and deleting
            # a key that was never written is harmless.
            keys.append(key)
            put_source(store, key, f.file, lengths[f.field], digests[f.field], seal_key)
        crashpoints.reached("upload.blobs_written")
        version = ModelVersion(
            model_id=model.id, version=meta.version, state=VersionState.uploaded,
            metadata_json=metadata_json, source_format=formats["model"], created_by=actor,
            protected=meta.protected,
        )
        session.add(version)
        session.flush()
        if seal_key is not None and content_keys is not None:
            content_keys.store(session, version.id, seal_key)
        for f, key in zip(files, keys, strict=True):
            session.add(SourceUpload(
                version_id=version.id, kind=UploadKind(f.field), filename=f.filename[:255],
                format=formats[f.field], sha256=digests[f.field], length=lengths[f.field],
                blob_key=key,
            ))
        for platform, settings in meta.platforms.items():
            for variant in meta.variants:
                session.add(Build(version_id=version.id, platform=platform, variant=variant,
                                  compile_settings=settings))
        audit.record(session, actor, "version.upload", f"{model.name}/{meta.version}",
                     sha256=digests["model"], length=lengths["model"], format=formats["model"],
                     platforms=sorted(meta.platforms), variants=meta.variants)
        session.commit()
    except IntegrityError:
        # A concurrent upload of the same version committed first: ours must leave no trace.
        session.rollback()
        _delete_quietly(store, keys)
        winner = session.scalars(
            _version_query(model.id).where(ModelVersion.version == meta.version)
        ).one()
        return _idempotent(winner, wanted, model_name, queue), False
    except BaseException:
        session.rollback()
        _delete_quietly(store, keys)
        raise
    crashpoints.reached("upload.committed")
    _enqueue(queue, version.id)
    return get_version(session, model_name, meta.version), True


def _with_data_inlined(files: list[UploadedFile], out: BinaryIO,
                       limits: Limits) -> list[UploadedFile]:
    """`files` with the ONNX `model` and its `model_data` replaced by one self-contained
    model written to `out`. The two together stay within the model cap."""
    by_field = {f.field: f for f in files}
    model = by_field.get(UploadKind.model.value)
    if model is None:
        raise InvalidInputError("file field 'model' is missing", field="model",
                                fix="attach the model file as multipart field 'model'")
    graph_bytes = digest_file(model.file, field="model", max_bytes=limits.max_model_bytes).length
    data = by_field[MODEL_DATA_FIELD]
    digest_file(data.file, field=MODEL_DATA_FIELD,
                max_bytes=max(limits.max_model_bytes - graph_bytes, 0))
    if detect_model_format(model.file) != "onnx":
        raise InvalidInputError(
            f"file field {MODEL_DATA_FIELD!r} is an ONNX model's external-data file, but "
            "'model' is not an ONNX model", field=MODEL_DATA_FIELD,
            fix="upload a .pt2 or TorchScript file alone")
    parsed = read_onnx(model.file)
    inline_external_data(parsed, data.file, max_bytes=limits.max_model_bytes)
    out.write(parsed.SerializeToString())
    del parsed
    out.seek(0)
    inlined = UploadedFile(field=UploadKind.model.value, file=out, filename=model.filename)
    return [inlined if f is model else f for f in files if f is not data]


def _idempotent(existing: ModelVersion, wanted: dict[str, Any], model_name: str,
                queue: JobQueue) -> ModelVersion:
    have = _existing_fingerprint(existing)
    if have != wanted:
        what = "model file" if have["files"].get("model") != wanted["files"].get("model") else (
            "calibration/reference files" if have["files"] != wanted["files"] else "metadata")
        raise ConflictError(
            f"version {existing.version} of {model_name!r} already exists with a different "
            f"{what} (model sha256 {have['files'].get('model')})",
            field="metadata.version",
            fix="versions are immutable: upload under a new version number",
        )
    if existing.state == VersionState.uploaded:
        _enqueue(queue, existing.id)  # an earlier enqueue may have been lost; it is idempotent
    return existing


def _enqueue(queue: JobQueue, version_id: int) -> None:
    try:
        queue.enqueue_compile(version_id)
    except Exception:
        # The version is committed in state `uploaded`; a re-upload or the worker's sweep
        # enqueues it again. Failing the request now would make the client retry for nothing.
        log.exception("could not enqueue compile of version %s", version_id)


def put_source(store: BlobStore, key: str, file: BinaryIO, length: int, sha256: str,
               seal_key: bytes | None) -> None:
    """Stores an uploaded file as given, or sealed under `seal_key` (a protected version)."""
    if seal_key is None:
        store.put(key, file, max_bytes=length, expected_sha256=sha256)
        return
    file.seek(0)
    with tempfile.TemporaryFile() as out:
        done = sealed.seal_file(seal_key, file, out)
        if done[:2] != (sha256, length):
            raise ConflictError(f"the upload of {key} changed while it was sealed",
                                fix="upload again")
        out.seek(0)
        store.put(key, out, max_bytes=done[3], expected_sha256=done[2])


def _delete_quietly(store: BlobStore, keys: list[str]) -> None:
    for key in keys:
        try:
            store.delete(key)
        except Exception:
            log.exception("could not delete blob %s of a failed upload", key)
