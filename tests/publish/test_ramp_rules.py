"""The ramp schedule rules without I/O: what a schedule may be, the share a rollout starts
at, and the status GET /v1/rollouts/{id} derives from the columns."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.db.states import ReleaseState
from server.rollouts.errors import InvalidRolloutError
from server.rollouts.rules import (
    MAX_RAMP_STEPS,
    MIN_RAMP_INTERVAL_S,
    RampSchedule,
    ramp_schedule,
    ramp_status,
    start_share,
)


def test_fractions_and_a_last_step_below_100_are_allowed() -> None:
    assert ramp_schedule(["0.5", 2, Decimal("12.5"), 50], 60) == RampSchedule(
        (5_000, 20_000, 125_000, 500_000), 60)


@given(st.lists(st.integers(1, 1_000_000), min_size=2, max_size=MAX_RAMP_STEPS, unique=True),
       st.integers(MIN_RAMP_INTERVAL_S, 10**6))
def test_any_increasing_schedule_is_accepted_and_any_other_order_refused(
        ppm: list[int], interval: int) -> None:
    ordered = sorted(ppm)
    percentages = [Decimal(p) / 10_000 for p in ordered]
    assert ramp_schedule(percentages, interval).steps_ppm == tuple(ordered)
    with pytest.raises(InvalidRolloutError, match="strictly increasing"):
        ramp_schedule(percentages[::-1], interval)


@pytest.mark.parametrize(("steps", "interval", "words"), [
    ([1, 1, 100], 3600, "strictly increasing"),
    ([1, 0.00001], 3600, "finer than 1 part per million"),
    ([1] * (MAX_RAMP_STEPS + 1), 3600, "2 to 10 steps"),
    ([1, 100], MIN_RAMP_INTERVAL_S - 1, "interval_seconds"),
])
def test_bad_schedules_say_what_is_wrong(steps: list[float], interval: int, words: str) -> None:
    with pytest.raises(InvalidRolloutError, match=words) as refused:
        ramp_schedule(steps, interval)
    assert refused.value.fix


def test_the_start_share_is_the_first_step_and_an_agreeing_percentage_is_fine() -> None:
    ramp = ramp_schedule([1, 5, 100], 3600)
    assert start_share(None, ramp) == start_share("1.0", ramp) == 10_000
    assert start_share(7, None) == 70_000
    with pytest.raises(InvalidRolloutError, match="disagrees"):
        start_share(5, ramp)


@pytest.mark.parametrize(("step", "next_at", "state", "shadow", "expected"), [
    (0, 100, ReleaseState.active, False, "scheduled"),
    (0, 100, ReleaseState.active, True, "waiting_for_promotion"),
    (1, 100, ReleaseState.paused, False, "paused"),
    (1, None, ReleaseState.active, False, "taken_over"),
    (2, None, ReleaseState.active, False, "done"),
    (1, 100, ReleaseState.halted, False, "halted"),
])
def test_the_status_follows_from_the_columns(step: int, next_at: int | None,
                                             state: ReleaseState, shadow: bool,
                                             expected: str) -> None:
    status = ramp_status([10_000, 50_000, 1_000_000], 3600, step, next_at, state, shadow)
    assert status is not None and status.state == expected
    assert status.next_at == (None if expected == "halted" else next_at)


def test_no_schedule_no_status() -> None:
    assert ramp_status([], None, None, None, ReleaseState.active, False) is None
