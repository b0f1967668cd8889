"""Rollout preview (dry run): which of these devices a rollout would reach, by the contract's
own rule (manifests.rollout_includes) plus "has an artifact it can run"."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import manifests
from server.publish.records import RolloutRecord

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
