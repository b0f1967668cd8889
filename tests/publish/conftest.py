"""Publishing fixtures: a migrated database (SQLite and PostgreSQL), real signing keys, a local
blob store, a publisher with an injected clock, and ready model versions with real blobs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

import manifests
from server.blobstore import LocalBlobStore
from server.db.migrate import upgrade
from server.db.session import make_engine, make_session_factory
from server.publish.keys import KeyPaths
from server.publish.publisher import Publisher
from server.publish.signer import LocalKeySigner
from tests.support.clock import NOW, Clock
from tests.support.server_keys import init_test_keys
from tests.support.versions import add_version


@pytest.fixture
def key_paths(tmp_path: Path) -> KeyPaths:
    return init_test_keys(tmp_path / "data", now=NOW, keys_dir=tmp_path / "data" / "keys")


@pytest.fixture
def root(key_paths: KeyPaths) -> manifests.Root:
    return manifests.load_trusted_root(key_paths.root_path(1).read_bytes())


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def blob_store(tmp_path: Path) -> LocalBlobStore:
    return LocalBlobStore(tmp_path / "blobs")


@pytest.fixture
def pub(blob_store: LocalBlobStore, key_paths: KeyPaths, clock: Clock) -> Publisher:
    return Publisher(blob_store=blob_store,
                     signer=LocalKeySigner(key_paths.release_key_path),
                     base_url="http://mf.test", lifetime_seconds=86_400, clock=clock,
                     content_keys=None)


@pytest.fixture
def make_version(factory: sessionmaker[Session], blob_store: LocalBlobStore
                 ) -> Callable[..., dict[str, str]]:
    """make_version("clf", "1.0", platforms=("android",), state="ready") -> {platform: sha}."""
    return version_maker(factory, blob_store)


@pytest.fixture
def make_version_factory(pub: Publisher, blob_store: LocalBlobStore
                         ) -> Iterator[Callable[..., Any]]:
    """For tests that pick their database: url -> (session factory, publisher, make_version)."""
    engines = []

    def make(url: str):  # type: ignore[no-untyped-def]
        upgrade(url)
        engine = make_engine(url, pool_size=10)
        engines.append(engine)
        factory = make_session_factory(engine)
        return factory, pub, version_maker(factory, blob_store)

    yield make
    for engine in engines:
        engine.dispose()


def version_maker(factory: sessionmaker[Session], blob_store: LocalBlobStore
                  ) -> Callable[..., dict[str, str]]:
    def make(model: str, version: str, platforms: tuple[str, ...] = ("android", "ios"),
             state: str = "ready") -> dict[str, str]:
        artifacts = {p: f"{model}-{version}-{p}".encode() * 100 for p in platforms}
        return add_version(factory, blob_store, model, version, artifacts, state=state,
                           target={"runtime": "ort"}, compile_settings={"fp16": True})[1]

    return make
