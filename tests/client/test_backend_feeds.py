"""What an app hands `ModelRuntime.predict` for a scalar reaches onnxruntime as the array
the input takes (client_sdk/backends.py `OrtBackend.feeds`), with a real session."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from client_sdk.backends import OrtBackend
from client_sdk.errors import BackendError


def _backend(tmp_path: Path) -> OrtBackend:
    """y = x * sr + t: x float32[1, 2], sr int64 scalar (cast), t float32[1]."""
    graph = helper.make_graph(
        [helper.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["x", "srf"], ["xs"]),
         helper.make_node("Add", ["xs", "t"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, []),
         helper.make_tensor_value_info("t", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "m.onnx"))
    return OrtBackend("onnxruntime-cpu", ort.InferenceSession(
        str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]))


def test_python_scalars_and_one_element_arrays_are_fed_as_the_inputs_take_them(
        tmp_path: Path) -> None:
    backend = _backend(tmp_path)
    x = np.array([[1.0, 2.0]], np.float32)
    # Before: "Unable to handle object of type <class 'int'>", and a 0-d `t` for the
    # float32[1] input was refused for its rank.
    out = backend.run({"x": x, "sr": 3, "t": np.float32(0.5)})  # type: ignore[dict-item]
    np.testing.assert_array_equal(out["y"], [[3.5, 6.5]])
    fed = backend.feeds({"x": x, "sr": 3, "t": np.array(0.5, np.float32)})
    assert fed["sr"].dtype == np.int64 and fed["sr"].shape == ()
    assert fed["t"].shape == (1,)


def test_a_wrong_shape_is_still_onnxruntimes_error(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="x"):
        _backend(tmp_path).run({"x": np.ones((1, 3), np.float32), "sr": np.array(1),
                                "t": np.ones(1, np.float32)})
