"""Channels and rollout control (scope `rollout`): create channels, start a release on a
channel, ramp, pause, resume, halt (the rollback), pin/unpin devices, preview a rollout.
Every change is audited and answered with the serial of the new signed manifest."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Literal

from fastapi import APIRouter, Path
from pydantic import BaseModel, Field

import manifests
from server.api.deps import (
    JobQueueDep,
    PublisherDep,
    RolloutPrincipal,
    SessionDep,
    SessionFactoryDep,
    TokenPrincipal,
)
from server.api.errors import AUTH_ERRORS, CONFLICT, INVALID, NOT_FOUND
from server.rollouts import channels, preview
from server.rollouts import service as ro
from server.rollouts.channels import ChannelSummary
from server.rollouts.health import RolloutHealth, rollout_health
from server.rollouts.rules import (
    MAX_DEVICE_IDS_PER_LIST,
    MAX_RAMP_STEPS,
    MIN_RAMP_INTERVAL_S,
    RampSchedule,
    RampStatus,
    ppm_to_percentage,
    ramp_schedule,
)

router = APIRouter(prefix="/v1", tags=["rollouts"])

Strings = Annotated[list[Annotated[str, Field(max_length=256)]],
                    Field(max_length=MAX_DEVICE_IDS_PER_LIST)]
RolloutId = Annotated[int, Path(ge=1, le=2**31 - 1)]
ChannelName = Annotated[str, Path(max_length=64)]
Percentage = Annotated[Decimal, Field(description="0–100, at most 4 decimals (1 ppm)")]


class ChannelCreate(BaseModel):
    name: str = Field(max_length=64, examples=["prod"])
    description: str = Field(default="", max_length=2000)


class ChannelPublic(BaseModel):
    name: str
    description: str
    serial: int | None
    manifest_sha256: str | None
    expires: int | None


class FiltersIn(BaseModel):
    platforms: Strings = []
    socs: Strings = []
    archs: Strings = []
    os_versions: Strings = []
    app_versions: Strings = []
    device_allow: Strings = []
    device_deny: Strings = []

    def to_filters(self) -> manifests.Filters:
        return manifests.Filters(**self.model_dump())

    @classmethod
    def of(cls, f: manifests.Filters) -> FiltersIn:
        return cls(**{name: list(getattr(f, name)) for name in manifests.Filters.LISTS})


class ShadowIn(BaseModel):
    max_kl_micro: int = Field(ge=0, le=2**53, description="KL divergence × 10^6")
    max_latency_p99_us: int = Field(ge=0, le=2**53)
    min_samples: int = Field(ge=0, le=2**31)


class GuardIn(BaseModel):
    """When the server halts the rollout by itself (docs/shadow.md "The guard")."""

    min_devices: int = Field(default=5, ge=1, le=1_000_000,
                             description="reporting devices needed before the guard judges")
    max_fail_share: float = Field(default=0.2, ge=0, le=1,
                                  description="halt when failed / reporting reaches this")
    max_latency_p99_us: int | None = Field(
        default=None, ge=0, le=2**53,
        description="a device whose candidate p99 exceeds this counts as failed")
    promote_min_passed: int | None = Field(
        default=None, ge=1, le=1_000_000,
        description="offered devices that passed before promotion or a ramp step "
        "(default: min_devices)")
    promote_min_spread_seconds: int = Field(
        default=0, ge=0, le=90 * 86_400,
        description="the first and last of those passes at least this far apart")

    def rule(self) -> ro.GuardRule:
        return ro.GuardRule(self.min_devices, round(self.max_fail_share * 1_000_000),
                            self.max_latency_p99_us, self.promote_min_passed,
                            self.promote_min_spread_seconds)


class RampScheduleIn(BaseModel):
    """Step the share through `steps` while the rollout is healthy (docs/shadow.md "Ramp
    schedules"): the rollout starts at the first step; each next one follows once
    `interval_seconds` passed since the last step and the guard judges the rollout healthy."""

    steps: list[Percentage] = Field(max_length=MAX_RAMP_STEPS, examples=[[1, 5, 25, 100]],
                                    description=f"2–{MAX_RAMP_STEPS} percentages, strictly "
                                    "increasing, above 0 and at most 100")
    interval_seconds: int = Field(ge=MIN_RAMP_INTERVAL_S, le=2**31 - 1, examples=[3600],
                                  description="wait after each step before the next")

    def schedule(self) -> RampSchedule:
        return ramp_schedule(self.steps, self.interval_seconds)


class RampPublic(BaseModel):
    steps: list[float]
    interval_seconds: int
    step: int = Field(description="1-based: the step the share is at")
    next_step_at: datetime | None = Field(
        description="when the next step is due (taken then if healthy); null when none is "
        "left, a manual ramp took over or the rollout is halted")
    state: str = Field(description="scheduled | waiting_for_promotion (shadow) | paused | "
                       "done | taken_over (a manual ramp cleared the rest) | halted")


class RolloutCreate(BaseModel):
    model: str = Field(max_length=64)
    version: str = Field(max_length=64)
    percentage: Percentage | None = Field(default=None, description="required unless `ramp` "
                                          "is given (then it must equal its first step)")
    mode: str = Field(default="active", description="active | shadow")
    filters: FiltersIn = FiltersIn()
    shadow: ShadowIn | None = None
    allow_failed_platforms: bool = Field(
        default=False,
        description="release a failed version whose portable onnx build passed: devices of "
        "the failed platforms get the onnx artifact (listed as the release's failed_platforms)")
    guard: GuardIn = GuardIn()
    auto_promote: bool = Field(default=False, description="a shadow rollout whose fleet "
                               "verdict passes turns active by itself")
    ramp: RampScheduleIn | None = None

    def spec(self) -> ro.RolloutSpec:
        shadow = None if self.shadow is None else manifests.ShadowThresholds(
            **self.shadow.model_dump())
        return ro.RolloutSpec(self.model, self.version, self.percentage, self.mode,
                              self.filters.to_filters(), shadow, self.allow_failed_platforms,
                              self.guard.rule(), self.auto_promote,
                              None if self.ramp is None else self.ramp.schedule())


class RampIn(BaseModel):
    percentage: Percentage | None = None
    mode: Literal["active"] | None = Field(
        default=None, description='"active" promotes a shadow rollout (devices holding the '
        "candidate swap it in)")


class DeviceCounts(BaseModel):
    offered: int
    downloaded: int
    shadow: int
    passed: int
    failed: int
    active: int
    rolled_back: int
    not_offered: int = Field(default=0, description="devices whose reports were stored but "
                             "not counted: the rule does not offer them the release")
    forged: int = Field(default=0, description="devices whose verdicts contradicted their "
                        "own figures (stored, not counted)")
    unattested: int = Field(default=0, description="devices without the attestation the "
                            "channel requires (stored, not counted)")
    revoked: int = Field(default=0, description="revoked devices: their votes were removed")


class HealthPublic(BaseModel):
    """What the devices reported, each device once (its latest reports)."""

    devices: DeviceCounts
    kl_micro: dict[str, int | None] = Field(description="p50, p99 of the devices' mean KL "
                                            "(×10^6); max of their max")
    latency_p99_us: dict[str, int | None] = Field(
        description="active_p50, candidate_p50 (medians), candidate_p99 (p99 over devices)")
    guard: GuardIn
    auto_promote: bool


class ReasonIn(BaseModel):
    reason: str = Field(default="", max_length=2000)


class PinIn(BaseModel):
    device_ids: Strings
    deny: bool = Field(default=False, description="pin out (deny-list) instead of in")


class RolloutPublic(BaseModel):
    id: int
    channel: str
    model: str
    version: str
    percentage: float
    share_ppm: int
    salt: str
    mode: str
    state: str
    state_reason: str
    filters: FiltersIn
    shadow: ShadowIn | None
    failed_platforms: list[str] = Field(
        default_factory=list, description="platforms released without their build "
        "(allow_failed_platforms); their devices run the portable onnx artifact")
    serial: int | None = Field(description="serial of the manifest this change published "
                               "(null when the change was a no-op)")
    health: HealthPublic | None = Field(default=None, description="GET /v1/rollouts/{id} only")
    ramp: RampPublic | None = Field(default=None, description="its ramp schedule, if any")


class DeviceIn(BaseModel):
    device_id: str = Field(max_length=256)
    platform: str = Field(max_length=64)
    soc: str = Field(default="", max_length=64)
    arch: str = Field(default="", max_length=64)
    os_version: str = Field(default="", max_length=64)
    app_version: str = Field(default="", max_length=64)


class PreviewIn(BaseModel):
    rollout_id: int | None = Field(default=None, ge=1, le=2**31 - 1,
                                   description="preview an existing rollout…")
    model: str | None = Field(default=None, max_length=64, description="…or a proposed one")
    version: str | None = Field(default=None, max_length=64)
    percentage: Percentage | None = None
    filters: FiltersIn = FiltersIn()
    devices: list[DeviceIn] | None = Field(
        default=None, max_length=10_000,
        description="device profiles; omitted = the devices the server has seen")


class PreviewOut(BaseModel):
    total: int
    included: int
    included_share: float
    included_device_ids: list[str] = Field(description="the first 1000 included")
    excluded_device_ids: list[str] = Field(description="the first 1000 excluded")


def _public(view: ro.RolloutView) -> RolloutPublic:
    r = view.record
    return RolloutPublic(
        id=r.id, channel=view.channel, model=r.model, version=r.version,
        percentage=float(ppm_to_percentage(r.share_ppm)), share_ppm=r.share_ppm, salt=r.salt,
        mode=r.mode, state=r.state.value, state_reason=view.state_reason,
        filters=FiltersIn.of(r.filters),
        shadow=None if r.shadow is None else ShadowIn(
            max_kl_micro=r.shadow.max_kl_micro, max_latency_p99_us=r.shadow.max_latency_p99_us,
            min_samples=r.shadow.min_samples),
        failed_platforms=list(r.failed_platforms), serial=view.serial,
        ramp=None if view.ramp is None else _ramp_public(view.ramp),
    )


def _ramp_public(s: RampStatus) -> RampPublic:
    return RampPublic(
        steps=[float(ppm_to_percentage(p)) for p in s.steps_ppm], interval_seconds=s.interval_s,
        step=s.step + 1, state=s.state,
        next_step_at=None if s.next_at is None else datetime.fromtimestamp(s.next_at, UTC))


def _channel_public(c: ChannelSummary) -> ChannelPublic:
    return ChannelPublic(name=c.name, description=c.description, serial=c.serial,
                         manifest_sha256=c.manifest_sha256, expires=c.expires)


@router.post("/channels", status_code=201, responses={**AUTH_ERRORS, **CONFLICT, **INVALID})
def create_channel(body: ChannelCreate, principal: RolloutPrincipal, factory: SessionFactoryDep,
                   pub: PublisherDep) -> ChannelPublic:
    """Create a channel; its first (empty) signed manifest is published at once."""
    return _channel_public(channels.create(factory, pub, body.name,
                                           description=body.description, actor=principal.actor))


@router.get("/channels", responses={**AUTH_ERRORS})
def list_channels(session: SessionDep, _principal: TokenPrincipal) -> list[ChannelPublic]:
    return [_channel_public(c) for c in channels.list_channels(session)]


@router.get("/channels/{channel}/rollouts", responses={**AUTH_ERRORS, **NOT_FOUND})
def list_channel_rollouts(channel: ChannelName, session: SessionDep,
                          _principal: TokenPrincipal) -> list[RolloutPublic]:
    """Every rollout on the channel, newest first."""
    return [_public(v) for v in ro.list_rollouts(session, channel)]


@router.post("/channels/{channel}/publish", responses={**AUTH_ERRORS, **NOT_FOUND})
def republish(channel: ChannelName, principal: RolloutPrincipal, factory: SessionFactoryDep,
              pub: PublisherDep) -> ChannelPublic:
    """Sign the channel again as it stands (new serial, fresh expiry)."""
    return _channel_public(channels.republish(factory, pub, channel, actor=principal.actor))


@router.post("/channels/{channel}/rollouts", status_code=201,
             responses={**AUTH_ERRORS, **NOT_FOUND, **CONFLICT, **INVALID})
def start_rollout(channel: ChannelName, body: RolloutCreate, principal: RolloutPrincipal,
                  factory: SessionFactoryDep, pub: PublisherDep,
                  queue: JobQueueDep) -> RolloutPublic:
    """Start offering a ready model version on the channel to `percentage` of the devices
    that match `filters` (409 if the version is not ready or already on the channel); with
    `ramp`, at its first step, stepping up while healthy."""
    return _public(ro.start_rollout(factory, pub, channel, body.spec(), actor=principal.actor,
                                    patches=queue))


@router.get("/rollouts/{rollout_id}", responses={**AUTH_ERRORS, **NOT_FOUND})
def get_rollout(rollout_id: RolloutId, session: SessionDep,
                _principal: TokenPrincipal) -> RolloutPublic:
    """The rollout with its `health`: devices offered / downloaded / in shadow / passed /
    failed / active / rolled back, divergence and latency distributions, and its guard."""
    public = _public(ro.get_rollout(session, rollout_id))
    public.health = _health(rollout_health(session, rollout_id))
    return public


def _health(h: RolloutHealth) -> HealthPublic:
    return HealthPublic(
        devices=DeviceCounts(offered=h.offered, downloaded=h.downloaded, shadow=h.shadow,
                             passed=h.passed, failed=h.failed, active=h.active,
                             rolled_back=h.rolled_back, revoked=h.revoked, **h.not_counted),
        kl_micro=h.kl_micro, latency_p99_us=h.latency_p99_us,
        guard=GuardIn(min_devices=h.guard.min_devices,
                      max_fail_share=h.guard.max_fail_share_ppm / 1_000_000,
                      max_latency_p99_us=h.guard.max_latency_p99_us,
                      promote_min_passed=h.guard.promote_min_passed,
                      promote_min_spread_seconds=h.guard.promote_min_spread_s),
        auto_promote=h.auto_promote)


@router.patch("/rollouts/{rollout_id}", responses={**AUTH_ERRORS, **NOT_FOUND, **CONFLICT,
                                                    **INVALID})
def ramp_rollout(rollout_id: RolloutId, body: RampIn, principal: RolloutPrincipal,
                 factory: SessionFactoryDep, pub: PublisherDep) -> RolloutPublic:
    """Change the share (ramp up or down; 409 on a halted or paused rollout; it clears the
    rest of a ramp schedule) and/or, with `"mode": "active"`, promote a shadow rollout —
    both in one signed manifest."""
    return _public(ro.update_rollout(factory, pub, rollout_id, percentage=body.percentage,
                                     promote=body.mode == "active", actor=principal.actor))


@router.post("/rollouts/{rollout_id}/pause", responses={**AUTH_ERRORS, **NOT_FOUND, **CONFLICT})
def pause_rollout(rollout_id: RolloutId, principal: RolloutPrincipal,
                  factory: SessionFactoryDep, pub: PublisherDep,
                  body: ReasonIn | None = None) -> RolloutPublic:
    """Freeze the share (still offered); resume before ramping again."""
    return _public(ro.pause_rollout(factory, pub, rollout_id, actor=principal.actor,
                                  reason=body.reason if body else ""))


@router.post("/rollouts/{rollout_id}/resume", responses={**AUTH_ERRORS, **NOT_FOUND, **CONFLICT,
                                                          **INVALID})
def resume_rollout(rollout_id: RolloutId, principal: RolloutPrincipal,
                   factory: SessionFactoryDep, pub: PublisherDep,
                   body: ReasonIn | None = None) -> RolloutPublic:
    """A paused rollout goes on. A halted one is offered again at its share before the
    halt — an operator's call, `reason` required (audited); the guard then counts only
    reports from now on."""
    return _public(ro.resume_rollout(factory, pub, rollout_id, actor=principal.actor,
                                   reason=body.reason if body else ""))


@router.post("/rollouts/{rollout_id}/halt", responses={**AUTH_ERRORS, **NOT_FOUND})
def halt_rollout(rollout_id: RolloutId, principal: RolloutPrincipal,
                 factory: SessionFactoryDep, pub: PublisherDep,
                 body: ReasonIn | None = None) -> RolloutPublic:
    """The rollback: share 0 and no longer offered; devices fall back to the previous fully
    rolled-out release. Halting again is a no-op (`serial` null); an operator may resume
    it (POST …/resume with a reason)."""
    return _public(ro.halt_rollout(factory, pub, rollout_id, actor=principal.actor,
                                 reason=body.reason if body else ""))


@router.post("/rollouts/{rollout_id}/pin", responses={**AUTH_ERRORS, **NOT_FOUND, **CONFLICT,
                                                       **INVALID})
def pin_devices(rollout_id: RolloutId, body: PinIn, principal: RolloutPrincipal,
                factory: SessionFactoryDep, pub: PublisherDep) -> RolloutPublic:
    """Pin devices in (regardless of share and filters) or, with `deny`, out."""
    return _public(ro.pin_devices(factory, pub, rollout_id, body.device_ids, deny=body.deny,
                                  actor=principal.actor))


@router.post("/rollouts/{rollout_id}/unpin", responses={**AUTH_ERRORS, **NOT_FOUND, **INVALID})
def unpin_devices(rollout_id: RolloutId, body: PinIn, principal: RolloutPrincipal,
                  factory: SessionFactoryDep, pub: PublisherDep) -> RolloutPublic:
    """Remove devices from the rollout's allow- and deny-lists."""
    return _public(ro.unpin_devices(factory, pub, rollout_id, body.device_ids,
                                    actor=principal.actor))


@router.post("/channels/{channel}/preview", responses={**AUTH_ERRORS, **NOT_FOUND, **INVALID})
def preview_rollout(channel: ChannelName, body: PreviewIn, session: SessionDep,
                    _principal: RolloutPrincipal) -> PreviewOut:
    """Dry run: which devices (given, or every device the server has seen, newest first, at
    most 100 000) a rollout would reach — by the same rule devices apply."""
    devices = (None if body.devices is None else
               [preview.profile_from_dict(d.device_id, d.model_dump()) for d in body.devices])
    result = preview.preview_rollout(
        session, channel, rollout_id=body.rollout_id, model=body.model, version=body.version,
        percentage=body.percentage, filters=body.filters.to_filters(), devices=devices)
    share = len(result.included) / result.total if result.total else 0.0
    return PreviewOut(total=result.total, included=len(result.included), included_share=share,
                      included_device_ids=result.included[:1000],
                      excluded_device_ids=result.excluded[:1000])
