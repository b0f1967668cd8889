"""Compile time per target for a ~20M-parameter conv net (1×3×224×224), one command:

    python bench/compile/bench_compile.py [--markdown] [--pipeline]

Builds a random-weight model, saves it as a torch ExportedProgram, then times each target
through the same compilers the workers use (each on its own, in this process): ONNX export,
Core ML FP16 and FP16 + int8 weights, QNN HTP FP16 and INT8 (w8a16, 8 calibration samples),
each for one SoC. Calibration inputs here are random: this measures time, not accuracy.
Prints a table (seconds, artifact size) with the date and machine.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np


def make_model():  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    def block(cin: int, cout: int, stride: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.Conv2d(cout, cout, 3, 1, 1), nn.BatchNorm2d(cout), nn.ReLU())

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            widths = [32, 64, 128, 256, 512, 1024]
            layers: list[nn.Module] = [nn.Conv2d(3, widths[0], 3, 2, 1), nn.ReLU()]
            for a, b in itertools.pairwise(widths):
                layers.append(block(a, b, 2))
            self.body = nn.Sequential(*layers)
            self.head = nn.Linear(widths[-1], 1000)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.body(x).mean(dim=(2, 3)))

    torch.manual_seed(0)
    return Net().eval()


def main() -> None:
    import torch

    from server.compile import CompileRequest, InputSpec, SourceFormat
    from server.compile.compilers.coreml import CoreMLCompiler
    from server.compile.compilers.onnx import OnnxCompiler
    from server.compile.compilers.qnn import QnnCompiler
    from server.compile.packing import pack
    from server.compile.source import export_onnx

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--pipeline", action="store_true", help="also time whole builds per "
                        "platform (export, reference run, gates on 4 samples, packing)")
    args = parser.parse_args()

    model = make_model()
    params = sum(p.numel() for p in model.parameters())
    spec = InputSpec("image", (1, 3, 224, 224))
    work = Path(tempfile.mkdtemp(prefix="bench-compile-"))
    pt2 = work / "model.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(*spec.shape),)), str(pt2))
    cal = work / "cal.npz"
    rng = np.random.default_rng(0)
    np.savez(cal, image=rng.standard_normal((8, *spec.shape)).astype(np.float32))

    rows: list[tuple[str, float, int]] = []
    t0 = time.perf_counter()
    onnx_path = export_onnx(pt2, SourceFormat.EXPORTED_PROGRAM, (spec,), work / "source.onnx")
    rows.append(("onnx export (dynamo, single file)", time.perf_counter() - t0,
                 onnx_path.stat().st_size))
    qnn_target = {"targets": [{"name": "SM8650", "soc_model": "57", "htp_arch": "75"}]}
    cases = [
        ("onnx artifact (copy + checks)", OnnxCompiler(), {}, None),
        ("coreml fp16 (.mlpackage)", CoreMLCompiler(), {"coreml": {"precision": "fp16"}}, None),
        ("coreml fp16 + int8 weights", CoreMLCompiler(),
         {"coreml": {"precision": "fp16", "weight_compression": "int8"}}, None),
        ("qnn htp fp16 (SM8650 / v75)", QnnCompiler(), {"qnn": {**qnn_target,
                                                                 "precision": "fp16"}}, None),
        ("qnn htp int8 w8a16 (SM8650 / v75)", QnnCompiler(), {"qnn": qnn_target}, cal),
    ]
    for label, compiler, settings, calibration in cases:
        out = work / label.split(" (")[0].replace(" ", "-").replace("+", "")
        out.mkdir()
        req = CompileRequest(pt2, SourceFormat.EXPORTED_PROGRAM, (spec,), settings=settings,
                             calibration_path=calibration, onnx_path=onnx_path)
        t0 = time.perf_counter()
        (art,) = compiler.compile(req, out)
        packed = pack(art.path, out / "packed")
        rows.append((label, time.perf_counter() - t0, packed.length))

    if args.pipeline:
        from server.compile import BuildSpec, Pipeline

        ref = work / "ref.npz"
        np.savez(ref, image=rng.standard_normal((4, *spec.shape)).astype(np.float32))
        for platform_name in ("onnx", "coreml", "qnn"):
            t0 = time.perf_counter()
            (outcome,) = Pipeline().build(BuildSpec(
                pt2, SourceFormat.EXPORTED_PROGRAM, {"default": (spec,)},
                platforms=(platform_name,), calibration_path=cal if platform_name == "qnn"
                else None, reference_path=ref), work / f"pipeline-{platform_name}")
            gate = outcome.gates.get("numeric", {}).get("status", "?")
            rows.append((f"whole build: {platform_name} {outcome.variant} (numeric {gate})",
                         time.perf_counter() - t0,
                         outcome.artifact.length if outcome.artifact else 0))

    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = (f"{params / 1e6:.1f}M-parameter conv net, input 1×3×224×224, {when}, "
            f"{platform.machine()} {os.cpu_count()} cores (shared), Python "
            f"{platform.python_version()}, torch {torch.__version__}")
    if args.markdown:
        print(head + "\n")
        print("| target | seconds | artifact bytes |\n|---|---:|---:|")
        for label, sec, size in rows:
            print(f"| {label} | {sec:.1f} | {size:,} |")
    else:
        print(head)
        for label, sec, size in rows:
            print(f"{label:<40} {sec:8.1f} s {size:>14,} B")


if __name__ == "__main__":
    main()
