"""Rollout rules that need no I/O: percentages, filter validation, state transitions.

Everything here raises InvalidRolloutError (the request can never succeed as written) or
RolloutStateError (not allowed in the rollout's current state — by the release state
machine of server/db/states.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from decimal import Decimal, InvalidOperation

from manifests import Filters, ManifestError, VersionRange
from server.db.states import (
    RELEASE_TRANSITIONS,
    ReleaseState,
    release_may_pin,
    release_may_ramp,
)
from server.publish.errors import InvalidRolloutError, RolloutStateError

PPM_PER_PERCENT = 10_000
MAX_DEVICE_IDS_PER_LIST = 10_000
MAX_DEVICE_ID_LENGTH = 256
MODES = ("active", "shadow")


def percentage_to_ppm(percentage: Decimal | int | float | str) -> int:
    """Exact share in parts per million: 10 → 100_000, 0.5 → 5_000; finer than 1 ppm refused.

    Floats go through str() so 0.1 means the decimal 0.1 that was written, not its binary
    approximation.
    """
    try:
        value = percentage if isinstance(percentage, Decimal) else Decimal(str(percentage))
    except InvalidOperation as e:
        raise InvalidRolloutError(f"percentage {percentage!r} is not a number") from e
    if not value.is_finite() or not Decimal(0) <= value <= Decimal(100):
        raise InvalidRolloutError(
            f"percentage {percentage} is outside 0–100; send a number like 5 or 0.5"
        )
    ppm = value * PPM_PER_PERCENT
    if ppm != ppm.to_integral_value():
        raise InvalidRolloutError(
            f"percentage {percentage} is finer than 1 part per million (0.0001%); round it "
            f"to at most 4 decimal places"
        )
    return int(ppm)


def release_salt(channel: str, model: str, version: str) -> str:
    """The salt of a release on a channel: fixed for its life, and known before it starts, so
    a preview shows exactly the cohort the rollout will reach. (Cohorts need not be secret;
    a device learns its own membership from the manifest anyway.)"""
    text = f"modelfleet-rollout:{channel}:{model}:{version}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def ppm_to_percentage(share_ppm: int) -> Decimal:
    return Decimal(share_ppm) / PPM_PER_PERCENT


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise InvalidRolloutError(f"mode {mode!r} is not one of {', '.join(MODES)}")


def check_filters(filters: Filters, release_platforms: Collection[str]) -> None:
    """Refuse filters that can never match: platforms the release has no artifact for, etc."""
    unknown = sorted(set(filters.platforms) - set(release_platforms))
    if unknown:
        raise InvalidRolloutError(
            f"filters name unknown platform(s) {', '.join(unknown)}; this release has "
            f"artifacts for: {', '.join(sorted(release_platforms)) or 'none'}"
        )
    for name in ("device_allow", "device_deny"):
        ids: list[str] = getattr(filters, name)
        check_device_ids(ids, name)
    for name in ("os_versions", "app_versions"):
        for spec in getattr(filters, name):
            _check_range(spec, name)


def check_device_ids(ids: Collection[str], what: str = "device_ids") -> None:
    if len(ids) > MAX_DEVICE_IDS_PER_LIST:
        raise InvalidRolloutError(
            f"{what} has {len(ids)} entries; at most {MAX_DEVICE_IDS_PER_LIST} are allowed "
            f"(use a filter or the percentage for larger cohorts)"
        )
    for device_id in ids:
        if not device_id or len(device_id) > MAX_DEVICE_ID_LENGTH:
            raise InvalidRolloutError(
                f"{what} contains an empty id or one longer than {MAX_DEVICE_ID_LENGTH} chars"
            )


def _check_range(spec: str, what: str) -> None:
    """Range strings like ">=14.0,<18", parsed by the contract's own parser."""
    try:
        VersionRange.parse(spec)
    except ManifestError as e:
        raise InvalidRolloutError(
            f"{what} range {spec!r} is not understood ({e}); write clauses like '>=14.0,<18'"
        ) from e


def check_ramp(state: ReleaseState) -> None:
    if state is ReleaseState.halted:
        raise RolloutStateError(
            "this rollout is halted (rolled back); a halted release cannot be ramped — fix "
            "the model and start a new rollout"
        )
    if not release_may_ramp(state):
        raise RolloutStateError("this rollout is paused; resume it before changing its share")


def check_pause(state: ReleaseState) -> None:
    if ReleaseState.paused not in RELEASE_TRANSITIONS[state]:
        raise RolloutStateError(f"only an active rollout can be paused; this one is {state}")


def check_resume(state: ReleaseState) -> None:
    if state is not ReleaseState.paused:  # active → active is no transition either
        raise RolloutStateError(f"only a paused rollout can be resumed; this one is {state}")


def check_pin(state: ReleaseState) -> None:
    if not release_may_pin(state):
        raise RolloutStateError("this rollout is halted; pinning devices to it has no effect")
