"""QNN HTP coverage: rewrites of rejected nodes, named CPU nodes with the HTP share, and the
`min_htp_share` policy — all through onnxruntime-qnn's offline HTP backend."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from server.compile import CompileRequest, ConversionError, InputSpec, SourceFormat
from server.compile.compilers.qnn import QnnCompiler
from server.compile.qnn_prep import rewrite
from server.compile.source import run_onnx_cpu

F, B, I64 = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64


def _save(path: Path, nodes: list, inputs: dict[str, tuple[int, list[int]]],
          outputs: dict[str, tuple[int, list[int]]], inits: dict[str, np.ndarray] | None = None,
          opset: int = 20) -> Path:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(k, t, s) for k, (t, s) in inputs.items()],
        [helper.make_tensor_value_info(k, t, s) for k, (t, s) in outputs.items()],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _mask_graph(path: Path) -> Path:
    """What torch's exporter writes for a BERT attention mask and a causal mask, plus Erf:
    int64 mask → bool → GatherND (constant indices) → Where; Trilu; x·erf(x)."""
    idx = np.stack([np.zeros(8, np.int64), np.arange(8)], -1).reshape(1, 1, 1, 8, 2)
    nodes = [
        helper.make_node("Cast", ["mask"], ["mb"], to=B, name="to_bool"),
        helper.make_node("GatherND", ["mb", "idx"], ["m4"], name="mask_gather"),
        helper.make_node("Where", ["m4", "x", "neg"], ["xm"], name="apply_mask"),
        helper.make_node("Trilu", ["xm"], ["xt"], upper=0, name="causal"),
        helper.make_node("Erf", ["xt"], ["e"], name="erf"),
        helper.make_node("Mul", ["xt", "e"], ["y"], name="out"),
    ]
    return _save(path, nodes, {"x": (F, [1, 1, 8, 8]), "mask": (I64, [1, 8])},
                 {"y": (F, [1, 1, 8, 8])},
                 {"idx": idx, "neg": np.array(-3.0, np.float32)})


def _feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    mask = np.ones((1, 8), np.int64)
    mask[0, 6:] = 0
    return {"x": rng.standard_normal((1, 1, 8, 8)).astype(np.float32) * 2, "mask": mask}


@pytest.mark.parametrize("op,attrs", [("Erf", {}), ("Gelu", {}),
                                      ("Gelu", {"approximate": "tanh"}),
                                      ("Trilu", {"upper": 1})])
def test_rewritten_node_matches_onnxruntime(op, attrs, tmp_path):
    src = _save(tmp_path / "a.onnx", [helper.make_node(op, ["x"], ["y"], name="n", **attrs)],
                {"x": (F, [2, 16, 16])}, {"y": (F, [2, 16, 16])})
    model, done = rewrite(onnx.load(str(src)), {"n"})
    assert set(done) == {"n"} and op not in {n.op_type for n in model.graph.node}
    onnx.save(model, str(tmp_path / "b.onnx"))
    feeds = [{"x": np.linspace(-5, 5, 512, dtype=np.float32).reshape(2, 16, 16)}]
    expected = run_onnx_cpu(src, feeds)[0][0]
    got = run_onnx_cpu(tmp_path / "b.onnx", feeds)[0][0]
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_bool_gathernd_rewrite_matches_onnxruntime(tmp_path):
    src = _mask_graph(tmp_path / "a.onnx")
    model, done = rewrite(onnx.load(str(src)), {"mask_gather"})
    assert "Gather" in done["mask_gather"]
    onnx.save(model, str(tmp_path / "b.onnx"))
    feeds = [_feeds()]
    np.testing.assert_array_equal(run_onnx_cpu(tmp_path / "b.onnx", feeds)[0][0],
                                  run_onnx_cpu(src, feeds)[0][0])


def _request(path: Path, inputs: tuple[InputSpec, ...], **qnn: object) -> CompileRequest:
    return CompileRequest(path, SourceFormat.ONNX, inputs, onnx_path=path,
                          settings={"qnn": {"precision": "fp16", **qnn}})


MASK_INPUTS = (InputSpec("x", (1, 1, 8, 8)), InputSpec("mask", (1, 8), "int64"))


def test_masked_erf_graph_runs_whole_on_the_htp_after_rewrites(tmp_path):
    """Bool GatherND, Trilu and Erf are rejected by the HTP as exported; rewritten, the whole
    graph compiles for the HTP and matches onnxruntime's CPU result."""
    src = _mask_graph(tmp_path / "mask.onnx")
    compiler = QnnCompiler()
    [art] = compiler.compile(_request(src, MASK_INPUTS), tmp_path)
    htp = art.extra["htp"]
    assert htp["cpu_nodes"] == [] and htp["node_share"] == 1.0
    rewritten = " ".join(art.notes)
    assert all(n in rewritten for n in ("mask_gather", "causal", "erf"))
    feeds = [_feeds()]
    got = compiler.run(art, feeds)[0][0]
    np.testing.assert_allclose(got, run_onnx_cpu(src, feeds)[0][0], atol=2e-2)


