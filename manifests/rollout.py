"""The rollout rule: which device gets which release. Pure and portable (see docs/manifest.md).

bucket = first 8 bytes of sha256(UTF-8 of salt + ":" + device_id), big-endian, mod 1_000_000;
a device is in the share when bucket < share_ppm. Raising share_ppm only ever adds devices.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .manifest import PPM, Artifact, Filters, Manifest, Release, Rollout
from .versions import matches_any


@dataclass(frozen=True)
class DeviceProfile:
    """What a device reports about itself. Empty strings mean "unknown" and fail any filter
    that constrains that attribute."""

    device_id: str
    platform: str
    soc: str = ""
    arch: str = ""
    os_version: str = ""
    app_version: str = ""


def bucket(salt: str, device_id: str) -> int:
    """The device's stable position in [0, 1_000_000) for a release with this salt."""
    digest = hashlib.sha256(f"{salt}:{device_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % PPM


def filters_match(filters: Filters, device: DeviceProfile) -> bool:
    """Attribute filters only (platform, SoC, arch, OS and app version); no allow/deny, no share."""
    return (
        (not filters.platforms or device.platform in filters.platforms)
        and (not filters.socs or device.soc in filters.socs)
        and (not filters.archs or device.arch in filters.archs)
        and matches_any(filters.os_versions, device.os_version)
        and matches_any(filters.app_versions, device.app_version)
    )


def rollout_includes(rollout: Rollout, device: DeviceProfile) -> bool:
    """Whether ``device`` is in ``rollout``, in this order:

    1. on ``device_deny``: out (deny beats everything);
    2. on ``device_allow``: in (pinned: regardless of share and attribute filters);
    3. failing an attribute filter: out;
    4. otherwise in exactly when ``bucket(salt, device_id) < share_ppm``.
    """
    f = rollout.filters
    if device.device_id in f.device_deny:
        return False
    if device.device_id in f.device_allow:
        return True
    if not filters_match(f, device):
        return False
    return bucket(rollout.salt, device.device_id) < rollout.share_ppm


def artifact_matches(artifact: Artifact, device: DeviceProfile) -> bool:
    """Platform must equal; a non-empty ``target["soc"]`` / ``target["arch"]`` must equal too."""
    if artifact.platform != device.platform:
        return False
    soc, arch = artifact.target.get("soc", ""), artifact.target.get("arch", "")
    return (not soc or soc == device.soc) and (not arch or arch == device.arch)


# The platform of the portable CPU ONNX artifact, which every device can run.
PORTABLE_PLATFORM = "onnx"


def artifacts_for(release: Release, device: DeviceProfile) -> list[Artifact]:
    """The artifacts of ``release`` (in manifest order) that ``device`` may install: those that
    match it; when none does and the device's platform is in ``release.failed_platforms``
    (released without its build), the portable ``onnx`` artifacts instead."""
    matching = [a for a in release.artifacts if artifact_matches(a, device)]
    if matching or device.platform not in release.failed_platforms:
        return matching
    portable = DeviceProfile(device.device_id, PORTABLE_PLATFORM, device.soc, device.arch,
                             device.os_version, device.app_version)
    return [a for a in release.artifacts if artifact_matches(a, portable)]


def select_artifact(release: Release, device: DeviceProfile) -> Artifact | None:
    """The first artifact of ``artifacts_for(release, device)``: the first that runs on
    ``device``, or, for a platform the release lists as failed, the first portable one."""
    usable = artifacts_for(release, device)
    return usable[0] if usable else None


def select_release(manifest: Manifest, model: str, device: DeviceProfile) -> Release | None:
    """The first release of ``model`` (in manifest order) that includes ``device`` and has an
    artifact for it; None if the model is absent or no release qualifies."""
    entry = manifest.models.get(model)
    if entry is None:
        return None
    for release in entry.releases:
        if rollout_includes(release.rollout, device) and select_artifact(release, device):
            return release
    return None
