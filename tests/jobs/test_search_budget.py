"""The precision search's budget is the version's (issue 22), shared among its builds as they
start: builds of one version, started and finished in any order, together get no more than
the version's `search_budget_seconds`, and a build's savings go to the ones still to run."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from server.db.migrate import upgrade
from server.db.models import Build, BuildState, Model, ModelVersion, VersionState
from server.db.session import make_engine, make_session_factory
from server.jobs.search_budget import version_share, with_share

AUTO = {"precision": "auto", "search_budget_seconds": "90"}


@pytest.fixture
def factory(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade(url)
    engine = make_engine(url)
    yield make_session_factory(engine)
    engine.dispose()


def _builds(s: Session, settings: list[dict[str, Any]]) -> list[Build]:
    model = Model(name="m")
    s.add(model)
    s.flush()
    v = ModelVersion(model_id=model.id, version="1.0.0", metadata_json={},
                     source_format="onnx", state=VersionState.compiling)
    s.add(v)
    s.flush()
    rows = [Build(version_id=v.id, platform=f"p{i}", variant="default",
                  state=BuildState.queued, compile_settings=cs)
            for i, cs in enumerate(settings)]
    s.add_all(rows)
    s.flush()
    return rows


def _finish(build: Build, spent: float) -> None:
    build.state = BuildState.succeeded
    build.gates_report = {"outcomes": [{"gates": {"precision_search": {
        "spent_seconds": spent / 2}}}, {"gates": {"precision_search": {
            "spent_seconds": spent}}}]}  # cumulative over targets: the last is the total


def test_builds_of_one_version_share_its_budget_and_inherit_savings(factory):
    with factory() as s:
        a, b, c, onnx = _builds(s, [AUTO, AUTO, AUTO, {"precision": "fp16"}])
        assert version_share(s, onnx) is None  # not a search: no budget set
        assert with_share({"x": 1}, None) == {"x": 1}
        # Three auto builds wait: a gets a third, and so does b while a still runs.
        a.state = BuildState.running
        assert version_share(s, a) == pytest.approx(30.0)
        b.state = BuildState.running
        assert version_share(s, b) == pytest.approx(30.0)
        # a finishes having spent 6 s (its last frontier's cumulative figure): c gets half
        # of what is left (84 s) beside b, which is still running.
        _finish(a, 6.0)
        s.flush()
        assert version_share(s, c) == pytest.approx(42.0)
        assert with_share({"precision": "auto"}, 42.0)["search_budget_seconds"] == 42.0


def test_any_interleaving_stays_within_the_version_budget(factory):
    """Builds start and finish in random orders, each spending all it was given."""
    rng = random.Random(7)
    for trial in range(30):
        with factory() as s:
            rows = _builds(s, [AUTO] * rng.randint(1, 5))
            granted: dict[int, float] = {}
            queued, running = list(rows), []
            while queued or running:
                if queued and (not running or rng.random() < 0.5):
                    b = queued.pop(rng.randrange(len(queued)))
                    share = version_share(s, b)
                    assert share is not None
                    granted[b.id] = share
                    b.state = BuildState.running
                    running.append(b)
                else:
                    b = running.pop(rng.randrange(len(running)))
                    _finish(b, granted[b.id])
                s.flush()
            assert sum(granted.values()) <= 90.0 + 1e-6, (trial, granted)
            s.rollback()


def test_the_smallest_budget_of_the_version_s_platforms_is_its_budget(factory):
    with factory() as s:
        a, _ = _builds(s, [AUTO, {"precision": "auto", "search_budget_seconds": 20}])
        assert version_share(s, a) == pytest.approx(10.0)
