"""Einsum rewritten for the QNN HTP: every (batched, grouped) matrix-product equation becomes
Transpose / Reshape / MatMul with onnxruntime's own Einsum as the oracle (hypothesis over
generated equations); other forms are refused naming what they do; and the grouped product
of issue 19 (`btgi,gih->btgh`) compiles on the HTP with no Einsum left."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from server.compile import CompileRequest, ConversionError, InputSpec, SourceFormat
from server.compile.qnn_einsum import parse
from server.compile.qnn_prep import rewrite
from server.compile.source import run_onnx_cpu

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _einsum_model(equation: str, sa: list[int], sb: list[int]) -> onnx.ModelProto:
    node = helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation, name="ein")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, sa),
                      helper.make_tensor_value_info("b", TensorProto.FLOAT, sb)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@st.composite
def matmul_equations(draw):  # type: ignore[no-untyped-def]
    """Random index groups (batch, left free, right free, contracted), shuffled within each
    operand and in the output, with sizes 1..4."""
    counts = [draw(st.integers(0, 2)), draw(st.integers(0, 2)), draw(st.integers(0, 2)),
              draw(st.integers(0, 2))]
    if counts[0] + counts[3] == 0:  # each operand needs an index (no scalar operands)
        counts[draw(st.sampled_from([0, 3]))] = 1
    letters = iter(draw(st.permutations(LETTERS))[:sum(counts)])
    batch, m, n, k = ("".join(next(letters) for _ in range(c)) for c in counts)
    a = "".join(draw(st.permutations(batch + m + k)))
    b = "".join(draw(st.permutations(batch + k + n)))
    out = "".join(draw(st.permutations(batch + m + n)))
    size = {c: draw(st.integers(1, 4)) for c in batch + m + n + k}
    return f"{a},{b}->{out}", [size[c] for c in a], [size[c] for c in b]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=matmul_equations(), seed=st.integers(0, 2**16))
def test_every_matrix_product_equation_matches_onnxruntime_einsum(case, seed, tmp_path_factory):
    equation, sa, sb = case
    tmp = tmp_path_factory.mktemp("ein")
    src = tmp / "a.onnx"
    onnx.save(_einsum_model(equation, sa, sb), str(src))
    model, done = rewrite(onnx.load(str(src)), {"ein"})
    assert set(done) == {"ein"}, equation
    assert "Einsum" not in {n.op_type for n in model.graph.node}
    onnx.save(model, str(tmp / "b.onnx"))
    rng = np.random.default_rng(seed)
    feeds = [{"a": rng.standard_normal(sa).astype(np.float32),
              "b": rng.standard_normal(sb).astype(np.float32)}]
    expected = run_onnx_cpu(src, feeds)[0][0]
    got = run_onnx_cpu(tmp / "b.onnx", feeds)[0][0]
    assert got.shape == expected.shape, equation
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=equation)


@pytest.mark.parametrize("equation,says", [
    ("ii,ij->ij", "repeats index i"), ("ij,jk->i", "sums index k over one operand only"),
    ("ij->ji", "1 operand"), ("...ij,...jk->...ik", "ellipsis"), ("ij,jk", "explicit output"),
    ("ij,jk,kl->il", "3 operand"), ("ij,jk->ikz", "output index z is in no operand")])
def test_other_einsum_forms_are_refused_naming_what_they_do(equation, says):
    with pytest.raises(ValueError, match=says):
        parse(equation)


def test_refused_einsum_is_left_in_place_with_its_reason():
    model = _einsum_model("bij,bjk->bi", [2, 3, 4], [2, 4, 5])
    refused: dict[str, str] = {}
    out, done = rewrite(model, {"ein"}, refused)
    assert done == {} and [n.op_type for n in out.graph.node] == ["Einsum"]
    assert "sums index k over one operand only" in refused["ein"]


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def test_grouped_matmul_einsum_of_issue_19_compiles_on_the_htp(tmp_path):
    """`btgi,gih->btgh` (a grouped linear layer, as the speech-enhancement GRU model has it)
    was refused; it now runs wholly on the HTP and matches onnxruntime."""
    from server.compile.compilers.qnn import QnnCompiler
    from server.compile.gates.operators import check_onnx, deny_list

    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 8, 6)).astype(np.float32)
    node = helper.make_node("Einsum", ["x", "w"], ["y"], equation="btgi,gih->btgh",
                            name="grouped_linear")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 10, 4, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 10, 4, 6])], [onnx.numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    src = _save(model, tmp_path / "ein.onnx")
    assert check_onnx(src, "qnn", deny_list("qnn", "onnx")).passed
    request = CompileRequest(src, SourceFormat.ONNX, (InputSpec("x", (1, 10, 4, 8)),),
                             onnx_path=src)
    (tmp_path / "q").mkdir()
    compiler = QnnCompiler()
    (art,) = compiler.compile(request, tmp_path / "q")
    assert art.extra["htp"]["cpu_nodes"] == []
    assert any("grouped_linear" in r and "MatMul" in r for r in art.extra["htp"]["rewritten"])
    feeds = [{"x": rng.standard_normal((1, 10, 4, 8)).astype(np.float32)}]
    np.testing.assert_allclose(compiler.run(art, feeds)[0][0], run_onnx_cpu(src, feeds)[0][0],
                               rtol=2e-2, atol=2e-2)


def test_einsum_the_htp_cannot_take_and_no_rewrite_covers_is_named(tmp_path):
    from server.compile.compilers.qnn import QnnCompiler

    model = _einsum_model("bij,bjk->bi", [2, 3, 4], [2, 4, 5])
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                 [2, 3]))
    src = _save(model, tmp_path / "ein.onnx")
    request = CompileRequest(src, SourceFormat.ONNX, (InputSpec("a", (2, 3, 4)),
                                                      InputSpec("b", (2, 4, 5))), onnx_path=src)
    (tmp_path / "q").mkdir()
    with pytest.raises(ConversionError) as err:
        QnnCompiler().compile(request, tmp_path / "q")
    assert "ein" in str(err.value) and "sums index k over one operand only" in str(err.value)
