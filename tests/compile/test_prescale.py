"""A sum scaled after its ReduceSum is scaled before it (server/compile/prescale.py): the same
values in FP32 over generated inputs and forms (Mul by 1/N, Div by N, the scale an
initializer or a Constant node after the sum, keepdims, axes), finite in FP16 where the
original overflows (Magika's LayerNorm: 512 squares summing past 65,504), and sums that are
not a plain scaled sum left alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from server.compile import InputSpec
from server.compile.gates.emulate import run as run_yardstick
from server.compile.gates.emulate import to_fp16
from server.compile.prescale import prescale_sums
from server.compile.shapes import specialize_file
from server.compile.source import run_onnx_cpu

F = TensorProto.FLOAT


def _mean_of_squares(path: Path, n: int, form: str, keepdims: int, constant_node: bool,
                     axis: int = 1) -> Path:
    """y = sum(x², axis) · (1/n) (form "mul") or / n ("div") + 1, x float32[2, n]."""
    scale = np.array(1 / n if form == "mul" else n, np.float32)
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"], name="square"),
             helper.make_node("ReduceSum", ["sq", "axes"], ["total"], keepdims=keepdims,
                              name="sum")]
    inits = [numpy_helper.from_array(np.array([axis], np.int64), "axes"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    if constant_node:
        nodes.append(helper.make_node("Constant", [], ["c"], name="c",
                                      value=numpy_helper.from_array(scale)))
    else:
        inits.append(numpy_helper.from_array(scale, "c"))
    nodes += [helper.make_node("Mul" if form == "mul" else "Div", ["total", "c"], ["mean"],
                               name="scale"),
              helper.make_node("Add", ["mean", "one"], ["y"], name="plus_one")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, n])],
                              [helper.make_tensor_value_info("y", F, [2, 1][:1 + keepdims])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@settings(max_examples=30, deadline=None, derandomize=True)
@given(n=st.sampled_from([3, 64, 512, 768]), form=st.sampled_from(["mul", "div"]),
       keepdims=st.integers(0, 1), constant_node=st.booleans(), axis=st.sampled_from([1, -1]),
       scale=st.floats(0.01, 200), seed=st.integers(0, 2**16))
def test_a_prescaled_sum_equals_the_original_in_fp32(
        tmp_path_factory: pytest.TempPathFactory, n: int, form: str, keepdims: int,
        constant_node: bool, axis: int, scale: float, seed: int) -> None:
    tmp = tmp_path_factory.mktemp("sum")
    src = _mean_of_squares(tmp / "a.onnx", n, form, keepdims, constant_node, axis)
    model = onnx.load(str(src))
    assert prescale_sums(model) == ["sum"]
    onnx.checker.check_model(model)  # topologically sorted, names defined before use
    onnx.save(model, str(tmp / "b.onnx"))
    x = (np.random.default_rng(seed).standard_normal((2, n)) * scale).astype(np.float32)
    (want,), (got,) = run_onnx_cpu(src, [{"x": x}])[0], run_onnx_cpu(tmp / "b.onnx",
                                                                     [{"x": x}])[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-6)


def test_fp16_holds_the_prescaled_sum_where_the_original_overflows(tmp_path: Path) -> None:
    """512 squares of values around 20 sum to ~2e5 > 65,504: the FP16 yardstick of the
    original is inf; the prescaled graph's FP16 run stays within FP16's rounding. And a
    static upload gets the rewrite through specialization (it no longer passes unchanged)."""
    src = _mean_of_squares(tmp_path / "a.onnx", 512, "mul", 0, False)
    report = specialize_file(src, (InputSpec("x", (2, 512)),), tmp_path / "b.onnx")
    assert report is not None and report.sums_prescaled == ("sum",)
    assert "sum(s) scaled before the ReduceSum" in report.note()
    x = (np.random.default_rng(0).standard_normal((2, 512)) * 20).astype(np.float32)
    (want,) = run_onnx_cpu(src, [{"x": x}])[0]
    assert float(np.sum(x[0] ** 2)) > 65504
    for path, name in ((src, "orig"), (tmp_path / "b.onnx", "pre")):
        to_fp16(path, tmp_path / f"{name}.fp16.onnx")
    (orig16,) = run_yardstick(tmp_path / "orig.fp16.onnx", [{"x": x}])[0]
    (pre16,) = run_yardstick(tmp_path / "pre.fp16.onnx", [{"x": x}])[0]
    assert not np.isfinite(orig16).all()
    np.testing.assert_allclose(pre16, want, rtol=2e-3)


def test_sums_that_are_not_a_plain_scaled_sum_are_left_alone(tmp_path: Path) -> None:
    src = _mean_of_squares(tmp_path / "a.onnx", 8, "mul", 0, False)
    base = onnx.load(str(src))
    cases = {}
    # The sum also feeds another node (it is needed unscaled).
    two = onnx.ModelProto()
    two.CopyFrom(base)
    two.graph.node.append(helper.make_node("Neg", ["total"], ["other"], name="neg"))
    two.graph.output.append(helper.make_tensor_value_info("other", F, [2]))
    cases["two consumers"] = two
    # A scale of 2: multiplying first makes overflow likelier, not less.
    up = onnx.ModelProto()
    up.CopyFrom(base)
    c = next(t for t in up.graph.initializer if t.name == "c")
    c.CopyFrom(numpy_helper.from_array(np.array(2.0, np.float32), "c"))
    cases["scale above 1"] = up
    # The scale is a tensor of higher rank than the sum: it broadcasts the sum up.
    wide = onnx.ModelProto()
    wide.CopyFrom(base)
    c = next(t for t in wide.graph.initializer if t.name == "c")
    c.CopyFrom(numpy_helper.from_array(np.full((1, 1), 0.125, np.float32), "c"))
    cases["rank-raising scale"] = wide
    for why, model in cases.items():
        before = onnx.ModelProto()
        before.CopyFrom(model)
        assert prescale_sums(model) == [], why
        assert model == before, why


def test_a_layernorm_written_as_sums_keeps_every_other_node(tmp_path: Path) -> None:
    """jax2tf's LayerNorm: two scaled sums (mean, mean of squares) in one graph, with nodes
    before, between and after them — each rewritten, nothing else lost or reordered wrongly
    (Magika lost its graph output to a rewrite keyed on protobuf wrapper ids)."""
    n = 512
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Mul", ["x", "g"], ["xg"], name="pre"),
             helper.make_node("ReduceSum", ["xg", "axes"], ["s1"], keepdims=1, name="sum"),
             helper.make_node("Mul", ["xg", "xg"], ["sq"], name="square"),
             helper.make_node("ReduceSum", ["sq", "axes"], ["s2"], keepdims=1, name="sum_1"),
             helper.make_node("Mul", ["s1", "inv"], ["mean"], name="truediv"),
             helper.make_node("Mul", ["s2", "inv"], ["meansq"], name="truediv_1"),
             helper.make_node("Mul", ["mean", "mean"], ["mean2"], name="square_1"),
             helper.make_node("Sub", ["meansq", "mean2"], ["var"], name="sub"),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="add"),
             helper.make_node("Sqrt", ["ve"], ["sd"], name="sqrt"),
             helper.make_node("Sub", ["xg", "mean"], ["centred"], name="centre"),
             helper.make_node("Div", ["centred", "sd"], ["y"], name="normalize")]
    graph = helper.make_graph(
        nodes, "ln", [helper.make_tensor_value_info("x", F, [1, n])],
        [helper.make_tensor_value_info("y", F, [1, n])],
        [numpy_helper.from_array(np.array([1], np.int64), "axes"),
         numpy_helper.from_array(np.array(1 / n, np.float32), "inv"),
         numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
         numpy_helper.from_array(rng.uniform(0.5, 2, (1, n)).astype(np.float32), "g")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(tmp_path / "a.onnx"))
    assert prescale_sums(model) == ["sum", "sum_1"]
    onnx.checker.check_model(model)
    assert len(model.graph.node) == len(nodes)  # each sum + scale pair is still two nodes
    assert [x.name for x in model.graph.node if x.op_type == "ReduceSum"] == ["sum", "sum_1"]
    onnx.save(model, str(tmp_path / "b.onnx"))
    x = (rng.standard_normal((1, n)) * 20 + 5).astype(np.float32)
    (want,), (got,) = (run_onnx_cpu(p, [{"x": x}])[0] for p in (tmp_path / "a.onnx",
                                                                tmp_path / "b.onnx"))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
