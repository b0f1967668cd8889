"""One shape for shadow on the device: ``ShadowConfig`` configures the runtime exactly as the
older ``shadow_*`` keywords do (both forms work), and the one ``Evaluator`` both workers use
runs → compares → adds → decides → persists, drops a sample it may not compare, fails a
candidate that raises and skips one that lacks the input-shape variant."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client_sdk import ModelRuntime, ShadowConfig
from client_sdk.backends import open_backend
from client_sdk.errors import ConfigError
from client_sdk.loaded import prepare_bundle
from client_sdk.runtime import CANDIDATE
from client_sdk.shadow import Evaluator, Session
from client_sdk.shadow_stats import FAILED, PASSED, PENDING, ShadowStats, ShadowStore
from client_sdk.shadow_worker import ShadowWorker
from tests.client.onnx_models import scaled_model, stage_onnx

X = np.array([[0.5, -1.0, 2.0, 0.1]], np.float32)  # not uniform: scaling it changes softmax
THRESHOLDS = {"max_kl_micro": 1000, "max_latency_p99_us": 10**9, "min_samples": 10**6}


def _stage(d: Path) -> tuple[Any, Any]:
    active, cand = stage_onnx(d, "1.0", scaled_model(1.0)), stage_onnx(d, "2.0", scaled_model(2.0))
    ShadowStore(d).register(cand.sha256, "clf", "2.0", THRESHOLDS)
    return active, cand


def _samples_after(rt: ModelRuntime, predictions: int) -> tuple[int, int]:
    active, cand = _stage(rt.data_dir)
    rt.swap(rt.prepare(active))
    rt.swap(rt.prepare(cand), CANDIDATE)
    for _ in range(predictions):
        rt.predict("clf", {"x": X})
        rt.flush_shadow()
    rt.close()
    stats = ShadowStore(rt.data_dir).load(cand.sha256)
    assert stats is not None
    return stats.samples, stats.dropped


def test_shadow_config_and_the_old_keywords_configure_the_same_runtime(tmp_path):
    config = ShadowConfig(queue_size=2, persist_every=5, sample_every=3, budget=None,
                          background=False, isolation="thread")
    new = ModelRuntime(tmp_path / "new", shadow_config=config)
    old = ModelRuntime(tmp_path / "old", shadow_queue=2, shadow_persist_every=5,
                       shadow_sample_every=3, shadow_budget=None, shadow_background=False,
                       shadow_isolation="thread")
    assert new.shadow_config == old.shadow_config == config
    assert isinstance(new.shadow, ShadowWorker) and isinstance(old.shadow, ShadowWorker)
    # What the settings do, not only what they say: one prediction in 3 reaches the candidate.
    assert _samples_after(new, 9) == _samples_after(old, 9) == (3, 0)


def test_one_old_keyword_keeps_the_other_defaults(tmp_path):
    rt = ModelRuntime(tmp_path, shadow_budget=None)
    assert rt.shadow_config == ShadowConfig(budget=None)
    rt.close()
    default = ModelRuntime(tmp_path)
    assert default.shadow_config == ShadowConfig() and default.shadow_config.budget == 0.02
    default.close()


def test_both_forms_at_once_and_unknown_keywords_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="not both"):
        ModelRuntime(tmp_path, shadow_config=ShadowConfig(), shadow_queue=4)
    with pytest.raises(TypeError, match="shadow_queu"):
        ModelRuntime(tmp_path, shadow_queu=4)  # type: ignore[call-arg]


@pytest.mark.parametrize("kwargs,match", [
    ({"sample_every": 0}, "sample_every"),
    ({"budget": 0.0}, "budget"),
    ({"budget": 1.5}, "budget"),
    ({"isolation": "fork"}, "isolation"),
])
def test_bad_shadow_settings_are_refused_with_the_field_named(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ShadowConfig(**kwargs)


# -- the evaluator ---------------------------------------------------------------------


def _timed(fn: Callable[[], Any]) -> tuple[Any, int]:
    t0 = time.perf_counter_ns()
    out = fn()
    return out, (time.perf_counter_ns() - t0) // 1000


class Recorder:
    """What the evaluator asked its worker to do."""

    def __init__(self, settle: bool = True) -> None:
        self.persisted: list[int] = []
        self.decided: list[str] = []
        self.settle = settle

    def evaluator(self, persist_every: int) -> Evaluator:
        return Evaluator(run=_timed, persist_every=persist_every,
                         persist=lambda s: self.persisted.append(s.stats.samples),
                         decided=lambda s: self.decided.append(s.stats.verdict),
                         settle=lambda: self.settle)


def _session(d: Path, candidate: bytes, min_samples: int) -> Session:
    bundle = stage_onnx(d, "2.0", candidate)
    loaded = prepare_bundle(bundle, open_backend, threshold=3, on_event=None)
    stats = ShadowStats(bundle.sha256, "clf", "2.0", thresholds={
        **THRESHOLDS, "min_samples": min_samples})
    return Session(loaded, stats)


def _active() -> dict[str, np.ndarray]:
    return {"y": X * 1.0, "tag": np.array([1.0], np.float32)}


def test_the_evaluator_runs_compares_adds_persists_and_decides(tmp_path):
    rec = Recorder()
    ev = rec.evaluator(persist_every=2)
    s = _session(tmp_path, scaled_model(1.0), min_samples=5)
    for i in range(5):
        ev.sample(s, {"x": X}, _active(), 10, None, at=100 + i)
    assert s.stats.samples == 5 and s.stats.kl_max == 0.0 and s.stats.first_at == 100
    assert s.stats.active_us == [10] * 5 and len(s.stats.candidate_us) == 5
    assert rec.persisted == [2, 4] and rec.decided == [PASSED]
    ev.sample(s, {"x": X}, _active(), 10, None, at=200)  # decided: nothing more is added
    assert s.stats.samples == 5


def test_the_evaluator_fails_a_diverging_candidate(tmp_path):
    rec = Recorder()
    s = _session(tmp_path, scaled_model(3.0), min_samples=3)
    for _ in range(3):
        rec.evaluator(persist_every=100).sample(s, {"x": X}, _active(), 10, None, at=1)
    assert rec.decided == [FAILED] and "mean KL" in (s.stats.reason or "")


def test_the_evaluator_drops_a_sample_it_may_not_compare(tmp_path):
    rec = Recorder(settle=False)
    s = _session(tmp_path, scaled_model(1.0), min_samples=5)
    rec.evaluator(persist_every=1).sample(s, {"x": X}, _active(), 10, None, at=1)
    assert (s.stats.samples, s.dropped, rec.persisted, rec.decided) == (0, 1, [], [])


def test_the_evaluator_fails_a_candidate_that_raises_and_skips_a_missing_variant(tmp_path):
    rec = Recorder()
    ev = rec.evaluator(persist_every=1)
    s = _session(tmp_path, scaled_model(1.0), min_samples=5)
    ev.sample(s, {"x": X}, _active(), 10, "720p", at=1)  # no such shape variant: skipped
    assert (s.stats.samples, s.stats.verdict, rec.decided) == (0, PENDING, [])
    wide = np.ones((1, 5), np.float32)  # the candidate cannot run this input
    ev.sample(s, {"x": wide}, _active(), 10, None, at=1)
    assert s.stats.verdict == FAILED and rec.decided == [FAILED]
    assert (s.stats.reason or "").startswith("candidate raised ")
