"""Fixtures of the kill tests: the backends (SQLite with the local blob directory, PostgreSQL
with S3 over HTTP on the moto server) and one fork server per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults.harness import ForkServer


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Any]:
    """(database URL, S3 bucket or None for the local blob directory)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'mf.db'}", None
    return request.getfixturevalue("postgres_url"), request.getfixturevalue("s3_bucket")


@pytest.fixture(scope="session")
def forker() -> Iterator[ForkServer]:
    server = ForkServer()
    yield server
    server.close()
