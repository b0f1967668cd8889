"""Compile-sandbox overhead per build, one command:

    python bench/compile/bench_sandbox.py [--runs 3] [--platform onnx] [--markdown]

Builds a small conv net (1×3×32×32) as ONNX, ExportedProgram (.pt2) and TorchScript, then
builds each through the pipeline in-process (what `MODELFLEET_SANDBOX=off` does; after one
warm-up build, as in a long-running server whose imports are cached) and through
`SandboxedPipeline` (a fresh bubblewrap child per build, as in production), `--runs` times
each, and prints the medians. Then times fresh interpreters (`python -c pass`, and importing
torch + onnx + onnxruntime) with and without the sandbox, to separate the sandbox's own cost
(bwrap + setpriv + prlimit) from re-importing the toolchains in a new process.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from server.compile import BuildSpec, InputSpec, Pipeline, SourceFormat
from server.compile.sandbox import (
    JobDirs,
    SandboxedPipeline,
    SandboxPolicy,
    bwrap_command,
    run_child,
)

SPEC = InputSpec("image", (1, 3, 32, 32))


def make_sources(tmp: Path) -> tuple[dict[SourceFormat, Path], Path]:
    import torch
    from torch import nn

    from server.compile.source import export_onnx

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), nn.BatchNorm2d(16), nn.ReLU(),
                        nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                        nn.Flatten(), nn.Linear(32, 10)).eval()
    x = torch.randn(*SPEC.shape)
    pt2, ts = tmp / "net.pt2", tmp / "net.pt"
    torch.export.save(torch.export.export(net, (x,)), str(pt2))
    torch.jit.save(torch.jit.trace(net, (x,)), str(ts))
    onnx_path = export_onnx(pt2, SourceFormat.EXPORTED_PROGRAM, (SPEC,), tmp / "net.onnx")
    ref = tmp / "ref.npz"
    np.savez(ref, image=np.random.default_rng(0).standard_normal((4, *SPEC.shape))
             .astype(np.float32))
    return {SourceFormat.ONNX: onnx_path, SourceFormat.EXPORTED_PROGRAM: pt2,
            SourceFormat.TORCHSCRIPT: ts}, ref


def timed_build(builder: Pipeline | SandboxedPipeline, spec: BuildSpec, work: Path) -> float:
    started = time.perf_counter()
    outcomes = builder.build(spec, work)
    seconds = time.perf_counter() - started
    bad = [o.error for o in outcomes if o.state != "ready"]
    if bad:
        raise SystemExit(f"build failed: {bad}")
    return seconds


IMPORTS = "import torch, torch.onnx, onnx, onnxruntime, onnxscript"


def fresh_process(tmp: Path, runs: int, code: str, sandboxed: bool) -> float:
    """Median seconds of a new interpreter running `code`, in the sandbox or not."""
    times = []
    for i in range(runs):
        argv = [sys.executable, "-s", "-c", code]
        started = time.perf_counter()
        if sandboxed:
            job = JobDirs(tmp / f"fresh-{sandboxed}-{len(code)}-{i}")
            job.create()
            policy = SandboxPolicy()
            run = run_child(bwrap_command(policy, job, program=argv), job, policy,
                            lambda _line: None)
            if run.returncode:
                raise SystemExit(run.failure())
        else:
            subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--platform", default="onnx")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as d:
        tmp = Path(d)
        sources, ref = make_sources(tmp)
        rows = []
        for fmt, path in sources.items():
            spec = BuildSpec(source_path=path, source_format=fmt, variants={"default": (SPEC,)},
                             platforms=(args.platform,), reference_path=ref)
            timed_build(Pipeline(), spec, tmp / f"warm-{fmt.value}")  # imports cached, as in serve
            off = [timed_build(Pipeline(), spec, tmp / f"off-{fmt.value}-{i}")
                   for i in range(args.runs)]
            on = [timed_build(SandboxedPipeline(), spec, tmp / f"on-{fmt.value}-{i}")
                  for i in range(args.runs)]
            rows.append((fmt.value, statistics.median(off), statistics.median(on)))
        fresh = {(what, box): fresh_process(tmp, args.runs, code, box)
                 for what, code in (("python -c pass", "pass"), (IMPORTS, IMPORTS))
                 for box in (False, True)}
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    print(f"sandbox overhead per build ({args.platform}, median of {args.runs}; {stamp}, "
          f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()})")
    head = ("source format", "in-process (s)", "sandboxed (s)", "overhead (s)")
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    else:
        print("  ".join(f"{h:>15}" for h in head))
    for name, off_s, on_s in rows:
        cells = (name, f"{off_s:.2f}", f"{on_s:.2f}", f"{on_s - off_s:+.2f}")
        print(("| " + " | ".join(cells) + " |") if args.markdown
              else "  ".join(f"{c:>15}" for c in cells))
    print()
    for what in ("python -c pass", IMPORTS):
        print(f"{'- ' if args.markdown else ''}fresh process `{what}`: "
              f"{fresh[(what, False)]:.2f} s plain, {fresh[(what, True)]:.2f} s in the sandbox")


if __name__ == "__main__":
    main()
