"""The shadow candidate does not compete with the app: its inference runs on a thread of its
own at the lowest CPU priority (Linux ``SCHED_IDLE``) while the app's thread and the shadow
worker keep theirs, errors cross back to the worker, and the GIL-light ``compare`` gives the
figures of the metrics' plain formulas."""

from __future__ import annotations

import math
import os
import sys
import threading
from typing import Any

import numpy as np
import pytest

from client_sdk import ModelRuntime
from client_sdk.backends import Backend, open_backend
from client_sdk.background import IDLE, BackgroundRunner
from client_sdk.install import Bundle, Member
from client_sdk.runtime import CANDIDATE
from client_sdk.shadow_stats import SNR_IDENTICAL_DB, ShadowStore, compare
from tests.client.onnx_models import scaled_model, stage_onnx

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE")


def _policy() -> int:
    return os.sched_getscheduler(0)


@linux_only
def test_runner_lowers_its_own_thread_only():
    before = _policy()
    runner = BackgroundRunner()
    try:
        (tid, policy), _ = runner.call(lambda: (threading.get_native_id(), _policy()))
    finally:
        runner.close()
    assert tid != threading.get_native_id()
    assert policy == os.SCHED_IDLE and runner.priority == IDLE
    assert _policy() == before  # the caller (the app's process, its thread) is untouched


def test_runner_reraises_what_the_call_raised_on_the_callers_thread():
    runner = BackgroundRunner(lower_priority=False)

    def boom() -> None:
        raise ValueError("candidate broke")

    try:
        with pytest.raises(ValueError, match="candidate broke"):
            runner.call(boom)
        assert runner.call(lambda: 42)[0] == 42  # the thread survives a failing call
    finally:
        runner.close()


_stage = stage_onnx


@linux_only
def test_candidate_inference_runs_at_idle_priority_and_the_app_keeps_its_own(tmp_path):
    seen: dict[str, set[tuple[int, int]]] = {"1.0": set(), "2.0": set()}

    class Recording:
        def __init__(self, inner: Backend, version: str) -> None:
            self.name, self._inner, self._version = inner.name, inner, version

        def run(self, inputs: Any) -> dict[str, np.ndarray]:
            seen[self._version].add((threading.get_native_id(), _policy()))
            return self._inner.run(inputs)

    def factory(bundle: Bundle, member: Member) -> Backend:
        return Recording(open_backend(bundle, member), bundle.version)

    d = tmp_path / "device"
    active, cand = _stage(d, "1.0", scaled_model(2.0)), _stage(d, "2.0", scaled_model(3.0))
    ShadowStore(d).register(cand.sha256, "clf", "2.0", {
        "max_kl_micro": 10**9, "max_latency_p99_us": 10**9, "min_samples": 10**6})
    rt = ModelRuntime(d, backend_factory=factory, shadow_budget=None)
    app_policy = _policy()
    try:
        rt.swap(rt.prepare(active))
        rt.swap(rt.prepare(cand), CANDIDATE)
        for i in range(5):
            rt.predict("clf", {"x": np.full((1, 4), i, np.float32)})
            rt.flush_shadow()
        stats = ShadowStore(d).load(cand.sha256)
    finally:
        rt.close()
    assert stats is not None and stats.samples == 5
    assert seen["1.0"] == {(threading.get_native_id(), app_policy)}
    ((cand_tid, cand_policy),) = seen["2.0"]
    assert cand_tid != threading.get_native_id() and cand_policy == os.SCHED_IDLE
    assert rt.shadow.priority == IDLE


def _plain(a: np.ndarray, c: np.ndarray) -> tuple[float | None, float, float]:
    """The metrics as docs/shadow.md defines them, written out the obvious way."""
    def dist(x: np.ndarray) -> np.ndarray:
        rows = x.reshape(-1, x.shape[-1]).astype(np.float64)
        if rows.min() >= 0 and np.allclose(rows.sum(axis=1), 1.0, atol=1e-3):
            return rows
        e = np.exp(rows - rows.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    kl = None
    if a.ndim >= 1 and a.shape[-1] >= 2:
        p, q = np.clip(dist(a), 1e-12, 1.0), np.clip(dist(c), 1e-12, 1.0)
        kl = max(float(np.mean(np.sum(p * np.log(p / q), axis=1))), 0.0)
    av, cv = a.astype(np.float64).ravel(), c.astype(np.float64).ravel()
    na, nc = float(np.linalg.norm(av)), float(np.linalg.norm(cv))
    cos = (1.0 if na == nc else 0.0) if na == 0 or nc == 0 else float(np.dot(av, cv) / (na * nc))
    noise, signal = float(np.sum((av - cv) ** 2)), float(np.sum(av ** 2))
    snr = (SNR_IDENTICAL_DB if noise == 0 else -SNR_IDENTICAL_DB if signal == 0 else
           max(min(10 * math.log10(signal / noise), SNR_IDENTICAL_DB), -SNR_IDENTICAL_DB))
    return kl, cos, snr


@pytest.mark.parametrize("shape", [(1, 10), (4, 7), (2, 3, 5), (1, 1), (6,)])
def test_compare_matches_the_plain_formulas(shape):
    rng = np.random.default_rng(sum(shape))
    for i in range(40):
        a = (rng.standard_normal(shape) * (i % 5)).astype(np.float32)
        c = a + (rng.standard_normal(shape) * 0.01 * (i % 3)).astype(np.float32)
        if i % 4 == 1:  # already probabilities
            a = np.abs(a) + 1e-3
            a = (a / a.sum(axis=-1, keepdims=True)).astype(np.float32)
        if i % 7 == 3:
            c = np.zeros_like(c)
        s = compare({"y": a, "n": np.array([1])}, {"y": c}, 1, 2)
        kl, cos, snr = _plain(a, c)
        assert (s.kl is None) == (kl is None)
        if kl is not None:
            assert s.kl == pytest.approx(kl, rel=1e-9, abs=1e-15)
        assert s.cosine == pytest.approx(cos, rel=1e-9, abs=1e-15)
        assert s.snr_db == pytest.approx(snr, rel=1e-9, abs=1e-12)
