"""ORT-QDQ against AIMET on the real-model corpus, compiled for the QNN HTP:

    python -m bench.compile.quantizers [--models a,b] [--schemes w8a8,w8a16]
        [--backends ort,aimet,aimet-seqmse,aimet-adaround] [--aimet-python PATH]
        [--json out.json]

For each model × scheme × backend the QNN compiler (server/compile/compilers/qnn.py, the one a
worker runs, SM8650 / v75, HTP emulated by onnxruntime-qnn) builds the EPContext artifact with
that backend's QDQ graph; the artifact runs on the HTP backend and is compared with the FP32
ONNX on the onnxruntime CPU provider on the model's reference inputs (worst output, worst
sample): cosine, SNR, max abs. "quantize s" is the backend's own time (for AIMET it includes
starting its interpreter, torch and all), "compile s" the rest of the QNN compile. The
baseline is `ort` (onnxruntime's QNN QDQ flow, the default); "wins" names the backend with
the best SNR per model and scheme. The corpus's reference inputs are also its calibration
inputs (the only real data it has), as in bench/compile/corpus.py. AIMET needs its own venv
(`--aimet-python`, default $MODELFLEET_AIMET_PYTHON); without it the AIMET rows are skipped
with the reason.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform as host
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCHEMES = ("w8a8", "w8a16")
BACKENDS = ("ort", "aimet", "aimet-seqmse", "aimet-adaround")


class Timed:
    """A `Quantizer` that records how long the wrapped one took."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.seconds = inner, inner.name, 0.0

    def unavailable(self) -> str:
        return str(self.inner.unavailable())

    def quantize(self, src: Path, out: Path, calibration: Any, scheme: Any) -> Path:
        started = time.monotonic()
        try:
            return Path(self.inner.quantize(src, out, calibration, scheme))
        finally:
            self.seconds = time.monotonic() - started


def figures(expected: list[list[Any]], got: list[list[Any]]) -> dict[str, float]:
    """Worst cosine / SNR / max abs over the outputs and samples."""
    import numpy as np

    from server.compile.gates.metrics import cosine, snr_db

    cos, snr, mx = 1.0, math.inf, 0.0
    for exp_outs, got_outs in zip(expected, got, strict=True):
        for e, g in zip(exp_outs, got_outs, strict=True):
            e64, g64 = np.asarray(e, np.float64), np.asarray(g, np.float64)
            cos, snr = min(cos, cosine(e64, g64)), min(snr, snr_db(e64, g64))
            mx = max(mx, float(np.max(np.abs(e64 - g64))) if e64.size else 0.0)
    return {"cosine": cos, "snr_db": snr, "max_abs": mx}


def run_cell(model: Any, fp32: Path, scheme: str, backend: Any, workdir: Path
             ) -> dict[str, Any]:
    from server.compile import CompileRequest
    from server.compile.compilers.qnn import QnnCompiler
    from server.compile.settings_map import pipeline_settings
    from server.compile.source import load_samples, run_onnx_cpu

    cell: dict[str, Any] = {"model": model.name, "scheme": scheme, "backend": backend.name}
    why = backend.unavailable()
    if why:
        return {**cell, "state": "skipped", "error": why}
    workdir.mkdir(parents=True)
    flat = {**model.platforms["qnn"], "precision": scheme, "quantizer": backend.name}
    request = CompileRequest(fp32, model.fmt, model.inputs, onnx_path=fp32,
                             settings=pipeline_settings("qnn", flat),
                             calibration_path=model.reference, reference_path=model.reference)
    timed = Timed(backend)
    compiler = QnnCompiler({backend.name: timed})
    started = time.monotonic()
    try:
        (artifact,) = compiler.compile(request, workdir)
    except Exception as e:  # a failed cell keeps its reason
        return {**cell, "state": "failed", "error": f"{type(e).__name__}: {str(e)[:300]}",
                "quantize_s": round(timed.seconds, 1)}
    total = time.monotonic() - started
    feeds = load_samples(model.reference, model.inputs)
    got = compiler.run(artifact, feeds)
    return {**cell, "state": "ok", **figures(run_onnx_cpu(fp32, feeds), got),
            "quantize_s": round(timed.seconds, 1), "compile_s": round(total - timed.seconds, 1),
            "aimet_s": _aimet_seconds(workdir), "bytes": artifact.path.stat().st_size}


