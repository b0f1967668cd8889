"""Shadow mode on the device: the candidate never serves, is compared on live inputs off the
app's thread, fails (and is never fetched again) or passes (and is promoted by swap, no
download); the statistics survive restarts; a full queue drops samples and counts them."""

from __future__ import annotations

import hashlib

import numpy as np

from client_sdk import ModelRuntime, Outcome
from client_sdk.runtime import CANDIDATE
from client_sdk.shadow_stats import FAILED, PASSED, PENDING, ShadowStore, compare, kl_divergence
from manifests import ShadowThresholds
from tests.client.onnx_models import check_whole, scaled_model

RNG = np.random.default_rng(7)


def inputs(n: int) -> list[np.ndarray]:
    return [RNG.standard_normal((1, 4)).astype(np.float32) for _ in range(n)]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def publish_shadow(sim, active: bytes, candidate: bytes, shadow=None):
    a1, a2 = sim.artifact(active), sim.artifact(candidate)
    sim.publish("clf", [sim.release("2.0", [a2], mode="shadow", shadow=shadow),
                        sim.release("1.0", [a1])])
    return a1, a2


def predict_all(runtime: ModelRuntime, xs: list[np.ndarray]) -> list[float]:
    """Predict each input (flushing the shadow queue after each: no drops); the k that
    answered each call."""
    ks = []
    for x in xs:
        p = runtime.predict("clf", {"x": x})
        ks.append(check_whole(p.outputs, x))
        assert p.version == "1.0"
        runtime.flush_shadow()
    return ks


def test_kl_of_logits_is_zero_for_the_same_model_and_positive_for_another():
    x = np.array([[0.5, -1.0, 2.0, 0.1]], dtype=np.float32)
    assert kl_divergence(x, x.copy()) == 0.0
    assert kl_divergence(x, 3 * x) > 0.01
    probs = np.array([[0.25, 0.25, 0.5]], dtype=np.float32)  # used as-is, not softmaxed
    assert abs(kl_divergence(probs, np.array([[0.5, 0.25, 0.25]], dtype=np.float32))
               - 0.25 * np.log(0.5) - 0.5 * np.log(2)) < 1e-6
    s = compare({"y": x, "tag": np.array([1.0], np.float32)},
                {"y": x, "tag": np.array([2.0], np.float32)}, 10, 20)
    assert s.kl == 0.0 and s.cosine == 1.0 and s.snr_db is not None and s.snr_db < 1.0


def test_diverging_candidate_never_serves_fails_and_is_never_fetched_again(
        make_updater, sim, tmp_path):
    v1, bad = scaled_model(1.0), scaled_model(3.0)
    _, a2 = publish_shadow(sim, v1, bad)
    runtime = ModelRuntime(tmp_path / "device", shadow_budget=None)
    up = make_updater(runtime=runtime)
    first = up.check_once()
    assert [(c.version, c.verdict) for c in first.candidates] == [("2.0", PENDING)]

    ks = predict_all(runtime, inputs(12))
    assert ks == [1.0] * 12  # every answer came from the active model

    stats = ShadowStore(tmp_path / "device").load(sha(bad))
    assert stats is not None and stats.verdict == FAILED and stats.samples == 10
    assert "mean KL" in (stats.reason or "")
    assert runtime.loaded("clf", CANDIDATE) is None  # discarded at once

    sim.fetches.clear()
    again = up.check_once()
    (c,) = again.candidates
    assert (c.version, c.verdict, c.outcome) == ("2.0", FAILED, Outcome.REFUSED)
    assert sim.fetched("/" + a2.url) == []
    pointer = up.store.pointer("clf")
    assert pointer.candidate is None
    assert len(list((up.store.model_dir("clf") / "bundles").iterdir())) == 1
    # Even a fresh runtime on this data dir never loads it again.
    fresh = ModelRuntime(tmp_path / "device", shadow_budget=None)
    fresh.predict("clf", {"x": inputs(1)[0]})
    assert fresh.loaded("clf", CANDIDATE) is None


def test_passing_candidate_is_promoted_by_swap_without_download(make_updater, sim, tmp_path):
    v1 = scaled_model(1.0)
    same = scaled_model(1.0, padding=8)  # other bytes, same outputs
    a1, a2 = publish_shadow(sim, v1, same)
    runtime = ModelRuntime(tmp_path / "device", shadow_budget=None)
    up = make_updater(runtime=runtime)
    up.check_once()
    predict_all(runtime, inputs(10))
    stats = ShadowStore(tmp_path / "device").load(sha(same))
    assert stats is not None and stats.verdict == PASSED and stats.kl_max_micro == 0
    assert up.check_once().candidates[0].verdict == PASSED
    held = runtime.loaded("clf", CANDIDATE)
    assert held is not None

    sim.publish("clf", [sim.release("2.0", [a2]), sim.release("1.0", [a1])])  # promotion
    sim.fetches.clear()
    result = up.check_once()
    assert result.models[0].version == "2.0" and result.models[0].outcome is Outcome.UPDATED
    assert sim.fetched("/blobs/") == []
    assert runtime.loaded("clf") is held  # the very loaded candidate, swapped in
    assert runtime.predict("clf", {"x": inputs(1)[0]}).version == "2.0"


def test_shadow_statistics_survive_an_app_restart(make_updater, sim, tmp_path):
    v1, bad = scaled_model(1.0), scaled_model(3.0)
    publish_shadow(sim, v1, bad)
    make_updater().check_once()  # the agent installs; the app runs separately
    app = ModelRuntime(tmp_path / "device", shadow_budget=None)
    predict_all(app, inputs(6))
    app.close()
    stats = ShadowStore(tmp_path / "device").load(sha(bad))
    assert stats is not None and (stats.samples, stats.verdict) == (6, PENDING)

    restarted = ModelRuntime(tmp_path / "device", shadow_budget=None)
    predict_all(restarted, inputs(4))
    stats = ShadowStore(tmp_path / "device").load(sha(bad))
    assert stats is not None and (stats.samples, stats.verdict) == (10, FAILED)
    assert len(stats.active_us) == 10 and len(stats.candidate_us) == 10


def test_full_queue_drops_samples_and_counts_them(make_updater, sim, tmp_path):
    v1 = scaled_model(1.0)
    slow = scaled_model(1.0, padding=2_000_000, use_padding=True)  # ~ms per run
    publish_shadow(sim, v1, slow, ShadowThresholds(1000, 10_000, min_samples=1000))
    make_updater().check_once()
    app = ModelRuntime(tmp_path / "device", shadow_queue=1, shadow_budget=None)
    xs = inputs(60)
    app.predict("clf", {"x": xs[0]})
    for x in xs[1:]:
        assert app.predict("clf", {"x": x}).version == "1.0"
    app.close()
    stats = ShadowStore(tmp_path / "device").load(sha(slow))
    assert stats is not None
    assert stats.dropped > 0 and stats.samples + stats.dropped == 60


def test_sampling_offers_one_prediction_in_n(make_updater, sim, tmp_path):
    publish_shadow(sim, scaled_model(1.0), scaled_model(1.0, padding=8),
                   ShadowThresholds(1000, 10_000, min_samples=1000))
    make_updater().check_once()
    app = ModelRuntime(tmp_path / "device", shadow_sample_every=3, shadow_budget=None)
    predict_all(app, inputs(9))
    app.close()
    stats = ShadowStore(tmp_path / "device").load(sha(scaled_model(1.0, padding=8)))
    assert stats is not None and (stats.samples, stats.dropped) == (3, 0)
