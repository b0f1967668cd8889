"""The source run at an artifact's precision, on onnxruntime's CPU provider: the yardstick that
tells a compiler's loss from the precision's own.

- FP32: the FP32 source graph itself.
- FP16: the FP32 ONNX converted by onnxruntime's maintained float16 converter
  (`onnxruntime.transformers.float16`, a fork of onnxconverter-common's), graph inputs and
  outputs kept FP32. Every float tensor between nodes is stored in FP16; onnxruntime computes
  a node in FP16 where its CPU provider has an FP16 kernel, else in FP32 between casts. Nodes
  with a float constant FP16 cannot hold (|value| > 65504, e.g. a BatchNormalization's running
  variance of 1e7 in PP-OCR's detector) stay FP32: every NPU compiler folds such a node
  into its neighbour's weights first (Core ML's and QNN's conv+batchnorm fusion), so casting
  the constant to FP16 would emulate a loss no device has.
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


def to_fp16(src: Path, out: Path) -> Path:
    """Writes the FP16 yardstick of the FP32 ONNX `src` to `out`."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(src))
    for i, node in enumerate(model.graph.node):  # the converter blocks nodes by name
        if not node.name:
            node.name = f"{node.op_type}_{i}"
    converted = convert_float_to_float16(model, keep_io_types=True,
                                         node_block_list=_out_of_fp16_range(model))
    onnx.save(converted, str(out))
    return out


def source_at_precision(onnx_path: Path, art: CompiledArtifact, workdir: Path
                        ) -> tuple[Path | None, str]:
    """(ONNX file emulating the source at `art.precision`, "") or (None, why not)."""
    if art.precision is Precision.FP32:
        return onnx_path, ""
    if art.precision is Precision.FP16:
        out = workdir / f"{onnx_path.stem}.fp16.onnx"
        if not out.is_file():
            try:
                to_fp16(onnx_path, out)
            except Exception as e:  # the yardstick is a diagnostic, never a crash
                return None, f"the FP16 converter failed on the source: {type(e).__name__}: {e}"
        return out, ""
    qdq = art.extra.get("qdq_model")
    if qdq and Path(str(qdq)).is_file():
        return Path(str(qdq)), ""
    return None, ("no INT8 emulation of the source for this artifact (the compiler quantized "
                  "inside its own toolchain)")


def describe(art: CompiledArtifact) -> str:
    """What the yardstick is, for the report."""
    return {Precision.FP32: "the FP32 source",
            Precision.FP16: "the source converted to FP16 (onnxruntime float16 converter, "
                            "run on the onnxruntime CPU provider)",
            Precision.INT8: "the QDQ-quantized source (the compiler's calibration, run on the "
                            "onnxruntime CPU provider)"}[art.precision]
