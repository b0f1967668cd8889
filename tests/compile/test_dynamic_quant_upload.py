"""A dynamically quantized upload (onnxruntime.quantization.quantize_dynamic; ddddocr ships
its OCR model so) is rewritten to the FP32 graph its int8 weights stand for
(server/compile/dequantize.py) and builds on every platform.

The rewrite is checked against onnxruntime's own integer kernels: a single quantized op fed
an input on the 8-bit grid (integers times a step, 0 and 255 among them) has no activation
rounding, so the upload's output is exact and the rewrite must reproduce it, over the
quantizer's settings (weight type, per channel, reduced range) and each op's attributes. An
LSTM requantizes its hidden state at every step, so its rewrite is checked against the FP32
LSTM whose weights sit on the quantization grid (quantizing them loses nothing)."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from server.compile import BuildSpec, InputSpec, Pipeline, SourceFormat
from server.compile.dequantize import dequantize, quantized_nodes
from server.compile.errors import InvalidSourceError
from server.compile.shapes import specialize_file
from server.compile.source import run_onnx_cpu

F = TensorProto.FLOAT
STEP = 2.0 ** -8  # the input grid: k · STEP, k in 0..255, so the run-time scale is STEP


def _model(nodes: list, x: tuple[int, ...], inits: dict[str, np.ndarray],
           out_shape: object = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, list(x))],
                              [helper.make_tensor_value_info("y", F, out_shape)],
                              [numpy_helper.from_array(v.astype(np.float32) if v.dtype.kind
                                                       == "f" else v, k)
                               for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _quantized(model: onnx.ModelProto, tmp: Path, **options: object) -> Path:
    from onnxruntime.quantization import quantize_dynamic

    onnx.save(model, str(tmp / "fp32.onnx"))
    quantize_dynamic(str(tmp / "fp32.onnx"), str(tmp / "int8.onnx"), **options)  # type: ignore[arg-type]
    assert quantized_nodes(onnx.load(str(tmp / "int8.onnx"))), "nothing was quantized"
    return tmp / "int8.onnx"


def _rewritten(path: Path, tmp: Path) -> Path:
    model = onnx.load(str(path))
    assert dequantize(model) is not None
    onnx.checker.check_model(model)
    onnx.shape_inference.infer_shapes(model, strict_mode=True)  # the types agree
    assert not quantized_nodes(model)
    onnx.save(model, str(tmp / "fp32_again.onnx"))
    return tmp / "fp32_again.onnx"


def _grid_input(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    k = rng.integers(0, 256, size=shape)
    k.reshape(-1)[:2] = (0, 255)
    return (k * STEP).astype(np.float32)


def _vnni() -> bool:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    return platform.machine() not in ("x86_64", "AMD64") or \
        any(f in flags.split() for f in ("avx512_vnni", "avx_vnni"))


def _options(data: st.DataObject) -> dict[str, object]:
    from onnxruntime.quantization import QuantType

    options = {"weight_type": data.draw(st.sampled_from([QuantType.QInt8, QuantType.QUInt8])),
               "per_channel": data.draw(st.booleans()),
               "reduce_range": data.draw(st.booleans())}
    # onnxruntime's u8·s8 kernel on x86 without VNNI (AVX2 vpmaddubsw) saturates pairs of
    # products at int16, as its docs warn ("use reduce_range"): there its own result is off
    # (0.57 of 4.03 once, on this machine) and the exact rewrite cannot match it.
    assume(_vnni() or options["weight_type"] != QuantType.QInt8 or options["reduce_range"])
    return options


def _assert_same(a: np.ndarray, b: np.ndarray) -> None:
    scale = float(np.max(np.abs(a))) or 1.0
    assert a.shape == b.shape
    np.testing.assert_allclose(b, a, rtol=0, atol=2e-5 * scale)


def _conv(data: st.DataObject, rng: np.random.Generator) -> tuple[onnx.ModelProto, tuple]:
    group = data.draw(st.sampled_from([1, 2]), label="group")
    k = data.draw(st.sampled_from([1, 3]), label="kernel")
    stride = data.draw(st.sampled_from([1, 2]), label="stride")
    dilation = data.draw(st.sampled_from([1, 2]), label="dilation")
    pad = data.draw(st.sampled_from([0, 1]), label="pad")
    bias = data.draw(st.booleans(), label="bias")
    inits = {"w": rng.standard_normal((4, 4 // group, k, k))}
    if bias:
        inits["b"] = rng.standard_normal(4)
    node = helper.make_node("Conv", ["x", "w", *(["b"] if bias else [])], ["y"], group=group,
                            kernel_shape=[k, k], strides=[stride] * 2,
                            dilations=[dilation] * 2, pads=[pad] * 4)
    return _model([node], (1, 4, 9, 9), inits), (1, 4, 9, 9)


def _matmul(data: st.DataObject, rng: np.random.Generator) -> tuple[onnx.ModelProto, tuple]:
    x = data.draw(st.sampled_from([(3, 16), (2, 3, 16)]), label="activation shape")
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], x,
                  {"w": rng.standard_normal((16, 8))}), x


def _gemm(data: st.DataObject, rng: np.random.Generator) -> tuple[onnx.ModelProto, tuple]:
    trans_b = data.draw(st.sampled_from([0, 1]), label="transB")
    bias = data.draw(st.booleans(), label="bias")
    inits = {"w": rng.standard_normal((8, 16) if trans_b else (16, 8))}
    if bias:
        inits["c"] = rng.standard_normal(8)
    node = helper.make_node("Gemm", ["x", "w", *(["c"] if bias else [])], ["y"],
                            transB=trans_b)
    return _model([node], (3, 16), inits), (3, 16)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_conv_matmul_and_gemm_rewrites_match_onnxruntimes_integer_kernels(
        data: st.DataObject, tmp_path: Path) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16), label="seed"))
    build = data.draw(st.sampled_from([_conv, _matmul, _gemm]), label="op")
    model, shape = build(data, rng)
    upload = _quantized(model, tmp_path, **_options(data))
    feed = [{"x": _grid_input(shape, rng)}]
    (expected,) = run_onnx_cpu(upload, feed)[0]
    (got,) = run_onnx_cpu(_rewritten(upload, tmp_path), feed)[0]
    _assert_same(expected, got)


def _on_grid(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """LSTM weights that quantize without loss: integer steps of 2^-6 spanning ±127 steps in
    every gate row (per-channel scales are per row of [4·hidden, in]). onnxruntime quantizes
    LSTM weights to symmetric int8 whatever `weight_type` says."""
    lo, hi = -127, 127
    k = rng.integers(lo, hi + 1, size=shape)
    k[..., 0], k[..., 1] = lo, hi
    return (k * 2.0 ** -6).astype(np.float32)


@settings(max_examples=16, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_dynamically_quantized_lstm_is_the_fp32_lstm_of_its_weights(
        data: st.DataObject, tmp_path: Path) -> None:
    from onnxruntime.quantization import QuantType

    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16), label="seed"))
    direction = data.draw(st.sampled_from(["forward", "reverse", "bidirectional"]))
    dirs = 2 if direction == "bidirectional" else 1
    weight_type = data.draw(st.sampled_from([QuantType.QInt8, QuantType.QUInt8]))
    hidden, size = 4, 6
    inits = {"W": _on_grid((dirs, 4 * hidden, size), rng),
             "R": _on_grid((dirs, 4 * hidden, hidden), rng)}
    if data.draw(st.booleans(), label="bias"):
        inits["B"] = rng.standard_normal((dirs, 8 * hidden))
    node = helper.make_node("LSTM", ["x", "W", "R", *(["B"] if "B" in inits else [])],
                            ["y"], hidden_size=hidden, direction=direction)
    model = _model([node], (5, 1, size), inits)
    upload = _quantized(model, tmp_path, weight_type=weight_type,
                        per_channel=data.draw(st.booleans(), label="per channel"))
    assert {n.op_type for n in onnx.load(str(upload)).graph.node} == {"DynamicQuantizeLSTM"}
    feed = [{"x": rng.standard_normal((5, 1, size)).astype(np.float32)}]
    (expected,) = run_onnx_cpu(tmp_path / "fp32.onnx", feed)[0]
    (got,) = run_onnx_cpu(_rewritten(upload, tmp_path), feed)[0]
    _assert_same(expected, got)


def _legacy_conv(tmp: Path, rng: np.random.Generator) -> Path:
    """A ConvInteger as older quantize_dynamic wrote it (ddddocr's OCR model): the bias
    quantized at run time, `Floor(b / (x_scale · w_scale))` cast to int32 and added to the
    integer sum, then one `Mul` by the scale product."""
    w = rng.integers(-127, 128, size=(4, 2, 3, 3)).astype(np.int8)
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("Mul", ["xs", "ws"], ["s1"]),
        helper.make_node("Div", ["b", "s1"], ["bq_f"]),
        helper.make_node("Floor", ["bq_f"], ["bq_r"]),
        helper.make_node("Cast", ["bq_r"], ["bq"], to=TensorProto.INT32),
        helper.make_node("ConvInteger", ["xq", "wq", "xz", "wz"], ["c"], pads=[1, 1, 1, 1],
                         name="conv_quant"),
        helper.make_node("Reshape", ["bq", "bshape"], ["br"]),
        helper.make_node("Add", ["c", "br"], ["cb"]),
        helper.make_node("Cast", ["cb"], ["cf"], to=F),
        helper.make_node("Mul", ["xs", "ws"], ["s2"]),
        helper.make_node("Mul", ["cf", "s2"], ["y"]),
    ]
    model = _model(nodes, (1, 2, 6, 6), {
        "wq": w, "wz": np.array(0, np.int8), "ws": np.array(0.02, np.float32),
        "b": rng.standard_normal(4).astype(np.float32), "bshape": np.array([1, 4, 1, 1])},
        out_shape=[1, 4, 6, 6])
    onnx.save(model, str(tmp / "legacy.onnx"))
    return tmp / "legacy.onnx"


def test_the_run_time_quantized_bias_of_older_exports_keeps_its_value(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    upload = _legacy_conv(tmp_path, rng)
    x = _grid_input((1, 2, 6, 6), rng)
    (expected,) = run_onnx_cpu(upload, [{"x": x}])[0]
    rewritten = _rewritten(upload, tmp_path)
    assert not {"Floor", "Cast"} & {n.op_type for n in onnx.load(str(rewritten)).graph.node}
    (got,) = run_onnx_cpu(rewritten, [{"x": x}])[0]
    # The upload floors the bias in steps of x_scale · w_scale (STEP · 0.02); the rewrite adds
    # it exactly. Rounding it in steps of w_scale alone (x_scale read as 1) would be 256×
    # coarser and fail this.
    assert np.max(np.abs(got - expected)) <= STEP * 0.02 * 1.001


def test_qattention_is_refused_by_name_with_the_fp32_fix(tmp_path: Path) -> None:
    node = helper.make_node("QAttention", ["x", "w", "b", "xs", "ws"], ["y"],
                            domain="com.microsoft", num_heads=2, name="attn_quant")
    model = _model([node], (1, 4, 8), {"w": np.zeros((8, 24), np.int8),
                                       "b": np.zeros(24, np.float32),
                                       "xs": np.array(1.0, np.float32),
                                       "ws": np.array(1.0, np.float32)})
    with pytest.raises(InvalidSourceError) as err:
        dequantize(model)
    msg = str(err.value)
    assert "QAttention 'attn_quant' has no FP32 rewrite here" in msg
    assert "Upload the FP32 model it was quantized from" in msg


def test_an_integer_operand_from_a_graph_input_is_refused_by_name(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [2, 3])],
        [numpy_helper.from_array(np.ones((4, 3), np.uint8), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InvalidSourceError, match="MatMulInteger 'mm' reads integer tensor 'a'"):
        dequantize(model)


@pytest.mark.parametrize("zero,scale", [
    (np.array(3, np.int8), np.array(0.1, np.float32)),  # int8 zero point, uint8 weight
    (np.zeros(5, np.uint8), np.full(5, 0.1, np.float32)),  # 5 columns' worth for 3
])
def test_a_zero_point_or_scale_that_does_not_fit_its_weight_is_refused_by_name(
        zero: np.ndarray, scale: np.ndarray) -> None:
    """onnx's reference DequantizeLinear reads every weight: a zero point of another type
    than the weight, or one per channel the weight lacks, is refused, never broadcast."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    nodes = [helper.make_node("DynamicQuantizeMatMul", ["x", "w", "ws", "wz"], ["y"],
                              domain="com.microsoft", name="dqmm")]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, [2, 3])], [
        numpy_helper.from_array(np.ones((4, 3), np.uint8), "w"),
        numpy_helper.from_array(scale, "ws"), numpy_helper.from_array(zero, "wz")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(InvalidSourceError, match="DynamicQuantizeMatMul 'dqmm': its weight, "
                                                 "scale and zero point do not fit"):
        dequantize(model)


def test_specialization_alone_refuses_a_quantized_graph_naming_the_rewrite(
        tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    model, shape = _conv_fixed(rng)
    upload = _quantized(model, tmp_path)
    with pytest.raises(InvalidSourceError) as err:
        specialize_file(upload, (InputSpec("x", shape),), tmp_path / "out.onnx")
    assert "rewrite it to FP32 first" in str(err.value)
    assert "tensor values" not in str(err.value)


def _conv_fixed(rng: np.random.Generator) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("MatMul", ["f", "m"], ["y"], name="fc")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F, ["batch", 2, 8, 8])],
        [helper.make_tensor_value_info("y", F, ["batch", 10])],
        [numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
         numpy_helper.from_array((rng.standard_normal((256, 10)) / 16).astype(np.float32),
                                 "m")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model, (1, 2, 8, 8)


def test_a_dynamically_quantized_upload_builds_on_every_platform_and_reports_the_rewrite(
        tmp_path: Path) -> None:
    from onnxruntime.quantization import QuantType

    rng = np.random.default_rng(1)
    model, shape = _conv_fixed(rng)
    upload = _quantized(model, tmp_path, weight_type=QuantType.QUInt8)
    np.savez(tmp_path / "ref.npz", x=rng.random((2, *shape)).astype(np.float32))
    spec = BuildSpec(upload, SourceFormat.ONNX, {"default": (InputSpec("x", shape),)},
                     platforms=("onnx", "coreml", "qnn"), reference_path=tmp_path / "ref.npz")
    out = {o.platform: o for o in Pipeline().build(spec, tmp_path / "work")}
    assert {p: o.error for p, o in out.items() if o.state != "ready"} == {}
    for o in out.values():
        assert o.gates["numeric"]["status"] == "passed", o.gates["numeric"]
        gate = o.gates["dequantized"]
        assert gate["ops"] == {"ConvInteger": 1, "DynamicQuantizeLinear": 2,
                               "MatMulInteger": 1}
        (row,) = gate["upload_vs_fp32"]
        # The upload's own 8-bit activation rounding, measured against its FP32 rewrite.
        assert 0.99 < row["cosine"] < 1.0 and 15 < row["snr_db"] < 80
        assert o.notes[0].startswith("dynamically quantized upload (1 ConvInteger")
    # The CPU artifact is the upload's own int8 graph (tests/compile/test_quantized_upload.py).
    assert (out["onnx"].precision, out["onnx"].variant) == ("int8", "int8")
    shipped = onnx.load(str(out["onnx"].artifact.path))  # type: ignore[union-attr]
    assert quantized_nodes(shipped)
