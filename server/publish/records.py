"""The record the publisher reads per release and the manifest builder consumes.

Kept free of SQLAlchemy so the builder and the rollout rules are pure functions that tests can
drive with literal values. What devices see is built as the contract's own types
(`manifests.Filters`, `ShadowThresholds`, `Artifact`, `Patch`) when the record is read; the
record adds only what the server alone knows: the release's id, order and state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from manifests import Artifact, Filters, Release, Rollout, ShadowThresholds
from manifests.manifest import Mode
from server.db.states import ReleaseState

FULL_SHARE_PPM = 1_000_000


@dataclass(frozen=True)
class RolloutRecord:
    """One release of one model on one channel, with what the manifest needs to offer it.

    `seq` orders rollouts of a channel by creation (higher = newer).
    """

    id: int
    seq: int
    model: str
    version: str
    share_ppm: int
    salt: str
    mode: Mode
    state: ReleaseState
    filters: Filters = field(default_factory=Filters)
    shadow: ShadowThresholds | None = None
    artifacts: tuple[Artifact, ...] = ()
    # Platforms whose build failed, released anyway: their devices take the portable artifact.
    failed_platforms: tuple[str, ...] = ()

    @property
    def fully_rolled_out(self) -> bool:
        return self.state is not ReleaseState.halted and self.share_ppm >= FULL_SHARE_PPM

    def manifest_release(self) -> Release:
        """The manifest entry devices get for this release."""
        return Release(version=self.version, artifacts=list(self.artifacts),
                       rollout=Rollout(share_ppm=self.share_ppm, salt=self.salt, mode=self.mode,
                                       filters=self.filters, shadow=self.shadow),
                       failed_platforms=list(self.failed_platforms))


# A release's filters are stored as the `filters` JSON column (platforms, socs, archs,
# os_versions, app_versions) plus the device lists pinning edits (`pinned_devices`,
# `denied_devices`); these two functions are the only mapping between the two shapes.
_FILTER_COLUMN_LISTS = ("platforms", "socs", "archs", "os_versions", "app_versions")


def filters_from_columns(filters: dict[str, list[str]] | None, pinned: list[str] | None,
                         denied: list[str] | None) -> Filters:
    f = filters or {}
    return Filters(platforms=list(f.get("platforms", ())), socs=list(f.get("socs", ())),
                   archs=list(f.get("archs", ())), os_versions=list(f.get("os_versions", ())),
                   app_versions=list(f.get("app_versions", ())),
                   device_allow=list(pinned or ()), device_deny=list(denied or ()))


def filters_to_columns(f: Filters) -> dict[str, object]:
    """Column values of `db.Release` for `f`."""
    return {"filters": {name: list(getattr(f, name)) for name in _FILTER_COLUMN_LISTS},
            "pinned_devices": list(f.device_allow), "denied_devices": list(f.device_deny)}
