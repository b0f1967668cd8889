"""Switching input-shape variants on the device without reloading (issue 11).

One dynamic ONNX model (paddle2onnx-style dims, Resize/Reshape shape arithmetic) is
specialized by the server's `server/compile/shapes.py` to three resolutions; the three static
artifacts are staged as one bundle (primary + `shape:<variant>` members, as the updater does
with `all_shape_variants`) and loaded once by `ModelRuntime`. Measured per call:

- predict on one variant (steady state);
- predict switching variant on every call (`shape_variant=` rotates 360p → 720p → 1080p);
- the switch itself: `LoadedModel.run` dispatch with a variant lookup, timed around a no-op
  backend (what switching costs beyond the inference);
- the alternative without variant bundles: load the other variant's session (`prepare`).

    python -m bench.sdk.bench_variant_switch [--calls 300] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from client_sdk import ModelRuntime
from client_sdk.install import SHAPE_ROLE_PREFIX, BundleStore, Member
from client_sdk.loaded import LoadedModel
from server.compile import InputSpec
from server.compile.shapes import specialize_file
from tests.compile.compile_models import dynamic_upsampler_onnx

RESOLUTIONS = {"360p": (1, 3, 36, 64), "720p": (1, 3, 72, 128), "1080p": (1, 3, 108, 192)}


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def _stage(tmp: Path) -> Any:
    dynamic = dynamic_upsampler_onnx(tmp / "dynamic.onnx")
    staged = []
    for i, (name, shape) in enumerate(RESOLUTIONS.items()):
        out = tmp / f"{name}.onnx"
        specialize_file(dynamic, (InputSpec("x", shape),), out)
        data = out.read_bytes()
        role = "primary" if i == 0 else f"{SHAPE_ROLE_PREFIX}{name}"
        staged.append((Member(role, "onnx", "onnx", f"{name}-fp32",
                              f"{role.replace(':', '-')}.onnx",
                              hashlib.sha256(data).hexdigest(), len(data),
                              target={"shape_variant": name}), out))
    return BundleStore(tmp / "device").stage("upsampler", "1.0.0", staged)


class _Null:
    """A backend that returns at once: isolates the runtime's own switching cost."""

    name = "null"

    def run(self, inputs: Any) -> dict[str, Any]:
        return {}


def run(calls: int) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(0)
    feeds = {n: {"x": rng.standard_normal(s).astype(np.float32)} for n, s in RESOLUTIONS.items()}
    names = list(RESOLUTIONS)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        bundle = _stage(tmp)
        rt = ModelRuntime(tmp / "device")
        rt.swap(rt.prepare(bundle))
        for n in names:  # warm every session once
            rt.predict("upsampler", feeds[n], shape_variant=n)
        steady, switching, lookup, reload = [], [], [], []
        for i in range(calls):
            t = time.perf_counter()
            rt.predict("upsampler", feeds["720p"], shape_variant="720p")
            steady.append((time.perf_counter() - t) * 1e3)
            n = names[i % 3]
            t = time.perf_counter()
            p = rt.predict("upsampler", feeds[n], shape_variant=n)
            switching.append((time.perf_counter() - t) * 1e3)
            assert p.shape_variant == n
        null = LoadedModel(bundle, _Null(), None, threshold=3, on_event=None,
                           shapes={n: _Null() for n in names[1:]})
        for i in range(calls * 10):
            t = time.perf_counter()
            null.run({}, names[i % 3])
            lookup.append((time.perf_counter() - t) * 1e3)
        for _ in range(max(calls // 20, 5)):
            t = time.perf_counter()
            rt.prepare(bundle)
            reload.append((time.perf_counter() - t) * 1e3 / len(names))
    rows = {"predict, one variant (steady)": steady,
            "predict, switching variant every call": switching,
            "switch dispatch alone (no-op backend)": lookup,
            "reload instead (load one variant's session)": reload}
    return {k: {"median_ms": statistics.median(v), "p99_ms": pct(v, 99), "n": len(v)}
            for k, v in rows.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = run(args.calls)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    shapes = ", ".join(f"{n} {s[2]}×{s[3]}" for n, s in RESOLUTIONS.items())
    print(f"variants: {shapes} (one bundle, loaded once)\n")
    print("| measure | median ms | p99 ms | n |")
    print("|---|---:|---:|---:|")
    for k, v in result.items():
        print(f"| {k} | {v['median_ms']:.4f} | {v['p99_ms']:.4f} | {v['n']} |")


if __name__ == "__main__":
    main()
