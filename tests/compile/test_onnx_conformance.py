"""ONNX's backend node cases through ONNX → MIL → ct.convert → the MIL reference executor
(server/compile/onnx_mil/conformance.py; the table in docs/compile.md comes from
`python -m bench.compile.onnx_conformance`). The suite is split by op into two modules
(tests/compile/conformance_halves.py)."""

from __future__ import annotations

import pytest

from server.compile.onnx_mil import claimed_ops
from server.compile.onnx_mil.conformance import primary_op
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


@pytest.mark.slow
def test_every_claimed_op_of_the_first_half_passes_95_percent_of_its_node_cases() -> None:
    """Half of the ~775 in-scope cases, each one ct.convert and one executor run; the other
    half is tests/compile/test_onnx_conformance_other_half.py (its own module, so xdist runs
    it on the other worker)."""
    check_half(0)
