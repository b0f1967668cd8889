"""Shadow-mode overhead on the app's predict latency (goal: p99 within 5% of no shadow).

One app thread calls ``ModelRuntime.predict`` at a steady rate on an MLP (onnxruntime CPU);
rounds alternate between *baseline* (no candidate) and *shadow* (a candidate of the same size
attached: each input is offered to the worker thread, which runs the candidate and compares).
Prints per-mode median over rounds of the app's predict p50/p99, and the samples the
candidate compared / dropped, for each ``--sample-every`` (1 = offer every prediction).

    python -m bench.sdk.bench_shadow [--rounds 5] [--calls 1000] [--interval-ms 2]
        [--hidden 512] [--sample-every 1 10]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from client_sdk import ModelRuntime
from client_sdk.install import Bundle, BundleStore, Member
from client_sdk.runtime import CANDIDATE
from client_sdk.shadow import ShadowStore

IN, OUT = 256, 10


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


def run(rounds: int, calls: int, interval_ms: float, hidden: int,
        sample_every: int = 1) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1, IN)).astype(np.float32) for _ in range(64)]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        active_b = stage(d, "1.0", mlp(hidden, 1))
        cand_b = stage(d, "2.0", mlp(hidden, 2))
        ShadowStore(d).register(cand_b.sha256, "mlp", "2.0", {
            "max_kl_micro": 10**9, "max_latency_p99_us": 10**9, "min_samples": 10**9})
        rt = ModelRuntime(d, shadow_queue=8, shadow_persist_every=500,
                          shadow_sample_every=sample_every)
        rt.swap(rt.prepare(active_b))
        cand = rt.prepare(cand_b)
        for _ in range(200):  # warm-up
            rt.predict("mlp", {"x": xs[0]})
        results: dict[str, list[tuple[float, float]]] = {"baseline": [], "shadow": []}
        for _ in range(rounds):
            for mode in ("baseline", "shadow"):
                if mode == "shadow":
                    rt.swap(cand, CANDIDATE)
                else:
                    rt.clear("mlp", CANDIDATE)
                results[mode].append(one_round(rt, calls, interval_ms / 1e3, xs))
                rt.flush_shadow()
        stats = ShadowStore(d).load(cand_b.sha256)
        rt.close()
    out = {m: {"p50_ms": statistics.median(r[0] for r in rs),
               "p99_ms": statistics.median(r[1] for r in rs)} for m, rs in results.items()}
    out["shadow"]["samples"] = float(stats.samples if stats else 0)
    out["shadow"]["dropped"] = float(stats.dropped if stats else 0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--interval-ms", type=float, default=2.0)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--sample-every", type=int, nargs="+", default=[1, 10])
    a = ap.parse_args()
    print(f"app predict latency, median of {a.rounds} rounds × {a.calls} calls every "
          f"{a.interval_ms:g} ms (MLP {IN}-{a.hidden}-{a.hidden}-{OUT})")
    print(f"{'sampling':<10} {'base p50':>9} {'base p99':>9} {'shadow p50':>11} "
          f"{'shadow p99':>11} {'p99 Δ':>8} {'compared':>9} {'dropped':>8}")
    for n in a.sample_every:
        r = run(a.rounds, a.calls, a.interval_ms, a.hidden, n)
        b, s = r["baseline"], r["shadow"]
        print(f"{'1/' + str(n):<10} {b['p50_ms']:>9.3f} {b['p99_ms']:>9.3f} "
              f"{s['p50_ms']:>11.3f} {s['p99_ms']:>11.3f} "
              f"{100 * (s['p99_ms'] / b['p99_ms'] - 1):>+7.1f}% {int(s['samples']):>9} "
              f"{int(s['dropped']):>8}")
    print("goal: p99 Δ ≤ +5%")


if __name__ == "__main__":
    main()
