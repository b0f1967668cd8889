"""`modelfleet device …`: the reference device agent built on client_sdk (issue 6).

    modelfleet device update --server URL --channel CH --root ROOT_JSON --data-dir DIR
        --device-id ID --platform P [--soc S --arch A --os-version V --app-version V]
        [--model NAME …] [--variant MODEL=VARIANT …] [--once] [--interval SECONDS]
        [--enroll-token TOKEN]
    modelfleet device predict --data-dir DIR --model NAME --input X.npz
    modelfleet device status --data-dir DIR

After each cycle the agent uploads its pending telemetry (signed by the device key; metrics
only): it enrols once with ``--enroll-token`` (a token of scope ``enroll``), before the first
cycle, with its Ed25519 and X25519 keys; without one and never enrolled it still updates
unprotected releases, it just cannot report (the reports wait in the bounded outbox) and gets
no protected release's content key (docs/security.md). ``predict`` answers with the active
bundle and feeds the candidate (shadow mode), persisting its statistics before it exits.

JSON on stdout: ``outcome``, ``serial``, ``active``, and per model in ``models`` (and
``candidates``) its ``outcome``, ``version``, ``sha256``, ``reason``, ``error``, ``via``
(patch | full | held, or null) and ``bytes`` (downloaded). Exit status: 0 when the cycle
ran (up_to_date / updated / rolled_back, or an offer not meant for this device was refused); 1
on any verification failure (one-line reason on stderr, active model untouched); 2 on other
failures (network, disk, bad arguments).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from client_sdk import ClientSDKError, Event, ModelResult, UpdaterConfig, UpdateResult
    from client_sdk.install import BundleStore

device_app = typer.Typer(no_args_is_help=True)
EXIT_VERIFICATION = 1
EXIT_OTHER = 2


def _keep_stdout_for_json() -> None:
    """Point fd 1 at stderr and keep the real stdout for our JSON only.

    Native runtimes (the QNN HTP libraries) print banners straight to fd 1, which would break
    the one-JSON-document-on-stdout promise scripts rely on. Only done when sys.stdout really
    is fd 1 (not under a test runner's captured stream).
    """
    try:
        if sys.stdout.fileno() != 1:
            return
    except (AttributeError, OSError, ValueError):
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(saved, "w", buffering=1, encoding="utf-8")


@device_app.command("version")
def version() -> None:
    """Print the client SDK version."""
    import client_sdk

    typer.echo(client_sdk.__version__)


def _active(store: BundleStore) -> list[dict[str, str]]:
    out = []
    for model in store.models():
        b = store.active(model)
        if b is not None:
            out.append({"model": model, "version": b.version, "sha256": b.sha256})
    return out


def _fail(code: int, reason: str, payload: dict[str, Any] | None = None) -> None:
    if payload is not None:
        typer.echo(json.dumps(payload, sort_keys=True))
    typer.echo(f"error: {reason}", err=True)
    raise typer.Exit(code)


class _Progress:
    """A one-line download progress indicator on stderr (only when stderr is a terminal)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = -1

    def __call__(self, event: Event) -> None:
        from client_sdk import EventKind

        if event.kind is EventKind.DOWNLOADING and event.total and self.tty:
            pct = event.done * 100 // event.total
            if pct != self.last:
                self.last = pct
                end = "\n" if pct == 100 else ""
                sys.stderr.write(f"\r{event.model} {event.version} {event.reason}: {pct:3d}%{end}")
                sys.stderr.flush()
        elif event.kind is not EventKind.DOWNLOADING and self.tty:
            sys.stderr.write(f"{event.kind.value} {event.model} {event.version} {event.reason}\n")


def _entry(m: ModelResult) -> dict[str, Any]:
    """One model's result: `via` is patch | full | held (held: the device had the bytes), or
    null when it failed or was refused before any came; `bytes` what it downloaded."""
    return {"model": m.model, "outcome": m.outcome.value, "reason": m.reason,
            "error": m.error, "version": m.version, "sha256": m.sha256,
            "via": None if m.via is None else m.via.value, "bytes": m.nbytes}


def _report(
    result: UpdateResult | ClientSDKError, store: BundleStore
) -> tuple[dict[str, Any], int, str]:
    from client_sdk import ClientSDKError, Outcome, TrustError

    if isinstance(result, ClientSDKError):
        verification = isinstance(result, TrustError) or type(result).__name__ in (
            "OversizeError", "IntegrityError")
        reason = str(result).splitlines()[0]
        failure: dict[str, Any] = {
            "outcome": "refused" if verification else "failed", "reason": reason,
            # A TrustError subclass (MetadataExpiredError) keeps reporting as "TrustError":
            # the JSON names the error family, the reason says which check failed.
            "error": "TrustError" if isinstance(result, TrustError) else type(result).__name__,
            "active": _active(store), "models": [],
        }
        return failure, EXIT_VERIFICATION if verification else EXIT_OTHER, reason
    models = [_entry(m) for m in result.models]
    reasons = [f"{m.model}: {m.reason}" for m in result.models if m.reason]
    candidates = [_entry(m) | {"verdict": m.verdict or "pending"} for m in result.candidates]
    payload: dict[str, Any] = {"outcome": result.outcome.value, "serial": result.serial,
               "reason": "; ".join(reasons), "active": _active(store), "models": models,
               "candidates": candidates}
    if result.verification_failed:
        bad = next(m for m in result.models + result.candidates
                   if m.error and m.outcome is Outcome.REFUSED)
        return payload, EXIT_VERIFICATION, f"{bad.model}: {bad.reason}"
    failed = [m for m in result.models if m.outcome is Outcome.FAILED]
    if failed:
        return payload, EXIT_OTHER, f"{failed[0].model}: {failed[0].reason}"
    return payload, 0, ""


@device_app.command("update")
def update(
    server: Annotated[str, typer.Option(help="Server or CDN base URL.")],
    channel: Annotated[str, typer.Option(help="Channel name, e.g. prod.")],
    root: Annotated[Path, typer.Option(help="The pinned root.json envelope.")],
    data_dir: Annotated[Path, typer.Option(help="Where the device keeps trust state and bundles.")],
    device_id: Annotated[str, typer.Option(help="Stable device id (rollout bucketing).")],
    platform: Annotated[str, typer.Option(
        help="Artifact platform this device runs: onnx (CPU), coreml, qnn, qnn-hub.")],
    soc: Annotated[str, typer.Option(help="SoC model, e.g. SM8650.")] = "",
    arch: Annotated[str, typer.Option(help="Hardware arch, e.g. x86_64, v75.")] = "",
    os_version: Annotated[str, typer.Option(help="OS version, e.g. 14.2.")] = "",
    app_version: Annotated[str, typer.Option(help="App version, e.g. 3.1.0.")] = "",
    model: Annotated[list[str] | None, typer.Option(help="Only these models (repeat).")] = None,
    variant: Annotated[list[str] | None, typer.Option(help="MODEL=VARIANT (repeat).")] = None,
    once: Annotated[bool, typer.Option(metavar="", help="Run one cycle and exit.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between polls.")] = 300.0,
    deadline: Annotated[float, typer.Option(help="Overall deadline per cycle, seconds.")] = 900.0,
    enroll_token: Annotated[str, typer.Option(
        help="Enrolment token (scope enroll): enrols the device once to report telemetry.")
    ] = "",
) -> None:
    """Run update cycles: verify the channel manifest, download, patch, compile, swap."""
    _keep_stdout_for_json()
    from client_sdk import ClientSDKError, DeviceProfile, Updater, UpdaterConfig

    try:
        root_bytes = root.read_bytes()
    except OSError as e:
        _fail(EXIT_OTHER, f"cannot read --root {root}: {e.strerror}")
    variants = {}
    for item in variant or []:
        name, sep, value = item.partition("=")
        if not sep:
            _fail(EXIT_OTHER, f"--variant {item!r} must look like MODEL=VARIANT")
        variants[name] = value
    progress = _Progress()
    try:
        cfg = UpdaterConfig(
            base_url=server, channel=channel, pinned_root=root_bytes,
            device=DeviceProfile(device_id, platform, soc, arch, os_version, app_version),
            data_dir=data_dir, models=model or None, variants=variants,
            poll_interval_seconds=interval, update_deadline_seconds=deadline,
            on_event=progress,
        )
        updater = Updater(cfg)
    except ClientSDKError as e:
        payload, code, reason = _report(e, _store(data_dir))
        _fail(code, reason, payload)
        return
    # Before the cycle: a protected release's content key needs an enrolled device.
    enrolled_first = bool(enroll_token) and bool(
        _upload(cfg, enroll_token, send=False).get("enrolled_now"))
    if once:
        try:
            outcome: UpdateResult | ClientSDKError = updater.check_once()
        except ClientSDKError as e:
            outcome = e
        payload, code, reason = _report(outcome, updater.store)
        payload["telemetry"] = _upload(cfg, enroll_token)
        if enrolled_first:
            payload["telemetry"]["enrolled_now"] = True
        if code:
            _fail(code, reason, payload)
        typer.echo(json.dumps(payload, sort_keys=True))
        return
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _sig, _frame: stop.set())
    signal.signal(signal.SIGINT, lambda _sig, _frame: stop.set())

    def emit(result: UpdateResult | ClientSDKError) -> None:
        payload, _code, reason = _report(result, updater.store)
        payload["telemetry"] = _upload(cfg, enroll_token)
        typer.echo(json.dumps(payload, sort_keys=True))
        if reason:
            typer.echo(f"error: {reason}", err=True)

    updater.run(stop, emit)
    typer.echo(json.dumps({"stopped": True, "active": _active(updater.store)}, sort_keys=True))


