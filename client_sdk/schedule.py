"""When to poll next: a jittered interval after success, capped exponential backoff after errors.

Pure logic (the random source is injected) so the schedule is tested without waiting. Jitter
spreads a fleet's polls so devices do not hit the server in lockstep.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class PollSchedule:
    interval: float
    jitter: float
    backoff_base: float
    backoff_cap: float
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0

    def next_delay(self, succeeded: bool) -> float:
        """Seconds to wait before the next poll, given how the last one went."""
        if succeeded:
            self.failures = 0
            spread = self.interval * self.jitter
            return max(0.0, self.interval + self.rng.uniform(-spread, spread))
        self.failures += 1
        ceiling = min(self.backoff_cap, self.backoff_base * 2 ** min(self.failures - 1, 62))
        # "Full jitter": uniform in [ceiling/2, ceiling] keeps a floor so a failing fleet
        # does not hammer the server, while still de-synchronising devices.
        return self.rng.uniform(ceiling / 2, ceiling)
