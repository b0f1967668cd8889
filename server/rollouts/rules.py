"""Rollout rules that need no I/O: percentages, filter validation, state transitions, ramp
schedules.

Everything here raises InvalidRolloutError (the request can never succeed as written) or
RolloutStateError (not allowed in the rollout's current state — by the release state
machine of server/db/states.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from itertools import pairwise
from typing import Literal

from manifests import Filters, ManifestError, VersionRange
from server.db.states import (
    RELEASE_TRANSITIONS,
    ReleaseState,
    release_may_pin,
    release_may_ramp,
)
from server.rollouts.errors import InvalidRolloutError, RolloutStateError

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
            "this rollout is halted (rolled back); a halted release cannot be ramped — resume "
            "it (POST /v1/rollouts/{id}/resume with a reason) or publish a fixed version"
        )
    if not release_may_ramp(state):
        raise RolloutStateError("this rollout is paused; resume it before changing its share")


def check_pause(state: ReleaseState) -> None:
    if ReleaseState.paused not in RELEASE_TRANSITIONS[state]:
        raise RolloutStateError(f"only an active rollout can be paused; this one is {state}")


def check_resume(state: ReleaseState, reason: str = "") -> None:
    """A paused rollout resumes; a halted one too, but only with a reason (it is audited:
    someone decided the failures that halted it are explained)."""
    if state is ReleaseState.halted:
        if not reason.strip():
            raise InvalidRolloutError(
                "resuming a halted rollout needs a reason", field="reason",
                fix='send {"reason": "why the failures that halted it are explained"}')
        return
    if state is not ReleaseState.paused:  # active → active is no transition either
        raise RolloutStateError(
            f"only a paused or halted rollout can be resumed; this one is {state}")


def check_pin(state: ReleaseState) -> None:
    if not release_may_pin(state):
        raise RolloutStateError("this rollout is halted; pinning devices to it has no effect")


# --------------------------------------------------------------------------- ramp schedules

MAX_RAMP_STEPS = 10
# Shorter waits leave the guard no time to hear from the devices of a step before the next.
MIN_RAMP_INTERVAL_S = 60
MAX_RAMP_INTERVAL_S = 90 * 86_400
RAMP_FIX = 'e.g. "ramp": {"steps": [1, 5, 25, 100], "interval_seconds": 3600}'


@dataclass(frozen=True)
class RampSchedule:
    """Shares to step through (ppm, strictly increasing, each > 0) and the wait between
    steps; the rollout starts at the first. Validated by `ramp_schedule`."""

    steps_ppm: tuple[int, ...]
    interval_s: int


def ramp_schedule(steps: Sequence[Decimal | int | float | str],
                  interval_s: int) -> RampSchedule:
    """A checked schedule: 2–MAX_RAMP_STEPS steps, each above 0% and at most 100% (1 ppm
    precision), strictly increasing; a wait of MIN_RAMP_INTERVAL_S–MAX_RAMP_INTERVAL_S. The
    last step need not be 100% (the ramp then stops there)."""
    if not 2 <= len(steps) <= MAX_RAMP_STEPS:
        raise InvalidRolloutError(
            f"a ramp schedule has 2 to {MAX_RAMP_STEPS} steps, not {len(steps)}",
            field="ramp.steps", fix=RAMP_FIX + '; for one fixed share send "percentage" alone')
    ppm = []
    for step in steps:
        try:
            share = percentage_to_ppm(step)
        except InvalidRolloutError as e:
            raise InvalidRolloutError(f"ramp step {step}: {e.message}", field="ramp.steps",
                                      fix=RAMP_FIX) from e
        if share == 0:
            raise InvalidRolloutError("a ramp step of 0% offers the release to no device",
                                      field="ramp.steps", fix=RAMP_FIX)
        ppm.append(share)
    if any(b <= a for a, b in pairwise(ppm)):
        raise InvalidRolloutError(
            f"ramp steps {', '.join(str(s) for s in steps)} are not strictly increasing",
            field="ramp.steps", fix=RAMP_FIX)
    if not MIN_RAMP_INTERVAL_S <= interval_s <= MAX_RAMP_INTERVAL_S:
        raise InvalidRolloutError(
            f"ramp interval_seconds {interval_s} is outside {MIN_RAMP_INTERVAL_S}–"
            f"{MAX_RAMP_INTERVAL_S}", field="ramp.interval_seconds",
            fix="wait at least a minute between steps (the guard needs reports of each step)")
    return RampSchedule(tuple(ppm), interval_s)


def start_share(percentage: Decimal | int | float | str | None,
                ramp: RampSchedule | None) -> int:
    """The share a rollout starts at: `percentage`, or the schedule's first step; both given,
    they must agree."""
    if ramp is None:
        if percentage is None:
            raise InvalidRolloutError("a rollout needs a percentage (or a ramp schedule)",
                                      field="percentage", fix='send "percentage": 5')
        return percentage_to_ppm(percentage)
    first = ramp.steps_ppm[0]
    if percentage is not None and percentage_to_ppm(percentage) != first:
        raise InvalidRolloutError(
            f"percentage {percentage} disagrees with the ramp schedule's first step "
            f"{ppm_to_percentage(first)}", field="percentage",
            fix="leave percentage out (the rollout starts at the first step) or make them equal")
    return first


RampState = Literal["scheduled", "waiting_for_promotion", "paused", "done", "taken_over",
                    "halted"]


@dataclass(frozen=True)
class RampStatus:
    """Where a rollout stands on its schedule (GET /v1/rollouts/{id} `ramp`). `step` is the
    index of the step the share is at; `next_at` when the next step is due (Unix seconds),
    None when none is left or a manual ramp took over."""

    steps_ppm: tuple[int, ...]
    interval_s: int
    step: int
    next_at: int | None
    state: RampState


def ramp_status(steps_ppm: Sequence[int], interval_s: int | None, step: int | None,
                next_at: int | None, state: ReleaseState, shadow: bool) -> RampStatus | None:
    """The status of a release's schedule from its columns; None without one."""
    if not steps_ppm or interval_s is None or step is None:
        return None
    status: RampState
    if state is ReleaseState.halted:
        status, next_at = "halted", None
    elif next_at is None:
        status = "done" if step >= len(steps_ppm) - 1 else "taken_over"
    elif state is ReleaseState.paused:
        status = "paused"
    else:
        status = "waiting_for_promotion" if shadow else "scheduled"
    return RampStatus(tuple(steps_ppm), interval_s, step, next_at, status)
