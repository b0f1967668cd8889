"""Shadow-mode overhead on the app's predict latency (goal: p99 within 5% of no shadow).

One app thread calls ``ModelRuntime.predict`` at a steady rate on an MLP (onnxruntime CPU);
rounds interleave the modes, in a new order each round, all in the same run so they see the
same machine load:

- *base*: a runtime that never had a candidate; *base′*: another one, the A/A row — the
  difference between two identical set-ups is the noise floor a real overhead must exceed;
- *thread*: a candidate attached, run on a worker thread of the app's process
  (``shadow_isolation="thread"``, ``client_sdk.shadow_worker``; ``SCHED_IDLE`` inference);
- *process*: the candidate run and compared in the shadow child process
  (``shadow_isolation="process"``, ``client_sdk.shadow_process``);
- *thread, all* / *process, all*: the same with no ``shadow_budget``: every prediction is
  offered, whatever the offer costs (what the SDK did before the budget);
- *normal* (``--modes`` only): the thread worker at the app's priority (before issue 12).

The *thread* and *process* rows use the SDK's defaults: offers within the default
``shadow_budget`` (2% of the app's predict time); the *offered* column says what share of
the predictions that let through. Every offered input is run on the candidate and compared
(or counted as dropped when the ring is full). Each row pools every call of a mode
over all rounds (rounds × calls latencies) and prints its p50/p99, the p99's change from
*base* with a 90% interval from resampling the rounds (paired: the same rounds for both), and
the samples compared / dropped; one table per ``--sample-every`` (1 = offer every prediction),
then the same for a candidate ``--slow-candidate`` times as costly as the active model.
``--cpu-hogs N`` adds N busy processes for the run (a loaded device).

    python -m bench.sdk.bench_shadow [--rounds 10] [--calls 1000] [--interval-ms 2]
        [--hidden 512] [--sample-every 1] [--slow-candidate 3] [--cpu-hogs 0]
        [--modes base base2 thread process process-all]
"""

from __future__ import annotations

import argparse
import hashlib
import math
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from client_sdk import ModelRuntime
from client_sdk.install import Bundle, BundleStore, Member
from client_sdk.loaded import LoadedModel
from client_sdk.runtime import CANDIDATE
from client_sdk.shadow_stats import ShadowStore

IN, OUT = 256, 10
# mode → the runtime's shadow settings (None: no candidate ever attached).
MODES: dict[str, dict[str, object] | None] = {
    "base": None, "base2": None,
    "thread": {"shadow_isolation": "thread"},
    "process": {"shadow_isolation": "process"},
    "thread-all": {"shadow_isolation": "thread", "shadow_budget": None},
    "process-all": {"shadow_isolation": "process", "shadow_budget": None},
    "normal": {"shadow_isolation": "thread", "shadow_background": False},
}
LABELS = {"base": "base", "base2": "base′ (A/A)", "thread": "thread", "process": "process",
          "thread-all": "thread, all", "process-all": "process, all",
          "normal": "thread, normal prio"}


def mlp(hidden: int, seed: int) -> bytes:
    """x[1, 256] → MatMul/Relu ×2 (``hidden`` wide) → logits[1, 10]."""
    rng = np.random.default_rng(seed)
    dims = [IN, hidden, hidden, OUT]
    inits, nodes, prev = [], [], "x"
    for i in range(3):
        w = (rng.standard_normal((dims[i], dims[i + 1])) / np.sqrt(dims[i])).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        out = "logits" if i == 2 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}" if i < 2 else out]))
        if i < 2:
            nodes.append(helper.make_node("Relu", [f"m{i}"], [out]))
        prev = out
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, IN])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, OUT])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def mlp_cost(hidden: int) -> int:
    """Multiply-adds of ``mlp(hidden)``."""
    return IN * hidden + hidden * hidden + hidden * OUT


def hidden_for(cost: float) -> int:
    """The hidden width whose MLP costs ``cost`` multiply-adds (the positive root)."""
    b = IN + OUT
    return round((-b + math.sqrt(b * b + 4 * cost)) / 2)


