"""The ramp tick: every rollout whose next ramp step is due takes it — if the fleet says it
is healthy (docs/shadow.md "Ramp schedules"): the guard's own judgement of the devices'
counted standings is "pass", i.e. at least `min_devices` reporting devices, a failed share
below `max_fail_share` (the latency budget counting as a failure) and the promotion
evidence (enough passed devices, spread over time, no unexplained failure). A rollout
still waiting for reports, or failing, keeps its share; the guard halts the failing ones.

It runs in every API process: periodically (`ramp_loop`, every `ramp_check_seconds`) and
after each telemetry batch that brought a verdict, for the rollouts that batch touched. The
step itself (server/rollouts/ramp.py) is idempotent across replicas.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from sqlalchemy.orm import Session, sessionmaker

from server.db import models as db
from server.publish.publisher import Publisher
from server.rollouts.guard import judge
from server.rollouts.health import rule_of, standings, thresholds_of
from server.rollouts.ramp import RampStep, advance_ramp, due_ramps

log = logging.getLogger("modelfleet.fleet.ramp")


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
