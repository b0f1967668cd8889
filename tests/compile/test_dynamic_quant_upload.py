"""A dynamically quantized upload (onnxruntime.quantization.quantize_dynamic; ddddocr ships
its OCR model so) is refused by name with what to upload instead, before specialization
would blame "sizes that depend on tensor values" on its contrib ops."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from server.compile import InputSpec
from server.compile.errors import InvalidSourceError
from server.compile.shapes import specialize_file


def _fp32_model(path: Path) -> Path:
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
         helper.make_node("Flatten", ["c"], ["f"], name="flat"),
         helper.make_node("MatMul", ["f", "m"], ["y"], name="fc")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(rng.standard_normal((4, 1, 3, 3)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal((256, 10)).astype(np.float32), "m")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_dynamically_quantized_upload_is_refused_naming_its_ops_and_the_fp32_fix(
        tmp_path: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src = _fp32_model(tmp_path / "fp32.onnx")
    quantize_dynamic(str(src), str(tmp_path / "int8.onnx"), weight_type=QuantType.QUInt8,
                     op_types_to_quantize=["Conv", "MatMul"])
    ops = {n.op_type for n in onnx.load(str(tmp_path / "int8.onnx")).graph.node}
    assert {"ConvInteger", "MatMulInteger", "DynamicQuantizeLinear"} <= ops
    with pytest.raises(InvalidSourceError) as err:
        specialize_file(tmp_path / "int8.onnx", (InputSpec("x", (1, 1, 8, 8)),),
                        tmp_path / "out.onnx")
    msg = str(err.value)
    assert msg.startswith("the upload is dynamically quantized (")
    assert "ConvInteger, DynamicQuantizeLinear, MatMulInteger" in msg
    assert "Upload the FP32 model it was quantized from" in msg
    assert "tensor values" not in msg
    # The FP32 model it came from specializes as any upload does.
    assert specialize_file(src, (InputSpec("x", (1, 1, 8, 8)),), tmp_path / "ok.onnx")
