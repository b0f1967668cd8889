"""Plain records the publisher reads from the database and the manifest builder consumes.

Kept free of SQLAlchemy so the builder and the rollout rules are pure functions that tests can
drive with literal values.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

FULL_SHARE_PPM = 1_000_000


class RolloutState(enum.StrEnum):
    """Lifecycle of one release on one channel (transitions checked in rules.py)."""

    ACTIVE = "active"  # offered at its share; may be ramped
    PAUSED = "paused"  # offered at its frozen share; resume before ramping
    HALTED = "halted"  # share 0 and no longer offered: the rollback; final


@dataclass(frozen=True)
class PatchRecord:
    from_sha256: str
    url: str
    length: int
    sha256: str
    algorithm: str


@dataclass(frozen=True)
class ArtifactRecord:
    platform: str
    variant: str
    format: str
    url: str
    length: int
    sha256: str
    compile_settings: dict[str, str | int | bool] = field(default_factory=dict)
    target: dict[str, str] = field(default_factory=dict)
    patches: tuple[PatchRecord, ...] = ()


@dataclass(frozen=True)
class FilterRecord:
    platforms: tuple[str, ...] = ()
    socs: tuple[str, ...] = ()
    archs: tuple[str, ...] = ()
    os_versions: tuple[str, ...] = ()
    app_versions: tuple[str, ...] = ()
    device_allow: tuple[str, ...] = ()
    device_deny: tuple[str, ...] = ()


@dataclass(frozen=True)
class ShadowRecord:
    max_kl_micro: int
    max_latency_p99_us: int
    min_samples: int


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
    mode: str
    state: RolloutState
    filters: FilterRecord = FilterRecord()
    shadow: ShadowRecord | None = None
    artifacts: tuple[ArtifactRecord, ...] = ()

    @property
    def fully_rolled_out(self) -> bool:
        return self.state is not RolloutState.HALTED and self.share_ppm >= FULL_SHARE_PPM
