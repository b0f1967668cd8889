"""The one leased-job mechanism: how a worker owns a row of a job table durably.

Builds (`runner.BuildRunner`) and patch jobs (`patch_runner.PatchRunner`) — and any job to
come whose table mixes in `server.db.models.LeasedJob` — follow the same rules:

- **Claim** with one conditional UPDATE: the row is queued and due (`next_attempt_at` passed
  or unset), or running with a heartbeat older than `stale_after_s` (its worker died —
  **takeover**). The UPDATE sets `running`, `locked_by`, a fresh heartbeat and `attempts + 1`
  and returns the key only if it matched, so two workers can never both own a job.
- **Heartbeat** while working, for at most `max_run_s`: a hung job then stops beating and
  becomes claimable by another worker.
- **Settle** only while still the owner (`owned`: row locked, `locked_by` is this worker,
  state running), so a worker that lost its claim cannot overwrite the new owner's result:
  `finish` moves to a final state, `back_off` re-queues with exponential delay
  (`RetryPolicy`) until `max_attempts`.

Every state change but the claim itself goes through the row's checked `transition`; the
claim's WHERE clause is the check for → running.

A worker's id (`locked_by`) names its host and pid, for operators; what a job shows the
outside (its log) names the worker by `public_worker_name` instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Generic, TypeVar

from sqlalchemy import ColumnElement, or_, select, update
from sqlalchemy.orm import InstrumentedAttribute, Session, sessionmaker

from server.db.models import LeasedJob
from server.db.types import utcnow

log = logging.getLogger(__name__)

S = TypeVar("S", bound=Enum)
J = TypeVar("J", bound=LeasedJob[Any])



def _dead_here(worker_id: str, host: str) -> bool:
    """Whether `worker_id` (server/wiring.py's `worker:<role>:<host>:<pid>` or the in-process
    queue's `inprocess:<host>:<pid>:<tag>`) names a process of `host` that is gone."""
    parts = worker_id.split(":")
    where = {"inprocess": (1, 2), "worker": (2, 3)}.get(parts[0])
    if where is None or len(parts) <= where[1] or parts[where[0]] != host \
            or not parts[where[1]].isdigit():
        return False
    pid = int(parts[where[1]])
    if pid == os.getpid():
        return False  # this process: an earlier queue of it, still alive
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def public_worker_name(worker_id: str) -> str:
    """An opaque, stable name for a worker id (`w-` and 10 hex digits): the same worker is
    recognisable across a job's log lines, its host name and pid are not in them."""
    return "w-" + hashlib.sha256(worker_id.encode()).hexdigest()[:10]


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff between attempts: base · 2^(attempt−1), capped at max_delay_s."""

    max_attempts: int = 4
    base_delay_s: float = 5.0
    max_delay_s: float = 300.0

    def delay(self, attempts: int) -> float:
        return float(min(self.base_delay_s * 2 ** max(attempts - 1, 0), self.max_delay_s))


class Lease(Generic[J, S]):
    """Claims, heartbeats and settles the rows of one job table for one worker.

    `key` is the column that names a job to callers (`Build.id`, `PatchJob.version_id`);
    `queued` / `running` are the table's states of those names."""

    def __init__(self, session_factory: sessionmaker[Session], model: type[J],
                 key: InstrumentedAttribute[int], *, queued: S, running: S, worker_id: str,
                 retry: RetryPolicy | None = None, heartbeat_s: float = 5.0,
                 stale_after_s: float = 120.0, max_run_s: float = 3600.0,
                 now: Callable[[], datetime] = utcnow) -> None:
        self._sf = session_factory
        # What time it is for heartbeats, staleness and backoff (tests move a fake one
        # instead of sleeping past `stale_after_s` or a retry's delay).
        self.now = now
        self.model = model
        self.key = key
        self.queued, self.running = queued, running
        self.worker_id = worker_id
        self.retry = retry or RetryPolicy()
        self.heartbeat_s = heartbeat_s
        self.stale_after_s = stale_after_s
        self.max_run_s = max_run_s

    # ---- claiming ------------------------------------------------------------------------

    def claimable(self, now: datetime) -> ColumnElement[bool]:
        """Rows a worker may claim now: queued and due, or running with a stale heartbeat."""
        m = self.model
        stale = now - timedelta(seconds=self.stale_after_s)
        return or_(
            (m.state == self.queued)
            & or_(m.next_attempt_at.is_(None), m.next_attempt_at <= now),
            (m.state == self.running)
            & or_(m.heartbeat_at.is_(None), m.heartbeat_at < stale),
        )

    def claim(self, s: Session, key: int, **values: object) -> bool:
        """Takes job `key` in `s`'s transaction (the caller commits, or rolls back on False);
        `values` are further columns the claim sets (e.g. counters to snapshot)."""
        now = self.now()
        m = self.model
        claimed = s.scalar(
            update(m).where(self.key == key, self.claimable(now)).values(
                state=self.running, locked_by=self.worker_id, heartbeat_at=now,
                started_at=now, finished_at=None, next_attempt_at=None,
                attempts=m.attempts + 1, updated_at=now, **values)
            .returning(self.key).execution_options(synchronize_session=False))
        return claimed is not None

    def free_jobs_of_dead_workers(self) -> list[int]:
        """Running jobs held by a worker process of this host that no longer exists (killed,
        crashed, the machine restarted): their heartbeat is cleared, so they are claimable
        now instead of `stale_after_s` later. Only a process known dead is passed over (a
        worker on another host, or one whose pid lives, waits for the timeout); a wrong
        guess would only mean a takeover, which settling makes safe. Returns the keys."""
        m = self.model
        host = socket.gethostname()
        with self._sf() as s:
            held = s.execute(select(self.key, m.locked_by).where(
                m.state == self.running, m.locked_by.is_not(None))).all()
            dead = [key for key, who in held if _dead_here(str(who), host)]
            if dead:
                s.execute(update(m).where(self.key.in_(dead), m.state == self.running)
                          .values(heartbeat_at=None)
                          .execution_options(synchronize_session=False))
                s.commit()
                log.warning("%s %s were held by dead workers of this host; claimable now",
                            m.__tablename__, dead)
        return dead

    def claimable_keys(self, limit: int = 10) -> list[int]:
        """Keys of the jobs due now (or abandoned by a dead worker), oldest row first."""
        with self._sf() as s:
            return list(s.scalars(select(self.key).where(self.claimable(self.now()))
                                  .order_by(self.model.id).limit(limit)))

    def next_wakeup(self) -> float | None:
        """Seconds until the earliest delayed retry is due (None if nothing is waiting)."""
        m = self.model
        with self._sf() as s:
            at = s.scalar(select(m.next_attempt_at).where(
                m.state == self.queued, m.next_attempt_at.is_not(None))
                .order_by(m.next_attempt_at).limit(1))
        return None if at is None else max((at - self.now()).total_seconds(), 0.0)

    # ---- while running -------------------------------------------------------------------

    @contextlib.contextmanager
    def heartbeat(self, key: int,
                  progress: Callable[[], Mapping[str, object]] | None = None) -> Iterator[None]:
        """Beats for job `key` in a thread while the block runs; each beat also writes
        `progress()` (e.g. the log so far)."""
        stop = threading.Event()
        beat = threading.Thread(target=self._beat, args=(key, stop, progress), daemon=True,
                                name=f"heartbeat-{self.model.__tablename__}-{key}")
        beat.start()
        try:
            yield
        finally:
            stop.set()
            beat.join(timeout=5)

    def _beat(self, key: int, stop: threading.Event,
              progress: Callable[[], Mapping[str, object]] | None) -> None:
        m = self.model
        # The lease's clock, like the heartbeats and staleness it feeds: a test moves it past
        # `max_run_s` instead of sleeping there. A wall-clock jump forward can only cause an
        # early takeover, which settling makes safe.
        started = self.now()
        while not stop.wait(self.heartbeat_s):
            if (self.now() - started).total_seconds() > self.max_run_s:
                log.error("%s %s exceeded %.0fs; no longer heartbeating so another worker "
                          "can take it over", m.__tablename__, key, self.max_run_s)
                return
            try:
                with self._sf() as s:
                    s.execute(update(m).where(self.key == key, m.locked_by == self.worker_id,
                                              m.state == self.running)
                              .values(heartbeat_at=self.now(),
                                      **(progress() if progress else {}))
                              .execution_options(synchronize_session=False))
                    s.commit()
            except Exception:  # a missed beat only risks a takeover, which is safe
                log.warning("heartbeat of %s %s failed", m.__tablename__, key, exc_info=True)

    # ---- settling ------------------------------------------------------------------------

    def owned(self, s: Session, key: int) -> J | None:
        """The job's row locked for update, or None if this worker no longer owns it."""
        job: J | None = s.execute(select(self.model).where(self.key == key).with_for_update()
                        ).scalar_one_or_none()
        if job is None or job.locked_by != self.worker_id or job.state != self.running:
            return None
        return job

    def may_retry(self, job: J) -> bool:
        return job.attempts < self.retry.max_attempts

    def finish(self, job: J, state: S, error: str = "") -> None:
        """Releases an owned job into `state` (a final state, or queued to run again now)."""
        now = self.now()
        job.error = error
        job.transition(state)
        job.locked_by, job.finished_at, job.updated_at = None, now, now

    def back_off(self, job: J, error: str) -> float:
        """Re-queues an owned job after its backoff delay; returns the delay in seconds.
        (`finished_at` stays unset: the job is not finished.)"""
        delay = self.retry.delay(job.attempts)
        now = self.now()
        job.error = error
        job.transition(self.queued)
        job.locked_by, job.updated_at = None, now
        job.next_attempt_at = now + timedelta(seconds=delay)
        return delay
