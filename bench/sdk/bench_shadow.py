"""Shadow-mode overhead on the app's predict latency (goal: p99 within 5% of no shadow).

One app thread calls ``ModelRuntime.predict`` at a steady rate on an MLP (onnxruntime CPU);
rounds alternate between *baseline* (no candidate), *shadow at normal priority* (a candidate
attached, its worker thread left at the app's priority: the SDK before issue 12's fix) and
*shadow in the background* (the SDK's default: the worker lowers its priority, see
``client_sdk.shadow_worker``), all in the same run so they see the same machine load. Each
offered input is run by the worker thread on the candidate and compared. Prints per mode the
median over rounds of the app's predict p50/p99 and the samples the candidate compared /
dropped, for each ``--sample-every`` (1 = offer every prediction), then the same for a
candidate ``--slow-candidate`` times as costly as the active model (every prediction offered:
the drop policy at work). ``--cpu-hogs N`` adds N busy processes for the run (a loaded device).

    python -m bench.sdk.bench_shadow [--rounds 5] [--calls 1000] [--interval-ms 2]
        [--hidden 512] [--sample-every 1 10] [--slow-candidate 3] [--cpu-hogs 0]
"""

from __future__ import annotations

import argparse
import hashlib
import math
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from client_sdk import ModelRuntime
from client_sdk.background import NORMAL
from client_sdk.install import Bundle, BundleStore, Member
from client_sdk.runtime import CANDIDATE, LoadedModel
from client_sdk.shadow import ShadowStore

IN, OUT = 256, 10
MODES = ("baseline", "normal", "background")


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
              ) -> tuple[float, float]:
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
    return pct(lat, 50), pct(lat, 99)


def runtime(d: Path, hidden: int, cand_hidden: int, sample_every: int, background: bool
            ) -> tuple[ModelRuntime, LoadedModel, str]:
    """A runtime in ``d`` with the active MLP swapped in and the candidate loaded (not yet
    attached); returns it, the candidate and the candidate's sha256."""
    d.mkdir()
    active_b = stage(d, "1.0", mlp(hidden, 1))
    cand_b = stage(d, "2.0", mlp(cand_hidden, 2))
    ShadowStore(d).register(cand_b.sha256, "mlp", "2.0", {
        "max_kl_micro": 10**9, "max_latency_p99_us": 10**9, "min_samples": 10**9})
    rt = ModelRuntime(d, shadow_queue=8, shadow_persist_every=500,
                      shadow_sample_every=sample_every, shadow_background=background)
    rt.swap(rt.prepare(active_b))
    return rt, rt.prepare(cand_b), cand_b.sha256


def run(rounds: int, calls: int, interval_ms: float, hidden: int, sample_every: int = 1,
        cand_hidden: int | None = None) -> dict[str, dict[str, float | str]]:
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1, IN)).astype(np.float32) for _ in range(64)]
    with tempfile.TemporaryDirectory() as tmp:
        # One runtime per worker priority (it is the worker thread's, set when it starts);
        # the baseline rounds run on the background one with its candidate cleared.
        rts = {bg: runtime(Path(tmp) / mode, hidden, cand_hidden or hidden, sample_every, bg)
               for mode, bg in (("normal", False), ("background", True))}
        for rt, _, _ in rts.values():
            for _ in range(200):  # warm-up
                rt.predict("mlp", {"x": xs[0]})
        results: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
        for _ in range(rounds):
            for mode in MODES:
                rt, cand, _ = rts[mode != "normal"]
                if mode == "baseline":
                    rt.clear("mlp", CANDIDATE)
                else:
                    rt.swap(cand, CANDIDATE)
                results[mode].append(one_round(rt, calls, interval_ms / 1e3, xs))
                rt.clear("mlp", CANDIDATE)
                rt.flush_shadow()
        out: dict[str, dict[str, float | str]] = {
            m: {"p50_ms": statistics.median(r[0] for r in rs),
                "p99_ms": statistics.median(r[1] for r in rs)} for m, rs in results.items()}
        for mode in MODES[1:]:
            rt, _, sha = rts[mode != "normal"]
            stats = ShadowStore(rt.data_dir).load(sha)
            out[mode]["samples"] = float(stats.samples if stats else 0)
            out[mode]["dropped"] = float(stats.dropped if stats else 0)
            out[mode]["priority"] = rt.shadow.priority
            rt.close()
    return out


def hog() -> None:
    while True:
        pass


def load_average() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--interval-ms", type=float, default=2.0)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--sample-every", type=int, nargs="+", default=[1, 10])
    ap.add_argument("--slow-candidate", type=float, default=3.0,
                    help="cost of the slow candidate over the active model's (0: no such row)")
    ap.add_argument("--cpu-hogs", type=int, default=0)
    a = ap.parse_args()
    hogs = [multiprocessing.Process(target=hog, daemon=True) for _ in range(a.cpu_hogs)]
    for h in hogs:
        h.start()
    print(f"app predict latency, median of {a.rounds} rounds × {a.calls} calls every "
          f"{a.interval_ms:g} ms (MLP {IN}-{a.hidden}-{a.hidden}-{OUT}); "
          f"{a.cpu_hogs} CPU hogs; load average {load_average()} (1/5/15 min), "
          f"{os.cpu_count()} CPUs")
    print(f"{'sampling':<9} {'candidate':<13} {'worker':<7} {'base p50':>9} {'base p99':>9} "
          f"{'shadow p50':>11} {'shadow p99':>11} {'p99 Δ':>8} {'compared':>9} {'dropped':>8}")
    cases = [(n, a.hidden) for n in a.sample_every]
    if a.slow_candidate > 0:
        cases.append((1, hidden_for(a.slow_candidate * mlp_cost(a.hidden))))
    try:
        for n, cand_hidden in cases:
            r = run(a.rounds, a.calls, a.interval_ms, a.hidden, n, cand_hidden)
            b = r["baseline"]
            size = ("same size" if cand_hidden == a.hidden
                    else f"{mlp_cost(cand_hidden) / mlp_cost(a.hidden):.1f}× cost")
            for mode in MODES[1:]:
                s = r[mode]
                prio = str(s["priority"]) if mode == "background" else NORMAL
                print(f"{'1/' + str(n):<9} {size:<13} {prio:<7} {b['p50_ms']:>9.3f} "
                      f"{b['p99_ms']:>9.3f} {s['p50_ms']:>11.3f} {s['p99_ms']:>11.3f} "
                      f"{100 * (float(s['p99_ms']) / float(b['p99_ms']) - 1):>+7.1f}% "
                      f"{int(s['samples']):>9} {int(s['dropped']):>8}")
    finally:
        for h in hogs:
            h.terminate()
    print(f"load average at the end {load_average()}; goal: p99 Δ ≤ +5% (worker 'normal': "
          "the candidate at the app's priority, the SDK before issue 12)")


if __name__ == "__main__":
    main()
