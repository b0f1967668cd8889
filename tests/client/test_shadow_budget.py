"""The shadow budget and the workers' pace. Offering samples adds at most ``shadow_budget`` of
the app's predict time on its thread: a fast model is offered less often than a slow one, the
first prediction always (a one-shot ``modelfleet device predict``), and ``None`` offers every
prediction. Neither worker polls: between batches it sleeps for as long as half a queue takes
to fill (``client_sdk.pace``), so an idle shadow child wakes only a few times a second."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client_sdk import ModelRuntime, shadow_process
from client_sdk.backends import Backend, open_backend
from client_sdk.errors import ConfigError
from client_sdk.install import Bundle, Member
from client_sdk.pace import MAX_SLEEP_S, MIN_SLEEP_S, Pace
from client_sdk.runtime import CANDIDATE
from client_sdk.shadow_stats import ShadowStore
from tests.client.onnx_models import scaled_model, stage_onnx

X = np.ones((1, 4), np.float32)
SLOW_RUN_S = 0.01


def _runtime(d: Path, **kwargs: Any) -> tuple[ModelRuntime, str]:
    active, cand = stage_onnx(d, "1.0", scaled_model(1.0)), stage_onnx(d, "2.0", scaled_model(2.0))
    ShadowStore(d).register(cand.sha256, "clf", "2.0", {
        "max_kl_micro": 10**9, "max_latency_p99_us": 10**9, "min_samples": 10**6})
    rt = ModelRuntime(d, **kwargs)
    rt.swap(rt.prepare(active))
    rt.swap(rt.prepare(cand), CANDIDATE)
    return rt, cand.sha256


def _offered(rt: ModelRuntime, sha: str) -> int:
    """Samples the candidate got so far, compared or dropped."""
    rt.flush_shadow()
    stats = ShadowStore(rt.data_dir).load(sha)
    return stats.samples + stats.dropped if stats else 0


ISOLATIONS = ["thread", pytest.param("process", marks=pytest.mark.skipif(
    not shadow_process.supported(), reason="Linux shadow process"))]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_fast_model_is_offered_within_the_budget_and_its_first_prediction_always(
        tmp_path, isolation):
    rt, sha = _runtime(tmp_path / "device", shadow_isolation=isolation)
    try:
        rt.predict("clf", {"x": X})
        assert _offered(rt, sha) == 1  # a process that predicts once still feeds its candidate
        for _ in range(199):
            rt.predict("clf", {"x": X})
        offered = _offered(rt, sha)
    finally:
        rt.close()
    # This model runs in tens of µs; an offer costs µs (a copy): at 2% each one is paid off
    # by dozens of predictions. Without the budget all 200 would be offered.
    assert 1 < offered < 100, offered


def test_no_budget_offers_every_prediction(tmp_path):
    rt, sha = _runtime(tmp_path / "device", shadow_isolation="thread", shadow_budget=None)
    try:
        for _ in range(50):
            rt.predict("clf", {"x": X})
        assert _offered(rt, sha) == 50
    finally:
        rt.close()


def test_a_slow_model_is_offered_nearly_every_prediction(tmp_path):
    class Slow:
        def __init__(self, inner: Backend) -> None:
            self.name, self._inner = inner.name, inner

        def run(self, inputs: Any) -> dict[str, np.ndarray]:
            time.sleep(SLOW_RUN_S)  # 2% of it (200 µs) pays for an offer
            return self._inner.run(inputs)

    def factory(bundle: Bundle, member: Member) -> Backend:
        return Slow(open_backend(bundle, member))

    rt, sha = _runtime(tmp_path / "device", backend_factory=factory)
    try:
        for _ in range(20):
            rt.predict("clf", {"x": X})
        offered = _offered(rt, sha)
    finally:
        rt.close()
    assert offered >= 15, offered  # (the first offers, which set things up, cost more)


@pytest.mark.parametrize("budget", [0, -0.1, 1.5])
def test_a_budget_outside_0_to_1_is_refused(tmp_path, budget):
    with pytest.raises(ConfigError, match="shadow_budget"):
        ModelRuntime(tmp_path / "device", shadow_budget=budget)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_pace_sleeps_for_half_a_queue_at_the_recent_rate(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr("client_sdk.pace.time.monotonic", clock)
    pace, seen = Pace(), 0
    # Nothing came yet: back off from the shortest sleep, doubling, up to the longest.
    waits = [pace.timeout(0, 8) for _ in range(12)]
    assert waits[0] == MIN_SLEEP_S and waits[1] == 2 * MIN_SLEEP_S
    assert waits[-1] == MAX_SLEEP_S and waits == sorted(waits)
    # 500 samples a second: half a queue of 8 arrives in 8 ms.
    for _ in range(20):
        clock.now += 0.01
        seen += 5
        wait = pace.timeout(seen, 8)
    assert wait == pytest.approx(4 / 500, rel=0.01)
    # The app stops sampling: the sleeps grow to the longest (no polling while idle).
    for _ in range(40):
        clock.now += wait
        wait = pace.timeout(seen, 8)
    assert wait == MAX_SLEEP_S
    # Very fast samples: never less than the shortest sleep.
    for _ in range(20):
        clock.now += 0.001
        seen += 100
        wait = pace.timeout(seen, 8)
    assert wait == MIN_SLEEP_S


def _wakeups(pid: int) -> int:
    """Context switches of every thread of ``pid`` so far (each sleep ends in one)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(not (shadow_process.supported() and sys.platform.startswith("linux")),
                    reason="Linux shadow process, /proc")
def test_an_idle_shadow_child_does_not_poll(tmp_path):
    """A child polling every millisecond (as before) woke ~1,000 times a second while samples
    came and 50 times a second when idle, each time evicting the caches of the app's core."""
    rt, sha = _runtime(tmp_path / "device", shadow_isolation="process", shadow_budget=None)
    try:
        for _ in range(20):
            rt.predict("clf", {"x": X})
            time.sleep(0.002)
        assert _offered(rt, sha) == 20
        pid = rt.shadow.pid
        assert pid is not None
        time.sleep(2.0)  # the pace backs off to its longest sleep
        before = _wakeups(pid)
        time.sleep(2.0)
        woke = _wakeups(pid) - before
    finally:
        rt.close()
    assert woke <= 4 * 2.0 / MAX_SLEEP_S + 4, woke


@pytest.mark.skipif(not shadow_process.supported(), reason="Linux shadow process")
def test_a_burst_after_idle_wakes_the_child_instead_of_being_dropped(tmp_path):
    """After a quiet spell the child sleeps its longest; a burst of samples fills the ring in
    a fraction of that: the app's thread wakes it at ¾ full (else ~22 of these 30 drop)."""
    rt, sha = _runtime(tmp_path / "device", shadow_isolation="process", shadow_budget=None)
    try:
        rt.predict("clf", {"x": X})
        assert _offered(rt, sha) == 1
        time.sleep(2.0)  # the pace backs off to its longest sleep
        for _ in range(30):
            rt.predict("clf", {"x": X})
            time.sleep(0.001)
        rt.flush_shadow()
        stats = ShadowStore(rt.data_dir).load(sha)
    finally:
        rt.close()
    assert stats is not None and stats.samples + stats.dropped == 31
    assert stats.dropped < 10, stats.dropped
