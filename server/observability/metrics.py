"""The server's Prometheus metrics: one definition of each counter, and rendering them.

Counters (each exposed with the `_total` suffix):

    modelfleet_http_requests{method, route, status}  requests the app routed (route template;
                                                     "unmatched" for no route; manifest polls
                                                     under their route, 200 / 304; 499: the
                                                     client went away before the answer)
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
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, values
from prometheus_client import generate_latest as _generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

CONTENT_TYPE = CONTENT_TYPE_LATEST
UNMATCHED_ROUTE = "unmatched"

HTTP_REQUESTS = Counter(
    "modelfleet_http_requests", "HTTP requests answered by the app, by route template",
    ["method", "route", "status"])
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