def _aimet_seconds(workdir: Path) -> float | None:
    """AIMET's own time inside its worker (without starting the interpreter and torch)."""
    try:
        doc = json.loads((workdir / "model.qdq.aimet" / "result.json").read_text())
    except (OSError, ValueError):
        return None
    return round(float(doc["seconds"]), 1) if "seconds" in doc else None


def winners(cells: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """Per (model, scheme): the backend with the highest worst-case SNR among those that
    compiled (ties: the faster one)."""
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for c in cells:
        if c["state"] != "ok":
            continue
        key = (c["model"], c["scheme"])
        rank = (c["snr_db"], -(c["quantize_s"] + c["compile_s"]))
        if key not in best or rank > (best[key]["snr_db"],
                                      -(best[key]["quantize_s"] + best[key]["compile_s"])):
            best[key] = c
    return {k: v["backend"] for k, v in best.items()}


def table(cells: list[dict[str, Any]]) -> str:
    wins = winners(cells)
    rows = ["| model | scheme | backend | cosine | SNR dB | max abs | quantize s (AIMET's own) |"
            " compile s | wins |", "|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        head = f"| {c['model']} | {c['scheme']} | {c['backend']} |"
        if c["state"] != "ok":
            rows.append(f"{head} {c['state']}: {c.get('error', '')[:160]} | | | | | |")
            continue
        win = "**yes**" if wins.get((c["model"], c["scheme"])) == c["backend"] else ""
        own = f" ({c['aimet_s']})" if c.get("aimet_s") is not None else ""
        rows.append(f"{head} {c['cosine']:.6f} | {c['snr_db']:.2f} | {c['max_abs']:.4g} | "
                    f"{c['quantize_s']}{own} | {c['compile_s']} | {win} |")
    return "\n".join(rows)


def backends(names: list[str], aimet_python: str, adaround_iterations: int) -> list[Any]:
    from server.compile.quantizers.aimet import AimetQuantizer
    from server.compile.quantizers.registry import default_quantizers

    known = {**default_quantizers(aimet_python),
             "aimet-adaround": AimetQuantizer(aimet_python, "adaround",
                                              adaround_iterations=adaround_iterations)}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown backend(s) {unknown}; known: {sorted(known)}")
    return [known[n] for n in names]


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench.common import load_note
    from server.compile.source import export_onnx
    from tests.corpus.models import corpus

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mobilenetv3-dynamo,unet-dynamo,detector-torchscript",
                    help="comma-separated corpus model names")
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--aimet-python", default=os.environ.get("MODELFLEET_AIMET_PYTHON", ""),
                    help="the AIMET venv's python (default $MODELFLEET_AIMET_PYTHON)")
    ap.add_argument("--adaround-iterations", type=int, default=500,
                    help="AdaRound optimization steps per layer (the server's default: 500)")
    ap.add_argument("--json", type=Path, help="also write the cells as JSON here")
    args = ap.parse_args(argv)
    chosen = backends([b for b in args.backends.split(",") if b], args.aimet_python,
                      args.adaround_iterations)
    schemes = [s for s in args.schemes.split(",") if s]
    cells = []
    started = load_note()
    with tempfile.TemporaryDirectory(prefix="quantizers-bench-") as tmp:
        for model in corpus(args.models.split(",")):
            fp32 = export_onnx(model.path, model.fmt, model.inputs,
                               Path(tmp) / f"{model.name}.fp32.onnx")
            for scheme in schemes:
                for backend in chosen:
                    cell = run_cell(model, fp32, scheme, backend,
                                    Path(tmp) / model.name / scheme / backend.name)
                    cells.append(cell)
                    print(json.dumps(cell), file=sys.stderr, flush=True)
                    if args.json:
                        args.json.write_text(json.dumps(cells, indent=1))
    print(f"QNN quantizers on the corpus, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M}"
          f" UTC, {host.machine()}, Python {host.python_version()}; {started} at the start, "
          f"{load_note()} at the end; baseline: ort\n")
    print(table(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
