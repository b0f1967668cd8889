"""Helpers for the job-queue tests (a uniquely named module: several test folders have a
conftest.py, and `from conftest import …` would pick whichever was imported first)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from server.db.migrate import upgrade
from server.settings import Settings


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


def procrastinate_jobs(database_url: str, task_name: str, arg: str) -> list[tuple[str, str]]:
    """(the job's argument `arg`, its status) of every procrastinate job of `task_name`, in
    the order they were deferred (successful ones are deleted by the workers)."""
    import psycopg

    dsn = database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn) as conn:
        return [(r[0], r[1]) for r in conn.execute(
            "SELECT args->>%s, status FROM procrastinate_jobs WHERE task_name = %s ORDER BY id",
            (arg, task_name)).fetchall()]
