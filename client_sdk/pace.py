"""``Pace``: how long a shadow worker sleeps between batches of samples, so that it never polls.

A worker that wakes every millisecond to look for samples costs the app more than the samples
do on a small device: each wake-up runs the interpreter on a core and evicts the caches the
app's next prediction needs (docs/benchmarks.md, "Shadow mode"). Instead it sleeps for as long
as half a queue of samples takes to arrive at the rate they arrived lately (a moving average
over the last few sleeps), between ``MIN_SLEEP_S`` and ``MAX_SLEEP_S``, and then runs them
all: a few wake-ups a second when the app samples little, one per half a queue when it
samples a lot; after a sleep in which nothing came, twice as long (when the app stops, the
worker is quiet within a second, after at most eight wake-ups: log2 of MAX_SLEEP_S /
MIN_SLEEP_S, whatever the rate was). Before the first sample (a new
``Pace`` per attached candidate) it sleeps ``MIN_SLEEP_S``, then twice as long each time
nothing came, so a candidate's first samples are not dropped while an idle one costs a few
wake-ups a second. When samples come faster than the pace expected, the app wakes the worker
once ``wake_at`` of them wait.
"""

from __future__ import annotations

import time

MIN_SLEEP_S = 0.002
# Also how long a sample waits at most when the rate falls, or its wake-up is lost.
MAX_SLEEP_S = 0.5


def wake_at(queue_size: int) -> int:
    """Samples waiting that make the app wake a sleeping worker early (¾ of its queue): they
    came faster than the pace expected."""
    return max(queue_size - queue_size // 4, 1)


class Pace:
    def __init__(self) -> None:
        self.rate = 0.0  # samples per second, lately
        self._at = time.monotonic()
        self._seen = 0
        self._backoff = MIN_SLEEP_S / 2
        self._last = MIN_SLEEP_S  # the sleep returned last

    def timeout(self, seen: int, queue_size: int) -> float:
        """Seconds to sleep now, given ``seen`` samples so far (a running count), for half of
        ``queue_size`` to arrive."""
        batch = max(queue_size // 2, 1)
        now = time.monotonic()
        if seen == self._seen:  # nothing came: twice as long (a few wake-ups, then quiet)
            # Twice the last sleep, not half the rate: after a burst the rate can be so high
            # that the sleep it gives is far under MIN_SLEEP_S, and halving it would take that
            # many more wake-ups to climb back (a loaded app thread offers in bursts).
            self.rate = min(self.rate / 2, batch / (2 * self._last)) if self.rate else 0.0
        elif now > self._at:
            lately = (seen - self._seen) / (now - self._at)
            self.rate = lately if self.rate == 0.0 else 0.7 * self.rate + 0.3 * lately
        self._at, self._seen = now, seen
        if self.rate <= 0.0:  # nothing came yet
            self._backoff = min(self._backoff * 2, MAX_SLEEP_S)
            self._last = self._backoff
            return self._backoff
        self._last = min(MAX_SLEEP_S, max(MIN_SLEEP_S, batch / self.rate))
        return self._last
