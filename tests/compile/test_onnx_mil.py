"""ONNX → MIL (server/compile/onnx_mil) per operator, each against onnxruntime.

Every check converts an ONNX graph to a MIL program, `ct.convert`s it to an .mlpackage as the
Core ML compile does, runs that package with the MIL reference executor and compares with
onnxruntime on the same inputs. The single-op graphs are the shapes exporters emit
(tests/compile/onnx_op_cases.py); the attribute spaces of the trickier ops are drawn with
hypothesis (tests/compile/test_onnx_mil_space.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from server.compile import CompileRequest, ConversionError, InputSpec, SourceFormat
from server.compile.compilers.coreml import CoreMLCompiler
from server.compile.onnx_mil import claimed_ops, convert_model
from server.compile.onnx_mil.conformance import execute_onnx
from tests.compile.onnx_op_cases import CASES, OpCase


def ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as rt

    sess = rt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in sess.run(None, feeds)]


def assert_matches_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                               rtol: float = 1e-4, atol: float = 1e-5) -> None:
    want = ort(model, feeds)
    got = execute_onnx(model, feeds)
    assert len(got) == len(want)
    for w, g in zip(want, got, strict=True):
        assert g.shape == w.shape
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g.astype(np.int64), w.astype(np.int64))
        else:
            np.testing.assert_allclose(g.astype(np.float64), w, rtol=rtol, atol=atol,
                                       equal_nan=True)


def mil_ops(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> list[str]:
    import coremltools as ct

    prog = convert_model(model, shapes, ct.target.iOS17)
    return [op.op_type for op in prog.functions["main"].operations]


def graph(nodes: list[onnx.NodeProto], inputs: dict[str, np.ndarray],
          inits: dict[str, np.ndarray] | None = None, opset: int = 18,
          n_out: int = 1) -> onnx.ModelProto:
    types = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64,
             np.dtype(np.bool_): TensorProto.BOOL}
    outs = [o for o in nodes[-1].output][:n_out]
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(k, types[v.dtype], list(v.shape))
                     for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_operator_case_matches_onnxruntime_through_mil(case: OpCase) -> None:
    model, feeds = case.build()
    onnx.checker.check_model(model)
    assert_matches_onnxruntime(model, feeds)


def test_prelu_becomes_mil_prelu_not_mask_indexing() -> None:
    """The torch detour turned PRelu into non_zero; the direct rule emits prelu."""
    model = graph([helper.make_node("PRelu", ["x", "slope"], ["y"])], {"x": rand(1, 3, 8, 8)},
                  {"slope": np.array([0.1, 0.2, 0.3], np.float32).reshape(3, 1, 1)})
    ops = mil_ops(model, {"x": (1, 3, 8, 8)})
    assert "prelu" in ops and "non_zero" not in ops
    assert_matches_onnxruntime(model, {"x": rand(1, 3, 8, 8)})


def test_max_min_become_maximum_minimum_with_broadcasting() -> None:
    nodes = [helper.make_node("Max", ["a", "b", "c"], ["m"]),
             helper.make_node("Min", ["m", "a"], ["y"])]
    model = graph(nodes, {"a": rand(2, 1, 5), "b": rand(3, 1, seed=1)},
                  {"c": np.float32(0.1).reshape(())})
    ops = mil_ops(model, {"a": (2, 1, 5), "b": (3, 1)})
    assert {"maximum", "minimum"} <= set(ops) and "tile" not in ops
    assert_matches_onnxruntime(model, {"a": rand(2, 1, 5), "b": rand(3, 1, seed=1)})


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceSum", "ReduceMean", "ReduceL2"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_a_reduction_over_all_axes_after_a_transpose_converts(op: str, keepdims: int) -> None:
    """No `axes`: the reduction is over every axis. coremltools' reduce_transposes pass
    reads the axes of each reduction after a transpose (it raised KeyError: 'axes')."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
             helper.make_node(op, ["t"], ["r"], keepdims=keepdims),
             helper.make_node("Div", ["t", "r"], ["y"])]
    model = graph(nodes, {"x": rand(1, 4, 6)})
    assert_matches_onnxruntime(model, {"x": rand(1, 4, 6)})


@pytest.mark.parametrize("mode", ["reflect", "edge", "constant", "wrap"])
def test_one_dimensional_pad_of_a_signal(mode: str) -> None:
    """tf2onnx audio front ends pad the time axis of a [batch, samples] signal."""
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)
    model = graph([node], {"x": rand(2, 32)}, {"pads": np.array([0, 5, 0, 7], np.int64)})
    assert_matches_onnxruntime(model, {"x": rand(2, 32)})


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum_over_each_axis_exclusive_and_reverse(axis: int, exclusive: int,
                                                     reverse: int) -> None:
    """The torch detour got CumSum on axis 0 wrong (cosine 0.78)."""
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive,
                            reverse=reverse)
    model = graph([node], {"x": rand(4, 5, 3)}, {"axis": np.array(axis, np.int64)}, opset=14)
    assert_matches_onnxruntime(model, {"x": rand(4, 5, 3)})


