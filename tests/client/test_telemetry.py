"""Device identity and telemetry: a 0600 Ed25519 key made once, enrolment once, signed batches
retried with backoff, idempotent report ids, a bounded outbox — and only metrics leave."""

from __future__ import annotations

import base64
import json
import stat

import nacl.signing
import numpy as np

from client_sdk import ModelRuntime
from client_sdk.identity import DeviceIdentity
from client_sdk.telemetry import Outbox, Reporter, update_report
from tests.client.conftest import LINUX
from tests.client.onnx_models import scaled_model
from tests.client.simulator import BASE


def reporter(sim, clock, data_dir):
    return Reporter(data_dir, BASE, sim, LINUX, clock, channel="prod", backoff_base=10)


def test_device_key_is_made_once_0600_and_keyid_is_sha256_of_the_public_key(tmp_path):
    a = DeviceIdentity.load_or_create(tmp_path)
    path = tmp_path / "identity" / "device.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    b = DeviceIdentity.load_or_create(tmp_path)
    assert a.public_key_hex == b.public_key_hex
    import hashlib
    assert a.keyid == hashlib.sha256(bytes.fromhex(a.public_key_hex)).hexdigest()


def test_enrolment_happens_once_and_reports_are_signed_over_the_exact_body(
        sim, clock, tmp_path):
    rep = reporter(sim, clock, tmp_path)
    assert rep.flush().status == "not_enrolled"
    assert rep.enroll(sim.telemetry.token) is True
    assert rep.enroll(sim.telemetry.token) is False  # no second request
    rep.outbox.add(update_report("clf", "1.0", "a" * 64, "activated", at=int(clock.time()),
                                 via="full", nbytes=123))
    result = rep.flush()
    assert (result.sent, result.pending, result.status) == (1, 0, "ok")
    body = sim.telemetry.bodies[-1]
    doc = json.loads(body)
    assert doc["device_id"] == LINUX.device_id and doc["reports"][0]["bytes"] == 123
    # The sink verified the signature; check it independently too.
    key = nacl.signing.VerifyKey(bytes.fromhex(rep.identity.public_key_hex))
    sig = rep.identity.sign_b64(body)
    key.verify(body, base64.b64decode(sig))


def test_failed_upload_is_kept_backed_off_and_retried_and_a_lost_reply_stores_once(
        sim, clock, tmp_path):
    rep = reporter(sim, clock, tmp_path)
    rep.enroll(sim.telemetry.token)
    for i in range(3):
        rep.outbox.add(update_report("clf", f"1.{i}", None, "downloaded", at=int(clock.time())))
    sim.telemetry.fail_next = [503]
    assert rep.flush().status == "retry_later"
    assert len(rep.outbox.files()) == 3
    assert rep.flush().status == "backing_off"  # within the backoff: no request
    assert len(sim.telemetry.bodies) == 1
    clock.advance(11)
    sim.telemetry.lose_reply_next = 1  # stored, but the reply is lost
    assert rep.flush().status == "retry_later"
    clock.advance(21)  # second failure: 20 s
    result = rep.flush()
    assert (result.status, result.sent, result.duplicates) == ("ok", 0, 3)
    assert len(sim.telemetry.of_kind("update")) == 3 and rep.outbox.files() == []


def test_rate_limited_upload_honours_retry_after(sim, clock, tmp_path):
    rep = reporter(sim, clock, tmp_path)
    rep.enroll(sim.telemetry.token)
    rep.outbox.add(update_report("clf", "1.0", None, "verified", at=int(clock.time())))
    sim.telemetry.fail_next = [429]  # Retry-After: 5, backoff_base 10 -> 10 s
    assert rep.flush().status == "retry_later"
    clock.advance(9)
    assert rep.flush().status == "backing_off"
    clock.advance(2)
    assert rep.flush().sent == 1


