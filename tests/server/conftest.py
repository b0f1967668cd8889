"""Server fixtures: a migrated database (SQLite and PostgreSQL, built with `alembic upgrade
head`), settings under a temp data dir, the app, an HTTP client and token helpers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from server.app import create_app
from server.auth import create_token
from server.db.migrate import upgrade
from server.db.session import make_engine, make_session_factory
from server.jobs.interface import NullJobQueue
from server.settings import Settings
from tests.server.server_testdata import make_onnx_bytes


@pytest.fixture
def migrated_db_url(database_url: str) -> str:
    """An empty database (SQLite, then PostgreSQL) upgraded to the migrations' head."""
    upgrade(database_url)
    return database_url


@pytest.fixture
def settings(migrated_db_url: str, tmp_path: Path) -> Settings:
    return Settings(
        env="development",
        data_dir=tmp_path / "data",
        database_url=migrated_db_url,
        max_model_bytes=2 * 1024 * 1024,
        max_npz_bytes=512 * 1024,
        token_pepper="test-pepper-0123456789",
    )


@pytest.fixture
def session_factory(settings: Settings) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(settings.resolved_database_url)
    try:
        yield make_session_factory(engine)
    finally:
        engine.dispose()


@pytest.fixture
def job_queue() -> NullJobQueue:
    return NullJobQueue()


@pytest.fixture
def client(settings: Settings, job_queue: NullJobQueue) -> Iterator[TestClient]:
    app = create_app(settings, job_queue=job_queue)
    with TestClient(app) as c:
        yield c


@pytest.fixture
def make_token(session_factory: sessionmaker[Session], settings: Settings) -> Callable[..., str]:
    """make_token("publish", "rollout") -> a bearer token secret with those scopes."""

    def make(*scopes: str, name: str = "test") -> str:
        with session_factory() as session:
            _row, secret = create_token(session, list(scopes), name=name,
                                        pepper=settings.token_pepper)
            session.commit()
        return secret

    return make


@pytest.fixture
def publish_headers(make_token: Callable[..., str]) -> dict[str, str]:
    return {"Authorization": f"Bearer {make_token('publish')}"}



@pytest.fixture(scope="session")
def onnx_bytes() -> bytes:
    return make_onnx_bytes()


@pytest.fixture(scope="session")
def torch_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Real .pt2 (torch.export.save) and TorchScript (torch.jit.save) files."""
    import torch

    class Double(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    d = tmp_path_factory.mktemp("torch")
    example = (torch.zeros(1, 3, 8, 8),)
    torch.export.save(torch.export.export(Double(), example), d / "m.pt2")
    torch.jit.save(torch.jit.trace(Double(), example), d / "m.ts")
    return {"pt2": (d / "m.pt2").read_bytes(), "torchscript": (d / "m.ts").read_bytes()}
