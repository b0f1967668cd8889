"""The Core ML numeric gate is live on Linux: a package whose weights were perturbed after
conversion, and a package converted with one deliberately wrong converter rule (relu written
as sigmoid), both fail the gate through the real pipeline, which names the MIL executor as
its basis; the same model unchanged passes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb

from server.compile import SourceFormat
from server.compile.compilers.coreml import CoreMLCompiler
from server.compile.milexec import MilExecutor
from server.compile.pipeline import BuildSpec, Pipeline

RUNNER = "mil reference executor (numpy, fp16)"
WEIGHTS = Path("Data/com.apple.CoreML/weights/weight.bin")


class PerturbedWeights(CoreMLCompiler):
    """Compiles as Core ML does, then scales the package's largest weight in its blob file
    (found by its exact bytes) by 1.5: the program is unchanged, the numbers are not."""

    def compile(self, request: Any, workdir: Path) -> Any:
        artifacts = super().compile(request, workdir)
        for art in artifacts:
            w = max((v for v in MilExecutor(art.path).weights().values()
                     if isinstance(v, np.ndarray) and v.dtype.kind == "f"), key=np.size)
            blob = art.path / WEIGHTS
            data = blob.read_bytes()
            at = data.find(w.tobytes())
            assert at >= 0 and data.count(w.tobytes()) == 1
            blob.write_bytes(data[:at] + (w * 1.5).astype(w.dtype).tobytes()
                             + data[at + w.nbytes:])
        return artifacts


def _coreml(convnet: Any, tmp_path: Path, compiler: Any = CoreMLCompiler) -> Any:
    spec = BuildSpec(convnet.pt2, SourceFormat.EXPORTED_PROGRAM, {"default": convnet.inputs},
                     platforms=("coreml",), reference_path=convnet.reference)
    (out,) = Pipeline({"coreml": compiler}).build(spec, tmp_path)
    return out


def test_unchanged_package_passes_the_core_ml_gate(convnet, tmp_path):  # type: ignore[no-untyped-def]
    out = _coreml(convnet, tmp_path)
    assert out.state == "ready", out.error
    assert out.gates["numeric"]["status"] == "passed"
    assert out.gates["numeric"]["runner"] == RUNNER


def test_perturbed_weights_fail_the_core_ml_gate(convnet, tmp_path):  # type: ignore[no-untyped-def]
    out = _coreml(convnet, tmp_path, PerturbedWeights)
    num = out.gates["numeric"]
    assert out.state == "failed" and num["status"] == "failed", num
    assert num["runner"] == RUNNER
    assert "numeric gate failed" in out.error and out.artifact is None


@pytest.fixture
def relu_converted_as_sigmoid(monkeypatch: pytest.MonkeyPatch) -> None:
    from coremltools.converters.mil.frontend.torch.ops import _get_inputs
    from coremltools.converters.mil.frontend.torch.torch_op_registry import _TORCH_OPS_REGISTRY

    def wrong_relu(context: Any, node: Any) -> None:
        (x,) = _get_inputs(context, node, expected=1)
        context.add(mb.sigmoid(x=x, name=node.name))
    monkeypatch.setitem(_TORCH_OPS_REGISTRY.name_to_func_mapping, "relu", wrong_relu)


def test_a_wrong_converter_rule_fails_the_core_ml_gate(convnet, tmp_path,  # type: ignore[no-untyped-def]
                                                       relu_converted_as_sigmoid):
    out = _coreml(convnet, tmp_path)
    assert "sigmoid" in out.gates["operators"][-1]["operators"]  # the wrong rule was used
    num = out.gates["numeric"]
    assert out.state == "failed" and num["status"] == "failed", num
    assert num["runner"] == RUNNER
