"""A settable clock for publishing tests: the publisher and the re-signer take `now()` as an
injected callable, so tests move time by assigning `clock.now` instead of sleeping."""

from __future__ import annotations

from dataclasses import dataclass

NOW = 1_900_000_000  # 2030-03-17: far from any real expiry boundary


@dataclass
class Clock:
    now: int = NOW

    def __call__(self) -> int:
        return self.now
