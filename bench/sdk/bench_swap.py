"""Swap latency of ModelRuntime under concurrent inference (goal: p99 < 1 ms).

Four threads predict in a loop on a tiny ONNX model while the main thread swaps between two
prepared bundles N times; reports swap p50/p99/max and inference p50/p99 with and without
swaps, plus the error count (must be 0).

    python -m bench.sdk.bench_swap [--swaps 2000] [--threads 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from client_sdk import ModelRuntime
from tests.client.onnx_models import check_whole
from tests.client.test_runtime import make_bundle

X = np.arange(4, dtype=np.float32).reshape(1, 4)


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 10) - 1] if len(values) > 1 else values[0]


def run(swaps: int, threads: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        rt = ModelRuntime(Path(tmp))
        loaded = [rt.prepare(make_bundle(Path(tmp), "clf", v, k))
                  for v, k in (("1.0", 1.0), ("2.0", 2.0))]
        rt.swap(loaded[0])
        stop, swapping = threading.Event(), threading.Event()
        lat_quiet: list[float] = []
        lat_swap: list[float] = []
        errors: list[BaseException] = []

        def worker() -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    p = rt.predict("clf", {"x": X})
                    check_whole(p.outputs, X)
                except BaseException as e:
                    errors.append(e)
                (lat_swap if swapping.is_set() else lat_quiet).append(time.perf_counter() - t0)

        ts = [threading.Thread(target=worker) for _ in range(threads)]
        for t in ts:
            t.start()
        time.sleep(1.0)
        swapping.set()
        swap_lat: list[float] = []
        for n in range(swaps):
            t0 = time.perf_counter()
            rt.swap(loaded[n % 2])
            swap_lat.append(time.perf_counter() - t0)
            time.sleep(0.0005)
        stop.set()
        for t in ts:
            t.join()
    ms = 1000.0
    return {
        "swaps": swaps, "threads": threads, "errors": len(errors),
        "swap_p50_ms": pct(swap_lat, 50) * ms, "swap_p99_ms": pct(swap_lat, 99) * ms,
        "swap_max_ms": max(swap_lat) * ms,
        "predict_p50_ms_quiet": pct(lat_quiet, 50) * ms,
        "predict_p99_ms_quiet": pct(lat_quiet, 99) * ms,
        "predict_p50_ms_swapping": pct(lat_swap, 50) * ms,
        "predict_p99_ms_swapping": pct(lat_swap, 99) * ms,
        "predictions": len(lat_quiet) + len(lat_swap),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--swaps", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=4)
    args = ap.parse_args()
    print(json.dumps(run(args.swaps, args.threads), indent=1))


if __name__ == "__main__":
    main()
