"""``ModelRuntime``: what the app calls to predict, with lock-free atomic bundle swaps.

Each model has slots ("active", and "candidate" for shadow mode) holding a ``LoadedModel``.
``predict`` reads the slot once (a single dict read, atomic in CPython) and runs on that object,
so a concurrent ``swap`` never fails, mixes or blocks an inference: calls already running finish
on the old bundle, which is released when the last of them drops its reference. Loading a
bundle (``prepare``) is slow and happens off the inference path; ``swap`` is a pointer store.

Shape variants: a bundle installed with ``all_shape_variants`` holds the model compiled for
each input-shape variant (``shape:<variant>`` members, e.g. 360p/720p/1080p); ``prepare`` loads
them all, and ``predict(..., shape_variant="720p")`` picks the loaded backend by a dict lookup,
so switching resolution never reloads a model. Loading, running, the circuit breaker (after
``breaker_threshold`` consecutive failures the CPU ONNX fallback for good): ``LoadedModel``,
``client_sdk.loaded``.

Shadow mode: a bundle in the "candidate" slot never answers ``predict`` (unless asked for by
``slot=``); active predictions are offered to it (bounded, drops counted; within the
``ShadowConfig.budget`` of the app's own predict time, see ``predict``) to the ``Shadow``
(``client_sdk.shadow``) — by default the shadow process (``client_sdk.shadow_process``: a
child with its own GIL), else the ``ShadowWorker`` thread (``ShadowConfig.isolation``) —,
which compares the outputs and latencies and decides its verdict. A failed candidate is
cleared from the slot at once.

Local rollback: ``client_sdk.health`` watches a newly active bundle; when it fails at run time
the previous bundle is loaded and swapped in at once and made active on disk (no download), and
the bad artifact is recorded as failed so the updater never installs it again.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Unpack

import numpy as np

from client_sdk import shadow_process
from client_sdk.backends import open_backend
from client_sdk.clock import Clock, SystemClock
from client_sdk.errors import BackendError, ClientSDKError, ConfigError, ModelNotLoadedError
from client_sdk.events import Event, EventCallback, EventKind, emit
from client_sdk.health import HealthMonitor, Policy
from client_sdk.install import Bundle, BundleStore
from client_sdk.keystore import KeyStore
from client_sdk.loaded import BackendFactory, LoadedModel, Prediction, prepare_bundle
from client_sdk.protection import use_keystore
from client_sdk.shadow import AUTO, PROCESS, Session, Shadow, ShadowConfig, ShadowKeywords
from client_sdk.shadow_process import ShadowProcess
from client_sdk.shadow_stats import FAILED, ShadowStore
from client_sdk.shadow_worker import ShadowWorker
from client_sdk.telemetry import Outbox, update_report

ACTIVE = "active"
CANDIDATE = "candidate"
# The lock the updater holds while it installs (runtime rollbacks take it to write the pointer).
LOCK_NAME = ".updater.lock"


class ModelRuntime:
    """Runs the active bundle of each model; swaps bundles atomically under load."""

    def __init__(
        self,
        data_dir: Path,
        *,
        on_event: EventCallback | None = None,
        breaker_threshold: int = 3,
        backend_factory: BackendFactory = open_backend,
        clock: Clock | None = None,
        shadow_config: ShadowConfig | None = None,
        health: Policy | None = None,
        keystore: KeyStore | None = None,
        timer: Callable[[], int] = time.perf_counter_ns,
        **shadow_keywords: Unpack[ShadowKeywords],
    ) -> None:
        """``shadow_config``: how shadow candidates run (``client_sdk.shadow.ShadowConfig``:
        queue, sampling, budget, persistence, priority, isolation); the older keywords
        ``shadow_queue``, ``shadow_persist_every``, ``shadow_sample_every``,
        ``shadow_budget``, ``shadow_background`` and ``shadow_isolation`` still work and set
        the ``ShadowConfig`` field of the same name (``queue_size`` for ``shadow_queue``);
        ``health``: when a newly active bundle is rolled back (``client_sdk.health``);
        ``keystore``: the device keys of protected models (default: 0600 files under
        ``data_dir/keys``, client_sdk/keystore.py);
        ``timer``: the ns counter predictions and offers are timed with (the active latency
        the health policy and the shadow see, and the shadow budget's accounts; tests inject
        one that counts, so what they offer does not depend on the machine's load)."""
        config = ShadowConfig.from_keywords(shadow_config, shadow_keywords)
        self.shadow_config = config
        self.data_dir = Path(data_dir)
        if keystore is not None:  # protected models open with its device-local key
            use_keystore(self.data_dir, keystore)
        self.store = BundleStore(self.data_dir)
        self._on_event = on_event
        self._threshold = breaker_threshold
        self._open = backend_factory
        self._slots: dict[tuple[str, str], LoadedModel] = {}
        self._swap_lock = threading.Lock()
        self._rollback_lock = threading.Lock()
        self.shadow_store = ShadowStore(self.data_dir)
        self.clock = clock or SystemClock()
        self._timer = timer
        # Active predictions started / finished (next() on a count is atomic): the shadow
        # worker runs the candidate only while none is in flight.
        self._started, self._finished = itertools.count(), itertools.count()
        self._n_started = self._n_finished = 0
        self._sample_every = config.sample_every
        self._budget = config.budget or 0.0
        # ns of predictions still to run before the next offer (the last offer's cost/budget).
        self._shadow_debt_ns = 0.0
        process_ok = shadow_process.supported() and backend_factory is open_backend
        if config.isolation == PROCESS and not process_ok:
            raise ConfigError("shadow isolation 'process' needs Linux, a Python executable "
                              "and the default backend factory")
        self._shadow_args: dict[str, Any] = dict(
            queue_size=config.queue_size, persist_every=config.persist_every,
            on_decided=self._decided, background=config.background)
        self.shadow: Shadow = (
            ShadowProcess(self.shadow_store, self.clock, **self._shadow_args,
                          on_unavailable=self._shadow_unavailable)
            if config.isolation == PROCESS or (config.isolation == AUTO and process_ok)
            else self._shadow_thread())
        self.health = HealthMonitor(self.data_dir, health)
        self.outbox = Outbox(self.data_dir)

    def prepare(self, bundle: Bundle) -> LoadedModel:
        """Load ``bundle`` (slow; off the inference path). Falls back to the CPU ONNX member
        when the primary backend cannot run here, and reports it."""
        return prepare_bundle(bundle, self._open, threshold=self._threshold,
                              on_event=self._on_event)

    def swap(self, loaded: LoadedModel, slot: str = ACTIVE) -> LoadedModel | None:
        """Make ``loaded`` serve ``slot`` of its model; returns what it replaced. A candidate
        whose artifact already failed shadow on this device is not taken."""
        b = loaded.bundle
        if slot == CANDIDATE and self.shadow_store.verdict(b.sha256) == FAILED:
            self.clear(b.model, CANDIDATE)
            return None
        key = (b.model, slot)
        with self._swap_lock:
            old = self._slots.get(key)
            self._slots[key] = loaded
            if slot == ACTIVE:
                cand = self._slots.get((b.model, CANDIDATE))
                if cand is not None and cand.bundle.bundle_id == b.bundle_id:
                    del self._slots[(b.model, CANDIDATE)]  # promoted: no longer a candidate
        if slot == CANDIDATE:
            self.shadow.attach(loaded)
        else:
            session = self.shadow.session(b.model)
            if session is not None and session.loaded.bundle.bundle_id == b.bundle_id:
                self.shadow.detach(b.model)
            self.health.swapped(b.model, b.bundle_id, b.sha256, b.version)
        return old

    def clear(self, model: str, slot: str = CANDIDATE) -> None:
        with self._swap_lock:
            self._slots.pop((model, slot), None)
        if slot == CANDIDATE:
            self.shadow.detach(model)

    def load_active(self, model: str) -> LoadedModel:
        """Load and swap in the bundle the store's pointer names as active (and its candidate,
        when it holds one still in shadow). A bundle crash-looping the app is rolled back."""
        pointer = self.store.pointer(model)
        bundle = self.store.active(model, pointer)
        if bundle is None:
            raise ModelNotLoadedError(
                f"no active bundle for model {model!r}; run `modelfleet device update` first"
            )
        loaded = self.prepare(bundle)
        self.swap(loaded)
        why = self.health.started(model, bundle.bundle_id, bundle.sha256, bundle.version)
        if why is not None:
            loaded = self._rollback(loaded, why) or loaded
        if pointer.candidate and self.loaded(model, CANDIDATE) is None:
            self._load_candidate(model, pointer.candidate)
        return loaded

    def _load_candidate(self, model: str, bundle_id: str) -> None:
        cand = self.store.find(model, bundle_id)
        if cand is None or self.shadow_store.verdict(cand.sha256) == FAILED:
            return
        try:
            self.swap(self.prepare(cand), CANDIDATE)
        except ClientSDKError as e:
            self.shadow_store.mark_failed(cand.sha256, model, cand.version,
                                          f"candidate does not load: {e}")

    def loaded(self, model: str, slot: str = ACTIVE) -> LoadedModel | None:
        return self._slots.get((model, slot))

    def predict(
        self, model: str, inputs: Mapping[str, np.ndarray[Any, Any]], slot: str = ACTIVE,
        *, shape_variant: str | None = None,
    ) -> Prediction:
        """Run ``inputs`` on the model's bundle in ``slot``; never blocks on a swap.
        ``shape_variant`` picks one of the bundle's loaded input-shape variants (default:
        the primary member's)."""
        loaded = self._slots.get((model, slot))
        if loaded is None:
            if slot != ACTIVE:
                raise ModelNotLoadedError(f"no {slot} bundle loaded for model {model!r}")
            loaded = self.load_active(model)
        if slot != ACTIVE:
            return loaded.run(inputs, shape_variant)
        bid = loaded.bundle.bundle_id
        self._n_started = next(self._started)
        t0 = self._timer()
        try:
            p = loaded.run(inputs, shape_variant)
        except BackendError:
            self._n_finished = next(self._finished)
            why = self.health.error(model, bid)
            if why is not None:
                self._rollback(loaded, why)
            raise
        ns = self._timer() - t0
        us = ns // 1000
        self._n_finished = next(self._finished)
        why = self.health.ok(model, bid, us)
        if why is not None:
            self._rollback(loaded, why)
        debt = self._shadow_debt_ns
        if debt > 0.0:  # the last offer is being paid off by the predictions since
            debt = self._shadow_debt_ns = debt - ns
        if debt <= 0.0 and self._n_started % self._sample_every == 0:  # (no candidate: no work)
            shadow = self.shadow
            if self._budget:
                t1, setups = self._timer(), shadow.setups
                if shadow.offer(model, inputs, p.outputs, us, shape_variant):
                    # A setup (a new ring, a layout sent to the child) happens once a session:
                    # not the price of a sample, so not charged.
                    cost = self._timer() - t1 if shadow.setups == setups else 0
                    self._shadow_debt_ns = cost / self._budget
            else:
                shadow.offer(model, inputs, p.outputs, us, shape_variant)
        return p

    def _shadow_thread(self) -> ShadowWorker:
        return ShadowWorker(self.shadow_store, self.clock, **self._shadow_args, idle=self._idle)

    def _shadow_unavailable(self, reason: str) -> None:
        """The shadow process cannot start here: the candidates go to a worker thread."""
        worker = self._shadow_thread()
        for (model, slot), loaded in list(self._slots.items()):
            if slot == CANDIDATE:
                worker.attach(loaded)
                emit(self._on_event, Event(EventKind.FALLBACK, model, loaded.bundle.version,
                                           f"shadow candidate runs on a thread: {reason}"))
        # Last: whoever sees the thread worker in charge also sees its candidates attached
        # and the FALLBACK events sent.
        self.shadow = worker

    def _idle(self) -> bool:
        """True when no active prediction is running (the shadow worker's turn)."""
        return self._n_started == self._n_finished

    # -- shadow verdicts and local rollback ---------------------------------------------

    def _decided(self, model: str, session: Session) -> None:
        """The shadow worker decided ``session``'s verdict: a failed candidate leaves its
        slot at once (the updater deletes its bundle on its next cycle)."""
        stats = session.stats
        if stats.verdict == FAILED:
            with self._swap_lock:
                if self._slots.get((model, CANDIDATE)) is session.loaded:
                    del self._slots[(model, CANDIDATE)]
            emit(self._on_event, Event(EventKind.FAILED, model, stats.version,
                                       f"candidate failed shadow mode: {stats.reason}"))
        else:
            emit(self._on_event, Event(EventKind.VERIFIED, model, stats.version,
                                       "candidate passed shadow mode; waiting for promotion"))

    def _rollback(self, bad: LoadedModel, reason: str) -> LoadedModel | None:
        """Put the previous bundle back in place of ``bad`` (no download); returns it, or
        None when there is no previous bundle to go back to."""
        b = bad.bundle
        with self._rollback_lock:
            if self._slots.get((b.model, ACTIVE)) is not bad:
                return self._slots.get((b.model, ACTIVE))  # another thread already did it
            pointer = self.store.pointer(b.model)
            prev = (self.store.find(b.model, pointer.previous)
                    if pointer.active == b.bundle_id and pointer.previous else None)
            if prev is None:
                emit(self._on_event, Event(EventKind.FAILED, b.model, b.version,
                                           f"{reason}; no previous bundle to roll back to"))
                return None
            self.shadow_store.mark_failed(b.sha256, b.model, b.version,
                                          f"rolled back at run time: {reason}")
            loaded = self.prepare(prev)
            self.swap(loaded)
            self.health.rolled_back(b.model, prev.bundle_id, prev.sha256, prev.version)
            with _data_dir_lock(self.data_dir):
                if self.store.pointer(b.model).active == b.bundle_id:
                    self.store.activate(b.model, prev.bundle_id)
            self.outbox.add(update_report(b.model, prev.version, prev.sha256, "rolled_back",
                                          at=int(self.clock.time()), via="held",
                                          reason=f"from {b.version}: {reason}"))
        emit(self._on_event, Event(EventKind.ROLLED_BACK, b.model, prev.version,
                                   f"{b.version} {reason}; rolled back"))
        return loaded

    def flush_shadow(self) -> None:
        """Wait for the queued shadow samples and persist the statistics."""
        self.shadow.flush()

    def close(self) -> None:
        """Finish the shadow work, persist it, and record a clean exit (crash-loop count)."""
        self.shadow.close()
        self.health.clean_exit()


@contextlib.contextmanager
def _data_dir_lock(data_dir: Path) -> Iterator[None]:
    """The updater's install lock, waited for (a rollback must not race an install)."""
    with open(data_dir / LOCK_NAME, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
