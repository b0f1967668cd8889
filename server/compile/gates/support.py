"""Support gate: before compiling, the nodes a target will not take, from the compilers' own
support data — so the gate and the compile agree by construction.

- coreml (ONNX uploads): the ONNX → MIL conversion the compile runs (server/compile/onnx_mil),
  at the declared shapes; when it fails, the node it stopped at and every other node no rule
  claims. Torch uploads go to coremltools directly and are not judged here.
- qnn: the HTP split onnxruntime-qnn makes (`htp_support.probe`) after the same rewrites the
  compile applies (`htp_plan.plan_htp`), judged by the same `min_htp_share` policy, for
  every target SoC. INT8 builds compile a quantized copy of this graph; the probe judges the
  float graph at FP16.

Findings: `{"kind": "unsupported", "name": op type, "where": node name, "detail": why}`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from server.compile.gates.operators import Finding, OperatorGateReport
from server.compile.quiet import quiet
from server.compile.types import CompileRequest, SourceFormat

PLATFORMS = ("coreml", "qnn")


def _coreml(request: CompileRequest, report: OperatorGateReport) -> None:
    import coremltools as ct
    import onnx

    from server.compile.compilers.base import settings_for
    from server.compile.errors import ConversionError
    from server.compile.onnx_mil import convert_model, unsupported_nodes

    if request.source_format is not SourceFormat.ONNX:
        report.advice = "torch upload: converted by coremltools directly (not judged here)"
        return
    model = onnx.load(str(request.onnx_path or request.source_path))
    target = getattr(ct.target, str(settings_for(request, "coreml").get(
        "minimum_deployment_target", "iOS17")), ct.target.iOS17)
    try:
        with quiet():
            convert_model(model, {s.name: s.shape for s in request.inputs}, target)
    except ConversionError as e:
        seen = set()
        # The node the conversion stopped at, then every other node no rule claims, so the
        # uploader learns all of them at once.
        for n in [*e.nodes, *unsupported_nodes(model)]:
            if (n["node"], n["op"]) not in seen:
                seen.add((n["node"], n["op"]))
                report.findings.append(Finding("unsupported", n["op"], n["node"], n["why"]))
        if not report.findings:
            report.findings.append(Finding("unsupported", "", "", str(e)))
        report.advice = ("the ONNX → MIL conversion for Core ML cannot convert these nodes: "
                         "re-export the model so that they use operators the Core ML "
                         "converter supports (docs/compile.md lists them), or exclude the "
                         "coreml platform for this model")


def _qnn(request: CompileRequest, report: OperatorGateReport) -> None:
    from server.compile.compilers.base import settings_for
    from server.compile.compilers.qnn import min_htp_share, targets_of
    from server.compile.htp_plan import plan_htp

    opts = settings_for(request, "qnn")
    min_share = min_htp_share(opts.get("min_htp_share"))
    shares = []
    source = request.onnx_path or request.source_path
    with tempfile.TemporaryDirectory(prefix="htp-gate-") as tmp:
        for t in targets_of(opts):
            provider = {"soc_model": t["soc_model"], "htp_arch": t["htp_arch"],
                        "enable_htp_fp16_precision": "1"}
            assignment, _ = plan_htp(source, provider, None, Path(tmp), t.get("name", "soc"))
            accepted = min_share is not None and assignment.node_share >= min_share
            for n in assignment.cpu_nodes:
                if not accepted:
                    report.findings.append(Finding("unsupported", n.op, n.name,
                                                   f"{t.get('name', '')}: {n.why}"))
            shares.append(f"{t.get('name', 'soc')}: {100 * assignment.node_share:.1f}% of nodes, "
                          f"{100 * assignment.mac_share:.1f}% of MACs on the HTP")
    report.advice = "; ".join(shares)
    if report.findings:
        report.advice += (". These nodes would run on the CPU, not the HTP: replace those "
                          "operators in the exported graph, or accept a partial offload with "
                          "the qnn setting min_htp_share (e.g. 0.95)")


def check_support(request: CompileRequest, platform: str) -> OperatorGateReport | None:
    """The support gate for `platform`, or None when the platform has no support data."""
    if platform not in PLATFORMS:
        return None
    report = OperatorGateReport(platform=platform, graph="support", passed=True)
    if platform == "coreml":
        _coreml(request, report)
    else:
        _qnn(request, report)
    report.passed = not report.findings
    return report