def test_outbox_is_bounded_and_counts_what_it_dropped(tmp_path, clock):
    box = Outbox(tmp_path, max_reports=5)
    for i in range(8):
        box.add(update_report("clf", f"1.{i}", None, "downloaded", at=int(clock.time()) + i))
    assert len(box.files()) == 5 and box.dropped() == 3
    kept = [json.loads(f.read_bytes())["version"] for f in box.files()]
    assert kept == ["1.3", "1.4", "1.5", "1.6", "1.7"]  # the oldest went first


def test_no_input_or_output_value_leaves_the_device(make_updater, sim, clock, tmp_path):
    a1, a2 = sim.artifact(scaled_model(1.0)), sim.artifact(scaled_model(1.0, padding=8))
    sim.publish("clf", [sim.release("2.0", [a2], mode="shadow"), sim.release("1.0", [a1])])
    data = tmp_path / "device"
    make_updater().check_once()
    app = ModelRuntime(data, shadow_budget=None)
    secret = np.array([[1234.5678, -8765.4321, 31337.25, 0.000271828]], dtype=np.float32)
    out = None
    for _ in range(12):
        out = app.predict("clf", {"x": secret}).outputs
        app.flush_shadow()
    app.close()
    rep = reporter(sim, clock, data)
    rep.enroll(sim.telemetry.token)
    assert rep.collect() >= 2  # a shadow summary and a health report
    assert rep.flush().status == "ok"
    kinds = {r["kind"] for r in sim.telemetry.reports.values()}
    assert kinds == {"update", "shadow", "health"}
    shadow = sim.telemetry.of_kind("shadow")[0]
    assert shadow["samples"] == 10 and shadow["verdict"] == "passed"
    sent = b"".join(sim.telemetry.bodies)
    assert out is not None
    for arr in (secret, out["y"]):
        for v in arr.ravel():
            for text in (repr(float(v)), f"{float(v):.4f}", str(v), f"{float(v):g}"):
                assert text.encode() not in sent, text
        assert arr.tobytes() not in sent
        assert base64.b64encode(arr.tobytes()) not in sent
    assert rep.collect() == 0  # nothing changed since: nothing new to report


def test_health_reports_count_predictions_since_the_last_report(make_updater, sim, clock,
                                                                tmp_path):
    sim.publish("clf", [sim.release("1.0", [sim.artifact(scaled_model(1.0))])])
    data = tmp_path / "device"
    make_updater().check_once()
    x = np.ones((1, 4), dtype=np.float32)
    rep = reporter(sim, clock, data)
    rep.enroll(sim.telemetry.token)
    counts = []
    for n in (5, 3):
        app = ModelRuntime(data, shadow_budget=None)
        for _ in range(n):
            app.predict("clf", {"x": x})
        app.close()
        rep.collect()
        rep.flush()
        counts = [(r["predictions"], r["errors"], r["rolled_back"])
                  for r in sorted(sim.telemetry.of_kind("health"), key=lambda r: r["at"])]
    assert sorted(counts) == [(3, 0, False), (5, 0, False)]


def update_events(data):
    return [(r["version"], r["event"], r["via"], r["bytes"])
            for r in (json.loads(f.read_bytes()) for f in Outbox(data).files())
            if r["kind"] == "update"]


def test_update_reports_say_how_the_bytes_came_full_patch_or_held(make_updater, sim, tmp_path,
                                                                 v1, v2):
    data = tmp_path / "device"
    a1 = sim.artifact(v1)
    sim.publish("clf", [sim.release("1.0", [a1])])
    up = make_updater()
    up.check_once()
    patch = sim.patch(v1, v2)
    a2 = sim.artifact(v2, patches=[patch])
    sim.publish("clf", [sim.release("2.0", [a2], mode="shadow"), sim.release("1.0", [a1])])
    up.check_once()
    sim.publish("clf", [sim.release("2.0", [a2]), sim.release("1.0", [a1])])  # promotion
    up.check_once()
    assert update_events(data) == [
        ("1.0", "downloaded", "full", len(v1)), ("1.0", "verified", "full", len(v1)),
        ("1.0", "activated", "full", None),
        ("2.0", "downloaded", "patch", patch.length), ("2.0", "verified", "patch", patch.length),
        ("2.0", "activated", "held", None),
    ]
