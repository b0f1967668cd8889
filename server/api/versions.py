"""`/v1/models/{name}/versions`: upload a version (multipart), list and get versions."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Path, Response, UploadFile
from pydantic import BaseModel, Field

from server.api.deps import (
    BlobStoreDep,
    JobQueueDep,
    PublisherDep,
    PublishPrincipal,
    SessionDep,
    SettingsDep,
    StrictQuery,
)
from server.api.errors import (
    AUTH_ERRORS,
    CONFLICT,
    INVALID,
    NOT_FOUND,
    STORAGE_FULL,
    TOO_LARGE,
    UNAVAILABLE,
    UNSUPPORTED,
)
from server.api.models import ModelName
from server.db.models import BuildState, ModelVersion, PatchJobState, VersionState
from server.services import registry
from server.services.registry import Limits, UploadedFile

router = APIRouter(
    prefix="/v1/models/{name}/versions", tags=["versions"], dependencies=[StrictQuery]
)

VersionStr = Annotated[str, Path(min_length=1, max_length=64)]

METADATA_HELP = (
    'JSON: {"version": "1.0.0", "platforms": ["onnx", "coreml"] or {"qnn": {"soc_model": '
    '"60"}}, "inputs": [{"name": "image", "dtype": "float32", "shape": [1, 3, 224, 224]}] — '
    'or per variant: "shapes": {"360p": [1, 3, 360, 640], "720p": [1, 3, 720, 1280]}, '
    '"notes": "…"}'
)


class UploadPublic(BaseModel):
    kind: str
    filename: str
    format: str
    sha256: str
    length: int


class BuildPublic(BaseModel):
    platform: str
    variant: str
    state: BuildState
    attempts: int
    error: str


class PatchesPublic(BaseModel):
    """The version's delta-patch job: made before the version turns ready (from the versions
    published before it) and again when a rollout starts. `failed` never holds the release
    back: devices download the full artifact."""

    state: PatchJobState
    patches: int = Field(description="patches to this version's artifacts")
    attempts: int
    error: str


class VersionPublic(BaseModel):
    model: str
    version: str
    state: VersionState
    source_format: str
    sha256: str  # of the source model file
    length: int
    platforms: dict[str, dict[str, Any]]
    inputs: list[dict[str, Any]]
    variants: list[str]
    notes: str
    uploads: list[UploadPublic]
    builds: list[BuildPublic]
    failed_platforms: list[str] = Field(
        default_factory=list, description="platforms with a failed build")
    can_release_what_passed: bool = Field(
        default=False, description="failed, but its portable onnx build passed: a rollout "
        "with allow_failed_platforms=true may release it (failed platforms get onnx)")
    error: str
    created_at: datetime
    updated_at: datetime
    created_by: str
    patches: PatchesPublic | None = Field(
        default=None, description="its delta-patch job; null when none was needed yet")


class VersionList(BaseModel):
    versions: list[VersionPublic]


def to_public(model_name: str, v: ModelVersion) -> VersionPublic:
    source = next(u for u in v.uploads if u.kind.value == "model")
    meta = v.metadata_json
    failed = sorted({b.platform for b in v.builds if b.state is BuildState.failed})
    passed = {b.platform for b in v.builds if b.state is BuildState.succeeded}
    return VersionPublic(
        model=model_name, version=v.version, state=v.state, source_format=v.source_format,
        sha256=source.sha256, length=source.length, platforms=meta["platforms"],
        inputs=meta["inputs"], variants=meta["variants"], notes=meta.get("notes", ""),
        uploads=[UploadPublic(kind=u.kind.value, filename=u.filename, format=u.format,
                              sha256=u.sha256, length=u.length)
                 for u in sorted(v.uploads, key=lambda u: u.kind.value)],
        builds=[BuildPublic(platform=b.platform, variant=b.variant, state=b.state,
                            attempts=b.attempts, error=b.error)
                for b in sorted(v.builds, key=lambda b: (b.platform, b.variant))],
        failed_platforms=failed, can_release_what_passed=(
            v.state is VersionState.failed and "onnx" in passed and "onnx" not in failed),
        error=v.error, created_at=v.created_at, updated_at=v.updated_at,
        created_by=v.created_by, patches=None if (job := v.patch_job) is None else PatchesPublic(
            state=job.state, patches=job.patches_added, attempts=job.attempts, error=job.error),
    )


@router.post("", status_code=201, responses={
    200: {"model": VersionPublic, "description": "Identical version already existed"},
    **AUTH_ERRORS, **NOT_FOUND, **CONFLICT, **INVALID, **TOO_LARGE, **UNSUPPORTED,
    **UNAVAILABLE, **STORAGE_FULL,
})
def upload_version(
    name: ModelName,
    model: Annotated[UploadFile, File(description="ONNX, .pt2 or TorchScript file")],
    metadata: Annotated[str, Form(min_length=2, description=METADATA_HELP)],
    session: SessionDep,
    store: BlobStoreDep,
    queue: JobQueueDep,
    settings: SettingsDep,
    publisher: PublisherDep,
    principal: PublishPrincipal,
    response: Response,
    calibration: Annotated[UploadFile | None, File(description="Calibration inputs (.npz)")]
    = None,
    reference: Annotated[UploadFile | None, File(description="Reference inputs (.npz)")]
    = None,
    model_data: Annotated[UploadFile | None, File(
        description="The ONNX model's external-data file (e.g. model.onnx.data), when its "
        "weights are kept beside the .onnx; stored inlined into one file")] = None,
) -> VersionPublic:
    """Uploads a model version (scope `publish`) and queues its compile jobs: one build per
    platform × shape variant. The same files and metadata again return the existing version
    with 200; anything different under an existing version number is a 409."""
    files = [UploadedFile(field="model", file=model.file, filename=model.filename or "")]
    for field, upload in (("calibration", calibration), ("reference", reference),
                          ("model_data", model_data)):
        if upload is not None:
            files.append(UploadedFile(field=field, file=upload.file,
                                      filename=upload.filename or ""))
    version, created = registry.upload_version(
        session, store, queue, principal.actor, model_name=name, metadata_raw=metadata,
        files=files, limits=Limits(settings.max_model_bytes, settings.max_npz_bytes,
                                   settings.max_metadata_bytes,
                                   max_npz_unpacked_bytes=settings.max_npz_unpacked_bytes),
        content_keys=publisher.content_keys,
    )
    if not created:
        response.status_code = 200
    return to_public(name, version)


@router.get("", responses={**NOT_FOUND})
def list_versions(name: ModelName, session: SessionDep) -> VersionList:
    """Versions of a model, newest semantic version first, each with its `state`."""
    return VersionList(versions=[to_public(name, v) for v in registry.list_versions(session, name)])


@router.get("/{version}", responses={**NOT_FOUND})
def get_version(name: ModelName, version: VersionStr, session: SessionDep) -> VersionPublic:
    """One version with its `state` (uploaded → compiling → [patching →] ready | failed),
    builds and delta-patch job."""
    return to_public(name, registry.get_version(session, name, version))