def test_layer_normalization_with_mean_and_inv_std_dev_outputs() -> None:
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y", "mean", "isd"],
                            axis=-1, epsilon=1e-5)
    model = graph([node], {"x": rand(2, 4, 16)},
                  {"g": rand(16, seed=1), "b": rand(16, seed=2)}, opset=17, n_out=3)
    assert_matches_onnxruntime(model, {"x": rand(2, 4, 16)})


def test_einsum_grouped_matmul_and_log_where_leaky_relu() -> None:
    nodes = [helper.make_node("Einsum", ["x", "w"], ["e"], equation="btgi,gih->btgh"),
             helper.make_node("LeakyRelu", ["e"], ["l"], alpha=0.2),
             helper.make_node("Abs", ["l"], ["a"]),
             helper.make_node("Log", ["a"], ["g"]),
             helper.make_node("Greater", ["e", "zero"], ["pos"]),
             helper.make_node("Where", ["pos", "g", "e"], ["y"])]
    model = graph(nodes, {"x": rand(1, 6, 2, 4)},
                  {"w": rand(2, 4, 3, seed=1), "zero": np.zeros((), np.float32)}, opset=12)
    assert_matches_onnxruntime(model, {"x": rand(1, 6, 2, 4)})


def test_shape_arithmetic_folds_to_a_static_reshape() -> None:
    """Shape → Gather → Concat → Reshape, as exporters write a flatten of dynamic batch."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
             helper.make_node("Unsqueeze", ["b", "axes"], ["b1"]),
             helper.make_node("Concat", ["b1", "minus1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"])]
    inits = {"zero": np.array(0, np.int64), "axes": np.array([0], np.int64),
             "minus1": np.array([-1], np.int64)}
    model = graph(nodes, {"x": rand(2, 3, 4)}, inits, opset=13)
    assert mil_ops(model, {"x": (2, 3, 4)}).count("reshape") == 1
    assert_matches_onnxruntime(model, {"x": rand(2, 3, 4)})


def test_constant_of_shape_and_range_fold_from_static_shapes() -> None:
    """TorchScript exports build masks with Shape → ConstantOfShape and positions with Range."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["z"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [2.0])),
             helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
             helper.make_node("Range", ["zero_i", "n", "one"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["z", "rf"], ["t"]),
             helper.make_node("Mul", ["t", "x"], ["y"])]
    inits = {"one": np.array(1, np.int64), "zero_i": np.array(0, np.int64)}
    model = graph(nodes, {"x": rand(2, 4)}, inits, opset=13)
    assert mil_ops(model, {"x": (2, 4)}).count("mul") == 1
    assert_matches_onnxruntime(model, {"x": rand(2, 4)})


def _if_model(cond_from_shape: bool) -> onnx.ModelProto:
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    if cond_from_shape:  # "if the input has 8 samples": fixed once the shape is declared
        nodes = [helper.make_node("Size", ["x"], ["n"]),
                 helper.make_node("Equal", ["n", "eight"], ["c"])]
    else:  # depends on the values
        nodes = [helper.make_node("ReduceSum", ["x"], ["n"], keepdims=0),
                 helper.make_node("Greater", ["n", "zero"], ["c"])]
    nodes.append(helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then,
                                  else_branch=other))
    return graph(nodes, {"x": rand(2, 4)}, {"eight": np.array(8, np.int64),
                                            "zero": np.zeros((), np.float32)}, opset=13)


def test_if_whose_condition_folds_is_inlined() -> None:
    model = _if_model(cond_from_shape=True)
    assert "relu" in mil_ops(model, {"x": (2, 4)})
    assert_matches_onnxruntime(model, {"x": rand(2, 4)})


def test_if_on_a_declared_shape_builds_for_core_ml_through_the_pipeline(tmp_path: Path
                                                                      ) -> None:
    from server.compile import BuildSpec, Pipeline

    path = tmp_path / "if.onnx"
    onnx.save(_if_model(cond_from_shape=True), str(path))
    np.savez(tmp_path / "ref.npz", x=np.stack([rand(2, 4, seed=s) for s in range(2)]))
    spec = BuildSpec(path, SourceFormat.ONNX, {"default": (InputSpec("x", (2, 4)),)},
                     platforms=("coreml",), reference_path=tmp_path / "ref.npz")
    (out,) = Pipeline().build(spec, tmp_path / "build")
    assert out.state == "ready", out.error
    assert out.gates["numeric"]["status"] == "passed"
    assert "cond" not in out.gates["operators"][-1]["operators"]


