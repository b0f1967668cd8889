"""`onnx` platform: the CPU-fallback artifact any device can run with onnxruntime.

ONNX uploads pass through unchanged; torch uploads are exported with the dynamo exporter to a
single file (weights embedded) with static shapes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from server.compile.compilers.base import Feeds, Outputs, ensure_onnx
from server.compile.source import ONNX_OPSET, run_onnx_cpu
from server.compile.types import CompiledArtifact, CompileRequest, Precision, Target


class OnnxCompiler:
    platform = "onnx"

    def compile(self, request: CompileRequest, workdir: Path) -> list[CompiledArtifact]:
        import onnx
        import onnxruntime

        src = ensure_onnx(request, workdir)
        out = workdir / "model.onnx"
        if src.resolve() != out.resolve():
            shutil.copyfile(src, out)
        opset = next((o.version for o in onnx.load(str(out), load_external_data=False)
                      .opset_import if o.domain in ("", "ai.onnx")), ONNX_OPSET)
        variant = "fp32" if request.shape_variant == "default" else \
            f"{request.shape_variant}-fp32"
        return [CompiledArtifact(
            path=out,
            target=Target(platform="onnx", variant=variant, format="onnx",
                          runtime="onnxruntime", runtime_version=onnxruntime.__version__),
            precision=Precision.FP32,
            compile_settings={"opset": int(opset), "passthrough":
                              request.source_format.value == "onnx"},
        )]

    def run(self, artifact: CompiledArtifact, feeds: Feeds) -> Outputs:
        return run_onnx_cpu(artifact.path, feeds)
