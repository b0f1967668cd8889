"""A version's state changes in one place (server/db/versions.py) and follows its builds."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from server.db import versions
from server.db.migrate import upgrade
from server.db.models import Build, BuildState, Model, ModelVersion, VersionState
from server.db.session import make_engine, make_session_factory

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def factory(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade(url)
    engine = make_engine(url)
    yield make_session_factory(engine)
    engine.dispose()


def _version(factory: sessionmaker[Session], *build_states: BuildState) -> int:
    with factory() as s:
        model = Model(name="m")
        s.add(model)
        s.flush()
        v = ModelVersion(model_id=model.id, version="1.0.0", metadata_json={},
                         source_format="onnx", state=VersionState.uploaded)
        s.add(v)
        s.flush()
        for i, st in enumerate(build_states):
            s.add(Build(version_id=v.id, platform="onnx", variant=f"v{i}", state=st,
                        error="boom" if st is BuildState.failed else ""))
        s.commit()
        return v.id


def _state(factory: sessionmaker[Session], version_id: int) -> tuple[VersionState, str]:
    with factory() as s:
        v = s.get(ModelVersion, version_id)
        assert v is not None
        return v.state, v.error


def _settle(factory: sessionmaker[Session], version_id: int) -> None:
    with factory() as s:
        versions.settle(s, version_id)
        s.commit()


def test_version_waits_while_a_build_is_queued_or_running(factory) -> None:
    vid = _version(factory, BuildState.succeeded, BuildState.running)
    _settle(factory, vid)
    assert _state(factory, vid) == (VersionState.uploaded, "")


def test_version_is_ready_when_every_build_succeeded(factory) -> None:
    vid = _version(factory, BuildState.succeeded, BuildState.succeeded)
    _settle(factory, vid)
    assert _state(factory, vid) == (VersionState.ready, "")


def test_version_fails_with_its_builds_errors_and_compiles_again_after_a_retry(factory) -> None:
    vid = _version(factory, BuildState.succeeded, BuildState.failed)
    _settle(factory, vid)
    assert _state(factory, vid) == (VersionState.failed, "onnx/v1: boom")
    with factory() as s:
        versions.begin_compiling(s, vid)
        s.commit()
    assert _state(factory, vid) == (VersionState.compiling, "")


def test_a_ready_version_is_never_reopened(factory) -> None:
    vid = _version(factory, BuildState.succeeded)
    _settle(factory, vid)
    with factory() as s:
        versions.begin_compiling(s, vid)
        s.commit()
    assert _state(factory, vid) == (VersionState.ready, "")


def test_no_other_server_module_changes_a_version_state() -> None:
    changes = re.compile(r"\.transition\(\s*VersionState\.|\.state\s*=\s*VersionState\.")
    owner = ROOT / "server" / "db" / "versions.py"
    bad = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "server").rglob("*.py"))
           if p != owner
           for n, line in enumerate(p.read_text().splitlines(), 1) if changes.search(line)]
    assert bad == [], f"version state changed outside server/db/versions.py: {bad}"
