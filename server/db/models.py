"""Every table of the release backend, as SQLAlchemy 2 declarative models.

Owned here so one migration history covers the whole system; later areas (compile jobs,
publishing, rollout control, telemetry) fill these tables rather than adding parallel ones.
Lifecycle states are enums with checked transitions (`ModelVersion.transition`,
`Build.transition`, `PatchJob.transition`, `Release.transition`; the state machines are
server/db/states.py). Enums are stored as short strings (not native
database enums) so adding a state later needs no ALTER TYPE on PostgreSQL.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Enum,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# The state machines live in server.db.states; re-exported for the models' users.
from server.db.states import BUILD_TRANSITIONS as BUILD_TRANSITIONS
from server.db.states import PATCH_JOB_TRANSITIONS as PATCH_JOB_TRANSITIONS
from server.db.states import RELEASE_TRANSITIONS as RELEASE_TRANSITIONS
from server.db.states import VERSION_TRANSITIONS as VERSION_TRANSITIONS
from server.db.states import BuildState as BuildState
from server.db.states import InvalidTransitionError as InvalidTransitionError
from server.db.states import PatchJobState as PatchJobState
from server.db.states import ReleaseState as ReleaseState
from server.db.states import State
from server.db.states import VersionState as VersionState
from server.db.states import check_transition as _check
from server.db.types import UTCDateTime, utcnow

# Deterministic constraint names so migrations can refer to them on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _enum(cls: type[enum.Enum]) -> Enum:
    return Enum(
        cls,
        native_enum=False,
        create_constraint=False,
        length=32,
        values_callable=lambda e: [m.value for m in e],
        validate_strings=True,
    )


class LeasedJob(Generic[State]):
    """The columns every leased job table shares (builds, patch jobs, and the jobs to come):
    `server/jobs/lease.py` claims, heartbeats, backs off and settles rows through them. Each
    table adds its own `state` column (an enum with `queued` and `running`) and checked
    `transition`."""

    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    locked_by: Mapped[str | None] = mapped_column(String(128), nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    error: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)

    if TYPE_CHECKING:  # declared by each table (`state` with its own enum)
        __tablename__: str
        id: Mapped[int]
        state: Mapped[State]

        def transition(self, new: State) -> None: ...


# --------------------------------------------------------------------------- registry


class TaskType(enum.StrEnum):
    classification = "classification"
    other = "other"


class Model(Base):
    __tablename__ = "models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    task: Mapped[TaskType] = mapped_column(_enum(TaskType), default=TaskType.other)
    owner: Mapped[str] = mapped_column(String(128), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    created_by: Mapped[str] = mapped_column(String(128), default="")

    versions: Mapped[list[ModelVersion]] = relationship(back_populates="model")


class ModelVersion(Base):
    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("model_id", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"), index=True)
    version: Mapped[str] = mapped_column(String(64))
    state: Mapped[VersionState] = mapped_column(_enum(VersionState), default=VersionState.uploaded)
    # Validated upload metadata as given (platforms with compile settings, inputs, notes).
    metadata_json: Mapped[dict[str, Any]] = mapped_column(JSON)
    source_format: Mapped[str] = mapped_column(String(16))  # onnx | pt2 | torchscript
    error: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)
    created_by: Mapped[str] = mapped_column(String(128), default="")
    # Protected (docs/security.md): its artifacts and patches are stored and served sealed
    # under its content key (ContentKey), given only to devices the rule offers it to.
    protected: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())

    model: Mapped[Model] = relationship(back_populates="versions")
    uploads: Mapped[list[SourceUpload]] = relationship(back_populates="version")
    builds: Mapped[list[Build]] = relationship(back_populates="version")
    # Its delta-patch job, if one was ever requested (read-only here: patch_runner writes it).
    patch_job: Mapped[PatchJob | None] = relationship(viewonly=True, uselist=False)

    def transition(self, new: VersionState) -> None:
        _check("model version", VERSION_TRANSITIONS, self.state, new)
        self.state = new


class UploadKind(enum.StrEnum):
    model = "model"
    calibration = "calibration"
    reference = "reference"


class SourceUpload(Base):
    """One uploaded file of a version: the source model, and optional calibration/reference."""

    __tablename__ = "source_uploads"
    __table_args__ = (UniqueConstraint("version_id", "kind"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"), index=True)
    kind: Mapped[UploadKind] = mapped_column(_enum(UploadKind))
    filename: Mapped[str] = mapped_column(String(255), default="")
    format: Mapped[str] = mapped_column(String(16))  # onnx | pt2 | torchscript | npz
    sha256: Mapped[str] = mapped_column(String(64))
    length: Mapped[int] = mapped_column(BigInteger)
    blob_key: Mapped[str] = mapped_column(String(512))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    version: Mapped[ModelVersion] = relationship(back_populates="uploads")


# --------------------------------------------------------------------------- compile


class Build(LeasedJob[BuildState], Base):
    """One compile of a version for one platform and one input-shape variant."""

    __tablename__ = "builds"
    __table_args__ = (
        UniqueConstraint("version_id", "platform", "variant"),
        Index("ix_builds_state_next_attempt_at", "state", "next_attempt_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"), index=True)
    platform: Mapped[str] = mapped_column(String(32))
    variant: Mapped[str] = mapped_column(String(64))
    state: Mapped[BuildState] = mapped_column(_enum(BuildState), default=BuildState.queued)
    compile_settings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    log: Mapped[str] = mapped_column(Text, default="")
    gates_report: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    version: Mapped[ModelVersion] = relationship(back_populates="builds")

    def transition(self, new: BuildState) -> None:
        _check("build", BUILD_TRANSITIONS, self.state, new)
        self.state = new


class Artifact(Base):
    """A compiled, packed, gated model file ready to be offered to devices."""

    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("version_id", "platform", "variant"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"), index=True)
    build_id: Mapped[int | None] = mapped_column(ForeignKey("builds.id"), nullable=True)
    platform: Mapped[str] = mapped_column(String(32))
    variant: Mapped[str] = mapped_column(String(64))
    format: Mapped[str] = mapped_column(String(32))
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    length: Mapped[int] = mapped_column(BigInteger)
    blob_key: Mapped[str] = mapped_column(String(512))
    target: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    compile_settings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # A protected version's artifact: sha256/length above are the sealed bytes'; these the
    # plaintext's (NULL: stored in the clear).
    plain_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    plain_length: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # A watermarked version's artifact: the row above is cohort 0's copy (what an SDK that
    # predates cohorts takes), `cohorts` every cohort's, and this the private blob of the
    # unmarked artifact that `modelfleet watermark identify` compares a leak with (sealed
    # like the artifact when the version is protected). NULL: not watermarked.
    unmarked_blob_key: Mapped[str | None] = mapped_column(String(512), nullable=True)
    # The compressed copy the manifest offers beside it (manifests/compressed.py; sealed like
    # the artifact when protected), served at v1/artifacts/<compressed_sha256>. NULL: none
    # (compression would not save enough, or built before copies existed).
    compressed_codec: Mapped[str | None] = mapped_column(String(16), nullable=True)
    compressed_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    compressed_length: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    compressed_blob_key: Mapped[str | None] = mapped_column(String(512), nullable=True)
    cohorts: Mapped[list[CohortArtifact]] = relationship(
        order_by="CohortArtifact.cohort", cascade="all, delete-orphan")


class CohortArtifact(Base):
    """One watermark cohort's copy of an artifact (server/compile/cohorts.py), served like an
    artifact at v1/artifacts/<sha256>."""

    __tablename__ = "cohort_artifacts"
    __table_args__ = (UniqueConstraint("artifact_id", "cohort"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    artifact_id: Mapped[int] = mapped_column(ForeignKey("artifacts.id"), index=True)
    cohort: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    length: Mapped[int] = mapped_column(BigInteger)
    blob_key: Mapped[str] = mapped_column(String(512))
    plain_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    plain_length: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # This cohort's compressed copy (as on Artifact).
    compressed_codec: Mapped[str | None] = mapped_column(String(16), nullable=True)
    compressed_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    compressed_length: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    compressed_blob_key: Mapped[str | None] = mapped_column(String(512), nullable=True)


class CohortPatch(Base):
    """A delta to one cohort's copy from what a device of that cohort may hold: the same
    cohort's copy of an earlier version, or an unwatermarked earlier artifact
    (server/publish/patches.py)."""

    __tablename__ = "cohort_patches"
    __table_args__ = (UniqueConstraint("to_cohort_artifact_id", "from_sha256"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    to_cohort_artifact_id: Mapped[int] = mapped_column(ForeignKey("cohort_artifacts.id"),
                                                       index=True)
    from_sha256: Mapped[str] = mapped_column(String(64))  # the base as the device holds it
    algorithm: Mapped[str] = mapped_column(String(32))
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    length: Mapped[int] = mapped_column(BigInteger)
    blob_key: Mapped[str] = mapped_column(String(512))


class ContentKey(Base):
    """A protected version's content key, wrapped (XSalsa20-Poly1305 secretbox) under the
    server's key-encryption key (server/services/protection.py); never stored in the clear."""

    __tablename__ = "content_keys"

    version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"), primary_key=True)
    wrapped: Mapped[bytes] = mapped_column(LargeBinary)
    kek_id: Mapped[str] = mapped_column(String(64))  # sha256 hex of the wrapping key, first 16
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Patch(Base):
    """A delta from one artifact to another (same platform and variant)."""

    __tablename__ = "patches"
    # One patch per (base, target) pair, whatever its algorithm: a repeated or concurrent
    # patch job (server/jobs/patch_runner.py) can then never list a pair twice.
    __table_args__ = (UniqueConstraint("from_artifact_id", "to_artifact_id",
                                       name="uq_patches_pair"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    from_artifact_id: Mapped[int] = mapped_column(ForeignKey("artifacts.id"), index=True)
    to_artifact_id: Mapped[int] = mapped_column(ForeignKey("artifacts.id"), index=True)
    algorithm: Mapped[str] = mapped_column(String(32))  # bsdiff4 | mfdelta1
    sha256: Mapped[str] = mapped_column(String(64))
    length: Mapped[int] = mapped_column(BigInteger)
    blob_key: Mapped[str] = mapped_column(String(512))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class PatchJob(LeasedJob[PatchJobState], Base):
    """The durable request to make the delta patches to one version's artifacts (one row per
    version; server/jobs/patch_runner.py claims, runs and settles it like a build)."""

    __tablename__ = "patch_jobs"
    __table_args__ = (Index("ix_patch_jobs_state_next_attempt_at", "state", "next_attempt_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"), unique=True)
    state: Mapped[PatchJobState] = mapped_column(_enum(PatchJobState),
                                                 default=PatchJobState.queued)
    # Counts enqueues; a claim copies it to `requests_claimed`. A run that ends with more
    # requests than it claimed goes back to queued (newer bases may have been published).
    requests: Mapped[int] = mapped_column(Integer, default=1)
    requests_claimed: Mapped[int] = mapped_column(Integer, default=0)
    patches_added: Mapped[int] = mapped_column(Integer, default=0)

    def transition(self, new: PatchJobState) -> None:
        _check("patch job", PATCH_JOB_TRANSITIONS, self.state, new)
        self.state = new


# --------------------------------------------------------------------------- rollout


class Channel(Base):
    __tablename__ = "channels"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    # Only reports of attested devices count on this channel (server/services/fleet/
    # attestation.py); off by default.
    require_attestation: Mapped[bool] = mapped_column(Boolean, default=False,
                                                      server_default=false())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class RolloutMode(enum.StrEnum):
    active = "active"
    shadow = "shadow"


class Release(Base):
    """A model version offered on a channel under a rollout rule."""

    __tablename__ = "releases"
    __table_args__ = (UniqueConstraint("channel_id", "version_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    channel_id: Mapped[int] = mapped_column(ForeignKey("channels.id"), index=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"), index=True)
    share_ppm: Mapped[int] = mapped_column(Integer, default=0)
    salt: Mapped[str] = mapped_column(String(64))
    mode: Mapped[RolloutMode] = mapped_column(_enum(RolloutMode), default=RolloutMode.active)
    # manifests.Filters minus the device lists: platforms, socs, archs, os_versions, app_versions.
    filters: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # manifests.Filters.device_allow / device_deny (pinning).
    pinned_devices: Mapped[list[str]] = mapped_column(JSON, default=list)
    denied_devices: Mapped[list[str]] = mapped_column(JSON, default=list)
    # Platforms whose build failed, released anyway (rollout `allow_failed_platforms`): the
    # manifest lists them and their devices take the portable ONNX artifact.
    failed_platforms: Mapped[list[str]] = mapped_column(JSON, default=list,
                                                        server_default="[]")
    shadow_max_kl_micro: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    shadow_max_latency_p99_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    shadow_min_samples: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The fleet guard (server/rollouts/guard.py): halt when the failed share of the
    # reporting devices reaches max_fail_share (ppm) among at least min_devices of them.
    guard_min_devices: Mapped[int] = mapped_column(Integer, default=5, server_default="5")
    guard_max_fail_share_ppm: Mapped[int] = mapped_column(Integer, default=200_000,
                                                          server_default="200000")
    guard_max_latency_p99_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    auto_promote: Mapped[bool] = mapped_column(Boolean, default=False,
                                               server_default=false())
    # Promotion evidence (guard.py): at least promote_min_passed offered devices passed
    # (NULL: guard_min_devices), their first passes spread over promote_min_spread_s.
    promote_min_passed: Mapped[int | None] = mapped_column(Integer, nullable=True)
    promote_min_spread_s: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Standings older than this do not count (set when an operator resumes a halt).
    evidence_since: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # The share a halt took away, restored when an operator resumes the rollout.
    share_before_halt_ppm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The ramp schedule (server/rollouts/ramp.py): the shares to step through (ppm), the wait
    # between steps, the index of the step the share is at, and when the next step is due
    # (Unix seconds, the publisher's clock; NULL when no step is left or a manual ramp took
    # over). Empty steps: no schedule.
    ramp_steps_ppm: Mapped[list[int]] = mapped_column(JSON, default=list, server_default="[]")
    ramp_interval_s: Mapped[int | None] = mapped_column(Integer, nullable=True)
    ramp_step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    ramp_next_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True, index=True)
    state: Mapped[ReleaseState] = mapped_column(_enum(ReleaseState), default=ReleaseState.active)
    state_reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)

    def transition(self, new: ReleaseState) -> None:
        _check("release", RELEASE_TRANSITIONS, self.state, new)
        self.state = new


