"""ONNX's backend node cases through ONNX → MIL → ct.convert → the MIL reference executor
(server/compile/onnx_mil/conformance.py; the table in docs/compile.md comes from
`python -m bench.compile.onnx_conformance`). The suite is split by op into two modules
(tests/compile/conformance_halves.py)."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.backend.test.case.test_case import TestCase

from server.compile.onnx_mil import claimed_ops
from server.compile.onnx_mil.conformance import _scope, primary_op
from tests.compile import node_cases
from tests.compile.conformance_halves import ISSUE_OPS, check_half, half


def test_the_issues_ops_are_claimed() -> None:
    # If is folded (constant condition) by the graph walk rather than a rule.
    assert ISSUE_OPS - {"If"} <= claimed_ops()


def test_cases_are_attributed_to_the_op_their_name_tests() -> None:
    ops = {"AveragePool", "Pad", "LayerNormalization", "Log", "LogSoftmax", "Softmax"}
    assert primary_op("test_averagepool_2d_ceil", ops) == "AveragePool"
    assert primary_op("test_layer_normalization_4d_axis0", ops) == "LayerNormalization"
    assert primary_op("test_logsoftmax_axis_0", ops) == "LogSoftmax"
    assert primary_op("test_log_example", ops) == "Log"
    assert primary_op("test_reflect_pad", ops) == "Pad"


def test_the_two_halves_cover_every_claimed_op_once() -> None:
    assert half(0) | half(1) == claimed_ops() | {"Constant"}
    assert not half(0) & half(1)


def test_cached_node_cases_come_back_as_collected(tmp_path: Path) -> None:
    """The cache both halves read (tests/compile/node_cases.py): models, arrays, tolerances
    as stored, and a value the .npz cannot hold out of scope for the same reason."""
    relu = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])]))
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    cases = [TestCase("test_relu", "test_relu", None, None, relu,
                      [([x], [np.maximum(x, 0)])], "node", 1e-3, 1e-7),
             TestCase("test_ints", "test_ints", None, None, relu,
                      [([np.arange(3, dtype=np.int64)], [np.array(True)])], "node", 0.5, 0.25),
             TestCase("test_seq", "test_seq", None, None, relu, [([[x, x]], [x])], "node", 1, 1),
             TestCase("test_str", "test_str", None, None, relu,
                      [([np.array(["a", "b"], dtype=object)], [x])], "node", 1, 1),
             TestCase("test_none", "test_none", None, None, relu, [], "node", 1, 1),
             TestCase("test_bf16", "test_bf16", None, None, relu,
                      [([x.astype(ml_dtypes.bfloat16)], [x])], "node", 1, 1)]
    node_cases.write(tmp_path, cases)
    back = node_cases.read(tmp_path)
    assert [c.name for c in back] == [c.name for c in cases]
    for got, want in zip(back, cases, strict=True):
        assert got.model.SerializeToString() == want.model.SerializeToString()
        assert (got.rtol, got.atol) == (want.rtol, want.atol)
        assert _scope(got) == _scope(want), got.name
    (ins, outs), = back[0].data_sets
    assert ins[0].dtype == np.float32 and np.array_equal(ins[0], x)
    assert np.array_equal(outs[0], np.maximum(x, 0))
    (ins, outs), = back[1].data_sets
    assert ins[0].dtype == np.int64 and outs[0].dtype == np.bool_ and outs[0].shape == ()
    assert _scope(back[0]) == "" and "sequence" in _scope(back[2])
    assert _scope(back[3]) == "dtype object" and _scope(back[4]) == "no data sets"
    assert _scope(back[5]) == "dtype bfloat16"
    assert isinstance(back[0].model, onnx.ModelProto)


@pytest.mark.slow
def test_every_claimed_op_of_the_first_half_passes_95_percent_of_its_node_cases() -> None:
    """Half of the ~775 in-scope cases, each one ct.convert and one executor run; the other
    half is tests/compile/test_onnx_conformance_other_half.py (its own module, so xdist runs
    it on the other worker)."""
    check_half(0)
