"""Shadow candidates in a child process (``shadow_isolation="process"``): the same verdict and
statistics as on a worker thread, the candidate at idle priority in another process, an app
thread that never waits for it (even when it is stopped), a child that dies being replaced —
and a candidate that keeps killing it failed —, and a child that cannot start at all leaving
the candidates to a worker thread."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from client_sdk import Event, EventKind, ModelRuntime, shadow_process
from client_sdk.background import IDLE
from client_sdk.runtime import CANDIDATE
from client_sdk.shadow_process import ShadowProcess
from client_sdk.shadow_stats import FAILED, PENDING, ShadowStats, ShadowStore
from client_sdk.shadow_worker import ShadowWorker
from tests.client.onnx_models import check_whole, scaled_model, stage_onnx

pytestmark = pytest.mark.skipif(not shadow_process.supported(), reason="Linux shadow process")

RNG = np.random.default_rng(11)
SLOW = dict(padding=2_000_000, use_padding=True)  # ~ms per run


_stage = stage_onnx


def _runtime(d: Path, candidate: bytes, min_samples: int, **kwargs) -> tuple[ModelRuntime, str]:
    active, cand = _stage(d, "1.0", scaled_model(1.0)), _stage(d, "2.0", candidate)
    ShadowStore(d).register(cand.sha256, "clf", "2.0", {
        "max_kl_micro": 1000, "max_latency_p99_us": 10**9, "min_samples": min_samples})
    kwargs.setdefault("shadow_budget", None)  # every prediction a sample: counts are exact
    rt = ModelRuntime(d, **kwargs)
    rt.swap(rt.prepare(active))
    rt.swap(rt.prepare(cand), CANDIDATE)
    return rt, cand.sha256


def _until(condition, what: str) -> None:
    """Poll for ``condition`` (a generous bound only against a hang: not a timing claim)."""
    end = time.monotonic() + 120
    while not condition():
        assert time.monotonic() < end, f"never happened: {what}"
        time.sleep(0.005)


XS = [RNG.standard_normal((1, 4)).astype(np.float32) for _ in range(14)]


def _aggregates(s: ShadowStats) -> tuple:
    return (s.samples, s.dropped, s.kl_samples, round(s.kl_sum, 12), round(s.kl_max, 12),
            round(s.cosine_min or 0, 12), round(s.snr_min_db or 0, 9), s.verdict, s.reason,
            s.active_us)


def test_the_process_gives_the_threads_verdict_and_statistics(tmp_path):
    seen = {}
    for isolation in ("thread", "process"):
        rt, sha = _runtime(tmp_path / isolation, scaled_model(3.0), 10,
                           shadow_isolation=isolation)
        assert isinstance(rt.shadow, ShadowProcess if isolation == "process" else ShadowWorker)
        for x in XS:
            p = rt.predict("clf", {"x": x})
            assert check_whole(p.outputs, x) == 1.0  # the active model answers
            rt.flush_shadow()
        rt.close()
        stats = ShadowStore(tmp_path / isolation).load(sha)
        assert stats is not None and stats.verdict == FAILED and stats.samples == 10
        assert rt.loaded("clf", CANDIDATE) is None  # failed: out of its slot at once
        stats.active_us = [0] * len(stats.active_us)  # latencies differ, their count does not
        seen[isolation] = _aggregates(stats)
    assert seen["process"] == seen["thread"]


def test_the_candidate_runs_in_another_process_at_idle_priority(tmp_path):
    rt, sha = _runtime(tmp_path, scaled_model(1.0, padding=8), 10**6)
    try:
        assert isinstance(rt.shadow, ShadowProcess)  # the default where it can run
        for x in XS[:3]:
            rt.predict("clf", {"x": x})
        rt.flush_shadow()
        pid = rt.shadow.pid
        assert pid is not None and pid != os.getpid()
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE and rt.shadow.priority == IDLE
        assert os.sched_getscheduler(0) != os.SCHED_IDLE  # the app's thread keeps its own
        stats = ShadowStore(tmp_path).load(sha)
        assert stats is not None and (stats.samples, stats.dropped) == (3, 0)
    finally:
        rt.close()


def test_the_app_never_waits_for_a_stopped_child_and_every_sample_is_counted(tmp_path):
    rt, sha = _runtime(tmp_path, scaled_model(1.0, padding=8), 10**6, shadow_queue=4)
    rt.predict("clf", {"x": XS[0]})
    rt.flush_shadow()
    pid = rt.shadow.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        for i in range(40):  # would hang here if an offer waited for the child
            assert rt.predict("clf", {"x": XS[i % len(XS)]}).version == "1.0"
    finally:
        os.kill(pid, signal.SIGCONT)
    rt.close()
    stats = ShadowStore(tmp_path).load(sha)
    assert stats is not None and stats.verdict == PENDING
    assert stats.samples == 1 + 4 and stats.dropped == 40 - 4  # the ring held 4


def test_a_child_killed_between_samples_is_replaced_and_nothing_fails(tmp_path):
    rt, sha = _runtime(tmp_path, scaled_model(1.0, padding=8), 10**6)
    for x in XS[:3]:
        rt.predict("clf", {"x": x})
    rt.flush_shadow()
    first = rt.shadow.pid
    os.kill(first, signal.SIGKILL)
    _until(lambda: rt.shadow.pid not in (None, first), "a new shadow process")
    for x in XS[3:6]:
        rt.predict("clf", {"x": x})
        rt.flush_shadow()
    rt.close()
    stats = ShadowStore(tmp_path).load(sha)
    assert stats is not None and stats.verdict == PENDING
    # The three samples after the restart are compared; none before it was lost (persisted
    # on flush), a sample offered while no child ran is counted as dropped.
    assert stats.samples + stats.dropped == 6 and stats.samples >= 3


def test_samples_offered_before_a_new_child_has_its_candidates_are_counted(
        tmp_path, monkeypatch):
    """A child started again after a crash gets its candidates re-attached just after it
    runs: the app's samples in between were lost without a trace (the suite caught it)."""
    rt, sha = _runtime(tmp_path, scaled_model(1.0, padding=8), 10**6)
    rt.predict("clf", {"x": XS[0]})
    rt.flush_shadow()
    first = rt.shadow.pid
    gate, sent, real = threading.Event(), threading.Event(), ShadowProcess._send_attach

    def held_attach(self, link, model, session):
        gate.wait(10)  # hold the re-attach until the app has offered
        real(self, link, model, session)
        sent.set()

    monkeypatch.setattr(ShadowProcess, "_send_attach", held_attach)
    os.kill(first, signal.SIGKILL)
    _until(lambda: rt.shadow.pid not in (None, first), "a new shadow process")
    for x in XS[1:4]:
        rt.predict("clf", {"x": x})
    gate.set()
    assert sent.wait(10)
    rt.close()
    stats = ShadowStore(tmp_path).load(sha)
    assert stats is not None and stats.samples == 1
    assert stats.dropped == 3  # offered, not compared: counted