def stage(data_dir: Path, version: str, data: bytes) -> Bundle:
    src = data_dir / f"src-{version}"
    src.write_bytes(data)
    member = Member("primary", "onnx", "linux", "", "primary.onnx",
                    hashlib.sha256(data).hexdigest(), len(data))
    return BundleStore(data_dir).stage("mlp", version, [(member, src)])


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def one_round(rt: ModelRuntime, calls: int, interval: float, xs: list[np.ndarray]
              ) -> list[float]:
    lat: list[float] = []
    next_at = time.perf_counter()
    for i in range(calls):
        next_at += interval
        t0 = time.perf_counter()
        rt.predict("mlp", {"x": xs[i % len(xs)]})
        lat.append((time.perf_counter() - t0) * 1e3)
        pause = next_at - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    return lat


def runtime(d: Path, hidden: int, cand_hidden: int, sample_every: int,
            settings: dict[str, object]) -> tuple[ModelRuntime, LoadedModel | None, str]:
    """A runtime in ``d`` with the active MLP swapped in and, when ``settings`` is not None,
    the candidate loaded (not yet attached); returns it, the candidate and its sha256."""
    d.mkdir()
    active_b = stage(d, "1.0", mlp(hidden, 1))
    cand_b = stage(d, "2.0", mlp(cand_hidden, 2))
    ShadowStore(d).register(cand_b.sha256, "mlp", "2.0", {
        "max_kl_micro": 10**9, "max_latency_p99_us": 10**9, "min_samples": 10**9})
    rt = ModelRuntime(d, shadow_queue=8, shadow_sample_every=sample_every,
                      **settings)  # type: ignore[arg-type]
    rt.swap(rt.prepare(active_b))
    return rt, rt.prepare(cand_b), cand_b.sha256


def seen(rt: ModelRuntime, sha: str) -> tuple[int, int]:
    """Samples compared and dropped so far, as persisted."""
    stats = ShadowStore(rt.data_dir).load(sha)
    return (stats.samples, stats.dropped) if stats else (0, 0)


def pooled_p99(rounds: list[list[float]], pick: list[int]) -> float:
    return pct([x for i in pick for x in rounds[i]], 99)


def run(rounds: int, calls: int, interval_ms: float, hidden: int, modes: list[str],
        sample_every: int = 1, cand_hidden: int | None = None
        ) -> dict[str, dict[str, float | str]]:
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1, IN)).astype(np.float32) for _ in range(64)]
    with tempfile.TemporaryDirectory() as tmp:
        rts = {m: runtime(Path(tmp) / m, hidden, cand_hidden or hidden, sample_every,
                          MODES[m] or {}) for m in modes}
        for m, (rt, cand, _) in rts.items():
            if cand is not None and MODES[m] is not None:
                rt.swap(cand, CANDIDATE)  # the warm-up starts the worker or the child
            for _ in range(200):
                rt.predict("mlp", {"x": xs[0]})
            rt.flush_shadow()
        # Candidates stay attached throughout, as on a device: an idle worker or child sleeps
        # (paced, client_sdk.pace) through the other modes' rounds.
        warm = {m: seen(rt, sha) for m, (rt, _, sha) in rts.items() if MODES[m] is not None}
        lat: dict[str, list[list[float]]] = {m: [] for m in modes}
        shuffle = np.random.default_rng(2)
        for _ in range(rounds):
            # A new order each round: a mode's round also pays for what the previous mode
            # left running (a worker winding down), and each mode follows each other alike.
            for m in shuffle.permutation(modes):
                lat[str(m)].append(one_round(rts[str(m)][0], calls, interval_ms / 1e3, xs))
        boot = np.random.default_rng(1)
        picks = [list(boot.integers(0, rounds, rounds)) for _ in range(1000)]
        base = [pooled_p99(lat["base"], p) for p in picks]
        out: dict[str, dict[str, float | str]] = {}
        everything = list(range(rounds))
        for m in modes:
            pooled = [x for rr in lat[m] for x in rr]
            ratios = [pooled_p99(lat[m], p) / b - 1 for p, b in zip(picks, base, strict=True)]
            out[m] = {"p50_ms": pct(pooled, 50), "p99_ms": pct(pooled, 99),
                      "delta": pooled_p99(lat[m], everything)
                      / pooled_p99(lat["base"], everything) - 1,
                      "lo": pct(ratios, 5), "hi": pct(ratios, 95)}
        for m, (rt, _, sha) in rts.items():
            rt.close()  # persists the candidate's statistics
            out[m]["priority"] = rt.shadow.priority if MODES[m] is not None else ""
            if MODES[m] is not None:  # the warm-up's samples left out
                (samples, dropped), (warm_samples, warm_dropped) = seen(rt, sha), warm[m]
                out[m]["samples"] = float(samples - warm_samples)
                out[m]["dropped"] = float(dropped - warm_dropped)
                out[m]["offered"] = (out[m]["samples"] + out[m]["dropped"]) / (rounds * calls)
    return out


