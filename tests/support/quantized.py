"""A small dynamically quantized ONNX model (onnxruntime.quantization.quantize_dynamic), as
PyPI packages ship int8 models: for the quantized-upload tests of the pipeline and the agent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def quantized_conv_upload(tmp: Path, batch: int | str = 1) -> Path:
    """Conv 3→32 (3×3) + ReLU + Conv 32→32, dynamically quantized; `batch` may be a name."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((32, 3, 3, 3)).astype(np.float32) * 0.3
    w2 = rng.standard_normal((32, 32, 3, 3)).astype(np.float32) * 0.1
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 32, 16, 16])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, str(tmp / "fp32.onnx"))
    quantize_dynamic(str(tmp / "fp32.onnx"), str(tmp / "int8.onnx"),
                     weight_type=QuantType.QUInt8)
    return tmp / "int8.onnx"


def quantized_lstm_upload(tmp: Path, hidden: int = 16) -> Path:
    """An LSTM over a dynamic time axis 'T' (x: [T, 1, 8], viewed through a Reshape whose
    size is computed), its initial state built from the input's shape (Shape → Gather →
    Concat → ConstantOfShape) and its output flattened by a Reshape whose shape is computed
    from the LSTM's (as CRNN OCR models export), then a MatMul; dynamically quantized: the
    LSTM becomes com.microsoft DynamicQuantizeLSTM, whose outputs onnx's shape inference
    cannot type."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    inits = {
        "W": rng.standard_normal((1, 4 * hidden, 8)).astype(np.float32) * 0.3,
        "R": rng.standard_normal((1, 4 * hidden, hidden)).astype(np.float32) * 0.3,
        "B": rng.standard_normal((1, 8 * hidden)).astype(np.float32) * 0.1,
        "w2": rng.standard_normal((hidden, 4)).astype(np.float32) * 0.3,
        "one": np.array([1], np.int64), "hid": np.array([hidden], np.int64),
        "eight": np.array([8], np.int64),
        "idx1": np.array(1, np.int64), "idx0": np.array(0, np.int64),
        "axes": np.array([0], np.int64), "minus1": np.array([-1], np.int64)}
    nodes = [
        # x viewed as [T // 1, 1, 8]: a size computed by arithmetic (a Div) that onnx's data
        # propagation does not follow, so every shape after it is unknown until folded
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Gather", ["xs", "idx0"], ["t"]),
        helper.make_node("Div", ["t", "idx1"], ["t_div"]),
        helper.make_node("Unsqueeze", ["t_div", "axes"], ["t1"]),
        helper.make_node("Concat", ["t1", "one", "eight"], ["view_shape"], axis=0),
        helper.make_node("Reshape", ["x", "view_shape"], ["xv"]),
        helper.make_node("Gather", ["xs", "idx1"], ["batch"]),
        helper.make_node("Unsqueeze", ["batch", "axes"], ["batch1"]),
        helper.make_node("Concat", ["one", "batch1", "hid"], ["state_shape"], axis=0),
        helper.make_node("ConstantOfShape", ["state_shape"], ["h0"],
                         value=helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0])),
        helper.make_node("LSTM", ["xv", "W", "R", "B", "", "h0", "h0"], ["Y", "Y_h", "Y_c"],
                         hidden_size=hidden),
        helper.make_node("Shape", ["Y"], ["ys"]),
        helper.make_node("Gather", ["ys", "idx0"], ["steps"]),
        helper.make_node("Unsqueeze", ["steps", "axes"], ["steps1"]),
        helper.make_node("Concat", ["steps1", "minus1"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["Y", "flat_shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w2"], ["y"])]
    graph = helper.make_graph(
        nodes, "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", 1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", 4])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    # Exporters write the inferred shapes, symbolic dims included, as value_info.
    onnx.save(onnx.shape_inference.infer_shapes(model), str(tmp / "fp32.onnx"))
    quantize_dynamic(str(tmp / "fp32.onnx"), str(tmp / "int8.onnx"),
                     weight_type=QuantType.QInt8)
    return tmp / "int8.onnx"