def test_a_candidate_that_keeps_killing_the_child_fails(tmp_path):
    events: list[Event] = []
    rt, sha = _runtime(tmp_path, scaled_model(1.0, **SLOW), 10**6, on_event=events.append)

    def failed() -> bool:
        return rt.loaded("clf", CANDIDATE) is None

    def killed_while_running() -> bool:
        """Stop the child (its counters hold still), kill it if it is running the candidate
        (as if the candidate crashed it), else let it go on."""
        rt.predict("clf", {"x": XS[0]})
        pid = rt.shadow.pid
        if pid is None:
            return False
        os.kill(pid, signal.SIGSTOP)
        if rt.shadow.busy and rt.shadow.pid == pid:
            os.kill(pid, signal.SIGKILL)
            _until(lambda: failed() or rt.shadow.pid != pid, "the child's death seen")
            return True
        os.kill(pid, signal.SIGCONT)
        return False

    for _ in range(shadow_process.MAX_CRASHES):
        _until(lambda: failed() or killed_while_running(), "the child running the candidate")
    _until(failed, "the candidate failed")
    stats = ShadowStore(tmp_path).load(sha)
    assert stats is not None and stats.verdict == FAILED
    assert f"crashed the shadow process {shadow_process.MAX_CRASHES} times" in (stats.reason or "")
    assert any(e.kind is EventKind.FAILED for e in events)
    assert rt.predict("clf", {"x": XS[1]}).version == "1.0"  # the app was never touched
    rt.close()


def test_a_child_that_cannot_start_leaves_the_candidates_to_a_thread(tmp_path, monkeypatch):
    monkeypatch.setattr(shadow_process, "child_command",
                        lambda *a: [sys.executable, "-c", "raise SystemExit(3)"])
    events: list[Event] = []
    rt, sha = _runtime(tmp_path, scaled_model(3.0), 5, on_event=events.append)
    _until(lambda: isinstance(rt.shadow, ShadowWorker), "the thread worker")
    assert any(e.kind is EventKind.FALLBACK and "runs on a thread" in e.reason for e in events)
    for x in XS[:5]:
        rt.predict("clf", {"x": x})
        rt.flush_shadow()
    rt.close()
    stats = ShadowStore(tmp_path).load(sha)
    assert stats is not None and stats.verdict == FAILED and stats.samples == 5
