"""The rollout service: every change to a release on a channel, each one audited and
published as ONE new signed manifest in the same transaction (publisher.publish_change) — a
start that creates its channel too, a PATCH that promotes and ramps at once.

Used by the HTTP API (server/api/rollouts.py), by the guard's automatic halt and promotion
(server/rollouts/guard.py: `halt_rollout(..., actor="system", reason=...)`) and by the
ramp step (server/rollouts/ramp.py reads `get_rollout`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

import manifests
from server.db import audit
from server.db import models as db
from server.db.types import utcnow
from server.jobs.interface import JobQueue
from server.observability.metrics import count_halt
from server.publish.errors import ChannelNotFoundError
from server.publish.publisher import (
    Audited,
    PublishedManifest,
    Publisher,
    publish_change,
    release_record,
)
from server.publish.records import RolloutRecord, filters_to_columns
from server.rollouts import rules
from server.rollouts.channels import open_or_create
from server.rollouts.errors import (
    InvalidRolloutError,
    RolloutExistsError,
    RolloutNotFoundError,
    RolloutStateError,
    VersionNotFoundError,
    VersionNotReadyError,
)

log = logging.getLogger("modelfleet.rollouts")


@dataclass(frozen=True)
class RolloutView:
    """A rollout as the API shows it, with the manifest serial the change produced."""

    record: RolloutRecord
    channel: str
    state_reason: str
    serial: int | None
    ramp: rules.RampStatus | None = None  # its ramp schedule, when it has one


@dataclass(frozen=True)
class GuardRule:
    """When the server halts a release by itself (docs/shadow.md "The guard"): the failed
    share of the reporting devices reaches `max_fail_share_ppm` among at least
    `min_devices`; a device whose candidate p99 passes `max_latency_p99_us` counts as failed."""

    min_devices: int = 5
    max_fail_share_ppm: int = 200_000
    max_latency_p99_us: int | None = None
    # Promotion (and each ramp step) needs more than a halt: at least this many offered
    # devices that passed (None: min_devices), their first passes spread over at least
    # promote_min_spread_s seconds, and no unexplained failure (docs/shadow.md).
    promote_min_passed: int | None = None
    promote_min_spread_s: int = 0

    @property
    def min_passed(self) -> int:
        return self.min_devices if self.promote_min_passed is None else self.promote_min_passed


@dataclass(frozen=True)
class RolloutSpec:
    """A request to start a release on a channel (validated by `start_rollout`)."""

    model: str
    version: str
    # None: start at the ramp schedule's first step (then `ramp` is required).
    percentage: Decimal | int | float | str | None
    mode: str = "active"
    filters: manifests.Filters = field(default_factory=manifests.Filters)
    shadow: manifests.ShadowThresholds | None = None
    # Release a version whose portable ONNX artifact passed although other platforms failed;
    # devices of the failed platforms get the portable artifact. Never implied.
    allow_failed_platforms: bool = False
    guard: GuardRule = field(default_factory=GuardRule)
    # A shadow release whose fleet verdict passes turns active by itself (server guard).
    auto_promote: bool = False
    # Step the share through this schedule while the rollout is healthy (server/rollouts/ramp.py).
    ramp: rules.RampSchedule | None = None


def version_row(session: Session, model: str, version: str) -> db.ModelVersion:
    row = session.scalars(
        select(db.ModelVersion).join(db.Model)
        .where(db.Model.name == model, db.ModelVersion.version == version)
    ).first()
    if row is None:
        raise VersionNotFoundError(
            f"model {model!r} has no version {version!r}",
            fix="check the names with GET /v1/models/{model}/versions",
        )
    return row


def _platforms(session: Session, version_id: int) -> set[str]:
    return set(session.scalars(
        select(db.Artifact.platform).where(db.Artifact.version_id == version_id)
    ))



def _release(session: Session, rollout_id: int) -> db.Release:
    row = session.get(db.Release, rollout_id)
    if row is None:
        raise RolloutNotFoundError(
            f"no rollout with id {rollout_id}", fix="list them with GET /v1/channels/{channel}"
        )
    return row


def _names(session: Session, release: db.Release) -> tuple[str, str, str]:
    version = session.get(db.ModelVersion, release.version_id)
    assert version is not None
    model = session.get(db.Model, version.model_id)
    channel = session.get(db.Channel, release.channel_id)
    assert model is not None and channel is not None
    return channel.name, model.name, version.version


def get_rollout(session: Session, rollout_id: int) -> RolloutView:
    release = _release(session, rollout_id)
    channel, model, version = _names(session, release)
    return RolloutView(release_record(release, model, version), channel,
                       release.state_reason, None, ramp_status_of(release))


def ramp_status_of(release: db.Release) -> rules.RampStatus | None:
    return rules.ramp_status(release.ramp_steps_ppm or [], release.ramp_interval_s,
                             release.ramp_step, release.ramp_next_at, release.state,
                             release.mode is db.RolloutMode.shadow)


def failed_platforms(session: Session, version_id: int) -> list[str]:
    """Platforms with a failed build of this version, sorted."""
    return sorted(set(session.scalars(
        select(db.Build.platform).where(db.Build.version_id == version_id,
                                        db.Build.state == db.BuildState.failed))))


def _ready_version(session: Session, spec: RolloutSpec) -> tuple[db.ModelVersion, list[str]]:
    """The version to start and the failed platforms released with it (empty unless the
    request opted in), if it may be released and the filters fit its artifacts."""
    version = version_row(session, spec.model, spec.version)
    failed: list[str] = []
    if version.state is db.VersionState.failed:
        failed = failed_platforms(session, version.id)
        _check_release_what_passed(session, spec, version, failed)
    elif version.state is not db.VersionState.ready:
        raise VersionNotReadyError(
            f"{spec.model} {spec.version} is {version.state.value}, not ready",
            fix="wait for its builds to finish (GET its version) or fix the failed ones",
        )
    platforms = _platforms(session, version.id)
    if not platforms:
        raise VersionNotReadyError(
            f"{spec.model} {spec.version} has no artifacts to offer",
            fix="check its builds: every platform failed or was gated out",
        )
    # Filters may name a failed platform: its devices run the portable artifact.
    rules.check_filters(spec.filters, platforms | set(failed))
    return version, failed


def _check_release_what_passed(session: Session, spec: RolloutSpec, version: db.ModelVersion,
                               failed: list[str]) -> None:
    name = f"{spec.model} {spec.version}"
    portable = manifests.PORTABLE_PLATFORM
    if portable in failed or portable not in _platforms(session, version.id):
        raise VersionNotReadyError(
            f"{name} is failed and its portable {portable} artifact did not pass "
            f"(failed platforms: {', '.join(failed) or 'none'})",
            fix="fix the failed builds and retry them (POST …/builds/retry); only a version "
            "whose onnx build passed can be released without the others")
    if not spec.allow_failed_platforms:
        raise VersionNotReadyError(
            f"{name} is failed: the builds for {', '.join(failed)} failed (see GET "
            f"/v1/models/{spec.model}/versions/{spec.version}/builds)",
            fix="fix and retry them, or release what passed with "
            '"allow_failed_platforms": true (devices of '
            f"{', '.join(failed)} then get the portable {portable} artifact)")


def start_rollout(factory: sessionmaker[Session], pub: Publisher, channel: str,
                  spec: RolloutSpec, *, actor: str, patches: JobQueue) -> RolloutView:
    """Offer `spec.version` on `channel` to `spec.percentage` of matching devices (or the
    first step of `spec.ramp`, whose next step is then due one interval from now), in one
    signed manifest — a channel that does not exist yet is created in the same transaction.

    The manifest lists the delta patches made while the version was `patching`; after the
    commit `patches.enqueue_patches` asks for those from versions published since (the patch
    job re-signs if it adds any: a change of its own, off the request path)."""
    share = rules.start_share(spec.percentage, spec.ramp)
    rules.check_mode(spec.mode)
    if spec.mode == "shadow" and spec.shadow is None:
        raise InvalidRolloutError(
            "mode 'shadow' needs shadow thresholds", field="shadow",
            fix='send "shadow": {"max_kl_micro": …, "max_latency_p99_us": …, "min_samples": …}',
        )

    version_id: list[int] = []  # the version started (for its patch job)

    def change(session: Session, ch: db.Channel) -> Audited:
        version, failed = _ready_version(session, spec)
        version_id[:] = [version.id]
        existing = session.scalars(select(db.Release).where(
            db.Release.channel_id == ch.id, db.Release.version_id == version.id)).first()
        if existing is not None:
            raise RolloutExistsError(
                f"{spec.model} {spec.version} already has rollout {existing.id} on {ch.name} "
                f"({existing.state.value})",
                fix=f"change it with PATCH /v1/rollouts/{existing.id}; a halted release "
                f"is resumed, not restarted: POST /v1/rollouts/{existing.id}/resume with a "
                "reason",
            )
        release = db.Release(
            channel_id=ch.id, version_id=version.id, share_ppm=share,
            salt=rules.release_salt(ch.name, spec.model, spec.version),
            mode=db.RolloutMode(spec.mode), **filters_to_columns(spec.filters),
            failed_platforms=failed,
            shadow_max_kl_micro=spec.shadow.max_kl_micro if spec.shadow else None,
            shadow_max_latency_p99_us=spec.shadow.max_latency_p99_us if spec.shadow else None,
            shadow_min_samples=spec.shadow.min_samples if spec.shadow else None,
            guard_min_devices=spec.guard.min_devices,
            guard_max_fail_share_ppm=spec.guard.max_fail_share_ppm,
            guard_max_latency_p99_us=spec.guard.max_latency_p99_us,
            promote_min_passed=spec.guard.promote_min_passed,
            promote_min_spread_s=spec.guard.promote_min_spread_s,
            auto_promote=spec.auto_promote, **_ramp_columns(spec.ramp, pub.clock()),
        )
        session.add(release)
        session.flush()
        audit.record(session, actor, "rollout.start", f"{ch.name}/{spec.model}/{spec.version}",
                     rollout_id=release.id, share_ppm=share, mode=spec.mode,
                     **({"failed_platforms": failed} if failed else {}),
                     **({"ramp": {"steps_ppm": list(spec.ramp.steps_ppm),
                                  "interval_seconds": spec.ramp.interval_s}}
                        if spec.ramp else {}))
        return Audited("rollout.start", str(release.id), {}, rollout_id=release.id)

    # A rollout names its channel; the first one creates it (audited), so `prod` needs no
    # separate setup step — and a refused start (version not ready …) creates nothing.
    result, published = publish_change(
        factory, pub, channel, change,
        open_channel=open_or_create("created by its first rollout", actor))
    assert result.rollout_id is not None
    view = _view(factory, result.rollout_id, published)
    try:
        patches.enqueue_patches(version_id[0])
    except Exception:  # the rollout is live already; devices download in full meanwhile
        log.exception("recording the patch job of version %d failed; start the rollout "
                      "again to retry", version_id[0])
    return view


def _ramp_columns(ramp: rules.RampSchedule | None, now: int) -> dict[str, object]:
    if ramp is None:
        return {}
    return {"ramp_steps_ppm": list(ramp.steps_ppm), "ramp_interval_s": ramp.interval_s,
            "ramp_step": 0, "ramp_next_at": now + ramp.interval_s}


def _view(factory: sessionmaker[Session], rollout_id: int,
          published: PublishedManifest | None) -> RolloutView:
    with factory() as session:
        view = get_rollout(session, rollout_id)
    serial = published.serial if published else None
    return dataclasses.replace(view, serial=serial)


@dataclass(frozen=True)
class Edit:
    """One audited edit of a release: `apply(release) -> bool (changed?)`, audited as
    `action` with `details` and what `extra()` says once `apply` ran."""

    action: str
    apply: Callable[[db.Release], bool]
    details: Mapping[str, object]
    extra: Callable[[], Mapping[str, object]] | None = None


def edit_rollout(factory: sessionmaker[Session], pub: Publisher, rollout_id: int,
                 edits: Sequence[Edit], *, actor: str) -> RolloutView:
    """Run the edits in order under the channel lock, audit each that changed something,
    and publish once if any did: one request, one signed serial."""
    with factory() as session:
        channel, _, _ = _names(session, _release(session, rollout_id))

    def change(session: Session, ch: db.Channel) -> Audited:
        release = _release(session, rollout_id)
        changed = False
        for edit in edits:
            if not edit.apply(release):
                continue
            changed = True
            _, model, version = _names(session, release)
            audit.record(session, actor, edit.action, f"{ch.name}/{model}/{version}",
                         rollout_id=rollout_id, **edit.details,
                         **(edit.extra() if edit.extra else {}))
        return Audited(edits[-1].action, str(rollout_id), {}, publish=changed)

    _, published = publish_change(factory, pub, channel, change)
    return _view(factory, rollout_id, published)


def _change_rollout(factory: sessionmaker[Session], pub: Publisher, rollout_id: int,
                    action: str, apply: Callable[[db.Release], bool], *, actor: str,
                    extra: Callable[[], Mapping[str, object]] | None = None,
                    **details: object) -> RolloutView:
    """`edit_rollout` with one edit."""
    return edit_rollout(factory, pub, rollout_id, [Edit(action, apply, details, extra)],
                        actor=actor)


def ramp_rollout(factory: sessionmaker[Session], pub: Publisher, rollout_id: int,
                 percentage: Decimal | int | float | str, *, actor: str) -> RolloutView:
    return edit_rollout(factory, pub, rollout_id, [ramp_edit(percentage)], actor=actor)


def ramp_edit(percentage: Decimal | int | float | str) -> Edit:
    """A manual share change. It takes over from a ramp schedule: the remaining steps are
    dropped (the audit event says `ramp_schedule_cleared`), so the server never moves a share
    a person has just set."""
    share = rules.percentage_to_ppm(percentage)
    cleared: list[bool] = []

    def apply(release: db.Release) -> bool:
        rules.check_ramp(release.state)
        release.share_ppm = share
        cleared[:] = [release.ramp_next_at is not None]
        release.ramp_next_at = None
        return True

    return Edit("rollout.ramp", apply, {"share_ppm": share}, lambda: (
        {"ramp_schedule_cleared": True} if any(cleared) else {}))


def pause_rollout(factory: sessionmaker[Session], pub: Publisher, rollout_id: int, *,
                  actor: str, reason: str = "") -> RolloutView:
    def apply(release: db.Release) -> bool:
        rules.check_pause(release.state)
        release.transition(db.ReleaseState.paused)
        release.state_reason = reason
        return True

    return _change_rollout(factory, pub, rollout_id, "rollout.pause", apply, actor=actor,
                           reason=reason)


def resume_rollout(factory: sessionmaker[Session], pub: Publisher, rollout_id: int, *,
                   actor: str, reason: str = "") -> RolloutView:
    """A paused rollout goes on. A halted one is offered again (an operator's call, with
    the `reason` required): its share before the halt comes back, and the guard gathers
    fresh evidence — standings before now no longer count (`evidence_since`), so the votes
    that halted it cannot halt it again, nor promote it."""
    restored: list[int] = []  # the share a resumed halt brought back

    def apply(release: db.Release) -> bool:
        halted = release.state is db.ReleaseState.halted
        rules.check_resume(release.state, reason)
        release.transition(db.ReleaseState.active)
        release.state_reason = reason if halted else ""
        if halted:
            release.share_ppm = release.share_before_halt_ppm or 0
            release.share_before_halt_ppm = None
            release.evidence_since = utcnow()
            if release.ramp_steps_ppm and release.ramp_step is not None and (
                    release.ramp_interval_s is not None
                    and release.ramp_step < len(release.ramp_steps_ppm) - 1):
                release.ramp_next_at = pub.clock() + release.ramp_interval_s
        elif release.ramp_next_at is not None and release.ramp_interval_s is not None:
            # A full interval of reports again before the next step: whatever made someone
            # pause must not be stepped over the moment they resume.
            release.ramp_next_at = pub.clock() + release.ramp_interval_s
        restored[:] = [release.share_ppm] if halted else []
        return True

    return _change_rollout(factory, pub, rollout_id, "rollout.resume", apply, actor=actor,
                           reason=reason, extra=lambda: (
                               {"from": "halted", "share_ppm": restored[0]} if restored
                               else {}))


def halt_rollout(factory: sessionmaker[Session], pub: Publisher, rollout_id: int, *,
                 actor: str, reason: str = "") -> RolloutView:
    """The rollback: share 0, no longer offered (until an operator resumes it, with a reason:
    `resume_rollout`). Halting a halted rollout changes nothing."""

    def apply(release: db.Release) -> bool:
        if release.state is db.ReleaseState.halted:
            return False  # idempotent: a retried halt must not fail nor publish again
        release.transition(db.ReleaseState.halted)
        release.share_before_halt_ppm = release.share_ppm
        release.share_ppm = 0
        release.state_reason = reason
        release.ramp_next_at = None
        return True

    view = _change_rollout(factory, pub, rollout_id, "rollout.halt", apply, actor=actor,
                           reason=reason)
    if view.serial is not None:  # this call halted it (a repeated halt publishes nothing)
        count_halt(actor)
    return view


def promote_rollout(factory: sessionmaker[Session], pub: Publisher, rollout_id: int, *,
                    actor: str, reason: str = "") -> RolloutView:
    return edit_rollout(factory, pub, rollout_id, [promote_edit(pub, reason)], actor=actor)


def promote_edit(pub: Publisher, reason: str = "") -> Edit:
    """Shadow → active: devices holding a candidate that passed swap it in, no download.
    Promoting an active rollout changes nothing; a halted one is refused (409)."""

    def apply(release: db.Release) -> bool:
        if release.state is db.ReleaseState.halted:
            raise RolloutStateError(
                "this rollout is halted (rolled back); a halted release cannot be promoted — "
                "resume it first (POST /v1/rollouts/{id}/resume with a reason) or publish a "
                "fixed version")
        if release.mode is db.RolloutMode.active:
            return False
        release.mode = db.RolloutMode.active
        if release.ramp_next_at is not None and release.ramp_interval_s is not None:
            # Devices start serving the candidate now: a full interval of their reports
            # before the share grows.
            release.ramp_next_at = pub.clock() + release.ramp_interval_s
        return True

    return Edit("rollout.promote", apply, {"reason": reason})


def pin_devices(factory: sessionmaker[Session], pub: Publisher, rollout_id: int,
                device_ids: Sequence[str], *, deny: bool = False, actor: str) -> RolloutView:
    """Pin devices in (allow-list, regardless of the share) or out (deny-list)."""
    rules.check_device_ids(device_ids)

    def apply(release: db.Release) -> bool:
        rules.check_pin(release.state)
        column = "denied_devices" if deny else "pinned_devices"
        current: list[str] = list(getattr(release, column) or [])
        merged = current + [d for d in dict.fromkeys(device_ids) if d not in current]
        rules.check_device_ids(merged, column)
        if merged == current:
            return False
        setattr(release, column, merged)  # a new list: JSON columns track assignment only
        return True

    return _change_rollout(factory, pub, rollout_id, "rollout.pin", apply, actor=actor,
                           device_ids=list(device_ids), deny=deny)


def unpin_devices(factory: sessionmaker[Session], pub: Publisher, rollout_id: int,
                  device_ids: Sequence[str], *, actor: str) -> RolloutView:
    """Remove devices from both the allow- and the deny-list."""
    rules.check_device_ids(device_ids)
    drop = set(device_ids)

    def apply(release: db.Release) -> bool:
        pinned = [d for d in release.pinned_devices or [] if d not in drop]
        denied = [d for d in release.denied_devices or [] if d not in drop]
        if pinned == list(release.pinned_devices or []) and denied == list(
                release.denied_devices or []):
            return False
        release.pinned_devices, release.denied_devices = pinned, denied
        return True

    return _change_rollout(factory, pub, rollout_id, "rollout.unpin", apply, actor=actor,
                           device_ids=list(device_ids))


def update_rollout(factory: sessionmaker[Session], pub: Publisher, rollout_id: int, *,
                   percentage: Decimal | None, promote: bool, actor: str) -> RolloutView:
    """PATCH /v1/rollouts/{id}: promote (shadow → active) and/or set the share, in one signed
    manifest; InvalidRolloutError when it asks for neither."""
    edits = ([promote_edit(pub)] if promote else []) + (
        [ramp_edit(percentage)] if percentage is not None else [])
    if not edits:
        raise InvalidRolloutError("nothing to change", field="percentage",
                                  fix='send {"percentage": 25} or {"mode": "active"}')
    return edit_rollout(factory, pub, rollout_id, edits, actor=actor)


def list_rollouts(session: Session, channel: str) -> list[RolloutView]:
    ch = session.scalars(select(db.Channel).where(db.Channel.name == channel)).first()
    if ch is None:
        raise ChannelNotFoundError(f"no channel named {channel!r}")
    ids = session.scalars(select(db.Release.id).where(db.Release.channel_id == ch.id)
                          .order_by(db.Release.id.desc()))
    return [get_rollout(session, i) for i in ids]
