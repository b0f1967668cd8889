"""Settable clocks: the publisher and the re-signer take `now()` (Unix seconds) as an injected
callable, job leases (`server.jobs.lease.Lease`, its runners' `now=`) an aware UTC datetime,
so tests move time instead of sleeping — and never race a window of wall time."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from server.db.types import utcnow

NOW = 1_900_000_000  # 2030-03-17: far from any real expiry boundary


@dataclass
class Clock:
    now: int = NOW

    def __call__(self) -> int:
        return self.now


@dataclass
class UtcClock:
    """A lease's `now=`: starts at the real time (rows stay plausible), moves on `advance`."""

    at: datetime = field(default_factory=utcnow)

    def __call__(self) -> datetime:
        return self.at

    def advance(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)