def _upload(cfg: UpdaterConfig, token: str, *, send: bool = True) -> dict[str, Any]:
    """Enrol (once, with ``token``), collect and send the telemetry (``send=False``: only
    enrol); never fails the cycle."""
    from client_sdk import ClientSDKError, SystemClock, UrllibTransport
    from client_sdk.telemetry import Reporter

    try:
        rep = Reporter(cfg.data_dir, cfg.base_url, cfg.transport or UrllibTransport(),
                       cfg.device, SystemClock(), channel=cfg.channel,
                       timeout=cfg.request_timeout_seconds)
        enrolled_now = rep.enroll(token) if token else False  # a no-op once done
        if not send:
            return {"enrolled": rep.enrolled(), "enrolled_now": enrolled_now}
        rep.collect()
        r = rep.flush()
    except ClientSDKError as e:
        typer.echo(f"warning: telemetry: {' '.join(str(e).split())}", err=True)
        return {"status": "error", "reason": " ".join(str(e).split())}
    return {"status": r.status, "sent": r.sent, "duplicates": r.duplicates,
            "pending": r.pending, "dropped": r.dropped, "enrolled": rep.enrolled(),
            "enrolled_now": enrolled_now}


def _store(data_dir: Path) -> BundleStore:
    from client_sdk.install import BundleStore

    return BundleStore(data_dir)


