"""A hostile mirror against the device: a manifest, an artifact or the response headers
dripped at one byte a second end the update shortly after its deadline with a typed
`DeadlineExceededError` (before: each read waited for 64 KiB, so one cycle could last hours);
redirect loops and https→http redirects are refused. Real HTTP on loopback, real sockets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from client_sdk import (
    DeadlineExceededError,
    DeviceProfile,
    FetchError,
    Outcome,
    Updater,
    UpdaterConfig,
    UpdateResult,
)
from client_sdk.errors import ClientSDKError
from client_sdk.http_transport import UrllibTransport
from tests.client.onnx_models import scaled_model
from tests.client.simulator import FakeClock, RepositorySimulator
from tests.security.drip_server import Plan, mirror, self_signed, timed

DEADLINE = 2.0
# How far past its deadline an update may end: one scheduler tick, not one more read.
MAX_OVERSHOOT = 1.5
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sim() -> RepositorySimulator:
    # Real time: the device runs on the system clock here, so manifests must be current.
    sim = RepositorySimulator(FakeClock(now=time.time()))
    sim.publish("clf", [sim.release("1.0", [sim.artifact(scaled_model(1.0, padding=4000))])])
    return sim


def _updater(sim: RepositorySimulator, base: str, data_dir: Path) -> Updater:
    return Updater(UpdaterConfig(
        base_url=base, channel="prod", pinned_root=sim.pinned_root,
        device=DeviceProfile("device-1", "linux", arch="x86_64", os_version="6.1",
                             app_version="2.0"),
        data_dir=data_dir, formats=["onnx"], update_deadline_seconds=DEADLINE))


def _drip(kind: str, where: Callable[[str], bool]) -> Plan:
    return lambda path: kind if where(path) else "ok"


def _manifest(path: str) -> bool:
    return path.endswith("/manifest")


def _blob(path: str) -> bool:
    return path.startswith("/blobs/")


@pytest.mark.parametrize("kind", ["drip-body", "drip-headers"])
def test_dripped_manifest_ends_the_update_at_its_deadline(sim: RepositorySimulator,
                                                          tmp_path: Path, kind: str) -> None:
    with mirror(sim, _drip(kind, _manifest)) as m:
        up = _updater(sim, m.base, tmp_path / "device")
        outcome, seconds = timed(up.check_once, DEADLINE + 8)
    assert isinstance(outcome, DeadlineExceededError), outcome
    assert seconds < DEADLINE + MAX_OVERSHOOT, f"{seconds:.2f} s for a {DEADLINE} s deadline"


def test_dripped_artifact_ends_the_update_at_its_deadline(sim: RepositorySimulator,
                                                          tmp_path: Path) -> None:
    with mirror(sim, _drip("drip-body", _blob)) as m:
        up = _updater(sim, m.base, tmp_path / "device")
        outcome, seconds = timed(up.check_once, DEADLINE + 8)
    assert isinstance(outcome, UpdateResult), outcome
    assert outcome.outcome is Outcome.FAILED
    assert [r.error for r in outcome.models] == ["DeadlineExceededError"]
    assert seconds < DEADLINE + MAX_OVERSHOOT, f"{seconds:.2f} s for a {DEADLINE} s deadline"
    assert not (tmp_path / "device" / "models").exists() or not any(
        (tmp_path / "device" / "models").rglob("*.onnx"))


def test_device_update_once_against_a_dripping_mirror_fails_at_its_deadline(
        sim: RepositorySimulator, tmp_path: Path) -> None:
    root = tmp_path / "root.json"
    root.write_bytes(sim.pinned_root)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with mirror(sim, _drip("drip-body", _manifest)) as m:
        start = time.monotonic()
        run = subprocess.run(
            [sys.executable, "-m", "modelfleet", "device", "update", "--server", m.base,
             "--channel", "prod", "--root", str(root), "--data-dir", str(tmp_path / "device"),
             "--device-id", "device-1", "--platform", "onnx", "--once",
             "--deadline", str(DEADLINE)],
            capture_output=True, text=True, env=env, timeout=30)
        seconds = time.monotonic() - start
    assert run.returncode != 0
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["error"] == "DeadlineExceededError", report
    # The process's own start-up (imports) comes on top of the deadline.
    assert seconds < DEADLINE + MAX_OVERSHOOT + 6, f"{seconds:.2f} s"


def test_redirect_loop_is_refused_after_the_redirect_cap(sim: RepositorySimulator) -> None:
    with mirror(sim, lambda path: "loop") as m:
        outcome, seconds = timed(
            lambda: UrllibTransport(max_redirects=5).fetch(m.base + "/v1/x", {}, 5.0), 10)
    assert isinstance(outcome, FetchError) and "redirects" in str(outcome), outcome
    assert len(m.requests) == 6  # the request and five redirects, then no more
    assert seconds < 2


def test_plain_http_transport_never_loads_the_ca_store(sim: RepositorySimulator,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The system's CA certificates (~30 ms of CPU) load on the first https request only: an
    app making an Updater per check against a plain-http mirror never pays for them."""
    import ssl

    def no_tls(*a: object, **k: object) -> ssl.SSLContext:
        raise AssertionError("a plain-http fetch set up TLS")

    monkeypatch.setattr(ssl, "create_default_context", no_tls)
    with mirror(sim, lambda path: "ok") as plain:
        resp = UrllibTransport().fetch(plain.base + "/v1/channels/prod/manifest", {}, 5.0)
        try:
            assert resp.status == 200 and b"".join(resp.chunks) == sim.manifest_bytes()
        finally:
            resp.close()


def test_https_to_http_redirect_is_refused(sim: RepositorySimulator, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    with mirror(sim, lambda path: "ok") as plain:
        with mirror(sim, lambda path: plain.base + path, tls=(cert, key)) as tls:
            import ssl

            ctx = ssl.create_default_context(cafile=str(cert))
            transport = UrllibTransport(ssl_context=ctx)
            with pytest.raises(FetchError, match="plain-HTTP"):
                transport.fetch(tls.base + "/v1/channels/prod/manifest", {}, 5.0)
        assert plain.requests == []  # the downgraded URL was never requested


def test_https_mirror_still_works(sim: RepositorySimulator, tmp_path: Path) -> None:
    """The TLS path itself (certificate checked against the given CA) serves real bytes."""
    import ssl

    cert, key = self_signed(tmp_path)
    with mirror(sim, lambda path: "ok", tls=(cert, key)) as tls:
        transport = UrllibTransport(ssl_context=ssl.create_default_context(cafile=str(cert)))
        resp = transport.fetch(tls.base + "/v1/channels/prod/manifest", {}, 5.0)
        try:
            body = b"".join(resp.chunks)
        finally:
            resp.close()
        assert resp.status == 200 and body == sim.manifest_bytes()
        with pytest.raises(ClientSDKError):  # and an unknown CA is refused
            UrllibTransport().fetch(tls.base + "/v1/channels/prod/manifest", {}, 5.0)
