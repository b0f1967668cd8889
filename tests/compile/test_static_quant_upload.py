"""A statically quantized upload (onnxruntime.quantization.quantize_static, QDQ and QOperator
formats) is rewritten to the FP32 graph its integer weights stand for
(server/compile/dequantize_static.py) and builds on every platform.

Weights on the quantization grid (integer steps of 2^-6 spanning ±127 steps in every
channel) quantize without loss, so the rewrite of their quantized graph must compute what
the FP32 graph computes, whatever the activations' scales: checked for each operator rule,
both formats, per tensor and per channel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from server.compile import BuildSpec, InputSpec, Pipeline, SourceFormat
from server.compile.dequantize import dequantize, quantized_nodes
from server.compile.errors import InvalidSourceError
from server.compile.source import run_onnx_cpu

F = TensorProto.FLOAT


def _grid(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """±127 steps of 2^-6 in every slice along axis 0 and along the last axis."""
    k = rng.integers(-126, 127, size=shape)
    flat = k.reshape(shape[0], -1)
    flat[:, 0], flat[:, 1] = 127, -127
    last = k.reshape(-1, shape[-1])
    last[0, :], last[1, :] = 127, -127
    return (k * 2.0 ** -6).astype(np.float32)


def _model(nodes: list, shape: tuple[int, ...], inits: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, list(shape))],
                              [helper.make_tensor_value_info("y", F, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def _conv(name: str, x: str, out: str, rng: np.random.Generator, inits: dict) -> object:
    inits[name] = _grid((4, 4, 3, 3), rng)
    return helper.make_node("Conv", [x, name], [out], pads=[1, 1, 1, 1])


def _case(op: str, rng: np.random.Generator) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    inits: dict[str, np.ndarray] = {}
    if op == "matmul":
        inits["w"] = _grid((16, 8), rng)
        return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], (3, 16), inits), (3, 16)
    if op == "gemm":
        inits["w"] = _grid((8, 16), rng)
        return _model([helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)], (3, 16),
                      inits), (3, 16)
    shape = (1, 4, 8, 8)
    first = _conv("w1", "x", "c", rng, inits)
    if op == "relu6":
        inits["zero"], inits["six"] = np.array(0, np.float32), np.array(6, np.float32)
    def second() -> object:
        return _conv("w2", "x", "d", rng, inits)

    tail = {
        "conv": lambda: [helper.make_node("Identity", ["c"], ["y"])],
        # the exporter folds the ReLU into the quantized range (zero point at qmin): the
        # rewrite must keep it as that range's clip
        "relu": lambda: [helper.make_node("Relu", ["c"], ["r"]),
                         _conv("w2", "r", "y", rng, inits)],
        # (last: a conv after it would see the clip saturate differently on the scaled
        # calibration inputs, so its own range would not cover the test's input)
        "relu6": lambda: [helper.make_node("Clip", ["c", "zero", "six"], ["y"])],
        "add": lambda: [second(), helper.make_node("Add", ["c", "d"], ["y"])],
        "mul": lambda: [second(), helper.make_node("Mul", ["c", "d"], ["y"])],
        "concat": lambda: [second(), helper.make_node("Concat", ["c", "d"], ["y"], axis=1)],
        "sigmoid": lambda: [helper.make_node("Sigmoid", ["c"], ["y"])],
        "leaky_relu": lambda: [helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.1)],
        "average_pool": lambda: [helper.make_node("AveragePool", ["c"], ["y"],
                                                  kernel_shape=[2, 2], strides=[2, 2])],
        "global_average_pool": lambda: [helper.make_node("GlobalAveragePool", ["c"], ["y"])],
        "max_pool": lambda: [helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2],
                                              strides=[2, 2])],
    }[op]()
    return _model([first, *tail], shape, inits), shape


OPS = ["conv", "relu", "relu6", "matmul", "gemm", "add", "mul", "concat", "sigmoid", "leaky_relu",
       "average_pool", "global_average_pool", "max_pool"]


def _quantize(model: onnx.ModelProto, tmp: Path, fmt: str, per_channel: bool,
              shape: tuple[int, ...], rng: np.random.Generator,
              also: list[dict[str, np.ndarray]] = ()) -> Path:  # type: ignore[assignment]
    """quantize_static calibrated on random inputs and `also` (the test's own inputs, made
    larger so that their activations lie inside the quantized ranges, whose ends move by up
    to half a step when the zero point is rounded: beyond them the upload saturates, and so
    does the rewrite)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([*({k: v * np.float32(1.25) for k, v in f.items()} for f in also),
                               *({"x": rng.standard_normal(shape).astype(np.float32)}
                                 for _ in range(4))])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    onnx.save(model, str(tmp / "fp32.onnx"))
    quantize_static(str(tmp / "fp32.onnx"), str(tmp / "int8.onnx"), Reader(),
                    quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
                    per_channel=per_channel)
    assert quantized_nodes(onnx.load(str(tmp / "int8.onnx"))), "nothing was quantized"
    return tmp / "int8.onnx"


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
@pytest.mark.parametrize("op", OPS)
@settings(max_examples=3, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(per_channel=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_each_rule_computes_the_fp32_graph_of_grid_weights(
        op: str, fmt: str, per_channel: bool, seed: int, tmp_path: Path) -> None:
    rng = np.random.default_rng(seed)
    model, shape = _case(op, rng)
    feed = [{"x": rng.standard_normal(shape).astype(np.float32)}]
    upload = _quantize(model, tmp_path, fmt, per_channel, shape, rng, feed)
    rewritten = onnx.load(str(upload))
    report = dequantize(rewritten)
    assert report is not None and not quantized_nodes(rewritten)
    onnx.checker.check_model(rewritten)
    onnx.save(rewritten, str(tmp_path / "again.onnx"))
    (want,) = run_onnx_cpu(tmp_path / "fp32.onnx", feed)[0]
    (got,) = run_onnx_cpu(tmp_path / "again.onnx", feed)[0]
    (upload_out,) = run_onnx_cpu(upload, feed)[0]
    scale = float(np.max(np.abs(want)))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * scale)
    # The upload itself rounds (and clips) its activations: the rewrite's exact agreement is
    # not the upload's own.
    assert float(np.max(np.abs(upload_out - want))) > 1e-4 * scale


def test_a_dequantize_of_an_integer_graph_input_is_refused_by_name() -> None:
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq_input")], "g",
        [helper.make_tensor_value_info("q", TensorProto.UINT8, [1, 4])],
        [helper.make_tensor_value_info("y", F, [1, 4])],
        [numpy_helper.from_array(np.array(0.1, np.float32), "s"),
         numpy_helper.from_array(np.array(128, np.uint8), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InvalidSourceError) as err:
        dequantize(model)
    assert "DequantizeLinear 'dq_input' reads 'q'" in str(err.value)
    assert str(err.value).startswith("the upload is statically quantized (")


def test_an_op_without_a_rule_on_a_quantized_tensor_is_refused_by_name() -> None:
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("Pad", ["q", "pads", "z"], ["p"], name="pad_q"),
             helper.make_node("DequantizeLinear", ["p", "s", "z"], ["y"])]
    model = _model(nodes, (1, 4), {"s": np.array(0.1, np.float32),
                                   "z": np.array(128, np.uint8),
                                   "pads": np.array([0, 1, 0, 1], np.int64)})
    with pytest.raises(InvalidSourceError, match="Pad 'pad_q' reads the quantized tensor 'q'"):
        dequantize(model)


def test_a_quantized_graph_output_is_refused_not_made_float() -> None:
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], name="q_out")]
    model = _model(nodes, (1, 4), {"s": np.array(0.1, np.float32),
                                   "z": np.array(128, np.uint8)})
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.UINT8
    with pytest.raises(InvalidSourceError, match="graph output 'y' is a quantized tensor"):
        dequantize(model)


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_a_statically_quantized_upload_builds_on_every_platform(fmt: str,
                                                                tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    model, shape = _case("add", rng)
    upload = _quantize(model, tmp_path, fmt, False, shape, rng)
    np.savez(tmp_path / "ref.npz", x=rng.standard_normal((2, *shape)).astype(np.float32))
    spec = BuildSpec(upload, SourceFormat.ONNX, {"default": (InputSpec("x", shape),)},
                     platforms=("onnx", "coreml", "qnn"), reference_path=tmp_path / "ref.npz")
    out = {o.platform: o for o in Pipeline().build(spec, tmp_path / "work")}
    assert {p: o.error for p, o in out.items() if o.state != "ready"} == {}
    for o in out.values():
        assert o.gates["numeric"]["status"] == "passed", o.gates["numeric"]
        assert o.notes[0].startswith("statically quantized upload (")
        assert o.gates["dequantized"]["upload_vs_fp32"]


def test_a_rewrite_that_departs_from_the_upload_builds_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The safety net under every rule: were a rule wrong (here the range clip is taken out,
    as the first version of the rewrite had it, so the fused ReLU is lost), the rewrite no
    longer computes what the upload does, and the build stops instead of shipping it."""
    from server.compile import dequantize_static

    monkeypatch.setattr(dequantize_static.StaticRewrite, "_saturate",
                        lambda self, helper, node, x, out, scale, zero: [
                            helper.make_node("Identity", [x], [out])])
    rng = np.random.default_rng(4)
    model, shape = _case("relu", rng)
    feed = {"x": rng.standard_normal(shape).astype(np.float32)}
    upload = _quantize(model, tmp_path, "qdq", False, shape, rng, [feed])
    np.savez(tmp_path / "ref.npz", x=np.stack([feed["x"]] * 2))
    spec = BuildSpec(upload, SourceFormat.ONNX, {"default": (InputSpec("x", shape),)},
                     platforms=("onnx", "coreml"), reference_path=tmp_path / "ref.npz")
    out = Pipeline().build(spec, tmp_path / "work")
    assert [o.state for o in out] == ["failed", "failed"]
    assert all("departs from the upload itself" in o.error for o in out)
    (row,) = out[0].gates["dequantized"]["upload_vs_fp32"]
    assert row["cosine"] < 0.9
