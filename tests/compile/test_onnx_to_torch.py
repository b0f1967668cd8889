"""The ONNX → torch → Core ML path: the torchvision stand-in and operator-named failures."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

from server.compile import CompileRequest, ConversionError, InputSpec, SourceFormat
from server.compile.compilers.coreml import CoreMLCompiler
from server.compile.onnx_to_torch import load_onnx2torch, onnx_to_torch
from server.compile.source import load_samples, run_onnx_cpu
from tests.compile.compile_models import onnx_model


def test_onnx2torch_imports_without_torchvision_and_leaves_no_stand_in_behind():
    load_onnx2torch()
    assert "onnx2torch" in sys.modules
    tv = sys.modules.get("torchvision")
    assert tv is None or not getattr(tv, "__modelfleet_stand_in__", False)


def test_exporter_opset_graph_converts_and_matches_onnxruntime(transformer):
    import torch

    module = onnx_to_torch(transformer.onnx)
    feeds = load_samples(transformer.reference, transformer.inputs)
    expected = run_onnx_cpu(transformer.onnx, feeds)
    with torch.no_grad():
        got = module(torch.from_numpy(feeds[0]["tokens"]))
    np.testing.assert_allclose(got.numpy(), expected[0][0], rtol=1e-4, atol=1e-5)


def test_unconvertible_operator_is_named_with_the_export_advice(tmp_path):
    path = onnx_model(tmp_path / "hardmax.onnx", [helper.make_node("Hardmax", ["x"], ["y"])],
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    with pytest.raises(ConversionError) as err:
        CoreMLCompiler().compile(CompileRequest(path, SourceFormat.ONNX,
                                                (InputSpec("x", (1, 4)),)), tmp_path)
    assert err.value.operators == ["Hardmax"]
    assert "Hardmax" in str(err.value) and "ExportedProgram" in str(err.value)


def test_onnx2torch_drift_fails_the_core_ml_build_before_conversion(convnet, tmp_path,
                                                                     monkeypatch):
    """If the intermediate torch graph disagrees with onnxruntime, Core ML is not built."""
    import torch

    import server.compile.onnx_to_torch as o2t

    real = o2t.onnx_to_torch

    class Drift(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x) * 1.05

    monkeypatch.setattr(o2t, "onnx_to_torch", lambda path: Drift(real(path)))
    req = CompileRequest(convnet.onnx, SourceFormat.ONNX, convnet.inputs,
                         reference_path=convnet.reference)
    with pytest.raises(ConversionError, match="changed the outputs"):
        CoreMLCompiler().compile(req, tmp_path)
    assert not (tmp_path / "model.mlpackage").exists()


def test_exported_program_is_decomposed_to_core_aten_before_coremltools(tmp_path):
    """`x.new_ones` (as transformers' attention masks write it) survives torch.export but has
    no coremltools converter: the program is decomposed to the core ATen set first."""
    import torch

    class Masked(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.max_pool2d(x * x.new_ones(x.shape), 2)

    path = tmp_path / "masked.pt2"
    torch.export.save(torch.export.export(Masked(), (torch.zeros(1, 2, 8, 8),)), str(path))
    (art,) = CoreMLCompiler().compile(CompileRequest(
        path, SourceFormat.EXPORTED_PROGRAM, (InputSpec("x", (1, 2, 8, 8)),)), tmp_path)
    assert (art.path / "Manifest.json").is_file()
