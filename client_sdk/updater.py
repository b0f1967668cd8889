"""``Updater``: one orchestrator that sequences the update cycle's I/O, one method per step.

    refresh()  poll the channel (ETag/304), follow root rotation link by link, verify the
               manifest against the trusted root and last trusted serial, persist atomically
    plan()     pick, per model, the release and artifacts for this device
               (``client_sdk.selection.select``: pure, no I/O)
    fetch()    get each member's bytes: already held, via a patch from a held base, or full
               (``client_sdk.downloads.Downloader``)
    _apply()   one path for the active and the candidate slot: reuse a held bundle or fetch
               and stage it (compile on device), load it in the runtime, point the slot at it,
               swap it in
    check_once() runs them all under one deadline; run() repeats on a jittered schedule.

Trust decisions (signatures, rollback, root and manifest expiry) live in ``client_sdk.trust``
and ``manifests``, selection in ``client_sdk.selection``; this module sequences the steps. Each
model's ``pointer.json`` is read once per cycle. A failure never touches the active bundle or
the trusted state unless verification passed.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from client_sdk.compile import COREML_FORMATS, FORMAT_ONNX, QNN_FORMATS, compile_bundle
from client_sdk.config import UpdaterConfig
from client_sdk.downloads import Downloader, Held, Via, resolve_url
from client_sdk.errors import (
    ClientSDKError,
    FetchError,
    InstallError,
    IntegrityError,
    OversizeError,
    TrustError,
)
from client_sdk.events import Event, EventKind, emit
from client_sdk.fetcher import Deadline, fetch_bytes
from client_sdk.http_transport import UrllibTransport
from client_sdk.install import Bundle, BundleStore, Member, Pointer
from client_sdk.runtime import ACTIVE, CANDIDATE
from client_sdk.schedule import PollSchedule
from client_sdk.selection import (
    PORTABLE_PLATFORM,
    Direction,
    Plan,
    Selection,
    direction,
    drops_candidate,
    select,
)
from client_sdk.shadow_stats import FAILED, PENDING, ShadowStore
from client_sdk.telemetry import Outbox, update_report
from client_sdk.transport import Transport
from client_sdk.trust import ChannelState, TrustedMetadata, TrustStore
from manifests import Manifest

__all__ = ["PORTABLE_PLATFORM", "VERIFICATION_ERRORS", "ModelResult", "Outcome", "Plan",
           "State", "UpdateResult", "Updater", "Via", "default_formats"]

# Errors that mean "these bytes are bad / untrusted", as opposed to "try again later".
VERIFICATION_ERRORS = (TrustError, IntegrityError, OversizeError)


class State(enum.Enum):
    IDLE = "idle"
    POLLING = "polling"
    VERIFYING = "verifying"
    SELECTING = "selecting"
    DOWNLOADING = "downloading"
    INSTALLING = "installing"


class Outcome(enum.Enum):
    UP_TO_DATE = "up_to_date"
    UPDATED = "updated"
    ROLLED_BACK = "rolled_back"
    REFUSED = "refused"
    FAILED = "failed"


@dataclass(frozen=True)
class ModelResult:
    model: str
    outcome: Outcome
    reason: str = ""
    error: str = ""  # exception class name when the outcome came from an error
    version: str = ""
    sha256: str = ""
    verdict: str = ""  # candidates: the shadow verdict on this device (pending|passed|failed)
    # How its bytes came this cycle: HELD when nothing had to be downloaded (up to date, a
    # held bundle swapped back in); None when it failed or was refused before any came.
    via: Via | None = None
    nbytes: int = 0  # bytes downloaded for it this cycle (patch or artifact; 0 when held)


@dataclass(frozen=True)
class UpdateResult:
    outcome: Outcome
    serial: int
    models: tuple[ModelResult, ...] = field(default_factory=tuple)
    candidates: tuple[ModelResult, ...] = field(default_factory=tuple)

    @property
    def verification_failed(self) -> bool:
        return any(m.error and m.outcome is Outcome.REFUSED
                   for m in self.models + self.candidates)


def default_formats() -> list[str]:
    """Formats this machine can run: CPU ONNX always; QNN if onnxruntime-qnn is installed;
    Core ML on macOS."""
    formats = [FORMAT_ONNX]
    try:
        import onnxruntime_qnn  # noqa: F401
    except ImportError:
        pass
    else:
        formats.extend(QNN_FORMATS)
    if sys.platform == "darwin":
        formats.extend(COREML_FORMATS)
    return formats


class Updater:
    """Keeps the models of one channel up to date on this device. See the module docstring."""

    def __init__(self, config: UpdaterConfig) -> None:
        self.config = config
        self.state = State.IDLE
        self._stop: threading.Event | None = None
        self.transport: Transport = config.transport or UrllibTransport()
        self.trust_store = TrustStore(config.data_dir)
        self.store = BundleStore(config.data_dir, config.fault_hook)
        self.downloader = Downloader(config, self.transport, stopped=self._stopped)
        self.downloads = self.downloader.dir
        self.formats = list(config.formats) if config.formats is not None else default_formats()
        for note in self.store.recover_all():
            emit(config.on_event, Event(EventKind.ROLLED_BACK, reason=note))
        self.trusted = TrustedMetadata(config.pinned_root, self.trust_store.load_root())
        self.shadow = ShadowStore(config.data_dir)
        self.outbox = Outbox(config.data_dir)
        self._pointers: dict[str, Pointer] = {}  # this cycle's pointer per model (see _pointer)

    # -- helpers ---------------------------------------------------------------------------

    def _event(self, kind: EventKind, model: str = "", version: str = "", reason: str = "",
               done: int = 0, total: int = 0) -> None:
        emit(self.config.on_event, Event(kind, model, version, reason, done, total))

    def _telemetry(self, plan: Plan, event: str, via: str | None = None,
                   nbytes: int | None = None, reason: str | None = None) -> None:
        """Queue an update report (metrics only) for the next upload."""
        self.outbox.add(update_report(
            plan.model, plan.version, plan.sha256, event, at=int(self.config.clock.time()),
            via=via, nbytes=nbytes, reason=reason, channel=self.config.channel))

    def _step(self, name: str) -> None:
        if self.config.fault_hook is not None:
            self.config.fault_hook(name)

    def _stopped(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    def url(self, ref: str) -> str:
        """Resolve an absolute or base-relative URL from a manifest."""
        return resolve_url(self.config.base_url, ref)

    def _deadline(self) -> Deadline:
        return Deadline(self.config.clock, self.config.update_deadline_seconds)

    # -- step 1: poll + verify ---------------------------------------------------------------

    def refresh_root(self, deadline: Deadline) -> bool:
        """Follow root rotation: fetch root N+1 until 404, verifying and persisting each link."""
        rotated = False
        for _ in range(self.config.limits.max_root_rotations):
            nxt = self.trusted.root.version + 1
            got = fetch_bytes(
                self.transport, self.url(f"v1/root/{nxt}.json"),
                max_bytes=self.config.limits.max_root_bytes, deadline=deadline,
                request_timeout=self.config.request_timeout_seconds, what=f"root v{nxt}",
            )
            if got.status == 404:
                break
            if got.status != 200:
                raise FetchError(f"HTTP {got.status} fetching root v{nxt}")
            self.trusted.update_root(got.body)
            self.trust_store.save_root(got.body)
            rotated = True
        self.trusted.check_root_unexpired(int(self.config.clock.time()))
        return rotated

    def refresh(self, deadline: Deadline | None = None) -> Manifest:
        """Poll the channel manifest and return it verified; persists the new trusted state."""
        deadline = deadline or self._deadline()
        channel = self.config.channel
        self.state = State.POLLING
        self._event(EventKind.CHECKING, reason=f"channel {channel}")
        rotated = self.refresh_root(deadline)
        previous = self.trust_store.load_channel(channel)
        use_etag = previous is not None and previous.etag and not rotated
        headers = {"If-None-Match": previous.etag} if previous and use_etag else {}
        got = fetch_bytes(
            self.transport, self.url(f"v1/channels/{channel}/manifest"),
            max_bytes=self.config.limits.max_manifest_bytes, deadline=deadline,
            request_timeout=self.config.request_timeout_seconds, headers=headers,
            what="manifest",
        )
        if got.status == 304 and previous is not None and headers:
            data, etag = previous.manifest, previous.etag
        elif got.status == 200:
            data, etag = got.body, got.headers.get("etag", "")
        elif got.status == 404:
            raise FetchError(f"channel {channel!r} has no manifest on {self.config.base_url}")
        else:
            raise FetchError(f"HTTP {got.status} fetching the manifest of channel {channel!r}")
        self.state = State.VERIFYING
        manifest = self.trusted.verify_manifest(
            data, now=int(self.config.clock.time()), channel=channel, previous=previous,
            max_size=self.config.limits.max_manifest_bytes,
        )
        state = ChannelState(manifest.serial, manifest.raw_sha256 or "", etag, data)
        if state != previous:
            self.trust_store.save_channel(channel, state)
        self._event(EventKind.VERIFIED, reason=f"manifest serial {manifest.serial}")
        self._step("manifest_verified")
        return manifest

    # -- step 2: select (pure: client_sdk.selection) ---------------------------------------

    def plan(self, manifest: Manifest) -> Selection:
        """Choose, per model, the release and members for this device (no I/O)."""
        self.state = State.SELECTING
        return select(manifest, self.config.device, formats=self.formats,
                      variants=self.config.variants, models=self.config.models,
                      all_shape_variants=self.config.all_shape_variants)

    # -- step 3: fetch -------------------------------------------------------------------

    def fetch(self, plan: Plan, held: Held, deadline: Deadline) -> list[tuple[Member, Path]]:
        """Get every member's verified bytes into downloads/ (``held``: sha256 → (member,
        file) of what the device already has, reused or patched from); returns (member,
        file) pairs."""
        self.state = State.DOWNLOADING
        return self.downloader.fetch(plan, held, deadline)

    # -- step 4: install (one path for the active and the candidate slot) -----------------

    def _pointer(self, model: str) -> Pointer:
        """The model's pointer: read from disk once per cycle, then kept in step with our own
        writes (the cycle holds the data dir's lock, so nobody else writes it)."""
        if model not in self._pointers:
            self._pointers[model] = self.store.pointer(model)
        return self._pointers[model]

    def _apply(self, plan: Plan, deadline: Deadline) -> ModelResult:
        """Bring one slot of one model to ``plan``: reuse the bundle if the device holds it
        (instant rollback, promotion of a candidate), else fetch → stage (compile on device);
        then prepare it in the runtime, record it in the pointer and swap it in."""
        model = plan.model
        pointer = self._pointer(model)
        active_version = None
        if plan.slot == ACTIVE and pointer.active not in (None, plan.bundle_id):
            active_version = self.store.bundle(model, str(pointer.active)).version
        way = direction(plan, pointer, active_version)
        if way is Direction.CURRENT:
            return self._report(plan, way, how=(Via.HELD, 0))
        via, nbytes = Via.HELD, 0
        fetching = False
        try:
            bundle = self.store.find(model, plan.bundle_id)
            if bundle is None:
                fetching = True
                files = self.fetch(plan, self.store.held_members(model, pointer), deadline)
                via, nbytes = self.downloader.how()
                self._telemetry(plan, "downloaded", via.value, nbytes)
                self.state = State.INSTALLING
                bundle = self.store.stage(model, plan.version, files, compile_bundle)
                self._telemetry(plan, "verified", via.value, nbytes)
                if plan.slot == ACTIVE:
                    self._event(EventKind.STAGED, model, plan.version)
            if plan.slot == CANDIDATE:
                self.shadow.register(bundle.sha256, model, plan.version, _thresholds(plan))
            self._switch(bundle, plan.slot)
        except ClientSDKError as e:
            self._telemetry(plan, "failed", reason=f"{type(e).__name__}: {e}")
            got = self.downloader.how() if fetching else (via, nbytes)
            return self._report(plan, way, e, how=got if got[1] else None)
        if plan.slot == ACTIVE:
            back = way is Direction.BACK
            self._telemetry(plan, "rolled_back" if back else "activated", via.value)
        return self._report(plan, way, how=(via, nbytes))

    def _switch(self, bundle: Bundle, slot: str) -> None:
        """Load ``bundle`` in the runtime (off the inference path), point ``slot`` at it on
        disk (atomic), then swap it into the runtime's slot."""
        runtime = self.config.runtime
        loaded = None
        if runtime is not None:
            held = runtime.loaded(bundle.model, CANDIDATE)
            # A promoted candidate is already loaded: swap that very object in.
            loaded = (held if slot == ACTIVE and held is not None
                      and held.bundle.bundle_id == bundle.bundle_id else runtime.prepare(bundle))
        current = self._pointer(bundle.model)
        if slot == ACTIVE:
            new = self.store.activate(bundle.model, bundle.bundle_id, current)
        else:
            new = self.store.set_candidate(bundle.model, bundle.bundle_id, current)
        self._pointers[bundle.model] = new
        if runtime is not None and loaded is not None:
            runtime.swap(loaded, slot)

    def _report(self, plan: Plan, way: Direction, error: ClientSDKError | None = None, *,
                how: tuple[Via, int] | None = None) -> ModelResult:
        """The event and result of applying ``plan`` (``error``: why it failed; ``how``: how
        its bytes came and how many were downloaded, None if none came)."""
        model, version, sha = plan.model, plan.version, plan.sha256
        candidate = plan.slot == CANDIDATE
        verdict = (self.shadow.verdict(sha) or PENDING) if candidate else ""
        via, nbytes = how if how is not None else (None, 0)
        if error is not None:
            outcome = Outcome.REFUSED if isinstance(error, VERIFICATION_ERRORS) else Outcome.FAILED
            self._event(EventKind.FAILED, model, version,
                        f"candidate: {error}" if candidate else str(error))
            return ModelResult(model, outcome, str(error), type(error).__name__,
                               version if candidate else "", verdict=verdict, via=via,
                               nbytes=nbytes)
        if way is Direction.CURRENT:
            if not candidate:
                self._event(EventKind.UP_TO_DATE, model, version)
            return ModelResult(model, Outcome.UP_TO_DATE, version=version, sha256=sha,
                               verdict=verdict, via=via, nbytes=nbytes)
        if candidate:
            self._event(EventKind.STAGED, model, version, "candidate (shadow mode)")
            return ModelResult(model, Outcome.UPDATED, version=version, sha256=sha,
                               verdict=verdict, via=via, nbytes=nbytes)
        back = way is Direction.BACK
        self._event(EventKind.ROLLED_BACK if back else EventKind.ACTIVE, model, version)
        return ModelResult(model, Outcome.ROLLED_BACK if back else Outcome.UPDATED,
                           version=version, sha256=sha, via=via, nbytes=nbytes)

    def _without_failed(self, plans: tuple[Plan, ...]
                        ) -> tuple[tuple[Plan, ...], list[ModelResult]]:
        """Plans whose artifact did not fail on this device (shadow verdict, or a run-time
        rollback): a failed artifact is never fetched or loaded again. The others come back
        as results saying why (candidates with ``verdict`` "failed")."""
        keep: list[Plan] = []
        skipped: list[ModelResult] = []
        for p in plans:
            failed = self.shadow.failed(p.sha256)
            held = self._pointer(p.model).active
            if failed is None or (p.slot == ACTIVE and held == p.bundle_id):
                keep.append(p)
                continue
            why = f"{p.version} failed on this device: {failed.reason or 'shadow verdict'}"
            self._event(EventKind.REFUSED, p.model, p.version, why)
            skipped.append(ModelResult(p.model, Outcome.REFUSED, why, version=p.version,
                                       sha256=p.sha256,
                                       verdict=FAILED if p.slot == CANDIDATE else ""))
        return tuple(keep), skipped

    def _drop_stale_candidates(self, plans: tuple[Plan, ...]) -> None:
        """Models whose channel no longer offers a shadow release to this device lose their
        candidate (on disk and in the runtime); a promoted candidate was already cleared."""
        runtime = self.config.runtime
        for model in [p.model for p in plans if p.slot == ACTIVE]:
            pointer = self._pointer(model)
            if drops_candidate(model, plans, pointer):
                pointer = self._pointers[model] = self.store.set_candidate(model, None, pointer)
            if runtime is not None and pointer.candidate is None:
                runtime.clear(model, CANDIDATE)

    # -- the cycle -----------------------------------------------------------------------

    def check_once(self) -> UpdateResult:
        """Run one full cycle. Raises for channel-level failures (FetchError, TrustError, …);
        per-model failures are reported in the result and as FAILED events."""
        deadline = self._deadline()
        with _exclusive(self.config.data_dir / ".updater.lock"):
            return self._cycle(deadline)

    def _cycle(self, deadline: Deadline) -> UpdateResult:
        self._pointers = {}
        try:
            manifest = self.refresh(deadline)
            chosen = self.plan(manifest)
            results = [ModelResult(r.model, Outcome.REFUSED, r.reason) for r in chosen.refused]
            for r in results:
                self._event(EventKind.REFUSED, r.model, reason=r.reason)
            plans, skipped = self._without_failed(chosen.plans)
            self.downloader.gc(plans)
            candidates: list[ModelResult] = [s for s in skipped if s.verdict]
            results += [s for s in skipped if not s.verdict]
            for plan in plans:
                applied = self._apply(plan, deadline)
                (candidates if plan.slot == CANDIDATE else results).append(applied)
            self._drop_stale_candidates(plans)
        finally:
            self.state = State.IDLE
            self._pointers = {}
        order = [Outcome.FAILED, Outcome.ROLLED_BACK, Outcome.UPDATED, Outcome.REFUSED]
        overall = next((o for o in order if any(r.outcome is o for r in results)),
                       Outcome.UP_TO_DATE)
        if any(r.error and r.outcome is Outcome.REFUSED for r in results):
            overall = Outcome.REFUSED
        return UpdateResult(overall, manifest.serial, tuple(results), tuple(candidates))

    def run(self, stop: threading.Event,
            on_result: Callable[[UpdateResult | ClientSDKError], None] | None = None) -> None:
        """Poll until ``stop`` is set: jittered interval after success, capped exponential
        backoff after errors.
        ``on_result`` receives each cycle's result or error. Setting ``stop`` during a
        download aborts it between chunks (the partial file is kept for resuming)."""
        cfg = self.config
        self._stop = stop
        schedule = PollSchedule(cfg.poll_interval_seconds, cfg.poll_jitter,
                                cfg.backoff_base_seconds, cfg.backoff_cap_seconds, cfg.rng)
        while not stop.is_set():
            outcome: UpdateResult | ClientSDKError
            try:
                outcome = self.check_once()
                ok = outcome.outcome is not Outcome.FAILED and not outcome.verification_failed
            except ClientSDKError as e:
                outcome, ok = e, False
                self._event(EventKind.FAILED, reason=str(e))
            if on_result is not None:
                on_result(outcome)
            stop.wait(schedule.next_delay(ok))


def _thresholds(plan: Plan) -> dict[str, int] | None:
    """The release's shadow limits as stored with the candidate's statistics."""
    t = plan.release.rollout.shadow
    if t is None:
        return None
    out = {"max_kl_micro": t.max_kl_micro, "max_latency_p99_us": t.max_latency_p99_us,
           "min_samples": t.min_samples}
    duration = t.extra.get("min_duration_s")
    if isinstance(duration, int) and not isinstance(duration, bool) and duration > 0:
        out["min_duration_s"] = duration
    return out


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold an advisory lock so two updaters never install into one data dir at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            raise InstallError(
                f"another updater is running on {path.parent}; run one agent per data dir"
            ) from e
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
