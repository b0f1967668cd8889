"""Tiny real models for the compile tests, built once per session (exports cost ~1 s each)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from server.compile import InputSpec
from server.compile.heap import frozen_heap
from tests.compile.compile_models import ModelFiles, build_model, onnx_model, torch_models


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def convnet(model_dir: Path) -> ModelFiles:
    conv, _ = torch_models()
    return build_model(model_dir, "convnet", conv, InputSpec("image", (1, 3, 16, 16)), 1)


@pytest.fixture(scope="session")
def transformer(model_dir: Path) -> ModelFiles:
    _, block = torch_models()
    return build_model(model_dir, "block", block, InputSpec("tokens", (1, 16, 32)), 2)


@pytest.fixture(scope="session")
def nms_onnx(model_dir: Path) -> Path:
    """Boxes + scores → NonMaxSuppression: the classic detector tail no NPU runs."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.array([5], np.int64), "max_out"),
             numpy_helper.from_array(np.array([0.5], np.float32), "iou"),
             numpy_helper.from_array(np.array([0.1], np.float32), "score_th")]
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou",
                                                  "score_th"], ["selected"], name="nms_tail")
    return onnx_model(
        model_dir / "nms.onnx", [node],
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 8, 4]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, 8])],
        [helper.make_tensor_value_info("selected", TensorProto.INT64, ["n", 3])], inits)


@pytest.fixture(scope="session")
def dynamic_onnx(model_dir: Path) -> Path:
    """A Relu whose input has a symbolic batch axis."""
    from onnx import TensorProto, helper

    return onnx_model(
        model_dir / "dynamic.onnx", [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])


@pytest.fixture(autouse=True)
def _no_qai_hub_network(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Point qai-hub at an empty config location unless a live test asks for the real one."""
    if os.environ.get("MODELFLEET_LIVE_QAI_HUB") != "1":
        monkeypatch.setenv("QAIHUB_CLIENT_INI", str(tmp_path / "no-client.ini"))


@pytest.fixture(autouse=True)
def _frozen_heap() -> Iterator[None]:
    """Each test's ct.convert calls (each ends in a full gc.collect()) walk only what the test
    allocated, not the ~340k objects torch, coremltools and onnx loaded (server/compile/heap.py)."""
    with frozen_heap():
        yield
