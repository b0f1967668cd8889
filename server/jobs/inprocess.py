"""The embedded default queue: a worker thread inside the API process.

Durable because the queue *is* the `builds` table: `enqueue_compile` only wakes the thread,
which claims due builds through `BuildRunner`. After a crash or restart the next process
finds the queued builds (and running ones whose heartbeat went stale) and finishes them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid

from server.jobs.runner import BuildRunner

log = logging.getLogger(__name__)


class InProcessJobQueue:
    def __init__(self, runner: BuildRunner, *, poll_interval_s: float = 2.0) -> None:
        self.runner = runner
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

    def start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._loop, name="modelfleet-compile",
                                                daemon=True)
                self._thread.start()

    def close(self, timeout_s: float = 30.0) -> None:
        """Stops taking builds; a build in progress finishes first (up to `timeout_s`)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def drain(self) -> int:
        """Runs every due build now, in the caller's thread; returns how many ran."""
        ran = 0
        while ids := self.runner.claimable_ids():
            progressed = False
            for build_id in ids:
                if self.runner.process(build_id):
                    ran += 1
                    progressed = True
            if not progressed:
                break
        return ran

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                for build_id in self.runner.claimable_ids():
                    if self._stop.is_set():
                        return
                    self.runner.process(build_id)
                due = self.runner.next_wakeup()
            except Exception:  # the database may be briefly unreachable; keep the thread
                log.warning("compile worker loop failed; retrying", exc_info=True)
                due = None
            wait = self._poll if due is None else min(self._poll, max(due, 0.05))
            self._wake.wait(wait)
            self._wake.clear()