@device_app.command("status")
def status(data_dir: Annotated[Path, typer.Option(help="The device data directory.")]) -> None:
    """Print the active bundle of every model (read-only)."""
    typer.echo(json.dumps({"active": _active(_store(data_dir))}, sort_keys=True))


@device_app.command("predict")
def predict(
    data_dir: Annotated[Path, typer.Option(help="The device data directory.")],
    model: Annotated[str, typer.Option(help="Model name.")],
    input_file: Annotated[Path, typer.Option("--input", help="An .npz, one array per input.")],
) -> None:
    """Run the active bundle of MODEL on the arrays in X.npz; print version and outputs."""
    _keep_stdout_for_json()
    import numpy as np

    from client_sdk import ClientSDKError, ModelRuntime, ShadowConfig

    try:
        with np.load(input_file, allow_pickle=False) as npz:
            inputs = {k: npz[k] for k in npz.files}
    except (OSError, ValueError) as e:
        _fail(EXIT_OTHER, f"cannot read --input {input_file}: {e}")
    # One prediction, then exit: no app latency to protect, and a shadow process would cost
    # this command its start-up (an interpreter and onnxruntime) for the one sample.
    runtime = ModelRuntime(data_dir, shadow_config=ShadowConfig(isolation="thread"))
    try:
        bundle = runtime.store.active(model)
        if bundle is not None and not runtime.store.verify(bundle):
            _fail(EXIT_VERIFICATION, f"active bundle of {model} fails its sha256 check; run "
                  "`modelfleet device update` to repair it")
        p = runtime.predict(model, inputs)
        shadow = runtime.shadow.session(model)
    except ClientSDKError as e:
        # The whole message on one line: onnxruntime puts the useful part ("index: 2 Got: 32
        # Expected: 64") on the lines after the first.
        _fail(EXIT_OTHER, " ".join(str(e).split()))
        return
    finally:
        runtime.close()  # the candidate's sample is compared and its statistics persisted
    outputs = {k: {"shape": list(v.shape), "dtype": str(v.dtype), "data": v.tolist()}
               for k, v in p.outputs.items()}
    doc: dict[str, Any] = {"model": p.model, "version": p.version, "sha256": p.sha256,
                           "backend": p.backend, "outputs": outputs}
    if shadow is not None:
        st = shadow.stats
        doc["candidate"] = {"version": st.version, "sha256": st.sha256,
                            "samples": st.samples, "verdict": st.verdict}
    typer.echo(json.dumps(doc, sort_keys=True))
