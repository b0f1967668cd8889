"""``ShadowWorker``: runs candidate models on the app's inputs, off the app's thread.

(``ModelRuntime(shadow_isolation="thread")``, and where the shadow process cannot run:
``client_sdk.shadow_process`` keeps the GIL-holding work out of the app's process.)

``ModelRuntime.predict`` answers with the active model, then ``offer``s the input (with the
active outputs and latency) here: an append to a bounded queue — when the queue is full the
sample is dropped and counted, so the app never waits for the candidate. The app's thread
never signals the worker (a wake-up would make the two contend for the GIL right inside the
app's call) but when the queue is ¾ full: while a candidate is attached the worker sleeps
between batches for as long as half a queue takes to fill at the rate samples came lately
(``client_sdk.pace``: polling every millisecond costs the app's predictions more than the
samples do), and on an event while none is; before each sample it waits until
no active prediction is running (``idle()``), so the candidate runs in the app's idle time; a
sample that finds no idle moment within ``max_wait_s`` is dropped and counted too. One worker
thread hands each sample to the ``Evaluator`` (``client_sdk.shadow``, the sequence the shadow
child runs too): run the candidate, compare, aggregate into the candidate's ``ShadowStats``,
persist them every ``persist_every`` samples and whenever the verdict is decided; a decided
verdict goes to ``on_decided``. ``flush`` waits until the queue is drained and persists
everything (the CLI calls it before exiting).

The candidate must not compete with the app for the CPU either: the worker hands each
inference to a ``BackgroundRunner`` thread at the lowest priority (``client_sdk.background``)
and keeps the GIL-holding work (comparison, aggregation, persistence) on its own thread at
normal priority; it compares only while no active prediction runs, too.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from client_sdk.background import BackgroundRunner
from client_sdk.clock import Clock
from client_sdk.loaded import LoadedModel
from client_sdk.pace import Pace, wake_at
from client_sdk.shadow import Decided, Evaluator, Session
from client_sdk.shadow_stats import PENDING, ShadowStats, ShadowStore

_Item = tuple[Session, dict[str, np.ndarray[Any, Any]], dict[str, np.ndarray[Any, Any]], int,
              str | None]


class ShadowWorker:
    """One thread, one bounded queue, the sessions by model (see the module docstring); a
    ``client_sdk.shadow.Shadow``."""

    setups = 0  # offers that set something up (``ShadowProcess``'s layouts; none here)

    def __init__(self, store: ShadowStore, clock: Clock, *, queue_size: int,
                 persist_every: int, on_decided: Decided,
                 idle: Callable[[], bool] = lambda: True, poll_s: float = 0.001,
                 max_wait_s: float = 0.25, background: bool = True) -> None:
        """``background``: candidates run on a thread at the lowest priority (False only to
        measure what that buys, bench/sdk/bench_shadow.py)."""
        self.store = store
        self._q: collections.deque[_Item] = collections.deque()
        self._size = max(queue_size, 1)
        self._wake_at = wake_at(self._size)
        self._offered = 0     # items appended (app threads; under the GIL, append is atomic)
        self._done = 0        # items finished by the worker
        self._arrived = 0     # samples offered, taken or dropped (the worker's pace)
        self._offer_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # a session was attached (or flush, or close)
        self._pace = Pace()
        self._idle = idle
        self._poll_s = poll_s
        self._max_wait_s = max_wait_s
        self._on_decided = on_decided
        self._sessions: dict[str, Session] = {}
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._runner = BackgroundRunner(lower_priority=background)
        self._evaluator = Evaluator(run=self._runner.call, persist_every=persist_every,
                                    persist=self._persist_when_idle, decided=self._decided,
                                    settle=self._wait_idle, clock=clock)

    # -- sessions --------------------------------------------------------------------------

    def attach(self, loaded: LoadedModel) -> Session | None:
        """Start (or resume, from the persisted stats) comparing ``loaded`` as its model's
        candidate; None when that artifact already has a verdict (nothing left to measure)."""
        b = loaded.bundle
        stats = self.store.load(b.sha256) or ShadowStats(b.sha256, b.model, b.version)
        self.detach(b.model)
        if stats.verdict != PENDING:
            return None
        session = Session(loaded, stats)
        self._sessions[b.model] = session
        self._pace = Pace()  # its samples may come at once: do not sleep on an old rate
        self._ensure_thread()
        self._wake.set()
        return session

    def detach(self, model: str) -> None:
        old = self._sessions.pop(model, None)
        if old is not None:
            old.detached = True
            self._persist(old)

    def session(self, model: str) -> Session | None:
        return self._sessions.get(model)

    @property
    def priority(self) -> str:
        """The priority candidates run at (``client_sdk.background``; once one ran)."""
        return self._runner.priority

    # -- the app's side --------------------------------------------------------------------

    def offer(self, model: str, inputs: Mapping[str, np.ndarray[Any, Any]],
              outputs: Mapping[str, np.ndarray[Any, Any]], active_us: int,
              shape_variant: str | None) -> bool:
        """Queue one sample for the candidate without ever blocking; False when dropped."""
        s = self._sessions.get(model)
        if s is None or s.stats.verdict != PENDING:
            return False
        self._arrived += 1  # (the pace's count: not exact across app threads, need not be)
        if len(self._q) >= self._size:
            return self._drop(s)
        # Copies: the app may reuse its buffers once predict returns.
        item = (s, {k: np.array(v, copy=True) for k, v in inputs.items()},
                {k: np.array(v, copy=True) for k, v in outputs.items()}, active_us,
                shape_variant)
        with self._offer_lock:
            self._offered += 1
            self._q.append(item)
        if len(self._q) >= self._wake_at:  # the rate jumped: wake the worker before the pace
            self._wake.set()
        return True

    @staticmethod
    def _drop(s: Session) -> bool:
        with s.lock:
            s.dropped += 1
        return False

    # -- the worker's side -----------------------------------------------------------------

    def _ensure_thread(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="modelfleet-shadow",
                                                daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                item = self._q.popleft()
            except IndexError:
                # Nothing to compare: sleep until an attach; else until the pace's time.
                self._wake.wait(self._pace.timeout(self._arrived, self._size)
                                if self._sessions else None)
                self._wake.clear()
                continue
            try:
                if self._wait_idle():
                    self._process(*item)
                else:
                    self._drop(item[0])
            finally:
                self._done += 1

    def _wait_idle(self) -> bool:
        """Wait (polling) until no active prediction runs; False after ``max_wait_s``."""
        end = time.perf_counter() + self._max_wait_s
        while not self._idle():
            if time.perf_counter() > end or self._stop.is_set():
                return False
            time.sleep(self._poll_s / 4)
        return True

    def _process(self, s: Session, inputs: dict[str, np.ndarray[Any, Any]],
                 outputs: dict[str, np.ndarray[Any, Any]], active_us: int,
                 shape_variant: str | None) -> None:
        # The run releases the GIL, the comparison holds it (numpy on small arrays): the
        # evaluator waits (``settle``) until a prediction the app started meanwhile finished.
        self._evaluator.sample(s, inputs, outputs, active_us, shape_variant)

    def _persist_when_idle(self, s: Session) -> None:
        self._wait_idle()  # (encoding the JSON holds the GIL too; persist even if busy)
        self._persist(s)

    def _decided(self, s: Session) -> None:
        self._persist(s)
        self._on_decided(s.stats.model, s)

    def _persist(self, s: Session) -> None:
        with s.lock:
            s.stats.dropped += s.dropped
            s.dropped = 0
            data = ShadowStats.from_dict(s.stats.to_dict())  # a copy: the worker goes on
        self.store.save(data)

    # -- lifecycle -------------------------------------------------------------------------

    def flush(self) -> None:
        """Wait until every queued sample is processed, then persist every session."""
        self._wake.set()  # now, not after the pace's sleep
        while (self._thread is not None and self._thread.is_alive()
               and self._done < self._offered):
            time.sleep(self._poll_s)
        for s in list(self._sessions.values()):
            self._persist(s)

    def close(self) -> None:
        """Drain, persist and stop the worker thread."""
        self.flush()
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._stop.set()
            self._wake.set()
            thread.join()
        self._runner.close()
        self._thread = None
        self._stop = threading.Event()
