"""The embedded default queue: a worker thread inside the API process.

Durable because the queue *is* the database: `enqueue_compile` only wakes the thread, which
claims due builds through `BuildRunner`; `enqueue_patches` records a `patch_jobs` row
(`request_patches`) and wakes it, and it runs due patch jobs through `PatchRunner` once no
build is due. After a crash or restart the next process finds the queued jobs (and running
ones whose heartbeat went stale) and finishes them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid

from server.jobs.interface import JobQueueUnavailableError
from server.jobs.patch_runner import PatchRunner, request_patches
from server.jobs.runner import BuildRunner

log = logging.getLogger(__name__)


class InProcessJobQueue:
    def __init__(self, runner: BuildRunner, patches: PatchRunner | None = None, *,
                 poll_interval_s: float = 2.0) -> None:
        self.runner = runner
        self.patches = patches
        self._poll = poll_interval_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @staticmethod
    def worker_name() -> str:
        return f"inprocess:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"

    def enqueue_compile(self, version_id: int) -> None:
        """Builds are already rows; wake the worker (idempotent, never raises)."""
        self._wake.set()
        self.start()

    def enqueue_patches(self, version_id: int) -> None:
        """Records the patch job (raises only if the database write fails) and wakes the
        worker."""
        if self.patches is None:
            raise RuntimeError("this in-process queue was built without a PatchRunner")
        request_patches(self.patches.session_factory, version_id)
        self._wake.set()
        self.start()

    def start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._loop, name="modelfleet-compile",
                                                daemon=True)
                self._thread.start()

    def check_ready(self) -> None:
        """The worker thread, once started, is still running (it dies only on a bug: a
        failing job is caught inside it). Raises JobQueueUnavailableError."""
        thread = self._thread
        if thread is not None and not thread.is_alive() and not self._stop.is_set():
            raise JobQueueUnavailableError("the in-process worker thread has stopped; "
                                           "queued builds wait for the next upload")

    def close(self, timeout_s: float = 30.0) -> None:
        """Stops taking builds; a build in progress finishes first (up to `timeout_s`)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def drain(self) -> int:
        """Runs every due build, then every due patch job, now, in the caller's thread;
        returns how many ran."""
        ran = 0
        runners: list[BuildRunner | PatchRunner] = [self.runner]
        if self.patches is not None:
            runners.append(self.patches)
        for runner in runners:
            while ids := runner.claimable_ids():
                progressed = False
                for job_id in ids:
                    if runner.process(job_id):
                        ran += 1
                        progressed = True
                if not progressed:
                    break
        return ran

    def _free_jobs_of_dead_workers(self) -> None:
        """A process of this host killed mid-build (or mid-patch job) holds its job until the
        heartbeat goes stale (minutes); a restarted server takes it back at once."""
        try:
            self.runner.lease.free_jobs_of_dead_workers()
            if self.patches is not None:
                self.patches.lease.free_jobs_of_dead_workers()
        except Exception:  # the database may be unreachable at start; the timeout remains
            log.warning("could not look for jobs of dead workers", exc_info=True)

    def _next_wakeup(self) -> float | None:
        dues = [self.runner.next_wakeup()]
        if self.patches is not None:
            dues.append(self.patches.next_wakeup())
        known = [d for d in dues if d is not None]
        return min(known) if known else None

    def _loop(self) -> None:
        self._free_jobs_of_dead_workers()
        while not self._stop.is_set():
            try:
                for build_id in self.runner.claimable_ids():
                    if self._stop.is_set():
                        return
                    self.runner.process(build_id)
                # Builds first (devices wait for them); one patch job per pass, so a new
                # upload never waits behind several patch jobs.
                if self.patches is not None and not self._stop.is_set():
                    for version_id in self.patches.claimable_ids(1):
                        if self.patches.process(version_id):
                            self._wake.set()  # there may be more: loop without sleeping
                due = self._next_wakeup()
            except Exception:  # the database may be briefly unreachable; keep the thread
                log.warning("compile worker loop failed; retrying", exc_info=True)
                due = None
            wait = self._poll if due is None else min(self._poll, max(due, 0.05))
            self._wake.wait(wait)
            self._wake.clear()
