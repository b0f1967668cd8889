"""Stepping a rollout along its ramp schedule: which rollouts have a step due, and the step
itself — the next share, audited as `rollout.ramp` by `system` and published as a new signed
manifest with a higher serial, in one transaction.

Whether a rollout is healthy enough to take its step is the guard's judgement (`RampTicker`
below); `advance_ramp` only moves the share, and only when the step is
still due when it holds the channel lock. Several API replicas may try the same step at once:
the channel row lock (SELECT … FOR UPDATE on PostgreSQL) queues them, and the share moves by
a conditional UPDATE (`WHERE ramp_step = k AND ramp_next_at <= now AND state = 'active' AND
mode = 'active'`), so the second replica changes no row and publishes nothing — on SQLite,
which has no row locks, too. A pause, a halt or a manual ramp committed first makes the
UPDATE miss in the same way.

The tick (`RampTicker`, docs/shadow.md "Ramp schedules"): every rollout whose next step is due
takes it if the guard's own judgement of the devices' counted standings is "pass" (at least
`min_devices` reporting devices, a failed share below `max_fail_share`, the latency budget
counting as a failure, and the promotion evidence: enough passed devices, spread over time,
no unexplained failure). A rollout still waiting for reports, or failing, keeps its share;
the guard halts the failing ones. It runs in every API process: periodically (`ramp_loop`,
every `ramp_check_seconds`) and after each telemetry batch that brought a verdict, for the
rollouts that batch touched.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from server import crashpoints
from server.db import audit
from server.db import models as db
from server.db.types import utcnow
from server.publish.publisher import Audited, Publisher, publish_change
from server.rollouts.guard import judge
from server.rollouts.health import rule_of, standings, thresholds_of
from server.rollouts.service import get_rollout

ACTOR = "system"
log = logging.getLogger("modelfleet.rollouts.ramp")


@dataclass(frozen=True)
class RampStep:
    """A step taken: the rollout now offers `share_ppm` (step `step` of `steps`, 1-based)."""

    rollout_id: int
    channel: str
    step: int
    steps: int
    share_ppm: int
    serial: int
    reason: str


def due_ramps(session: Session, now: int, only: set[int] | None = None) -> list[int]:
    """Active, promoted (not shadow) rollouts whose next step is due at `now`, by id."""
    query = select(db.Release.id).where(
        db.Release.ramp_next_at.is_not(None), db.Release.ramp_next_at <= now,
        db.Release.state == db.ReleaseState.active, db.Release.mode == db.RolloutMode.active,
    ).order_by(db.Release.id)
    if only is not None:
        query = query.where(db.Release.id.in_(sorted(only)))
    return list(session.scalars(query))


def advance_ramp(factory: sessionmaker[Session], pub: Publisher, rollout_id: int, *,
                 health: str) -> RampStep | None:
    """Take the rollout's next step if it is still due; None when it was not (taken by
    another replica, paused, halted, ramped by hand, not due yet). `health` is why the fleet
    judged it healthy, recorded in the audit event's reason."""
    with factory() as session:
        view = get_rollout(session, rollout_id)  # RolloutNotFoundError
    taken: list[RampStep] = []

    def change(session: Session, ch: db.Channel) -> Audited:
        taken.clear()  # a retried attempt starts over
        now = pub.clock()
        release = session.get(db.Release, rollout_id)
        assert release is not None  # releases are never deleted
        k, steps = release.ramp_step, list(release.ramp_steps_ppm or [])
        if k is None or release.ramp_interval_s is None or k + 1 >= len(steps):
            return Audited("rollout.ramp", str(rollout_id), {}, publish=False)
        share = steps[k + 1]
        next_at = now + release.ramp_interval_s if k + 2 < len(steps) else None
        moved = session.execute(
            update(db.Release).where(
                db.Release.id == rollout_id, db.Release.ramp_step == k,
                db.Release.ramp_next_at <= now, db.Release.state == db.ReleaseState.active,
                db.Release.mode == db.RolloutMode.active,
            ).values(share_ppm=share, ramp_step=k + 1, ramp_next_at=next_at,
                     updated_at=utcnow())
            .execution_options(synchronize_session="fetch"))
        if moved.rowcount != 1:  # type: ignore[attr-defined]  # CursorResult
            return Audited("rollout.ramp", str(rollout_id), {}, publish=False)
        reason = f"ramp schedule step {k + 2}/{len(steps)}: {health}"
        audit.record(session, ACTOR, "rollout.ramp",
                     f"{ch.name}/{view.record.model}/{view.record.version}",
                     rollout_id=rollout_id, share_ppm=share, reason=reason, step=k + 2,
                     steps=len(steps))
        taken.append(RampStep(rollout_id, ch.name, k + 2, len(steps), share, 0, reason))
        crashpoints.reached("ramp.moved")
        return Audited("rollout.ramp", str(rollout_id), {}, rollout_id=rollout_id)

    _, published = publish_change(factory, pub, view.channel, change)
    if published is None or not taken:
        return None
    step = taken[0]
    return RampStep(step.rollout_id, step.channel, step.step, step.steps, step.share_ppm,
                    published.serial, step.reason)


class RampTicker:
    """See the module docstring; time is the publisher's clock (tests inject one)."""

    def __init__(self, factory: sessionmaker[Session], publisher: Publisher) -> None:
        self.factory = factory
        self.publisher = publisher

    def tick(self, rollout_ids: Iterable[int] | None = None) -> list[RampStep]:
        """Take every due step of a healthy rollout (of `rollout_ids` only, when given)."""
        with self.factory() as session:
            due = due_ramps(session, self.publisher.clock(),
                            None if rollout_ids is None else set(rollout_ids))
        taken = []
        for rollout_id in due:
            try:
                step = self._step(rollout_id)
            except Exception:  # one broken rollout must not hold back the others' steps
                log.exception("ramp step of rollout %d failed; continuing", rollout_id)
                continue
            if step is not None:
                log.info("rollout %d ramped to %d ppm (%s), serial %d", rollout_id,
                         step.share_ppm, step.reason, step.serial)
                taken.append(step)
        return taken

    def _step(self, rollout_id: int) -> RampStep | None:
        with self.factory() as session:
            release = session.get(db.Release, rollout_id)
            assert release is not None
            verdict = judge(rule_of(release), standings(session, rollout_id),
                            thresholds_of(release))
        if verdict.decision != "pass":
            log.debug("rollout %d holds its ramp step: %s", rollout_id, verdict.reason)
            return None
        return advance_ramp(self.factory, self.publisher, rollout_id, health=verdict.reason)


async def ramp_loop(ticker: RampTicker, interval_s: float) -> None:
    """Run `ticker.tick` forever (until cancelled), logging and surviving failures."""
    while True:
        try:
            await asyncio.to_thread(ticker.tick)
        except Exception:  # a database outage must not end ramping for good
            log.exception("ramp tick failed; retrying in %.0f s", interval_s)
        await asyncio.sleep(interval_s)
