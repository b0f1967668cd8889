"""``ModelRuntime``: what the app calls to predict, with lock-free atomic bundle swaps.

Each model has slots ("active", and "candidate" for shadow mode) holding a ``LoadedModel``.
``predict`` reads the slot once (a single dict read, atomic in CPython) and runs on that object,
so a concurrent ``swap`` never fails, mixes or blocks an inference: calls already running finish
on the old bundle, which is released when the last of them drops its reference. Loading a
bundle (``prepare``) is slow and happens off the inference path; ``swap`` is a pointer store.

Shape variants: a bundle installed with ``all_shape_variants`` holds the model compiled for
each input-shape variant (``shape:<variant>`` members, e.g. 360p/720p/1080p); ``prepare`` loads
them all, and ``predict(..., shape_variant="720p")`` picks the loaded backend by a dict lookup,
so switching resolution never reloads a model.

Circuit breaker: when the primary backend (e.g. QNN) raises, the call is retried on the
bundle's CPU ONNX fallback member; after ``breaker_threshold`` consecutive failures the loaded
model switches to the fallback for good and a FALLBACK event is reported.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from client_sdk.backends import Arrays, Backend, open_backend
from client_sdk.errors import BackendError, BackendUnavailableError, ModelNotLoadedError
from client_sdk.events import Event, EventCallback, EventKind, emit
from client_sdk.install import SHAPE_ROLE_PREFIX, Bundle, BundleStore, Member

ACTIVE = "active"
CANDIDATE = "candidate"
BackendFactory = Callable[[Bundle, Member], Backend]


@dataclass(frozen=True)
class Prediction:
    model: str
    version: str
    sha256: str
    backend: str
    outputs: Arrays
    shape_variant: str = ""


class LoadedModel:
    """A bundle with its backend(s) loaded and ready to run."""

    def __init__(
        self,
        bundle: Bundle,
        primary: Backend,
        fallback: Backend | None,
        *,
        threshold: int,
        on_event: EventCallback | None,
        shapes: Mapping[str, Backend] | None = None,
    ) -> None:
        self.bundle = bundle
        self._backend = primary
        self._fallback = fallback
        self.primary_shape = bundle.members[0].target.get("shape_variant", "")
        # The other input-shape variants, loaded once (read-only after construction).
        self._shapes: dict[str, Backend] = dict(shapes or {})
        self._threshold = threshold
        self._failures = 0
        self._lock = threading.Lock()  # taken only on the failure path
        self._on_event = on_event

    @property
    def backend_name(self) -> str:
        return self._backend.name

    @property
    def shape_variants(self) -> tuple[str, ...]:
        """The input-shape variants this loaded model can run, the primary's first."""
        return tuple(s for s in (self.primary_shape, *self._shapes) if s)

    def run(self, inputs: Mapping[str, np.ndarray[Any, Any]],
            shape_variant: str | None = None) -> Prediction:
        if shape_variant and shape_variant != self.primary_shape:
            other = self._shapes.get(shape_variant)
            if other is None:
                raise ModelNotLoadedError(
                    f"{self.bundle.model} {self.bundle.version} has no shape variant "
                    f"{shape_variant!r}; loaded: {list(self.shape_variants)} (install with "
                    "UpdaterConfig(all_shape_variants=[model]))")
            b = self.bundle
            return Prediction(b.model, b.version, b.sha256, other.name, other.run(inputs),
                              shape_variant)
        backend = self._backend
        try:
            outputs = backend.run(inputs)
        except BackendError as e:
            fallback = self._record_failure(backend, e)
            if fallback is None:
                raise
            backend, outputs = fallback, fallback.run(inputs)
        else:
            if self._failures:
                self._failures = 0
        b = self.bundle
        return Prediction(b.model, b.version, b.sha256, backend.name, outputs,
                          self.primary_shape)

    def _record_failure(self, backend: Backend, error: BackendError) -> Backend | None:
        with self._lock:
            if backend is not self._backend:  # another thread already switched
                return self._backend
            self._failures += 1
            if self._fallback is None:
                return None
            if self._failures >= self._threshold:
                self._backend, self._fallback = self._fallback, None
                emit(self._on_event, Event(
                    EventKind.FALLBACK, self.bundle.model, self.bundle.version,
                    f"{backend.name} failed {self._failures} times in a row ({error}); "
                    f"switched to {self._backend.name}",
                ))
                return self._backend
            return self._fallback


class ModelRuntime:
    """Runs the active bundle of each model; swaps bundles atomically under load."""

    def __init__(
        self,
        data_dir: Path,
        *,
        on_event: EventCallback | None = None,
        breaker_threshold: int = 3,
        backend_factory: BackendFactory = open_backend,
    ) -> None:
        self.store = BundleStore(Path(data_dir))
        self._on_event = on_event
        self._threshold = breaker_threshold
        self._open = backend_factory
        self._slots: dict[tuple[str, str], LoadedModel] = {}
        self._swap_lock = threading.Lock()

    def prepare(self, bundle: Bundle) -> LoadedModel:
        """Load ``bundle`` (slow; off the inference path). Falls back to the CPU ONNX member
        when the primary backend cannot run here, and reports it."""
        primary_m = bundle.members[0]
        fallback_m = next((m for m in bundle.members[1:] if m.role == "fallback"), None)
        fallback = self._open(bundle, fallback_m) if fallback_m is not None else None
        try:
            primary = self._open(bundle, primary_m)
        except BackendUnavailableError as e:
            if fallback is None:
                raise
            emit(self._on_event, Event(
                EventKind.FALLBACK, bundle.model, bundle.version,
                f"{primary_m.format} unavailable ({e}); using {fallback.name}",
            ))
            primary, fallback = fallback, None
        shapes = {m.role.removeprefix(SHAPE_ROLE_PREFIX): self._open(bundle, m)
                  for m in bundle.members if m.role.startswith(SHAPE_ROLE_PREFIX)}
        return LoadedModel(
            bundle, primary, fallback, threshold=self._threshold, on_event=self._on_event,
            shapes=shapes,
        )

    def swap(self, loaded: LoadedModel, slot: str = ACTIVE) -> LoadedModel | None:
        """Make ``loaded`` serve ``slot`` of its model; returns what it replaced."""
        key = (loaded.bundle.model, slot)
        with self._swap_lock:
            old = self._slots.get(key)
            self._slots[key] = loaded
        return old

    def clear(self, model: str, slot: str = CANDIDATE) -> None:
        with self._swap_lock:
            self._slots.pop((model, slot), None)

    def load_active(self, model: str) -> LoadedModel:
        """Load and swap in the bundle the store's pointer names as active."""
        bundle = self.store.active(model)
        if bundle is None:
            raise ModelNotLoadedError(
                f"no active bundle for model {model!r}; run `modelfleet device update` first"
            )
        loaded = self.prepare(bundle)
        self.swap(loaded)
        return loaded

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
        return loaded.run(inputs, shape_variant)
