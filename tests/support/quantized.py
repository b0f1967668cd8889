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
