"""A bundle loaded and ready to run: ``LoadedModel`` (its backends, the circuit breaker, its
input-shape variants), ``prepare_bundle`` that loads one, and the ``Prediction`` it answers.

Apart from the runtime (``client_sdk.runtime``: slots, swaps, shadow offers, rollback) because
both shadow workers load and run candidates with it — the thread worker in the app's process
and the shadow child (``client_sdk.shadow_child``) — and the runtime imports the workers.

Circuit breaker: when the primary backend (e.g. QNN) raises, the call is retried on the
bundle's CPU ONNX fallback member; after ``threshold`` consecutive failures the loaded model
switches to the fallback for good and a FALLBACK event is reported.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from client_sdk.backends import Arrays, Backend
from client_sdk.errors import BackendError, BackendUnavailableError, ModelNotLoadedError
from client_sdk.events import Event, EventCallback, EventKind, emit
from client_sdk.install import SHAPE_ROLE_PREFIX, Bundle, Member

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


def prepare_bundle(bundle: Bundle, open_member: BackendFactory, *, threshold: int,
                   on_event: EventCallback | None) -> LoadedModel:
    """Load ``bundle``'s backends (``ModelRuntime.prepare``; also the shadow process's way to
    load a candidate): the primary member, else the bundle's CPU ONNX fallback when the
    primary cannot run here (reported), and every input-shape variant."""
    primary_m = bundle.members[0]
    fallback_m = next((m for m in bundle.members[1:] if m.role == "fallback"), None)
    fallback = open_member(bundle, fallback_m) if fallback_m is not None else None
    try:
        primary = open_member(bundle, primary_m)
    except BackendUnavailableError as e:
        if fallback is None:
            raise
        emit(on_event, Event(
            EventKind.FALLBACK, bundle.model, bundle.version,
            f"{primary_m.format} unavailable ({e}); using {fallback.name}",
        ))
        primary, fallback = fallback, None
    shapes = {m.role.removeprefix(SHAPE_ROLE_PREFIX): open_member(bundle, m)
              for m in bundle.members if m.role.startswith(SHAPE_ROLE_PREFIX)}
    return LoadedModel(bundle, primary, fallback, threshold=threshold, on_event=on_event,
                       shapes=shapes)
