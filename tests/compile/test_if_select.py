"""An `If` on tensor values computed both ways and selected by `Where`
(server/compile/if_select.py): the same outputs as onnxruntime's `If` on either side of the
condition, over generated inputs; the forms it cannot take are refused with the reason."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from server.compile import BuildSpec, InputSpec, Pipeline, SourceFormat
from server.compile.errors import InvalidSourceError
from server.compile.if_select import select_ifs
from server.compile.shapes import specialize_file
from server.compile.source import run_onnx_cpu

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _out(name: str, elem: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, None)


def _gated_model(inner_if: bool = False) -> onnx.ModelProto:
    """openWakeWord's keyword head in small: score = mean(x·w); when score ≥ t a verifier
    stage rescales x (then), else x passes (else). Two outputs (a float tensor and an int64
    argmax); both branches name a local 'h' (the names must not collide), the then branch
    has an initializer and a Constant of its own and reads `score`, computed outside."""
    then_nodes = [
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(
            np.array(0.5, np.float32))),
        helper.make_node("Mul", ["x", "v"], ["h"]),
        helper.make_node("Add", ["h", "score"], ["h2"]),
        helper.make_node("Mul", ["h2", "k"], ["y_then" if not inner_if else "y0"]),
        helper.make_node("ArgMax", ["h2"], ["i_then"], axis=1, keepdims=1),
    ]
    if inner_if:  # y_then = y0 + (x if c else -x)
        then_nodes.append(helper.make_node(
            "If", ["c"], ["z"], name="inner",
            then_branch=helper.make_graph([helper.make_node("Identity", ["x"], ["a"])], "a",
                                          [], [_out("a")]),
            else_branch=helper.make_graph([helper.make_node("Neg", ["x"], ["b"])], "b", [],
                                          [_out("b")])))
        then_nodes.append(helper.make_node("Add", ["y0", "z"], ["y_then"]))
    then_branch = helper.make_graph(
        then_nodes, "verify", [], [_out("y_then"), _out("i_then", I64)],
        [numpy_helper.from_array(np.linspace(-2, 2, 8, dtype=np.float32).reshape(1, 8), "v")])
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["h"]),
         helper.make_node("ArgMax", ["x"], ["i_else"], axis=1, keepdims=1)],
        "pass", [], [_out("h"), _out("i_else", I64)])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["xw"], name="weigh"),
         helper.make_node("ReduceMean", ["xw"], ["score"], keepdims=0, name="score"),
         helper.make_node("GreaterOrEqual", ["score", "t"], ["c"], name="passes"),
         helper.make_node("If", ["c"], ["y", "i"], name="gate", then_branch=then_branch,
                          else_branch=else_branch),
         helper.make_node("Sigmoid", ["y"], ["p"], name="after")],
        "gated",
        [helper.make_tensor_value_info("x", F, [1, 8]), helper.make_tensor_value_info("t", F, [])],
        [helper.make_tensor_value_info("p", F, [1, 8]), helper.make_tensor_value_info("i", I64,
                                                                                      [1, 1])],
        [numpy_helper.from_array(np.arange(1, 9, dtype=np.float32).reshape(1, 8) / 8, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


@settings(max_examples=40, deadline=None, derandomize=True)
@given(x=st.lists(st.floats(-8, 8, width=32), min_size=8, max_size=8),
       t=st.floats(-4, 4, width=32))
def test_an_if_on_values_selected_by_where_matches_onnxruntime_on_both_sides(
        tmp_path_factory: pytest.TempPathFactory, x: list[float], t: float) -> None:
    tmp = tmp_path_factory.mktemp("gate")
    model = _gated_model()
    onnx.save(model, str(tmp / "if.onnx"))
    selected, kept = select_ifs(model)
    assert selected == ["gate"] and kept == {}
    assert "If" not in {n.op_type for n in model.graph.node}
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(tmp / "where.onnx"))
    feeds = [{"x": np.array([x], np.float32), "t": np.array(t, np.float32)}]
    want = run_onnx_cpu(tmp / "if.onnx", feeds)[0]
    got = run_onnx_cpu(tmp / "where.onnx", feeds)[0]
    for w, g in zip(want, got, strict=True):
        assert w.dtype == g.dtype and w.shape == g.shape
        np.testing.assert_array_equal(g, w)


def test_both_sides_of_the_condition_are_reached_by_the_generated_inputs(tmp_path: Path
                                                                         ) -> None:
    """The property above is not vacuous: the same x gives the then branch at a low
    threshold and the else branch at a high one, and the selected graph follows both."""
    model = _gated_model()
    onnx.save(model, str(tmp_path / "if.onnx"))
    select_ifs(model)
    onnx.save(model, str(tmp_path / "where.onnx"))
    x = np.linspace(-1, 3, 8, dtype=np.float32)[None]
    low, high = ({"x": x, "t": np.array(v, np.float32)} for v in (-4.0, 4.0))
    (then_p, _), (else_p, _) = run_onnx_cpu(tmp_path / "where.onnx", [low, high])
    score = float(np.mean(x * np.arange(1, 9) / 8))
    v = np.linspace(-2, 2, 8, dtype=np.float32)
    np.testing.assert_allclose(then_p, 1 / (1 + np.exp(-(x * v + score) * 0.5)), rtol=1e-6)
    np.testing.assert_allclose(else_p, 1 / (1 + np.exp(-x)), rtol=1e-6)


def test_an_if_with_control_flow_in_a_branch_is_refused_naming_its_input_and_why(
        tmp_path: Path) -> None:
    onnx.save(_gated_model(inner_if=True), str(tmp_path / "m.onnx"))
    with pytest.raises(InvalidSourceError) as err:
        specialize_file(tmp_path / "m.onnx", (InputSpec("x", (1, 8)), InputSpec("t", ())),
                        tmp_path / "s.onnx")
    assert ("If node 'gate' (its condition reads the values of input(s) 't', 'x'; not "
            "computable both ways: a branch holds control flow of its own (If node 'inner'))"
            in str(err.value))


def test_branches_whose_outputs_differ_in_shape_are_not_selected() -> None:
    """`Where` would broadcast the else branch's [1, 1] to [1, 8]: a shape it never had."""
    model = _gated_model()
    gate = next(n for n in model.graph.node if n.op_type == "If")
    else_branch = next(a.g for a in gate.attribute if a.name == "else_branch")
    else_branch.node[0].CopyFrom(helper.make_node("ReduceMax", ["x"], ["h"], axes=[1],
                                                  keepdims=1))
    before = onnx.ModelProto()
    before.CopyFrom(model)
    selected, kept = select_ifs(model)
    assert selected == [] and model == before
    assert kept == {"gate": "output 'y' differs between the branches (float32[1, 8] vs "
                            "float32[1, 1])"}


def test_a_selected_if_builds_for_onnx_coreml_and_qnn(tmp_path: Path) -> None:
    """Through the pipeline (specialization, gates, compile, numeric gate): the If that
    every build refused before is a Where each platform runs."""
    onnx.save(_gated_model(), str(tmp_path / "m.onnx"))
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "ref.npz", x=rng.uniform(-2, 4, (2, 1, 8)).astype(np.float32),
             t=np.array([0.5, 1.5], np.float32))
    spec = BuildSpec(tmp_path / "m.onnx", SourceFormat.ONNX,
                     {"default": (InputSpec("x", (1, 8)), InputSpec("t", ()))},
                     platforms=("onnx", "coreml", "qnn"), reference_path=tmp_path / "ref.npz")
    out = {o.platform: o for o in Pipeline().build(spec, tmp_path / "work")}
    assert {p: o.error for p, o in out.items() if o.state != "ready"} == {}
    for o in out.values():
        assert o.gates["numeric"]["status"] == "passed", o.gates["numeric"]
        assert o.gates["shapes"]["ifs_selected"] == ["gate"]
