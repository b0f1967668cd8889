"""Job-queue fixtures: a migrated database, settings, tokens, and an upload helper that goes
through the real registry API. Model files come from tests/compile/compile_models.py."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "compile"))

from compile_models import ModelFiles, build_model, onnx_model, torch_models

from server.compile import InputSpec
from server.db.migrate import upgrade
from server.settings import Settings


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


def make_settings(database_url: str, data_dir: Path, **kw: Any) -> Settings:
    upgrade(database_url)
    return Settings(env="development", data_dir=data_dir, database_url=database_url, **kw)


def publish_token(settings: Settings) -> str:
    from server.auth import create_token
    from server.db.session import make_engine, make_session_factory

    engine = make_engine(settings.resolved_database_url)
    try:
        with make_session_factory(engine)() as s:
            _row, secret = create_token(s, ["publish"], name="jobs-test")
            s.commit()
    finally:
        engine.dispose()
    return secret


def uploader(client: Any, token: str) -> Callable[..., dict[str, Any]]:
    """upload("m", "1.0.0", model_path, inputs, platforms, reference=…) -> version JSON."""
    headers = {"Authorization": f"Bearer {token}"}

    def upload(model: str, version: str, path: Path, inputs: list[dict[str, Any]],
               platforms: Any, *, reference: Path | None = None,
               calibration: Path | None = None) -> dict[str, Any]:
        r = client.post("/v1/models", json={"name": model}, headers=headers)
        assert r.status_code in (200, 201), r.text
        files: dict[str, Any] = {"model": (path.name, path.read_bytes())}
        if reference is not None:
            files["reference"] = (reference.name, reference.read_bytes())
        if calibration is not None:
            files["calibration"] = (calibration.name, calibration.read_bytes())
        meta = {"version": version, "platforms": platforms, "inputs": inputs}
        r = client.post(f"/v1/models/{model}/versions", files=files,
                        data={"metadata": json.dumps(meta)}, headers=headers)
        assert r.status_code == 201, r.text
        return dict(r.json())

    return upload
