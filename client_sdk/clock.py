"""Time as an injected dependency: wall time for expiry, monotonic time for deadlines."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """What the SDK needs from time; tests inject a fake that advances on ``sleep``."""

    def time(self) -> float:
        """Wall-clock seconds since the Unix epoch (UTC), used for manifest expiry."""
        ...

    def monotonic(self) -> float:
        """Monotonic seconds, used for deadlines."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds`` (the fake advances its time instead)."""
        ...


class SystemClock:
    """The real clock."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
