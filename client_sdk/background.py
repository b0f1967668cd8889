"""``BackgroundRunner``: one low-priority thread that runs shadow candidates' inferences.

A candidate must not take the CPU from the app: the runner thread lowers its own scheduling
priority when it starts (``lower_thread_priority``: Linux ``SCHED_IDLE``, else nice 19 for that
thread only), so under load the kernel runs the app's threads first and the candidate gets
what is left. It runs the inference and nothing else. Everything that holds the GIL for long
(comparing outputs, aggregating, writing the statistics) stays on the shadow worker at normal
priority: a low-priority thread preempted while it holds the GIL would stall the app's thread
until the kernel gives it the CPU back (measured: p99 +330% under load, against +19% when the
comparison moved off it; docs/benchmarks.md). Inference releases the GIL (onnxruntime's
``run``), and the candidate's session runs on the calling thread without spinning
(``client_sdk.backends``), so the whole inference happens at the low priority.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
# What ``lower_thread_priority`` achieved.
IDLE, NICE, NORMAL = "idle", "nice", "normal"


def lower_thread_priority() -> str:
    """Give the calling thread (only it) the lowest CPU priority the OS grants without
    privileges: ``SCHED_IDLE`` on Linux (it runs only when no normal thread wants the core),
    else nice 19 for the thread; returns which, or ``NORMAL`` where neither is supported.
    Never raises: a candidate at normal priority is slower to judge, not wrong."""
    if not sys.platform.startswith("linux"):
        # Elsewhere PRIO_PROCESS would renice the whole process (the app), not one thread.
        return NORMAL
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: the calling thread
        return IDLE
    except (AttributeError, OSError):
        pass
    try:
        # On Linux a thread id is a valid PRIO_PROCESS target: this renices the thread alone.
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        return NICE
    except (AttributeError, OSError):
        return NORMAL


class BackgroundRunner:
    """``call(fn)`` runs ``fn`` on the runner thread and returns its result and wall time."""

    def __init__(self, *, lower_priority: bool = True) -> None:
        self._lower = lower_priority
        self.priority = NORMAL  # what the thread got, once started
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        if self._lower:
            self.priority = lower_thread_priority()
        while (job := self._jobs.get()) is not None:
            job()

    def call(self, fn: Callable[[], T]) -> tuple[T, int]:
        """``fn()`` on the runner thread, and how long it took there (µs); re-raises what it
        raised. The caller blocks (GIL released) until it is done."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="modelfleet-candidate",
                                            daemon=True)
            self._thread.start()
        done: queue.SimpleQueue[tuple[T | None, BaseException | None, int]] = \
            queue.SimpleQueue()

        def job() -> None:
            t0 = time.perf_counter_ns()
            try:
                value, error = fn(), None
            except BaseException as e:  # handed to the caller's thread, raised there
                value, error = None, e
            done.put((value, error, (time.perf_counter_ns() - t0) // 1000))

        self._jobs.put(job)
        value, error, us = done.get()
        if error is not None:
            raise error
        return value, us  # type: ignore[return-value]  # fn returned it (no error)

    def close(self) -> None:
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._jobs.put(None)
            thread.join()
        self._thread = None
