"""The `onnx` platform ships a quantized upload's own int8 graph.

A quantized upload (`quantize_dynamic` / `quantize_static`, as PyPI packages ship models) is
rewritten to FP32 for every platform's build (dequantize.py, dequantize_static.py). The CPU
artifact made from that rewrite is FP32: four times the int8 weight bytes the upload had,
and not the graph its authors run. onnxruntime runs the int8 graph on every CPU, so the onnx
platform ships the upload itself, its input dims fixed to the declared shapes by
onnxruntime's own tool (`make_input_shape_fixed`), as an INT8 artifact. Its numeric gate
judges it against itself as the INT8 yardstick (the compile changed nothing but the input
dims) and reports its precision cost against the FP32 rewrite, which `precision_gate: seed`
can enforce; the rewrite's agreement with the upload is checked before every build as
before.

Input dims alone leave some int8 graphs' inner shapes unknown to onnx's shape inference, which
the static-shape gate needs: sizes computed by shape arithmetic (`Shape` → `ConstantOfShape`,
folded only once the dims are fixed) and the outputs of onnxruntime's contrib operators
(`DynamicQuantizeLSTM`), which onnx has no schema for. Such a graph is
folded like every upload (onnxslim, no fusion; `shapes.specialize` step 3), with the contrib
outputs' shapes taken from the FP32 rewrite, which computes the same tensors under the same
names (`static_int8`). Its yardstick stays the upload with only its dims fixed, so the
numeric gate checks the folding too.

The FP32 build is made instead, with a note saying why, when the version asks for it
(onnx setting `quantized: fp32`), when the int8 graph cannot be shipped as it is (an input
bound to a constant value, per-cohort watermarks, which mark the FP32 weights), and when the
int8 artifact fails its operator or numeric gate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from server.compile.compilers.base import settings_for
from server.compile.errors import InvalidSourceError
from server.compile.quiet import quiet
from server.compile.shapes import (
    SKIPPED_OPTIMIZATIONS,
    fold_shapes,
    forget_inferred_shapes,
    static_shapes,
    unfixed_dims,
)
from server.compile.types import CompiledArtifact, CompileRequest, Precision, Target

SETTING = "quantized"  # onnx platform: "keep" (default) | "fp32"


def why_not(request: CompileRequest, watermarked: bool) -> str:
    """"" when the upload's int8 graph is to be tried, else why the FP32 build ships."""
    choice = str(settings_for(request, "onnx").get(SETTING, "keep")).lower()
    if choice not in ("keep", "fp32"):
        raise InvalidSourceError(f"onnx setting {SETTING} must be keep or fp32, not "
                                 f"{choice[:40]!r}")
    if choice == "fp32":
        return f"the version asks for the FP32 rewrite (onnx setting {SETTING}: fp32)"
    if request.quantized_upload is None:
        return "the upload is not quantized"
    bound = list(request.bound_inputs)
    if bound:
        return (f"input(s) {bound} are bound to a constant value, which only the FP32 "
                "rewrite folds in")
    if watermarked:
        return "per-cohort watermarks are embedded in the FP32 weights"
    return ""


