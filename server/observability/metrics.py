"""The server's Prometheus metrics: one definition of each counter, and rendering them.

Counters (each exposed with the `_total` suffix):

    modelfleet_http_requests{method, route, status}  requests the app routed (route template;
                                                     "unmatched" for no route)
    modelfleet_manifest_polls{path, status}          manifest polls by answering path
                                                     (shortcut | app | route) and 200 / 304
    modelfleet_build_jobs{outcome}                   compile jobs settled: succeeded | failed |
                                                     retried
    modelfleet_patch_jobs{outcome}                   delta-patch jobs: done | failed | retried
    modelfleet_telemetry_reports{result}             reports ingested: accepted | duplicate
    modelfleet_rollout_halts{actor}                  halts that published: system | user

Several API processes (`modelfleet serve --workers N`) each count on their own; serve points
PROMETHEUS_MULTIPROC_DIR at a fresh directory before any worker imports prometheus_client,
so every process writes its counters to its own mmap file there and whichever process
answers `/metrics` sums them all (prometheus_client's multiprocess mode). Counters only: no
gauges here, so nothing needs `mark_process_dead`.

Manifest polls are the hot path: a multiprocess `inc()` costs ~3 µs (mmap write under a
lock), a poll on the protocol shortcut ~20 µs. So the poll paths only add to the plain ints
of `PollStats` and `PollFlusher` copies the deltas into the counter once a second (and just
before a scrape in the scraping process).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, values
from prometheus_client import generate_latest as _generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = CONTENT_TYPE_LATEST
UNMATCHED_ROUTE = "unmatched"

HTTP_REQUESTS = Counter(
    "modelfleet_http_requests", "HTTP requests answered by the app, by route template",
    ["method", "route", "status"])
MANIFEST_POLLS = Counter(
    "modelfleet_manifest_polls", "Manifest polls by answering path (shortcut: uvicorn "
    "protocol, app: before routing, route: FastAPI route) and status (304 = unchanged)",
    ["path", "status"])
BUILD_JOBS = Counter("modelfleet_build_jobs", "Compile jobs settled, by outcome", ["outcome"])
PATCH_JOBS = Counter("modelfleet_patch_jobs", "Delta-patch jobs settled, by outcome",
                     ["outcome"])
TELEMETRY_REPORTS = Counter("modelfleet_telemetry_reports",
                            "Device telemetry reports ingested, by result", ["result"])
ROLLOUT_HALTS = Counter("modelfleet_rollout_halts",
                        "Rollout halts that published a manifest, by actor (system: the "
                        "telemetry guard; user: a token holder)", ["actor"])


def count_telemetry(accepted: int, duplicates: int) -> None:
    """One ingested batch (called where the ingest knows both numbers)."""
    if accepted:
        TELEMETRY_REPORTS.labels("accepted").inc(accepted)
    if duplicates:
        TELEMETRY_REPORTS.labels("duplicate").inc(duplicates)


def count_halt(actor: str) -> None:
    ROLLOUT_HALTS.labels("system" if actor == "system" else "user").inc()


class PollStats(Protocol):
    """What server.publish.manifest_cache.PollStats counts (structural: no import of it)."""

    shortcut: int
    shortcut_304: int
    app: int
    app_304: int
    route: int
    route_304: int


# (path label, status label, how to read that count off PollStats)
_POLL_FIELDS: tuple[tuple[str, str, Callable[[PollStats], int]], ...] = (
    ("shortcut", "200", lambda s: s.shortcut - s.shortcut_304),
    ("shortcut", "304", lambda s: s.shortcut_304),
    ("app", "200", lambda s: s.app - s.app_304),
    ("app", "304", lambda s: s.app_304),
    ("route", "200", lambda s: s.route - s.route_304),
    ("route", "304", lambda s: s.route_304),
)


class PollFlusher:
    """Moves what a process's `PollStats` counted since the last flush into MANIFEST_POLLS."""

    def __init__(self, stats: PollStats) -> None:
        self.stats = stats
        self._seen = [0] * len(_POLL_FIELDS)
        self._children = [MANIFEST_POLLS.labels(path, status)
                          for path, status, _ in _POLL_FIELDS]

    def flush(self) -> None:
        for i, (_path, _status, read) in enumerate(_POLL_FIELDS):
            now = read(self.stats)
            if now > self._seen[i]:
                self._children[i].inc(now - self._seen[i])
                self._seen[i] = now


def multiprocess() -> bool:
    """Whether this process's counters live in mmap files: prometheus_client chose so at
    import from PROMETHEUS_MULTIPROC_DIR (its own read of the environment, not ours)."""
    return bool(values.ValueClass.__name__ == "MmapedValue")


def render() -> bytes:
    """The text exposition of every counter: summed over all processes in multiprocess mode,
    this process's (plus its process/GC collectors) otherwise."""
    if not multiprocess():
        return _generate_latest(REGISTRY)
    registry = CollectorRegistry()
    # It finds the directory itself (PROMETHEUS_MULTIPROC_DIR), as the values did.
    MultiProcessCollector(registry)  # type: ignore[no-untyped-call]  # untyped upstream
    return _generate_latest(registry)