class SignedManifest(Base):
    """Every manifest ever signed for a channel; the highest serial is the current one."""

    __tablename__ = "signed_manifests"
    __table_args__ = (UniqueConstraint("channel_id", "serial"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    channel_id: Mapped[int] = mapped_column(ForeignKey("channels.id"), index=True)
    serial: Mapped[int] = mapped_column(BigInteger)
    blob_key: Mapped[str] = mapped_column(String(512))
    sha256: Mapped[str] = mapped_column(String(64))
    length: Mapped[int] = mapped_column(BigInteger)
    expires: Mapped[int] = mapped_column(BigInteger)  # Unix seconds, as in the document
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class RootDocument(Base):
    """Signed root documents (DSSE envelope bytes), one per root version."""

    __tablename__ = "root_documents"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, unique=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


# --------------------------------------------------------------------------- fleet


class Device(Base):
    """A device of the fleet: enrolled with its own Ed25519 key (server/services/fleet/), kept
    current by its telemetry (last seen, the versions it runs)."""

    __tablename__ = "devices"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    profile: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    first_seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    # Raw 32-byte Ed25519 public key as 64 hex, and its keyid (sha256 hex of the raw key).
    public_key: Mapped[str | None] = mapped_column(String(64), nullable=True)
    keyid: Mapped[str | None] = mapped_column(String(64), nullable=True)
    enrolled_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # {model: version} the device last reported active.
    active_versions: Mapped[dict[str, str]] = mapped_column(JSON, default=dict,
                                                            server_default="{}")
    # The enrolment token that enrolled it (its quota counts these); NULL: an operator's.
    enrolled_by_token_id: Mapped[int | None] = mapped_column(Integer, nullable=True,
                                                             index=True)
    # The attestation provider that vouched for it at enrolment (NULL: not attested).
    attested_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Its X25519 public key (64 hex), enrolled beside the Ed25519 one: protected releases'
    # content keys are sealed to it. NULL: an agent that predates protection.
    box_public_key: Mapped[str | None] = mapped_column(String(64), nullable=True)


class DeviceRelease(Base):
    """One device's standing on one release, from its latest reports: what the rollout health
    and the guard count (each device once)."""

    __tablename__ = "device_releases"
    __table_args__ = (Index("ix_device_releases_release_id_verdict", "release_id", "verdict"),)

    device_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    release_id: Mapped[int] = mapped_column(ForeignKey("releases.id"), primary_key=True)
    # Latest update event (downloaded | verified | activated | rolled_back | failed), its time.
    event: Mapped[str | None] = mapped_column(String(16), nullable=True)
    event_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    downloaded: Mapped[bool] = mapped_column(Boolean, default=False)
    rolled_back: Mapped[bool] = mapped_column(Boolean, default=False)
    # Latest shadow summary: verdict (pending | passed | failed) and its figures.
    verdict: Mapped[str | None] = mapped_column(String(16), nullable=True)
    shadow_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    samples: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    kl_mean_micro: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    kl_max_micro: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    active_p50_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    candidate_p50_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    candidate_p99_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # Server time of the device's first counted passed verdict (the promotion's spread).
    passed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class TelemetryEvent(Base):
    """One report from a device about one release (install status, shadow statistics)."""

    __tablename__ = "telemetry_events"
    __table_args__ = (
        Index("ix_telemetry_events_release_id_received_at", "release_id", "received_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    # The device's random id of the report (32 hex): a report sent twice is stored once.
    report_id: Mapped[str | None] = mapped_column(String(32), nullable=True, unique=True)
    # Not indexed: nothing reads the table by device, and each index is paid per report
    # (migration 0006).
    device_id: Mapped[str] = mapped_column(String(128))
    release_id: Mapped[int | None] = mapped_column(ForeignKey("releases.id"), nullable=True)
    model: Mapped[str] = mapped_column(String(64), default="")
    version: Mapped[str] = mapped_column(String(64), default="")
    kind: Mapped[str] = mapped_column(String(32))  # installed | failed | rolled_back | shadow …
    kl_micro: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    latency_p99_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    samples: Mapped[int | None] = mapped_column(Integer, nullable=True)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # counted | not_offered | forged | unattested (server/services/fleet/standing.py);
    # NULL when the report names no known release.
    standing: Mapped[str | None] = mapped_column(String(16), nullable=True)


# --------------------------------------------------------------------------- access


class ApiToken(Base):
    """An API token; only the sha256 of the secret is stored."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), default="")
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))  # shown in listings to tell tokens apart
    scopes: Mapped[list[str]] = mapped_column(JSON)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # Enrolment limits (server/services/fleet/enrolment.py); NULL: none.
    device_quota: Mapped[int | None] = mapped_column(Integer, nullable=True)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    enroll_per_hour: Mapped[int | None] = mapped_column(Integer, nullable=True)


class AuditEvent(Base):
    """Who did what, when: one row per write."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(128))  # "token:<id>:<name>" or "cli" / "system"
    action: Mapped[str] = mapped_column(String(64))  # e.g. model.create, version.upload
    target: Mapped[str] = mapped_column(String(255), default="")  # e.g. "resnet/1.2.0"
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
