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

The FP32 build is made instead, with a note saying why, when the version asks for it
(onnx setting `quantized: fp32`), when the int8 graph cannot be shipped as it is (an input
bound to a constant value, per-cohort watermarks, which mark the FP32 weights), and when the
int8 artifact fails its operator or numeric gate.
"""

from __future__ import annotations

from pathlib import Path

from server.compile.compilers.base import settings_for
from server.compile.errors import InvalidSourceError
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
    out = workdir / "model.onnx"
    workdir.mkdir(parents=True, exist_ok=True)
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
               f"({out.stat().st_size} bytes)"],
        # The yardstick at INT8 is the upload itself: nothing but the input dims changed.
        extra={"qdq_model": str(out)},
    )
