"""Clip with computed bounds on the QNN HTP (server/compile/qnn_prep.py): the HTP's Clip takes
constant bounds only, so a log-mel front end's top-dB clamp `Clip(x, max(x) - 80, ∞)`
(openWakeWord's melspectrogram) left a node on the CPU and failed the support gate. Max / Min
is the same function over every input, bounds present or not, min above max included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from server.compile import CompileRequest, InputSpec, SourceFormat
from server.compile.compilers.qnn import QnnCompiler
from server.compile.qnn_prep import rewrite
from server.compile.source import run_onnx_cpu

F = TensorProto.FLOAT


def _clip_graph(path: Path, low: float | None, high: float | None, high_const: bool,
                n: int = 8) -> Path:
    """y = Clip(x, max(x) - low, min(x) + high) (or the constant `high`); a bound left out
    when None."""
    nodes = [helper.make_node("ReduceMax", ["x"], ["xmax"], keepdims=0, name="xmax"),
             helper.make_node("Sub", ["xmax", "low"], ["lo"], name="lo"),
             helper.make_node("ReduceMin", ["x"], ["xmin"], keepdims=0, name="xmin"),
             helper.make_node("Add", ["xmin", "high"], ["hi_computed"], name="hi")]
    hi = "high" if high_const else "hi_computed"
    nodes.append(helper.make_node("Clip", ["x", "lo" if low is not None else "",
                                           hi if high is not None else ""], ["y"],
                                  name="top_db"))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F, [1, n])],
        [helper.make_tensor_value_info("y", F, [1, n])],
        [numpy_helper.from_array(np.array(low or 0.0, np.float32), "low"),
         numpy_helper.from_array(np.array(high or 0.0, np.float32), "high")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


BOUND = st.none() | st.floats(-20, 20, width=32)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(x=st.lists(st.floats(-50, 50, width=32), min_size=8, max_size=8), low=BOUND,
       high=BOUND, high_const=st.booleans())
def test_clip_with_computed_bounds_as_max_min_equals_onnxruntime(
        tmp_path_factory: pytest.TempPathFactory, x: list[float], low: float | None,
        high: float | None, high_const: bool) -> None:
    tmp = tmp_path_factory.mktemp("clip")
    src = _clip_graph(tmp / "a.onnx", low, high, high_const)
    model, done = rewrite(onnx.load(str(src)), {"top_db"})
    if low is None and high is None:  # nothing to rewrite: left as it was
        assert done == {} and "Clip" in {n.op_type for n in model.graph.node}
        return
    assert set(done) == {"top_db"} and "Clip" not in {n.op_type for n in model.graph.node}
    onnx.save(model, str(tmp / "b.onnx"))
    feeds = [{"x": np.array([x], np.float32)}]
    np.testing.assert_array_equal(run_onnx_cpu(tmp / "b.onnx", feeds)[0][0],
                                  run_onnx_cpu(src, feeds)[0][0])


def test_a_top_db_clamp_runs_whole_on_the_htp(tmp_path: Path) -> None:
    """The clamp as openWakeWord exports it (a computed lower bound, a constant upper one),
    with values in the range a log-mel has: compiled whole for the HTP after the rewrite,
    and the HTP's FP16 result agrees with onnxruntime."""
    src = _clip_graph(tmp_path / "mel.onnx", 80.0, 3.0e4, True, n=256)
    request = CompileRequest(src, SourceFormat.ONNX, (InputSpec("x", (1, 256)),),
                             onnx_path=src, settings={"qnn": {"precision": "fp16"}})
    compiler = QnnCompiler()
    [art] = compiler.compile(request, tmp_path)
    htp = art.extra["htp"]
    assert htp["cpu_nodes"] == [] and htp["node_share"] == 1.0
    assert any("top_db" in n for n in art.notes)
    x = np.linspace(-120, 10, 256, dtype=np.float32)[None]  # dB: the clamp cuts below -70
    want = run_onnx_cpu(src, [{"x": x}])[0][0]
    assert (want == -70).sum() > 50  # the lower bound is exercised
    np.testing.assert_allclose(compiler.run(art, [{"x": x}])[0][0], want, atol=0.1)
