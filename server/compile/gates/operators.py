"""Operator gate: rejects operators an accelerator cannot run and any dynamic shape.

Field experience: an unsupported operator does not fail loudly on device, the runtime silently
falls back to the CPU. So the gate walks every node, including nested subgraphs (ONNX If/Loop
bodies, Core ML `blocks`), and names each offender with where it sits. Lists are per platform
and can be extended per version (`settings["operator_gate"]["deny"]` / `["allow"]`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Operators rejected everywhere: data-dependent control flow and detection post-processing
# that no mobile accelerator runs, plus deformable convolution (CPU-only on every runtime).
COMMON_ONNX_DENY = frozenset({
    "NonMaxSuppression", "Loop", "If", "Scan", "DeformConv", "RoiAlign", "NonZero",
    "Unique", "SequenceConstruct", "SequenceAt", "SequenceInsert", "SplitToSequence",
    "ConcatFromSequence", "Optional", "OptionalGetElement", "OptionalHasElement",
})
COMMON_MIL_DENY = frozenset({
    "non_maximum_suppression", "cond", "while_loop", "make_list", "list_read", "list_write",
    "list_gather", "list_scatter", "list_length", "non_zero",
})

# Per platform; the ONNX list also applies to the graph every platform is compiled from.
DEFAULT_DENY: dict[str, dict[str, frozenset[str]]] = {
    "onnx": {"onnx": COMMON_ONNX_DENY},
    # Core ML's ONNX → MIL conversion inlines an If whose condition folds at the declared
    # shapes and refuses any other naming the node (server/compile/onnx_mil/convert.py).
    "coreml": {"onnx": COMMON_ONNX_DENY - {"If"}, "mil": COMMON_MIL_DENY},
    # Einsum: the matrix-product forms are rewritten for the HTP (qnn_einsum.py), the rest
    # are named by the HTP probe.
    "qnn": {"onnx": COMMON_ONNX_DENY | {"GridSample"}},
    "qnn-hub": {"onnx": COMMON_ONNX_DENY | {"GridSample", "Einsum"}},
}


@dataclass(frozen=True)
class Finding:
    kind: str  # "operator" | "dynamic_shape"
    name: str  # operator type, or the input / tensor name
    where: str  # node name / path into nested blocks
    detail: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.name, "where": self.where, "detail": self.detail}


@dataclass
class OperatorGateReport:
    platform: str
    graph: str  # "onnx" | "mil"
    passed: bool
    findings: list[Finding] = field(default_factory=list)
    operators_seen: dict[str, int] = field(default_factory=dict)
    advice: str = ""

    def summary(self) -> str:
        if self.passed:
            return f"{self.graph} operator gate passed ({sum(self.operators_seen.values())} ops)"
        parts = [f"{f.kind} {f.name} at {f.where}" + (f" ({f.detail})" if f.detail else "")
                 for f in self.findings[:10]]
        return f"{self.graph} operator gate rejected: " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"gate": "operators", "graph": self.graph, "passed": self.passed,
                "summary": self.summary(), "advice": self.advice,
                "findings": [f.to_dict() for f in self.findings],
                "operators": dict(sorted(self.operators_seen.items()))}


def deny_list(platform: str, graph: str, settings: dict[str, Any] | None = None) -> frozenset[str]:
    """The platform's default list for a graph kind, adjusted by per-version settings."""
    base = set(DEFAULT_DENY.get(platform, DEFAULT_DENY["onnx"]).get(graph, frozenset()))
    gate = (settings or {}).get("operator_gate", {})
    base |= set(gate.get("deny", []))
    base -= set(gate.get("allow", []))
    return frozenset(base)


# ---- ONNX -------------------------------------------------------------------------------


def _dims_dynamic(type_proto: Any) -> list[str]:
    """Names of non-static dims in a tensor type ('' when the type has no shape at all)."""
    if not type_proto.HasField("tensor_type"):
        return []
    tt = type_proto.tensor_type
    if not tt.HasField("shape"):
        return ["<unknown rank>"]
    out = []
    for i, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value") and d.dim_value > 0:
            continue
        out.append(d.dim_param or f"dim {i}")
    return out


def _walk_onnx(graph: Any, path: str) -> Iterator[tuple[Any, str]]:
    for i, node in enumerate(graph.node):
        where = f"{path}/{node.name or node.op_type + str(i)}"
        yield node, where
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _walk_onnx(attr.g, f"{where}.{attr.name}")
            for j, g in enumerate(attr.graphs):
                yield from _walk_onnx(g, f"{where}.{attr.name}[{j}]")


