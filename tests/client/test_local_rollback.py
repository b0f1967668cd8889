"""Local rollback: a newly active bundle that fails at run time gives way to the previous one at
once (no download), and the updater never installs the failed artifact again."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from client_sdk import BackendError, ModelRuntime, Outcome
from client_sdk.health import Policy
from client_sdk.shadow_stats import FAILED, ShadowStore
from client_sdk.telemetry import Outbox
from tests.client.onnx_models import scaled_model

X = np.ones((1, 4), dtype=np.float32)


def install_two(sim, make_updater, v2: bytes):
    """1.0 then 2.0 active: 1.0 is the previous bundle."""
    a1 = sim.artifact(scaled_model(1.0))
    sim.publish("clf", [sim.release("1.0", [a1])])
    up = make_updater()
    up.check_once()
    a2 = sim.artifact(v2)
    sim.publish("clf", [sim.release("2.0", [a2]), sim.release("1.0", [a1])])
    assert up.check_once().models[0].version == "2.0"
    return up, a2


def test_erroring_new_model_rolls_back_at_once_without_download(make_updater, sim, tmp_path):
    # 2.0 expects [1, 8] inputs: every prediction of the app's [1, 4] inputs fails.
    bad = scaled_model(2.0, width=8)
    up, _ = install_two(sim, make_updater, bad)
    app = ModelRuntime(tmp_path / "device", health=Policy(error_limit=3))
    for _ in range(3):
        with pytest.raises(BackendError):
            app.predict("clf", {"x": X})
    sim.fetches.clear()
    p = app.predict("clf", {"x": X})
    assert p.version == "1.0"
    assert up.store.active("clf").version == "1.0"
    failed = ShadowStore(tmp_path / "device").failed(hashlib.sha256(bad).hexdigest())
    assert failed is not None and failed.verdict == FAILED and "rolled back" in failed.reason
    events = [r for r in (json.loads(f.read_bytes())
                          for f in Outbox(tmp_path / "device").files())
              if r["kind"] == "update" and r["event"] == "rolled_back"]
    assert events and events[-1]["version"] == "1.0"

    result = up.check_once()  # the manifest still offers 2.0: refused, never fetched again
    assert result.models[0].outcome is Outcome.REFUSED
    assert "failed on this device" in result.models[0].reason
    assert sim.fetched("/blobs/") == []
    assert up.store.active("clf").version == "1.0"


def test_crash_loop_across_restarts_rolls_back(make_updater, sim, tmp_path):
    up, _ = install_two(sim, make_updater, scaled_model(2.0))
    for _ in range(3):  # the app starts, predicts, and dies without closing the runtime
        app = ModelRuntime(tmp_path / "device")
        assert app.predict("clf", {"x": X}).version == "2.0"
    app = ModelRuntime(tmp_path / "device")
    assert app.predict("clf", {"x": X}).version == "1.0"
    assert up.store.active("clf").version == "1.0"


def test_clean_exits_are_not_a_crash_loop(make_updater, sim, tmp_path):
    install_two(sim, make_updater, scaled_model(2.0))
    for _ in range(5):
        app = ModelRuntime(tmp_path / "device")
        assert app.predict("clf", {"x": X}).version == "2.0"
        app.close()


def test_p99_far_over_its_shadow_figure_rolls_back(make_updater, sim, tmp_path):
    v2 = scaled_model(2.0)
    up, _ = install_two(sim, make_updater, v2)
    # What 2.0 showed in shadow on this device: a 1 µs p99 (any real run is far over it).
    store = ShadowStore(tmp_path / "device")
    stats = store.register(hashlib.sha256(v2).hexdigest(), "clf", "2.0", None)
    stats.candidate_us = [1] * 50
    store.save(stats)
    app = ModelRuntime(tmp_path / "device", health=Policy(probation=20, p99_factor=3.0))
    versions = [app.predict("clf", {"x": X}).version for _ in range(21)]
    assert versions[:20] == ["2.0"] * 20 and versions[20] == "1.0"
    assert up.store.active("clf").version == "1.0"
    assert "shadow figure" in (store.failed(hashlib.sha256(v2).hexdigest()).reason or "")


def test_p99_near_its_shadow_figure_keeps_the_new_model(make_updater, sim, tmp_path):
    v2 = scaled_model(2.0)
    install_two(sim, make_updater, v2)
    store = ShadowStore(tmp_path / "device")
    stats = store.register(hashlib.sha256(v2).hexdigest(), "clf", "2.0", None)
    stats.candidate_us = [1_000_000] * 50  # a generous figure: 1 s
    store.save(stats)
    app = ModelRuntime(tmp_path / "device", health=Policy(probation=20))
    assert {app.predict("clf", {"x": X}).version for _ in range(40)} == {"2.0"}
