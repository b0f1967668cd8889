"""Rollout preview (dry run): which of these devices a rollout would reach, by the contract's
own rule (manifests.rollout_includes) plus "has an artifact it can run" — `preview` is that
rule alone (rollout health counts the offered devices with it too); `preview_rollout` reads
the rollout, or a proposed one, and the devices for the API."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

import manifests
from server.db import models as db
from server.publish.errors import ChannelNotFoundError
from server.publish.publisher import load_artifact_records
from server.publish.records import RolloutRecord
from server.rollouts.errors import InvalidRolloutError
from server.rollouts.rules import check_filters, percentage_to_ppm, release_salt
from server.rollouts.service import get_rollout, version_row

MAX_PREVIEW_DEVICES = 100_000


@dataclass(frozen=True)
class PreviewResult:
    total: int
    included: list[str]
    excluded: list[str]


def profile_from_dict(device_id: str, profile: Mapping[str, Any]) -> manifests.DeviceProfile:
    def text(key: str) -> str:
        value = profile.get(key, "")
        return value if isinstance(value, str) else str(value)

    return manifests.DeviceProfile(
        device_id=device_id, platform=text("platform"), soc=text("soc"), arch=text("arch"),
        os_version=text("os_version"), app_version=text("app_version"),
    )


def preview(record: RolloutRecord, devices: Iterable[manifests.DeviceProfile]) -> PreviewResult:
    release = record.manifest_release()
    included: list[str] = []
    excluded: list[str] = []
    for device in devices:
        ok = (manifests.rollout_includes(release.rollout, device)
              and manifests.select_artifact(release, device) is not None)
        (included if ok else excluded).append(device.device_id)
    return PreviewResult(len(included) + len(excluded), included, excluded)


def platforms_of(record: RolloutRecord) -> Sequence[str]:
    return sorted({a.platform for a in record.artifacts})


@dataclass(frozen=True)
class ProposedRollout:
    """A preview of a rollout that does not exist yet."""

    model: str
    version: str
    percentage: Decimal
    filters: manifests.Filters


def preview_rollout(session: Session, channel: str, *, rollout_id: int | None,
                    model: str | None, version: str | None, percentage: Decimal | None,
                    filters: manifests.Filters,
                    devices: list[manifests.DeviceProfile] | None) -> PreviewResult:
    """Which devices (given, or every device the server has seen, newest first, at most
    MAX_PREVIEW_DEVICES) a rollout — `rollout_id`, or the proposed model, version,
    percentage and filters — would reach."""
    if session.scalars(select(db.Channel.id).where(db.Channel.name == channel)).first() is None:
        raise ChannelNotFoundError(f"no channel named {channel!r}")
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
        view = get_rollout(session, target)
        release = session.get(db.Release, target)
        assert release is not None  # get_rollout raised otherwise
        arts = load_artifact_records(session, release.version_id, "")
        return dataclasses.replace(view.record, artifacts=arts)
    version = version_row(session, target.model, target.version)
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
