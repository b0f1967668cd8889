"""The numeric gate of one built artifact, end to end: run it, run the source at its precision,
judge both questions (`numeric.judge`), localize a loss layer by layer (`layers.py`) and word
the failure with advice the user can follow for this platform.

Localization, one sample:
- a faithful-check failure compares the artifact's intermediates with the source at its
  precision, read where `layerdiff.candidate_for` finds them: an ONNX artifact's own, on the
  CPU provider; for a compiler offering `intermediates(artifact)` (QNN: its context binary
  exposes none, so the graph it compiled is compiled again on the same HTP with the tensors
  as outputs), those; a Core ML package's on the MIL executor;
- a precision cost below the seed thresholds (enforced or not) compares the FP32 source with
  the source at the precision: where that precision's loss starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from server.compile.compilers.base import Compiler
from server.compile.gates import emulate, layerdiff, layers, numeric
from server.compile.types import CompiledArtifact, CompileRequest, Precision

# Platforms where the version can ask for a higher precision, and the setting that does it.
HIGHER_PRECISION = {"coreml": "set the coreml setting precision=fp32"}


@dataclass(frozen=True)
class Reference:
    feeds: list[Any]
    outputs: list[Any] | None
    reason: str  # why there are no reference outputs


def _run_yardstick(request: CompileRequest, art: CompiledArtifact, ref: Reference,
                   workdir: Path) -> tuple[Path | None, list[Any] | None, str]:
    assert request.onnx_path is not None
    if art.precision is Precision.FP32:
        return request.onnx_path, ref.outputs, ""
    path, why = emulate.source_at_precision(request.onnx_path, art, workdir)
    if path is None:
        return None, None, why
    try:
        return path, emulate.run(path, ref.feeds), ""
    except Exception as e:  # onnxruntime's CPU provider lacks a kernel at this precision
        return None, None, f"the source at {art.precision.value} cannot run on the CPU: {e}"


def numeric_gate(compiler: Compiler, art: CompiledArtifact, request: CompileRequest,
                 ref: Reference, workdir: Path, *, walk_artifact: bool = True
                 ) -> numeric.NumericGateReport:
    """The gate's report; `walk_artifact=False` leaves out the failing artifact's layer walk
    (the precision search's candidates: a step of the search, not the build's verdict, and
    on the HTP the walk is one more compile of the graph)."""
    if not art.runnable_here:
        return numeric.not_run(art.precision, art.not_runnable_reason)
    # The reference ran the source with every input; the artifact and the specialized graph
    # take only the request's (inputs declared with a value are constants there).
    names = {i.name for i in request.inputs}
    ref = Reference([{k: v for k, v in f.items() if k in names} for f in ref.feeds],
                    ref.outputs, ref.reason)
    if ref.outputs is None:
        return numeric.not_run(art.precision, ref.reason)
    try:
        numeric.thresholds_for(art.precision, request.settings)
        numeric.precision_gate_enforced(request.settings)
    except ValueError as e:
        report = numeric.not_run(art.precision, "")
        report.status, report.reason = "failed", f"invalid numeric gate settings: {e}"
        return report
    try:
        candidate = compiler.run(art, ref.feeds)
    except Exception as e:  # a run that crashes is a failed gate, with the reason
        report = numeric.not_run(art.precision, "")
        report.status, report.reason = "failed", f"could not run the artifact: {e}"
        return report
    yard_path, at_precision, why = _run_yardstick(request, art, ref, workdir)
    try:
        report = numeric.judge(
            ref.outputs, at_precision, candidate, art.precision, request.settings,
            classifier=request.settings.get("task") == "classification",
            runner=str(art.extra.get("numeric_runner", type(compiler).__name__)),
            basis=emulate.describe(art), no_yardstick=why)
    except ValueError as e:  # e.g. the artifact returned another number of outputs
        report = numeric.not_run(art.precision, "")
        report.status, report.reason = "failed", f"artifact outputs unusable: {e}"
        return report
    if yard_path is not None:
        report.layers = _localize(report, compiler, art, request, yard_path, ref.feeds[0],
                                  walk_artifact)
        faithful = report.layers.get("faithful") or {}
        if faithful and layerdiff.on_cpu_provider(art):
            _fused_kernels(faithful, art.path, ref.feeds, candidate, at_precision,
                           numeric.thresholds_for(art.precision, request.settings))
    return report


def _localize(report: numeric.NumericGateReport, compiler: Compiler, art: CompiledArtifact,
              request: CompileRequest, yardstick: Path, feeds: dict[str, Any],
              walk_artifact: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {}
    t = numeric.thresholds_for(art.precision, request.settings)
    label = art.precision.value.upper()
    fp16 = art.precision is Precision.FP16
    assert request.onnx_path is not None
    source = request.onnx_path
    if walk_artifact and report.status == "failed" and \
            not report.reason.startswith("precision cost"):
        try:
            found = layerdiff.candidate_for(compiler, art, feeds)
        except Exception as e:  # a diagnostic: its failure is reported, never fatal
            found, why = None, f"{type(e).__name__}: {str(e)[:300]}"
        else:
            why = f"the {art.target.format} artifact exposes no intermediate tensors"
        if found is not None:
            cand, where, chunk = found
            out["faithful"] = _walk(yardstick, cand, feeds, t.min_cosine, t.min_snr_db,
                                    f"source at {label} vs {where}", fp16, source,
                                    chunk=chunk)
        else:
            out["faithful"] = {"basis": "the artifact", "unavailable": why}
    seed = numeric.SEED_THRESHOLDS.get(art.precision)
    if seed is not None and report.precision_cost.get("status") == "exceeds_seed":
        # A quantized upload's yardstick is its own int8 graph: some of its tensors bear
        # the rewrite's names at another scale.
        out["precision"] = _walk(source, yardstick, feeds, seed.min_cosine,
                                 seed.min_snr_db, f"source FP32 vs source at {label}", fp16,
                                 source, same_op=art.compile_settings.get("quantized") ==
                                 "upload")
    return out


def _walk(reference: Path, candidate: Path | layers.Candidate, feeds: dict[str, Any],
          min_cosine: float, min_snr_db: float, basis: str, fp16: bool, names_from: Path,
          chunk: int = layers.CHUNK, same_op: bool = False) -> dict[str, Any]:
    try:
        loc = layers.first_divergence(reference, candidate, feeds, min_cosine, min_snr_db,
                                      basis, clip=emulate.FP16_MAX if fp16 else None,
                                      chunk=chunk, names_from=names_from, same_op=same_op)
    except Exception as e:  # a diagnostic: its failure is reported, never fatal
        return {"basis": basis, "unavailable": f"{type(e).__name__}: {str(e)[:300]}"}
    return {**loc.to_dict(), "summary": loc.sentence()}


def _fused_kernels(walked: dict[str, Any], artifact: Path, feeds: list[dict[str, Any]],
                   fused: list[list[Any]], yardstick: list[list[Any]] | None,
                   t: numeric.Thresholds) -> None:
    """When every tensor of an ONNX artifact agrees, the walk (which runs onnxruntime with its
    graph optimizations off, so that no fused node hides a tensor) has not seen what the gate
    ran: the artifact as devices run it, fused. Its outputs unfused against fused say whether
    onnxruntime's fused kernels are where the loss is (a QDQ graph's int8 kernels round
    otherwise than its QuantizeLinear / DequantizeLinear arithmetic), and the summary says so
    instead of blaming the outputs."""
    if walked.get("first_below") is not None or "compared" not in walked or not yardstick:
        return
    import onnx

    try:
        session = layers.cpu_session(onnx.load(str(artifact)))
        unfused = [session.run(None, f) for f in feeds]
    except Exception as e:  # a diagnostic: its failure is reported, never fatal
        walked["fused"] = {"unavailable": f"{type(e).__name__}: {str(e)[:300]}"}
        return
    # Every sample, as the gate judged them (the walk looked at the first only).
    def rows(a: list[list[Any]], b: list[list[Any]]) -> list[layers.LayerMetrics]:
        return [layers.layer_metrics(_stacked(a, k), _stacked(b, k), "", "", f"output {k}")
                for k in range(len(a[0]))]

    graph, kernels = rows(yardstick, unfused), rows(unfused, fused)
    below = [m for m in kernels if m.below(t.min_cosine, t.min_snr_db)]
    in_kernels = bool(below) and not any(m.below(t.min_cosine, t.min_snr_db) for m in graph)
    walked["fused"] = {"unfused_vs_yardstick": [m.to_dict() for m in graph],
                       "fused_vs_unfused": [m.to_dict() for m in kernels],
                       "loss_in_fused_kernels": in_kernels}
    if in_kernels:
        m = below[0]
        walked["summary"] = (
            f"{walked['basis']}: all {walked['compared']} intermediate tensors agree with "
            "onnxruntime's graph optimizations off (as the layer walk runs both), and the "
            f"artifact's outputs do too; run fused, as devices run it, its {m.tensor} falls to "
            f"cosine {m.cosine:.6f}, SNR {m.snr_db:.1f} dB against the same graph unfused, so "
            "the loss is in onnxruntime's fused kernels, not in the graph")


def _stacked(samples: list[list[Any]], k: int) -> Any:
    return np.concatenate([np.ravel(np.asarray(s[k], np.float64)) for s in samples])


def where(report: numeric.NumericGateReport, key: str) -> str:
    loc = report.layers.get(key) or {}
    return str(loc.get("summary") or loc.get("unavailable") or "")


def failure_message(report: numeric.NumericGateReport, art: CompiledArtifact,
                    platform: str) -> str:
    """The build error for a failed numeric gate, with what the user can do about it."""
    p = art.precision.value
    if report.reason.startswith(("could not run", "artifact out", "invalid numeric")):
        return f"numeric gate failed: {report.reason}"
    cost = report.precision_cost
    if cost.get("enforced") and cost.get("status") == "exceeds_seed" and all(
            f.startswith("precision cost") for f in report.reason.split("; ")):
        higher = HIGHER_PRECISION.get(platform)
        return (f"numeric gate failed: {p.upper()} itself costs this model more than the seed "
                f"thresholds allow ({cost['reason']}); {where(report, 'precision')}. The "
                f"compiler kept what {p.upper()} allows. "
                + (f"To keep more precision, {higher}; " if higher else
                   f"{platform} has no higher precision than {p.upper()}; ")
                + "to ship at this cost, set precision_gate=off in the version's "
                f"{platform} settings, or change the model where the loss starts.")
    loc = where(report, "faithful")
    costs = cost.get("outputs") or []
    snr = min(float(c["snr_db"]) for c in costs) if costs else 0.0
    itself = "FP16 storage" if art.precision is Precision.FP16 else "the quantization itself"
    kept = (f"The source at {p.upper()} keeps SNR {snr:.1f} dB against FP32, so the loss comes "
            f"from the compile or the target's own {p.upper()} arithmetic, not from "
            f"{itself}. " if costs else "")
    floor = float((report.thresholds or {}).get("min_snr_db", 0.0))
    if costs and (not math.isfinite(snr) or (cost.get("status") == "exceeds_seed"
                                             and snr < floor)):
        # The yardstick itself is broken (overflow to infinity, NaN, or less signal left than
        # the artifact is held to: Magika's LayerNorm at FP16 kept -0.2 dB), so comparing
        # the artifact with it says nothing about the compile.
        kept = (f"The source at {p.upper()} itself loses this model (SNR {snr:.1f} dB against "
                f"FP32" + ("" if math.isfinite(snr) else f": {itself} overflows or underflows")
                + (f"; {where(report, 'precision')}" if where(report, "precision") else "")
                + "), so this is the precision's loss, not the compile's"
                + (_against_fp32(report) if math.isfinite(snr) else "") + ". ")
    higher = HIGHER_PRECISION.get(platform)
    # An SNR of -inf (an infinity or NaN on either side) fails every threshold: lowering
    # min_snr_db is advice that cannot be followed there.
    hopeless = any(m.get("snr_db") == "-inf" for m in report.outputs)  # NaN too (_num)
    accept = (f", or accept the difference by lowering min_cosine / min_snr_db in the "
              f"version's {platform} settings" if not hopeless else
              " (no threshold accepts it: the outputs compared hold an infinity or NaN"
              + _against_fp32(report) + ")")
    return (f"numeric gate failed: the {platform} artifact departs from "
            f"{report.basis or 'the source'} more than {p.upper()} allows ({report.reason})"
            + (f"; {loc}" if loc else "") + ". " + kept
            + (f"To keep more precision, {higher}; or " if higher else "Options: ")
            + "change the model where the loss starts, exclude the "
            f"{platform} platform for this model{accept}.")


def _against_fp32(report: numeric.NumericGateReport) -> str:
    """The artifact's worst output against the FP32 source, e.g. when the yardstick broke."""
    rows = [(float(m["cosine"]), float(m["snr_db"])) for m in report.vs_fp32]
    if not rows:
        return ""
    cos, snr = min(r[0] for r in rows), min(r[1] for r in rows)
    return f"; the artifact itself scores cosine {cos:.6f}, SNR {snr:.1f} dB against FP32"


def log_lines(report: numeric.NumericGateReport) -> list[str]:
    """The precision cost and any localization, for the build log."""
    lines = []
    cost = report.precision_cost
    for row in cost.get("outputs") or []:
        lines.append(f"precision cost, output {row['output']} (source at "
                     f"{report.precision} vs FP32): cosine {row['cosine']}, SNR "
                     f"{row['snr_db']} dB, max abs diff {row['max_abs_diff']}")
    lines += [f"layers: {where(report, key)}" for key in ("faithful", "precision")
              if where(report, key)]
    return lines + report.notes
