"""Job-queue fixtures: a migrated database, settings, tokens, and an upload helper that goes
through the real registry API. Model files come from tests/compile/compile_models.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.compile import InputSpec
from tests.compile.compile_models import ModelFiles, build_model, onnx_model, torch_models


@pytest.fixture(scope="session")
def convnet_files(tmp_path_factory: pytest.TempPathFactory) -> ModelFiles:
    conv, _ = torch_models()
    return build_model(tmp_path_factory.mktemp("jobmodels"), "convnet", conv,
                       InputSpec("image", (1, 3, 16, 16)), 1)


@pytest.fixture(scope="session")
def transformer_files(tmp_path_factory: pytest.TempPathFactory) -> ModelFiles:
    _, block = torch_models()
    return build_model(tmp_path_factory.mktemp("jobmodels"), "block", block,
                       InputSpec("tokens", (1, 16, 32)), 2)


@pytest.fixture(scope="session")
def nms_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from onnx import TensorProto, helper

    node = helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["sel"], name="nms_tail")
    return onnx_model(
        tmp_path_factory.mktemp("nms") / "nms.onnx", [node],
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 8, 4]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, 8])],
        [helper.make_tensor_value_info("sel", TensorProto.INT64, [4, 3])])
