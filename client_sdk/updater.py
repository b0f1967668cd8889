"""``Updater``: one orchestrator that sequences the update cycle's I/O, one method per step.

    refresh()  poll the channel (ETag/304), follow root rotation link by link, verify the
               manifest against the trusted root and last trusted serial, persist atomically
    plan()     pick, per model, the release and artifacts for this device (pure)
    fetch()    get each member's bytes: already held, via a patch from a held base, or full
    install()  stage (compile on device), load in the runtime, activate, swap
    check_once() runs them all under one deadline; run() repeats on a jittered schedule.

Trust decisions live in ``client_sdk.trust`` and ``manifests``; this module only moves bytes.
A failure never touches the active bundle or the trusted state unless verification passed.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import os
import shutil
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import manifests
from client_sdk.compile import COREML_FORMATS, FORMAT_ONNX, QNN_FORMATS, compile_bundle
from client_sdk.config import UpdaterConfig
from client_sdk.errors import (
    ClientSDKError,
    DeadlineExceededError,
    FetchError,
    InstallError,
    IntegrityError,
    OversizeError,
    PatchFailedError,
    TrustError,
)
from client_sdk.events import Event, EventKind, emit
from client_sdk.fetcher import Deadline, download_file, fetch_bytes
from client_sdk.fsutil import check_name, sha256_file
from client_sdk.http_transport import UrllibTransport
from client_sdk.install import Bundle, BundleStore, Member, bundle_id_for
from client_sdk.runtime import ACTIVE, CANDIDATE
from client_sdk.schedule import PollSchedule
from client_sdk.transport import Transport
from client_sdk.trust import ChannelState, TrustedMetadata, TrustStore
from manifests import Artifact, Manifest, Release

_EXT = {FORMAT_ONNX: ".onnx", **{f: ".onnx" for f in QNN_FORMATS},
        **{f: ".mlpackage.tar" for f in COREML_FORMATS}}
# The platform of the portable CPU artifacts the server compiles for every model.
PORTABLE_PLATFORM = "onnx"
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
class Plan:
    """What one model should become on this device."""

    model: str
    release: Release
    artifacts: tuple[tuple[Member, Artifact], ...]
    bundle_id: str
    slot: str = ACTIVE  # or CANDIDATE: a shadow-mode release staged beside the active one


@dataclass(frozen=True)
class ModelResult:
    model: str
    outcome: Outcome
    reason: str = ""
    error: str = ""  # exception class name when the outcome came from an error
    version: str = ""
    sha256: str = ""


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
        self.downloads = config.data_dir / "downloads"
        self.formats = list(config.formats) if config.formats is not None else default_formats()
        for note in self.store.recover_all():
            emit(config.on_event, Event(EventKind.ROLLED_BACK, reason=note))
        self.trusted = TrustedMetadata(config.pinned_root, self.trust_store.load_root())

    # -- helpers ---------------------------------------------------------------------------

    def _event(self, kind: EventKind, model: str = "", version: str = "", reason: str = "",
               done: int = 0, total: int = 0) -> None:
        emit(self.config.on_event, Event(kind, model, version, reason, done, total))

    def _step(self, name: str) -> None:
        if self.config.fault_hook is not None:
            self.config.fault_hook(name)

    def url(self, ref: str) -> str:
        """Resolve an absolute or base-relative URL from a manifest."""
        return urllib.parse.urljoin(self.config.base_url.rstrip("/") + "/", ref)

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
        now = int(self.config.clock.time())
        if self.trusted.root.is_expired(now):
            raise TrustError(
                f"trusted root v{self.trusted.root.version} expired at "
                f"{self.trusted.root.expires}; the server must publish a new root",
                kind="ExpiredError",
            )
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

    # -- step 2: select ------------------------------------------------------------------

    def plan(self, manifest: Manifest) -> tuple[list[Plan], list[ModelResult]]:
        """Choose, per model, the release and members for this device (no I/O)."""
        self.state = State.SELECTING
        device = self.config.device
        plans: list[Plan] = []
        refused: list[ModelResult] = []
        names = list(self.config.models) if self.config.models is not None else list(
            manifest.models
        )
        for model in names:
            try:
                check_name("model", model)
            except ClientSDKError as e:
                refused.append(ModelResult(model, Outcome.REFUSED, str(e)))
                continue
            entry = manifest.models.get(model)
            if entry is None:
                refused.append(ModelResult(model, Outcome.REFUSED, "not offered on this channel"))
                continue
            # Shadow releases run as candidates beside the active model (next capability); the
            # active bundle comes from the first *active-mode* release that includes us.
            active_view = replace(manifest, models={model: replace(
                entry, releases=[r for r in entry.releases
                                 if r.rollout.mode == "active"])})
            release = manifests.select_release(active_view, model, device)
            if release is None:
                refused.append(ModelResult(model, Outcome.REFUSED, (
                    f"no release of {model} includes this device (id={device.device_id}, "
                    f"platform={device.platform}, soc={device.soc or '-'}, "
                    f"os={device.os_version or '-'}, app={device.app_version or '-'})")))
                continue
            chosen = self._members(model, release)
            if not chosen:
                offered = sorted({a.format for a in release.artifacts})
                refused.append(ModelResult(model, Outcome.REFUSED, (
                    f"{model} {release.version} has no artifact this device can run "
                    f"(offered {offered}, supported {self.formats})")))
                continue
            members = tuple(m for m, _ in chosen)
            plans.append(Plan(model, release, tuple(chosen),
                              bundle_id_for(model, release.version, members)))
            candidate = self._candidate(manifest, model, release)
            if candidate is not None:
                plans.append(candidate)
        return plans, refused

    def _candidate(self, manifest: Manifest, model: str, active: Release) -> Plan | None:
        """The shadow-mode release this device should run beside ``active``, if any: the
        first release that includes the device, when that one is in shadow mode."""
        entry = manifest.models[model]
        view = replace(manifest, models={model: replace(
            entry, releases=list(entry.releases))})
        first = manifests.select_release(view, model, self.config.device)
        if first is None or first.rollout.mode != "shadow" or first.version == active.version:
            return None
        chosen = self._members(model, first)
        if not chosen:
            return None
        members = tuple(m for m, _ in chosen)
        return Plan(model, first, tuple(chosen), bundle_id_for(model, first.version, members),
                    slot=CANDIDATE)

    def _members(self, model: str, release: Release) -> list[tuple[Member, Artifact]]:
        device = self.config.device
        usable = [a for a in release.artifacts
                  if manifests.artifact_matches(a, device) and a.format in self.formats]
        wanted_variant = self.config.variants.get(model)
        if wanted_variant is not None:
            usable = [a for a in usable if a.variant == wanted_variant]
        if not usable:
            return []
        primary = usable[0]
        chosen = [(self._member("primary", primary), primary)]
        if primary.format != FORMAT_ONNX:
            cpu = self._cpu_fallback(release, primary)
            if cpu is not None:
                chosen.append((self._member("fallback", cpu), cpu))
        return chosen

    def _cpu_fallback(self, release: Release, primary: Artifact) -> Artifact | None:
        """The ONNX artifact the runtime falls back to when ``primary``'s backend fails: one
        for this device's platform with the same variant, else the portable CPU artifact
        (platform "onnx", which any device runs) compiled for the same input shapes."""
        device = self.config.device
        same_variant = next((a for a in release.artifacts if a.format == FORMAT_ONNX
                             and manifests.artifact_matches(a, device)
                             and a.variant == primary.variant), None)
        if same_variant is not None:
            return same_variant
        portable = replace(device, platform=PORTABLE_PLATFORM)
        shapes = primary.target.get("shape_variant", "")
        return next((a for a in release.artifacts if a.format == FORMAT_ONNX
                     and manifests.artifact_matches(a, portable)
                     and a.target.get("shape_variant", "") == shapes), None)

    @staticmethod
    def _member(role: str, a: Artifact) -> Member:
        return Member(role=role, format=a.format, platform=a.platform, variant=a.variant,
                      file=f"{role}{_EXT.get(a.format, '.bin')}", sha256=a.sha256,
                      length=a.length, target=dict(a.target),
                      compile_settings=dict(a.compile_settings))

    # -- step 3: fetch -------------------------------------------------------------------

    def fetch(self, plan: Plan, deadline: Deadline) -> list[tuple[Member, Path]]:
        """Get every member's verified bytes into downloads/; returns (member, file) pairs."""
        self.state = State.DOWNLOADING
        held = self.store.held_files(plan.model)
        out: list[tuple[Member, Path]] = []
        for member, artifact in plan.artifacts:
            target = self.downloads / f"{artifact.sha256}.ready"
            if artifact.sha256 in held:
                _copy(held[artifact.sha256], target)
                if sha256_file(target) != artifact.sha256:
                    target.unlink(missing_ok=True)
                    raise IntegrityError(f"{plan.model}: the local copy of {member.file} "
                                         "no longer matches its sha256")
            else:  # verified against the signed length and sha256 on the way in
                self._fetch_artifact(plan, artifact, held, target, deadline)
            out.append((member, target))
            self._event(EventKind.VERIFIED, plan.model, plan.release.version,
                        f"{member.file} sha256 {artifact.sha256[:16]}…")
        self._step("download_done")
        return out

    def _fetch_artifact(self, plan: Plan, artifact: Artifact, held: dict[str, Path],
                        target: Path, deadline: Deadline) -> None:
        version = plan.release.version
        cap = self.config.limits.max_artifact_bytes
        if artifact.length > cap:
            raise OversizeError(
                f"{plan.model} {version}: artifact declares {artifact.length} bytes, over this "
                f"device's cap of {cap} (Limits.max_artifact_bytes)"
            )
        patch = next((p for p in artifact.patches
                      if p.from_sha256 in held and p.length <= cap), None)
        if patch is not None:
            try:
                self._fetch_via_patch(plan, artifact, patch, held[patch.from_sha256], target,
                                      deadline)
                return
            except DeadlineExceededError:
                raise
            except ClientSDKError as e:
                self._event(EventKind.FAILED, plan.model, version,
                            f"patch unusable ({e}); downloading the full artifact")
        elif artifact.patches:
            self._event(EventKind.DOWNLOADING, plan.model, version,
                        "no patch from a base this device holds; downloading the full artifact")
        part = self.downloads / f"{artifact.sha256}.part"
        download_file(
            self.transport, self.url(artifact.url), part, length=artifact.length,
            sha256=artifact.sha256, deadline=deadline,
            request_timeout=self.config.request_timeout_seconds,
            progress=lambda done, total: self._progress(plan.model, version, "artifact", done,
                                                        total),
        )
        os.replace(part, target)

    def _fetch_via_patch(self, plan: Plan, artifact: Artifact, patch: manifests.Patch,
                         base: Path, target: Path, deadline: Deadline) -> None:
        from client_sdk.patching import PatchError, apply_patch

        version = plan.release.version
        part = self.downloads / f"{patch.sha256}.part"
        download_file(
            self.transport, self.url(patch.url), part, length=patch.length, sha256=patch.sha256,
            deadline=deadline, request_timeout=self.config.request_timeout_seconds,
            progress=lambda done, total: self._progress(plan.model, version, "patch", done,
                                                        total),
        )
        out = self.downloads / f"{artifact.sha256}.patched"
        try:
            apply_patch(patch.algorithm, base, part, out, max_output=artifact.length)
        except PatchError as e:
            out.unlink(missing_ok=True)
            raise PatchFailedError(f"{patch.algorithm} patch failed: {e}") from e
        finally:
            part.unlink(missing_ok=True)
        deadline.check("applying a patch")
        if out.stat().st_size != artifact.length or sha256_file(out) != artifact.sha256:
            out.unlink(missing_ok=True)
            raise PatchFailedError("patched file does not match the signed sha256")
        os.replace(out, target)
        self._step("patch_applied")

    def _progress(self, model: str, version: str, what: str, done: int, total: int) -> None:
        if self._stop is not None and self._stop.is_set():
            # Stop between chunks: the partial file stays and the next run resumes it.
            raise FetchError(f"stopped while downloading {model} {version}; will resume")
        self._event(EventKind.DOWNLOADING, model, version, what, done, total)

    def _gc_downloads(self, plans: list[Plan]) -> None:
        """Drop partial downloads no plan wants any more: a resume is only valid while the
        expected sha256 is unchanged, and the file name *is* that sha256."""
        wanted = {a.sha256 for p in plans for _, a in p.artifacts}
        wanted |= {pt.sha256 for p in plans for _, a in p.artifacts for pt in a.patches}
        if not self.downloads.exists():
            return
        for f in self.downloads.iterdir():
            if f.name.split(".", 1)[0] not in wanted or not f.name.endswith(".part"):
                f.unlink(missing_ok=True)

    # -- step 4: install -----------------------------------------------------------------

    def install(self, plan: Plan, files: list[tuple[Member, Path]]) -> Bundle:
        """Stage (with on-device compile), load in the runtime, then activate and swap."""
        self.state = State.INSTALLING
        bundle = self.store.stage(plan.model, plan.release.version, files, compile_bundle)
        self._event(EventKind.STAGED, plan.model, plan.release.version)
        self._activate(bundle)
        return bundle

    def _activate(self, bundle: Bundle) -> None:
        runtime = self.config.runtime
        loaded = runtime.prepare(bundle) if runtime is not None else None
        self.store.activate(bundle.model, bundle.bundle_id)
        if runtime is not None and loaded is not None:
            runtime.swap(loaded)

    # -- the cycle -----------------------------------------------------------------------

    def check_once(self) -> UpdateResult:
        """Run one full cycle. Raises for channel-level failures (FetchError, TrustError, …);
        per-model failures are reported in the result and as FAILED events."""
        deadline = self._deadline()
        with _exclusive(self.config.data_dir / ".updater.lock"):
            return self._cycle(deadline)

    def _cycle(self, deadline: Deadline) -> UpdateResult:
        try:
            manifest = self.refresh(deadline)
            plans, results = self.plan(manifest)
            for r in results:
                self._event(EventKind.REFUSED, r.model, reason=r.reason)
            self._gc_downloads(plans)
            candidates: list[ModelResult] = []
            for plan in plans:
                if plan.slot == CANDIDATE:
                    candidates.append(self._apply_candidate(plan, deadline))
                else:
                    results.append(self._apply(plan, deadline))
            self._drop_stale_candidates(plans, [p.model for p in plans if p.slot == ACTIVE])
        finally:
            self.state = State.IDLE
        order = [Outcome.FAILED, Outcome.ROLLED_BACK, Outcome.UPDATED, Outcome.REFUSED]
        overall = next((o for o in order if any(r.outcome is o for r in results)),
                       Outcome.UP_TO_DATE)
        if any(r.error and r.outcome is Outcome.REFUSED for r in results):
            overall = Outcome.REFUSED
        return UpdateResult(overall, manifest.serial, tuple(results), tuple(candidates))

    def _apply_candidate(self, plan: Plan, deadline: Deadline) -> ModelResult:
        """Stage a shadow-mode release and load it in the runtime's candidate slot."""
        model, version = plan.model, plan.release.version
        sha = plan.artifacts[0][1].sha256
        if self.store.pointer(model).candidate == plan.bundle_id:
            return ModelResult(model, Outcome.UP_TO_DATE, version=version, sha256=sha)
        try:
            bundle = self.store.find(model, plan.bundle_id)
            if bundle is None:
                files = self.fetch(plan, deadline)
                self.state = State.INSTALLING
                bundle = self.store.stage(model, version, files, compile_bundle)
            runtime = self.config.runtime
            loaded = runtime.prepare(bundle) if runtime is not None else None
            self.store.set_candidate(model, bundle.bundle_id)
            if runtime is not None and loaded is not None:
                runtime.swap(loaded, CANDIDATE)
        except ClientSDKError as e:
            self._event(EventKind.FAILED, model, version, f"candidate: {e}")
            verification = isinstance(e, VERIFICATION_ERRORS)
            return ModelResult(model, Outcome.REFUSED if verification else Outcome.FAILED,
                               str(e), type(e).__name__, version)
        self._event(EventKind.STAGED, model, version, "candidate (shadow mode)")
        return ModelResult(model, Outcome.UPDATED, version=version, sha256=sha)

    def _drop_stale_candidates(self, plans: list[Plan], models: list[str]) -> None:
        """Models whose channel no longer offers a shadow release to this device lose their
        candidate (on disk and in the runtime); a promoted candidate was already cleared."""
        wanted = {p.model for p in plans if p.slot == CANDIDATE}
        runtime = self.config.runtime
        for model in models:
            if model not in wanted and self.store.pointer(model).candidate is not None:
                self.store.set_candidate(model, None)
            if runtime is not None and self.store.pointer(model).candidate is None:
                runtime.clear(model, CANDIDATE)

    def _apply(self, plan: Plan, deadline: Deadline) -> ModelResult:
        model, version = plan.model, plan.release.version
        pointer = self.store.pointer(model)
        if pointer.active == plan.bundle_id:
            self._event(EventKind.UP_TO_DATE, model, version)
            return ModelResult(model, Outcome.UP_TO_DATE, version=version,
                               sha256=plan.artifacts[0][1].sha256)
        current = self.store.active(model) if pointer.active else None
        going_back = pointer.previous == plan.bundle_id or (
            current is not None and _older(version, current.version))
        try:
            held = self.store.find(model, plan.bundle_id)
            if held is not None:  # instant rollback / switch: the bundle is already here
                self._activate(held)
            else:
                self.install(plan, self.fetch(plan, deadline))
        except ClientSDKError as e:
            verification = isinstance(e, VERIFICATION_ERRORS)
            self._event(EventKind.FAILED, model, version, str(e))
            return ModelResult(model, Outcome.REFUSED if verification else Outcome.FAILED,
                               str(e), type(e).__name__)
        outcome = Outcome.ROLLED_BACK if going_back else Outcome.UPDATED
        self._event(EventKind.ROLLED_BACK if going_back else EventKind.ACTIVE, model, version)
        return ModelResult(model, outcome, version=version, sha256=plan.artifacts[0][1].sha256)

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


def _older(a: str, b: str) -> bool:
    """True when version ``a`` is lower than ``b`` (non-numeric versions never compare)."""
    try:
        return manifests.compare_versions(a, b) < 0
    except ValueError:
        return False


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


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".copy")
    try:
        os.link(src, tmp)  # bundles are immutable, so a hard link is a safe copy
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
