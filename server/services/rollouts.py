"""Channels and rollouts as the API offers them: one method per route, bound once (in
server/wiring.py) to the session factory, the publisher and the patch scheduler.

The changes themselves (locked, audited, published in one transaction) are
server/rollouts/service.py; this adds what a route needs around them — the channel summary a
create or re-publish answers with, patch scheduling after a rollout starts (the patches from
versions published before this one were made before it turned ready, so the first manifest
lists them; this catches bases published since), and the preview's reads. Manifest-cache
invalidation is not here: it follows the publisher's "published" event.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

import manifests
from server.db import models as db
from server.publish.errors import ChannelNotFoundError, InvalidRolloutError
from server.publish.patches import PatchScheduler
from server.publish.publisher import (
    Publisher,
    latest_manifest,
    load_artifact_records,
    publish_channel,
)
from server.publish.records import RolloutRecord
from server.rollouts import service as ro
from server.rollouts.health import RolloutHealth, rollout_health
from server.rollouts.preview import MAX_PREVIEW_DEVICES, PreviewResult, preview, profile_from_dict
from server.rollouts.rules import check_filters, percentage_to_ppm, release_salt


@dataclass(frozen=True)
class ChannelSummary:
    name: str
    description: str
    serial: int | None
    manifest_sha256: str | None
    expires: int | None


@dataclass(frozen=True)
class ProposedRollout:
    """A preview of a rollout that does not exist yet."""

    model: str
    version: str
    percentage: Decimal
    filters: manifests.Filters


def _summary(session: Session, ch: db.Channel) -> ChannelSummary:
    m = latest_manifest(session, ch.id)
    return ChannelSummary(ch.name, ch.description, m.serial if m else None,
                          m.sha256 if m else None, m.expires if m else None)


def _channel(session: Session, name: str) -> db.Channel:
    ch = session.scalars(select(db.Channel).where(db.Channel.name == name)).first()
    if ch is None:
        raise ChannelNotFoundError(f"no channel named {name!r}")
    return ch


def channel_names(factory: sessionmaker[Session]) -> list[str]:
    with factory() as session:
        return list(session.scalars(select(db.Channel.name).order_by(db.Channel.name)))


class RolloutService:
    """Channels and rollouts for the API (see module docstring)."""

    def __init__(self, factory: sessionmaker[Session], publisher: Publisher,
                 patches: PatchScheduler) -> None:
        self._sf = factory
        self._pub = publisher
        self._patches = patches

    def _summary_of(self, name: str) -> ChannelSummary:
        with self._sf() as session:
            return _summary(session, _channel(session, name))

    def create_channel(self, name: str, *, description: str, actor: str) -> ChannelSummary:
        """The channel and its first (empty) signed manifest."""
        ro.create_channel(self._sf, self._pub, name, description=description, actor=actor)
        return self._summary_of(name)

    def list_channels(self) -> list[ChannelSummary]:
        with self._sf() as session:
            return [_summary(session, ch)
                    for ch in session.scalars(select(db.Channel).order_by(db.Channel.name))]

    def republish(self, channel: str, *, actor: str) -> ChannelSummary:
        publish_channel(self._sf, self._pub, channel, actor=actor)
        return self._summary_of(channel)

    def list_rollouts(self, channel: str) -> list[ro.RolloutView]:
        with self._sf() as session:
            return ro.list_rollouts(session, channel)

    def get(self, rollout_id: int) -> ro.RolloutView:
        with self._sf() as session:
            return ro.get_rollout(session, rollout_id)

    def start(self, channel: str, spec: ro.RolloutSpec, *, actor: str) -> ro.RolloutView:
        """Starts the release — signed with the patches made while the version was
        `patching` — then schedules delta patches from versions published since; the
        manifest is re-signed if that adds any (off the request path)."""
        view = ro.start_rollout(self._sf, self._pub, channel, spec, actor=actor)
        with self._sf() as session:
            release = session.get(db.Release, view.record.id)
            assert release is not None
            version_id = release.version_id
        self._patches.schedule(version_id)
        return view

    def ramp(self, rollout_id: int, percentage: Decimal, *, actor: str) -> ro.RolloutView:
        return ro.ramp_rollout(self._sf, self._pub, rollout_id, percentage, actor=actor)

    def pause(self, rollout_id: int, *, actor: str, reason: str) -> ro.RolloutView:
        return ro.pause_rollout(self._sf, self._pub, rollout_id, actor=actor, reason=reason)

    def resume(self, rollout_id: int, *, actor: str, reason: str = "") -> ro.RolloutView:
        return ro.resume_rollout(self._sf, self._pub, rollout_id, actor=actor, reason=reason)

    def halt(self, rollout_id: int, *, actor: str, reason: str) -> ro.RolloutView:
        return ro.halt_rollout(self._sf, self._pub, rollout_id, actor=actor, reason=reason)

    def promote(self, rollout_id: int, *, actor: str) -> ro.RolloutView:
        return ro.promote_rollout(self._sf, self._pub, rollout_id, actor=actor)

    def health(self, rollout_id: int) -> RolloutHealth:
        with self._sf() as session:
            ro.get_rollout(session, rollout_id)  # RolloutNotFoundError
            return rollout_health(session, rollout_id)

    def pin(self, rollout_id: int, device_ids: Sequence[str], *, deny: bool,
            actor: str) -> ro.RolloutView:
        return ro.pin_devices(self._sf, self._pub, rollout_id, device_ids, deny=deny,
                              actor=actor)

    def unpin(self, rollout_id: int, device_ids: Sequence[str], *,
              actor: str) -> ro.RolloutView:
        return ro.unpin_devices(self._sf, self._pub, rollout_id, device_ids, actor=actor)

    def preview(self, channel: str, *, rollout_id: int | None, model: str | None,
                version: str | None, percentage: Decimal | None, filters: manifests.Filters,
                devices: list[manifests.DeviceProfile] | None) -> PreviewResult:
        """Which devices (given, or every device the server has seen, newest first, at most
        MAX_PREVIEW_DEVICES) a rollout — `rollout_id`, or the proposed model, version,
        percentage and filters — would reach."""
        with self._sf() as session:
            _channel(session, channel)
            target = (rollout_id if rollout_id is not None
                      else _proposed(model, version, percentage, filters))
            record = _record(session, channel, target)
            if devices is None:
                rows = session.scalars(select(db.Device).order_by(db.Device.last_seen_at.desc())
                                       .limit(MAX_PREVIEW_DEVICES))
                devices = [profile_from_dict(d.id, d.profile or {}) for d in rows]
        return preview(record, devices)


def _record(session: Session, channel: str, target: int | ProposedRollout) -> RolloutRecord:
    if isinstance(target, int):
        view = ro.get_rollout(session, target)
        release = session.get(db.Release, target)
        assert release is not None  # get_rollout raised otherwise
        arts = load_artifact_records(session, release.version_id, "")
        return dataclasses.replace(view.record, artifacts=arts)
    version = ro.version_row(session, target.model, target.version)
    arts = load_artifact_records(session, version.id, "")
    check_filters(target.filters, {a.platform for a in arts})
    return RolloutRecord(
        id=0, seq=0, model=target.model, version=target.version,
        share_ppm=percentage_to_ppm(target.percentage),
        salt=release_salt(channel, target.model, target.version), mode="active",
        state=db.ReleaseState.active, filters=target.filters, artifacts=arts)


def _proposed(model: str | None, version: str | None, percentage: Decimal | None,
             filters: manifests.Filters) -> ProposedRollout:
    """A proposed rollout from a preview request, or InvalidRolloutError naming what lacks."""
    if model is None or version is None or percentage is None:
        raise InvalidRolloutError(
            "preview needs either rollout_id or model, version and percentage",
            fix='send {"rollout_id": 7} or {"model": …, "version": …, "percentage": 5}')
    return ProposedRollout(model, version, percentage, filters)
