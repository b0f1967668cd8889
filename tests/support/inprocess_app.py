"""The real server app in process (SQLite, local blob store, signing keys, in-process build
queue running the real compile pipeline), with a token of the given scopes."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from server.app import create_app
from server.auth import create_token
from server.db.migrate import upgrade
from server.settings import Settings
from tests.support.server_keys import init_test_keys


@contextmanager
def inprocess_app(tmp_path: Path, scopes: Sequence[str] = ("publish", "rollout")
                  ) -> Iterator[TestClient]:
    url = f"sqlite:///{tmp_path / 'server.db'}"
    upgrade(url)
    data = tmp_path / "data"
    init_test_keys(data, root_keys=2)
    settings = Settings(env="development", data_dir=data, database_url=url,
                        manifest_lifetime_seconds=86_400)
    with TestClient(create_app(settings), base_url="http://testserver") as client:
        with client.app.state.session_factory() as s:  # type: ignore[attr-defined]
            _, secret = create_token(s, list(scopes), name="release-engineer")
            s.commit()
        client.headers["Authorization"] = f"Bearer {secret}"
        yield client


def wait_settled(client: TestClient, model: str, version: str, timeout_s: float = 1800
                 ) -> dict[str, Any]:
    """The version once its builds finished (ready or failed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        body: dict[str, Any] = client.get(f"/v1/models/{model}/versions/{version}").json()
        if body["state"] in ("ready", "failed") or time.monotonic() > deadline:
            return body
        time.sleep(0.25)
