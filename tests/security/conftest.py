"""The embedded default as an attacker meets it: SQLite + local blobs + the in-process compile
worker, a real key set under DATA_DIR/keys, and a `publish` token (what the attacker holds)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.publish.keys import KeyPaths, init_keys
from tests.compile.compile_models import ModelFiles, build_model, torch_models


@dataclass
class Embedded:
    client: TestClient
    token: str
    data_dir: Path
    key_path: Path

    @property
    def seed_hex(self) -> str:
        return str(json.loads(self.key_path.read_text())["seed_hex"])

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def upload(self, model: str, path: Path, inputs: list[dict[str, Any]], *,
               version: str = "1.0.0", platforms: Any = ("onnx",),
               **npz: Path) -> Any:
        r = self.client.post("/v1/models", json={"name": model}, headers=self.headers())
        assert r.status_code in (200, 201), r.text
        files: dict[str, Any] = {"model": (path.name, path.read_bytes())}
        files.update({k: (p.name, p.open("rb")) for k, p in npz.items()})
        meta = {"version": version, "platforms": list(platforms), "inputs": inputs}
        return self.client.post(f"/v1/models/{model}/versions", files=files,
                                data={"metadata": json.dumps(meta)}, headers=self.headers())

    def settle(self, model: str, version: str = "1.0.0", timeout_s: float = 300) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.client.get(f"/v1/models/{model}/versions/{version}").json()["state"]
            if state in ("ready", "failed"):
                return str(state)
            time.sleep(0.5)
        raise AssertionError(f"{model} {version} still {state} after {timeout_s}s")


@pytest.fixture(scope="session")
def convnet_files(tmp_path_factory: pytest.TempPathFactory) -> ModelFiles:
    from server.compile import InputSpec

    conv, _ = torch_models()
    return build_model(tmp_path_factory.mktemp("secmodels"), "convnet", conv,
                       InputSpec("image", (1, 3, 16, 16)), 1)


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[Embedded]:
    from server.app import create_app
    from server.auth import create_token
    from server.db.migrate import upgrade
    from server.db.session import make_engine, make_session_factory
    from server.settings import Settings

    data = tmp_path / "data"
    paths = KeyPaths.for_data_dir(data)
    init_keys(paths, now=int(time.time()), root_keys=1, threshold=1)
    settings = Settings(env="development", data_dir=data, token_pepper="security-pepper-0123")
    upgrade(settings.resolved_database_url)
    engine = make_engine(settings.resolved_database_url)
    with make_session_factory(engine)() as s:
        _row, token = create_token(s, ["publish"], name="attacker",
                                   pepper=settings.token_pepper)
        s.commit()
    engine.dispose()
    with TestClient(create_app(settings)) as client:
        yield Embedded(client, token, data, paths.release_key_path)


def all_api_text(e: Embedded, model: str, version: str = "1.0.0") -> str:
    """Every response a client (with or without a token) can get about the version."""
    base = f"/v1/models/{model}/versions/{version}"
    texts = []
    for path in (base, f"{base}/builds", f"{base}/builds?logs=true", f"/v1/models/{model}",
                 f"/v1/models/{model}/versions"):
        for headers in ({}, e.headers()):
            texts.append(e.client.get(path, headers=headers).text)
    return "\n".join(texts)