def test_if_on_input_values_is_refused_naming_the_node() -> None:
    with pytest.raises(ConversionError) as err:
        mil_ops(_if_model(cond_from_shape=False), {"x": (2, 4)})
    assert err.value.nodes[0]["node"] == "branch" and err.value.operators == ["If"]
    assert "depends on the model's input values" in str(err.value)


def _unclaimed(tmp_path: Path) -> Path:
    node = helper.make_node("DFT", ["x"], ["y"], name="spectrum", onesided=1)
    ok = helper.make_node("Relu", ["y"], ["z"], name="fine")
    model = graph([node, ok], {"x": rand(1, 16, 1)}, opset=17)
    onnx.save(model, str(tmp_path / "dft.onnx"))
    return tmp_path / "dft.onnx"


def test_node_without_rule_is_named_with_op_opset_and_advice_for_onnx(tmp_path: Path) -> None:
    assert "DFT" not in claimed_ops()
    with pytest.raises(ConversionError) as err:
        CoreMLCompiler().compile(CompileRequest(_unclaimed(tmp_path), SourceFormat.ONNX,
                                                (InputSpec("x", (1, 16, 1)),)), tmp_path)
    text = str(err.value)
    assert err.value.operators == ["DFT"] and err.value.nodes[0]["node"] == "spectrum"
    assert "opset 17" in text and "exclude the coreml platform" in text
    assert "ExportedProgram" not in text  # advice an ONNX uploader can follow


def test_support_gate_names_the_node_the_conversion_refuses(tmp_path: Path) -> None:
    from server.compile.gates.support import check_support

    request = CompileRequest(_unclaimed(tmp_path), SourceFormat.ONNX,
                             (InputSpec("x", (1, 16, 1)),))
    report = check_support(request, "coreml")
    assert report is not None and not report.passed
    assert [(f.name, f.where) for f in report.findings] == [("DFT", "spectrum")]
    assert "ExportedProgram" not in report.advice


def test_refused_attribute_names_node_and_reason() -> None:
    node = helper.make_node("LSTM", ["x", "w", "r"], ["y"], name="coupled", hidden_size=4,
                            input_forget=1)
    model = graph([node], {"x": rand(5, 1, 3)}, {"w": rand(1, 16, 3), "r": rand(1, 16, 4)},
                  opset=14)
    with pytest.raises(ConversionError) as err:
        mil_ops(model, {"x": (5, 1, 3)})
    assert "coupled" in str(err.value) and "input_forget" in str(err.value)
    assert err.value.operators == ["LSTM"]


def test_dilated_average_pool_is_computed_tap_by_tap() -> None:
    """Refused on the torch detour; by definition here (a strided slice per kernel tap)."""
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], dilations=[2, 2],
                            pads=[1, 1, 1, 1], count_include_pad=0)
    model = graph([node], {"x": rand(1, 2, 9, 9)}, opset=19)
    assert_matches_onnxruntime(model, {"x": rand(1, 2, 9, 9)})


def _centering_upload(tmp_path: Path) -> tuple[Path, Path]:
    """x − mean(x) then a Conv: an upload whose numbers hinge on Sub."""
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
             helper.make_node("Sub", ["x", "m"], ["c"], name="center"),
             helper.make_node("Conv", ["c", "w"], ["y"], pads=[1, 1, 1, 1])]
    model = graph(nodes, {"x": rand(1, 3, 8, 8)},
                  {"axes": np.array([2, 3], np.int64), "w": rand(4, 3, 3, 3, seed=1)})
    path = tmp_path / "center.onnx"
    onnx.save(model, str(path))
    ref = tmp_path / "ref.npz"
    np.savez(ref, x=np.stack([rand(1, 3, 8, 8, seed=s) + 1 for s in range(2)]))
    return path, ref


def test_core_ml_numeric_gate_catches_a_wrong_conversion_rule(tmp_path: Path, monkeypatch
                                                              ) -> None:
    """Registering Sub as add (a converter bug) must fail the Core ML build's numeric gate,
    which runs the built package's MIL program through the reference executor."""
    from server.compile import BuildSpec, Pipeline
    from server.compile.onnx_mil import ops_math, registry

    path, ref = _centering_upload(tmp_path)
    spec = BuildSpec(path, SourceFormat.ONNX, {"default": (InputSpec("x", (1, 3, 8, 8)),)},
                     platforms=("coreml",), reference_path=ref)
    (good,) = Pipeline().build(spec, tmp_path / "good")
    assert good.state == "ready", good.error
    assert good.gates["numeric"]["status"] == "passed"

    def sub_as_add(ctx):  # type: ignore[no-untyped-def]
        x, y = ops_math._pair(ctx)
        return [ops_math.mb.add(x=x, y=y, name=ctx.name())]

    registry.rule_for("Sub", 18)  # rules loaded before the swap
    monkeypatch.setitem(registry._RULES, "Sub", [registry.Rule("Sub", 1, 28, sub_as_add)])
    (bad,) = Pipeline().build(spec, tmp_path / "bad")
    assert bad.state == "failed" and bad.artifact is None
    assert bad.gates["numeric"]["status"] == "failed"
    assert bad.gates["numeric"]["runner"].startswith("mil reference executor")
    assert "numeric gate failed" in bad.error


