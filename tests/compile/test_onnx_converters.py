"""ONNX → torch → Core ML per operator and opset, each against onnxruntime.

The graphs are the shapes real exporters emit (tests/compile/onnx_op_cases.py). Every case:
the onnx2torch module (with our converters) matches onnxruntime at FP32, then torch.export
and coremltools turn it into an ML Program (Core ML cannot execute on Linux).
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from server.compile import CompileRequest, ConversionError, InputSpec, SourceFormat
from server.compile.compilers.coreml import CoreMLCompiler
from server.compile.onnx_to_torch import onnx_to_torch, unconvertible_nodes
from server.compile.source import run_onnx_cpu
from tests.compile.onnx_op_cases import CASES, OpCase

# Opset variants of one operator convert to the same torch module: coremltools sees the
# newest opset of each operator variant only (keeps this file fast).
_FAMILY = {re.sub(r"-\d+", "", c.id): c.id for c in CASES}
TO_CORE_ML = set(_FAMILY.values())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_operator_converts_to_core_ml_and_matches_onnxruntime(case: OpCase,
                                                               tmp_path: Path) -> None:
    import coremltools as ct
    import torch

    model, feeds = case.build()
    onnx.checker.check_model(model)
    path = tmp_path / "case.onnx"
    onnx.save(model, str(path))
    assert unconvertible_nodes(model) == []
    expected = run_onnx_cpu(path, [feeds])[0][0]
    module = onnx_to_torch(path)
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    with torch.no_grad():
        got = module(*args).numpy()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, equal_nan=True)
    if case.id not in TO_CORE_ML:
        return
    program = torch.export.export(module, args).run_decompositions()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        ml = ct.convert(program, convert_to="mlprogram",
                        minimum_deployment_target=ct.target.iOS17)
    assert ml.get_spec().WhichOneof("Type") == "mlProgram"


def _dilated_pool(tmp_path: Path) -> Path:
    node = helper.make_node("AveragePool", ["x"], ["y"], name="pool_dilated",
                            kernel_shape=[3, 3], dilations=[2, 2])
    ok = helper.make_node("Relu", ["y"], ["z"], name="fine")
    graph = helper.make_graph(
        [node, ok], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 9, 9])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 2, 5, 5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    onnx.save(model, str(tmp_path / "pool.onnx"))
    return tmp_path / "pool.onnx"


def test_refused_node_is_named_with_the_converters_reason_by_gate_and_compile(tmp_path):
    path = _dilated_pool(tmp_path)
    found = unconvertible_nodes(onnx.load(str(path)))
    assert [(u.op, u.node) for u in found] == [("AveragePool", "pool_dilated")]
    assert "dilations" in found[0].reason
    with pytest.raises(ConversionError) as err:
        CoreMLCompiler().compile(CompileRequest(path, SourceFormat.ONNX,
                                                (InputSpec("x", (1, 2, 9, 9)),)), tmp_path)
    assert err.value.operators == ["AveragePool"]
    assert "pool_dilated" in str(err.value) and "dilations" in str(err.value)


def test_resize_with_computed_sizes_is_refused_with_the_fix(tmp_path):
    """TorchScript exports compute Resize sizes from Shape; unfolded, that cannot convert."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Mul", ["s", "two"], ["sizes"]),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="up",
                              mode="nearest")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([1, 1, 2, 2], np.int64), "two")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    found = unconvertible_nodes(model)
    assert [(u.op, u.node) for u in found] == [("Resize", "up")]
    assert "fix the input shapes" in found[0].reason


def test_support_gate_names_the_node_core_ml_conversion_refuses(tmp_path):
    from server.compile.gates.support import check_support

    request = CompileRequest(_dilated_pool(tmp_path), SourceFormat.ONNX,
                             (InputSpec("x", (1, 2, 9, 9)),))
    report = check_support(request, "coreml")
    assert report is not None and not report.passed
    assert [(f.name, f.where) for f in report.findings] == [("AveragePool", "pool_dilated")]
    assert "dilations" in report.findings[0].detail
