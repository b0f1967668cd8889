"""The source run at an artifact's precision, on onnxruntime's CPU provider: the yardstick that
tells a compiler's loss from the precision's own.

- FP32: the FP32 source graph itself.
- FP16: FP16 storage with FP32 arithmetic: the FP32 ONNX with its float weights rounded to
  FP16 values and every float graph input and node output cast to FP16 and back, run on the
  CPU provider. (onnxruntime's float16 converter is not used: for consecutive nodes without
  an FP16 CPU kernel onnxruntime drops the casts between them, so those tensors stay FP32 —
  measured: `(x + 2048) - 2048` came out exact, where FP16 keeps x in steps of 2.) Nodes
  with a float constant FP16 cannot hold (|value| > 65504, e.g. a BatchNormalization's running
  variance of 1e7 in PP-OCR's detector) stay FP32: every NPU compiler folds such a node
  into its neighbour's weights first (Core ML's and QNN's conv+batchnorm fusion), so rounding
  the constant to FP16 would emulate a loss no device has.
- FP16 with precision islands (a QNN artifact whose `extra["fp32_nodes"]` run at FP32 on the
  device's CPU EP, server/compile/qnn_islands.py): the same, except that those nodes' outputs
  are not rounded and the constants only they read keep their FP32 values.
- INT8: the QDQ-quantized graph the compiler made with the version's calibration inputs
  (`CompiledArtifact.extra["qdq_model"]`); without one there is no INT8 yardstick.

`source_at_precision` returns the ONNX file, or None with the reason it cannot be made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from server.compile.types import CompiledArtifact, Precision

FP16_MAX = 65504.0


def _out_of_fp16_range(model: Any) -> list[str]:
    """Names of the nodes that read a float constant outside FP16's finite range."""
    from onnx import TensorProto, numpy_helper

    wide = {t.name for t in model.graph.initializer if t.data_type == TensorProto.FLOAT
            and t.dims and _wide(numpy_helper.to_array(t))}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value" and a.t.data_type == TensorProto.FLOAT \
                        and _wide(numpy_helper.to_array(a.t)):
                    wide.add(node.output[0])
    return [n.name for n in model.graph.node if n.name and any(i in wide for i in n.input)]


def _wide(values: Any) -> bool:
    finite = values[np.isfinite(values)]
    return bool(finite.size) and float(np.max(np.abs(finite))) > FP16_MAX


def to_fp16(src: Path, out: Path, fp32_nodes: tuple[str, ...] = ()) -> Path:
    """Writes the FP16 yardstick of the FP32 ONNX `src` to `out`: float weights rounded to FP16
    values, and a Cast to FP16 and back after every float graph input and node output, except
    the outputs and the constants read only by `fp32_nodes` (precision islands)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(src))
    wide_nodes = set(_out_of_fp16_range(model))
    wide = {i for n in model.graph.node if n.name in wide_nodes for i in n.input}
    keep = wide_nodes | set(fp32_nodes)
    # an island's constant that an FP16 node reads too is rounded: that node reads it at FP16
    wide |= {i for n in model.graph.node if n.name in fp32_nodes for i in n.input} - {
        i for n in model.graph.node if n.name not in keep for i in n.input}
    for t in model.graph.initializer:
        if t.data_type == TensorProto.FLOAT and t.name not in wide:
            t.CopyFrom(numpy_helper.from_array(_round(numpy_helper.to_array(t)), t.name))
    inferred = onnx.shape_inference.infer_shapes(model)
    floats = {vi.name for vi in [*inferred.graph.value_info, *inferred.graph.output,
                                 *inferred.graph.input]
              if vi.type.tensor_type.elem_type == TensorProto.FLOAT}
    nodes: list[Any] = []

    def round_trip(name: str, stored: str) -> None:
        half = f"{stored}__fp16"
        nodes.append(helper.make_node("Cast", [stored], [half], to=TensorProto.FLOAT16,
                                      name=f"{half}__cast"))
        nodes.append(helper.make_node("Cast", [half], [name], to=TensorProto.FLOAT,
                                      name=f"{name}__cast32"))

    # a graph input read only by islands reaches the CPU EP at FP32, unrounded
    island_only = {i for n in model.graph.node if n.name in fp32_nodes for i in n.input} - {
        i for n in model.graph.node if n.name not in fp32_nodes for i in n.input}
    inputs = {i.name: f"{i.name}__rounded" for i in model.graph.input
              if i.name in floats and i.name not in island_only}
    for name, rounded in inputs.items():
        round_trip(rounded, name)
    for node in model.graph.node:
        for k, name in enumerate(node.input):
            if name in inputs:
                node.input[k] = inputs[name]
        if node.op_type == "Constant" or node.name in keep:
            nodes.append(node)
            continue
        outs = [o for o in node.output if o in floats]
        for k, name in enumerate(node.output):
            if name in outs:
                node.output[k] = f"{name}__fp32"
        nodes.append(node)
        for name in outs:
            round_trip(name, f"{name}__fp32")
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(out))
    return out


def _round(values: Any) -> Any:
    """FP16 values of `values`, finite ones saturated at ±65504 (as the HTP and Core ML do)."""
    sat = np.where(np.isfinite(values), np.clip(values, -FP16_MAX, FP16_MAX), values)
    return sat.astype(np.float16).astype(np.float32)


def source_at_precision(onnx_path: Path, art: CompiledArtifact, workdir: Path
                        ) -> tuple[Path | None, str]:
    """(ONNX file emulating the source at `art.precision`, "") or (None, why not)."""
    if art.precision is Precision.FP32:
        return onnx_path, ""
    if art.precision is Precision.FP16:
        islands = tuple(str(n) for n in art.extra.get("fp32_nodes") or ())
        tag = f"-fp32x{len(islands)}-{_digest(islands)}" if islands else ""
        out = workdir / f"{onnx_path.stem}.fp16{tag}.onnx"
        if not out.is_file():
            try:
                to_fp16(onnx_path, out, islands)
            except Exception as e:  # the yardstick is a diagnostic, never a crash
                return None, f"the FP16 converter failed on the source: {type(e).__name__}: {e}"
        return out, ""
    qdq = art.extra.get("qdq_model")
    if qdq and Path(str(qdq)).is_file():
        return Path(str(qdq)), ""
    return None, ("no INT8 emulation of the source for this artifact (the compiler quantized "
                  "inside its own toolchain)")


def _digest(names: tuple[str, ...]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:12]


def run(path: Path, feeds: list[dict[str, Any]]) -> list[list[Any]]:
    """The yardstick's outputs per sample, with onnxruntime's graph optimizations off (a
    fusion could drop the rounding casts)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    return [[np.asarray(o) for o in sess.run(None, f)] for f in feeds]


def describe(art: CompiledArtifact) -> str:
    """What the yardstick is, for the report."""
    islands = [str(n) for n in art.extra.get("fp32_nodes") or ()]
    if art.compile_settings.get("quantized") == "upload":
        return ("the upload's own int8 graph (unfused: graph optimizations off, on the "
                "onnxruntime CPU provider)")
    return {Precision.FP32: "the FP32 source",
            Precision.FP16: "the source at FP16 (every weight and tensor rounded to FP16"
                            + (f" except the FP32 precision island {', '.join(islands[:4])}"
                               + (", …" if len(islands) > 4 else "") if islands else "")
                            + ", run on the onnxruntime CPU provider)",
            Precision.INT8: "the QDQ-quantized source (the compiler's calibration, run on the "
                            "onnxruntime CPU provider)"}[art.precision]