def hog() -> None:
    while True:
        pass


def load_average() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--interval-ms", type=float, default=2.0)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--sample-every", type=int, nargs="+", default=[1])
    ap.add_argument("--slow-candidate", type=float, default=3.0,
                    help="cost of the slow candidate over the active model's (0: no such row)")
    ap.add_argument("--cpu-hogs", type=int, default=0)
    ap.add_argument("--modes", nargs="+", choices=list(MODES),
                    default=["base", "base2", "thread", "process", "process-all"])
    a = ap.parse_args()
    modes = ["base", *[m for m in a.modes if m != "base"]]
    hogs = [multiprocessing.Process(target=hog, daemon=True) for _ in range(a.cpu_hogs)]
    for h in hogs:
        h.start()
    print(f"app predict latency, {a.rounds} interleaved rounds × {a.calls} calls every "
          f"{a.interval_ms:g} ms per mode, pooled (MLP {IN}-{a.hidden}-{a.hidden}-{OUT}); "
          f"{a.cpu_hogs} CPU hogs; load average {load_average()} (1/5/15 min), "
          f"{os.cpu_count()} CPUs")
    print(f"{'sampling':<9} {'candidate':<10} {'mode':<20} {'prio':<6} {'p50 ms':>7} "
          f"{'p99 ms':>7} {'p99 Δ':>7} {'90% interval':>16} {'offered':>8} {'compared':>9} "
          f"{'dropped':>8}")
    cases = [(n, a.hidden) for n in a.sample_every]
    if a.slow_candidate > 0:
        cases.append((1, hidden_for(a.slow_candidate * mlp_cost(a.hidden))))
    try:
        for n, cand_hidden in cases:
            r = run(a.rounds, a.calls, a.interval_ms, a.hidden, modes, n, cand_hidden)
            size = ("same size" if cand_hidden == a.hidden
                    else f"{mlp_cost(cand_hidden) / mlp_cost(a.hidden):.1f}× cost")
            for m in modes:
                s = r[m]
                delta = "" if m == "base" else f"{100 * float(s['delta']):+.1f}%"
                ci = ("" if m == "base" else
                      f"[{100 * float(s['lo']):+.1f}, {100 * float(s['hi']):+.1f}]%")
                shadow = MODES[m] is not None
                offered = f"{100 * float(s['offered']):.0f}%" if shadow else ""
                print(f"{'1/' + str(n):<9} {size:<10} {LABELS[m]:<20} {s['priority']!s:<6} "
                      f"{s['p50_ms']:>7.3f} {s['p99_ms']:>7.3f} {delta:>7} {ci:>16} "
                      f"{offered:>8} "
                      f"{int(s['samples']) if shadow else '':>9} "
                      f"{int(s['dropped']) if shadow else '':>8}")
    finally:
        for h in hogs:
            h.terminate()
    print(f"load average at the end {load_average()}; goal: p99 Δ ≤ +5%, beyond the A/A row")


if __name__ == "__main__":
    main()