def check_onnx(model_or_path: Any, platform: str, deny: Iterable[str]) -> OperatorGateReport:
    """Walks an ONNX model (all subgraphs) for denied operators and dynamic shapes."""
    import onnx

    model = onnx.load(str(model_or_path)) if isinstance(model_or_path, (str, Path)) \
        else model_or_path
    denied = set(deny)
    report = OperatorGateReport(platform=platform, graph="onnx", passed=True)
    init_names = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in init_names:
            continue
        for dim in _dims_dynamic(vi.type):
            report.findings.append(Finding("dynamic_shape", vi.name, "graph input",
                                           f"dimension {dim!r} is not static"))
            report.advice = ("fix every input dimension before upload (e.g. python -m "
                             "onnxruntime.tools.make_dynamic_shape_fixed), or upload a torch "
                             "model and declare one shape variant per size")
    producers: dict[str, tuple[str, str]] = {}
    for node, where in _walk_onnx(model.graph, "graph"):
        op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}:{node.op_type}"
        report.operators_seen[op] = report.operators_seen.get(op, 0) + 1
        if node.op_type in denied or op in denied:
            report.findings.append(Finding("operator", op, where))
        for out in node.output:
            producers[out] = (op, where)
    if any(f.kind == "operator" for f in report.findings):
        report.advice = (f"{platform} cannot run these operators on its accelerator (they would "
                         "silently fall back to CPU); move them out of the model (e.g. do NMS "
                         "or control flow in app code) or allow them per version")
    if not any(f.kind == "dynamic_shape" for f in report.findings):
        # Static inputs can still yield data-dependent shapes (e.g. NonZero); infer and look.
        try:
            inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except Exception:  # inference is best effort; ops it cannot type are caught above
            inferred = model
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            dims = _dims_dynamic(vi.type)
            if dims and dims != ["<unknown rank>"]:
                op, where = producers.get(vi.name, ("?", "graph"))
                report.findings.append(Finding("dynamic_shape", vi.name, where,
                                               f"output of {op} has dynamic dims {dims}"))
    report.passed = not report.findings
    return report


# ---- Core ML (.mlpackage / ML Program spec) ----------------------------------------------


def _walk_mil_block(block: Any, path: str) -> Iterator[tuple[Any, str]]:
    for i, op in enumerate(block.operations):
        name = next(iter(o.name for o in op.outputs), f"{op.type}{i}")
        where = f"{path}/{name}"
        yield op, where
        for j, sub in enumerate(op.blocks):
            yield from _walk_mil_block(sub, f"{where}.block[{j}]")


def check_mlpackage(path: Path, platform: str, deny: Iterable[str]) -> OperatorGateReport:
    """Walks a Core ML ML Program spec (every function and nested block) for denied ops and
    for inputs declared with shape ranges or enumerated shapes."""
    import coremltools as ct

    spec = ct.utils.load_spec(str(path))
    return check_mil_spec(spec, platform, deny)


def check_mil_spec(spec: Any, platform: str, deny: Iterable[str]) -> OperatorGateReport:
    denied = set(deny)
    report = OperatorGateReport(platform=platform, graph="mil", passed=True)
    for inp in spec.description.input:
        kind = inp.type.WhichOneof("Type")
        if kind == "multiArrayType":
            arr = inp.type.multiArrayType
            flex = arr.WhichOneof("ShapeFlexibility")
            if flex is not None or not list(arr.shape):
                report.findings.append(Finding("dynamic_shape", inp.name, "model input",
                                               f"declared with {flex or 'no fixed shape'}"))
    if spec.WhichOneof("Type") != "mlProgram":
        report.findings.append(Finding("operator", spec.WhichOneof("Type") or "?", "model",
                                       "not an ML Program; convert with convert_to='mlprogram'"))
    for fname, fn in spec.mlProgram.functions.items():
        for spec_name, block in fn.block_specializations.items():
            for op, where in _walk_mil_block(block, f"{fname}[{spec_name}]"):
                report.operators_seen[op.type] = report.operators_seen.get(op.type, 0) + 1
                if op.type in denied:
                    report.findings.append(Finding("operator", op.type, where))
    if report.findings:
        report.advice = ("the Neural Engine cannot run these; remove them from the exported "
                         "graph (e.g. run NMS or control flow in app code) and re-upload")
    report.passed = not report.findings
    return report