def _hardmax_graph(path: Path) -> Path:
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Hardmax", ["r"], ["h"], name="pick_max"),
             helper.make_node("Add", ["h", "r"], ["y"], name="add")]
    return _save(path, nodes, {"x": (F, [4, 16])}, {"y": (F, [4, 16])})


def test_node_the_htp_rejects_is_named_with_the_htp_share_and_fails_by_default(tmp_path):
    src = _hardmax_graph(tmp_path / "h.onnx")
    with pytest.raises(ConversionError) as err:
        QnnCompiler().compile(_request(src, (InputSpec("x", (4, 16)),)), tmp_path)
    msg = str(err.value)
    assert "Hardmax node 'pick_max'" in msg and "66.7% of nodes (2/3)" in msg
    assert "min_htp_share" in msg
    assert err.value.operators == ["Hardmax"]
    assert err.value.nodes[0]["node"] == "pick_max" and err.value.nodes[0]["why"]


def test_min_htp_share_accepts_partial_offload_at_or_above_the_share_only(tmp_path):
    src = _hardmax_graph(tmp_path / "h.onnx")
    with pytest.raises(ConversionError, match=r"below min_htp_share 0\.9"):
        QnnCompiler().compile(_request(src, (InputSpec("x", (4, 16)),), min_htp_share=0.9),
                              tmp_path)
    compiler = QnnCompiler()
    [art] = compiler.compile(_request(src, (InputSpec("x", (4, 16)),), min_htp_share="0.6"),
                             tmp_path)
    assert art.extra["htp"]["cpu_nodes"][0]["node"] == "pick_max"
    assert any("partial offload accepted" in n for n in art.notes)
    feeds = [{"x": np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)}]
    np.testing.assert_allclose(compiler.run(art, feeds)[0][0],
                               run_onnx_cpu(src, feeds)[0][0], atol=1e-2)


def test_support_gate_predicts_the_qnn_compile_before_compiling(tmp_path):
    """The gate names the node the compile would fail on, accepts what the compile accepts
    (partial offload by policy, rewritable nodes), from the same HTP probe."""
    from server.compile.gates.support import check_support

    hardmax = _hardmax_graph(tmp_path / "h.onnx")
    x = (InputSpec("x", (4, 16)),)
    rejected = check_support(_request(hardmax, x), "qnn")
    assert rejected is not None and not rejected.passed
    assert [(f.name, f.where) for f in rejected.findings] == [("Hardmax", "pick_max")]
    assert "66.7% of nodes" in rejected.advice and "min_htp_share" in rejected.advice
    accepted = check_support(_request(hardmax, x, min_htp_share=0.6), "qnn")
    assert accepted is not None and accepted.passed
    masked = check_support(_request(_mask_graph(tmp_path / "m.onnx"), MASK_INPUTS), "qnn")
    assert masked is not None and masked.passed, masked.summary()


def test_int64_constant_outside_int32_is_refused_by_name(tmp_path):
    """The HTP computes int64 in 32 bits: a constant that does not fit would change meaning
    silently, so the build names it; Slice's INT64_MAX "to the end" stays allowed."""
    nodes = [helper.make_node("Add", ["ids", "offset"], ["shifted"], name="shift_ids"),
             helper.make_node("Slice", ["shifted", "start", "end"], ["cut"], name="to_end"),
             helper.make_node("Cast", ["cut"], ["y"], to=F, name="as_float")]
    src = _save(tmp_path / "wide.onnx", nodes, {"ids": (I64, [1, 8])}, {"y": (F, [1, 8])},
                {"offset": np.array([2**40], np.int64), "start": np.array([0], np.int64),
                 "end": np.array([2**63 - 1], np.int64)})
    with pytest.raises(ConversionError) as err:
        QnnCompiler().compile(_request(src, (InputSpec("ids", (1, 8), "int64"),)), tmp_path)
    assert "offset (input of Add node 'shift_ids')" in str(err.value)
    assert "end" not in [n["why"].split()[2] for n in err.value.nodes]