def compile_kept(request: CompileRequest, workdir: Path) -> CompiledArtifact:
    """The upload with its input dims fixed to the request's shapes, as an INT8 artifact."""
    import onnx
    import onnxruntime
    from onnxruntime.tools.onnx_model_utils import fix_output_shapes, make_input_shape_fixed

    assert request.quantized_upload is not None
    model = onnx.load(str(request.quantized_upload))
    try:
        for spec in request.inputs:
            make_input_shape_fixed(model.graph, spec.name, list(spec.shape))
        fix_output_shapes(model)
    except Exception as e:  # the tool's own errors name the input; onnx's checker errors too
        raise InvalidSourceError(f"cannot fix the int8 upload's input dims: "
                                 f"{str(e).splitlines()[0][:300]}") from None
    out, yardstick = workdir / "model.onnx", workdir / "model.onnx"
    workdir.mkdir(parents=True, exist_ok=True)
    notes = []
    if unfixed_dims(model) and request.onnx_path is not None:
        yardstick = workdir / "upload_dims_fixed.onnx"
        onnx.save(model, str(yardstick))
        model, borrowed = static_int8(model, request.onnx_path)
        notes.append("shape arithmetic folded at the declared shapes"
                     + (f"; the shapes of {len(borrowed)} contrib operator output(s) "
                        f"({', '.join(borrowed[:4])}) taken from the FP32 rewrite"
                        if borrowed else ""))
    onnx.save(model, str(out))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    variant = "int8" if request.shape_variant == "default" else \
        f"{request.shape_variant}-int8"
    return CompiledArtifact(
        path=out,
        target=Target(platform="onnx", variant=variant, format="onnx", runtime="onnxruntime",
                      runtime_version=onnxruntime.__version__),
        precision=Precision.INT8,
        compile_settings={"opset": int(opset), "passthrough": True, "quantized": "upload"},
        notes=["the upload's own int8 graph, input dims fixed to the declared shapes "
               f"({out.stat().st_size} bytes)", *notes],
        # The yardstick at INT8 is the upload itself, with nothing but its input dims changed.
        extra={"qdq_model": str(yardstick)},
    )


# Contrib operators (no onnx schema) with float outputs, which the FP32 rewrite computes
# under the same names. (QOperator ones, QLinearAdd…, leave their outputs' rank unknown,
# which the static-shape gate lets pass.)
_FLOAT_OUTPUTS = {"DynamicQuantizeLSTM", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}
# Folding must not turn int8 weights into float ones (onnxslim leaves DequantizeLinear be).
_MAX_GROWTH = 1.1


def static_int8(model: Any, rewrite: Path) -> tuple[Any, list[str]]:
    """`model` (input dims fixed) with its shape arithmetic folded by onnxslim and its contrib
    outputs typed from the FP32 `rewrite`, and the names so typed; `model` itself when
    folding fails or would grow it."""
    import onnx
    import onnxslim

    work = onnx.ModelProto()
    work.CopyFrom(model)
    # Inferred and declared shapes were the dynamic graph's (ddddocr declares its output
    # [1, seqlen] and returns [20, 1, 8210]); folding must not trust them.
    forget_inferred_shapes(work)
    try:
        types = static_shapes(onnx.load(str(rewrite)))
        _type_contrib_outputs(work, types)
        with quiet():
            slim = onnxslim.slim(work, skip_optimizations=SKIPPED_OPTIMIZATIONS)
        if slim is None:
            return model, []
        # onnxslim's own inference drops the contrib outputs' types (it writes them back as
        # unknown), so it cannot fold the `Shape` of a tensor after them: fold those here
        # with the types restored, and let onnxslim fold what they feed.
        typed = _retyped(slim, types)
        if fold_shapes(slim):
            with quiet():
                slim = onnxslim.slim(slim, skip_optimizations=SKIPPED_OPTIMIZATIONS)
            typed = _retyped(slim, types) if slim is not None else []
    except Exception:  # the gate names what stays unresolved in the unfolded graph
        return model, []
    if slim is None or slim.ByteSize() > _MAX_GROWTH * model.ByteSize():
        return model, []
    return slim, typed


def _retyped(model: Any, types: dict[str, list[int]]) -> list[str]:
    del model.graph.value_info[:]
    return _type_contrib_outputs(model, types)


def _type_contrib_outputs(model: Any, types: dict[str, list[int]]) -> list[str]:
    from onnx import TensorProto, helper

    typed = []
    for node in model.graph.node:
        if node.domain != "com.microsoft" or node.op_type not in _FLOAT_OUTPUTS:
            continue
        for out in node.output:
            if out in types:
                model.graph.value_info.append(
                    helper.make_tensor_value_info(out, TensorProto.FLOAT, types[out]))
                typed.append(out)
    return typed