def test_inputs_named_like_tensorflow_or_a_mil_keyword_feed_the_core_ml_gate(
        tmp_path: Path) -> None:
    """tf2onnx names inputs 'serving_default_input:0'; Silero's recurrent input is 'state',
    a word coremltools renames. The numeric gate feeds the package from the source's names
    (before: "feed 'serving_default_input_0' missing", "feed 'state_workaround' missing")."""
    from server.compile import BuildSpec, Pipeline

    graph = helper.make_graph(
        [helper.make_node("Add", ["serving_default_input:0", "state"], ["_out"])], "g",
        [helper.make_tensor_value_info("serving_default_input:0", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("_out", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "m.onnx"))
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "ref.npz", **{n: rng.standard_normal((2, 1, 4)).astype(np.float32)
                                      for n in ("serving_default_input:0", "state")})
    specs = (InputSpec("serving_default_input:0", (1, 4)), InputSpec("state", (1, 4)))
    (o,) = Pipeline().build(BuildSpec(tmp_path / "m.onnx", SourceFormat.ONNX,
                                      {"default": specs}, platforms=("coreml",),
                                      reference_path=tmp_path / "ref.npz"), tmp_path / "w")
    assert o.state == "ready", o.error
    assert o.gates["numeric"]["status"] == "passed"


def _tied_head(perm: list[int]) -> onnx.ModelProto:
    """GPT-2's tied LM head: Gather(E, ids) → MatMul(·, Transpose(E)); E is square here so
    that an identity `perm` gives the same shapes."""
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["h"], axis=0),
             helper.make_node("Transpose", ["emb"], ["emb_t"], perm=perm),
             helper.make_node("MatMul", ["h", "emb_t"], ["logits"])]
    return graph(nodes, {"ids": np.array([[1, 5, 7]], np.int64)},
                 {"emb": rand(64, 64, seed=3)}, opset=17)


@pytest.mark.parametrize("perm", [[1, 0], [0, 1]])
def test_tied_embedding_is_stored_once_and_matches_onnxruntime(tmp_path: Path,
                                                                perm: list[int]) -> None:
    model = _tied_head(perm)
    feeds = {"ids": np.array([[1, 5, 7]], np.int64)}
    assert_matches_onnxruntime(model, feeds, rtol=1e-3, atol=1e-3)
    onnx.save(model, str(tmp_path / "m.onnx"))
    spec = (InputSpec("ids", (1, 3), "int64"),)
    (art,) = CoreMLCompiler().compile(CompileRequest(
        tmp_path / "m.onnx", SourceFormat.ONNX, spec, onnx_path=tmp_path / "m.onnx",
        settings={"coreml": {"precision": "fp32"}}), tmp_path)
    weights = (art.path / "Data/com.apple.CoreML/weights/weight.bin").stat().st_size
    # One 64x64 FP32 table (16 kB) and a blob header; a transposed copy would double it. (An
    # identity perm is no transpose: that MatMul reads E itself, and numerics must match.)
    assert 64 * 64 * 4 <= weights < 2 * 64 * 64 * 4


@pytest.mark.parametrize("policy", ["not_smaller", "not_larger"])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("shape,sizes", [((1, 1, 2, 4), [1, 3]), ((1, 2, 5, 3), [7, 8]),
                                         ((1, 1, 6, 9), [4, 5])])
def test_resize_keep_aspect_ratio_rounds_the_size_half_up_and_samples_at_the_ratio(
        policy: str, mode: str, shape: tuple[int, ...], sizes: list[int]) -> None:
    """Before: the map was asked at the common ratio alone, whose size floors — 1 row short of
    ONNX's round-half-up size (test_resize_downsample_sizes_nearest_not_smaller)."""
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode=mode, axes=[2, 3],
                            keep_aspect_ratio_policy=policy)
    model = graph([node], {"x": rand(*shape)}, {"sizes": np.array(sizes, np.int64)})
    assert_matches_onnxruntime(model, {"x": rand(*shape)})
