"""Schemathesis fuzzing of the publishing operations (tags serving, rollouts) from the app's
own OpenAPI spec: no 5xx, responses conform to the spec, invalid input is rejected."""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient

from server.app import create_app
from server.auth import create_token
from server.blobstore import LocalBlobStore
from server.db.migrate import upgrade
from server.jobs.interface import NullJobQueue
from server.settings import Settings
from tests.publish.conftest import version_maker
from tests.support.openapi_fuzz import NEGATIVE_REJECTIONS, fuzz_operations
from tests.support.server_keys import init_test_keys

FUZZED_TAGS = {"serving", "rollouts"}
EXAMPLES_PER_OPERATION = 15
# Schema-valid requests the service may still refuse on content the spec cannot express
# (a percentage finer than 1 ppm, an unknown version or platform, a halted rollout …).
FUZZ_CONFIG = schemathesis.Config.from_dict({
    "checks": {"positive_data_acceptance": {
        "expected-statuses": ["2xx", 304, 401, 403, 404, 409, 413, 416, 422]},
        "negative_data_rejection": {"expected-statuses": NEGATIVE_REJECTIONS}},
})


@pytest.fixture
def seeded_app(tmp_path: Path) -> tuple[FastAPI, dict[str, str]]:
    url = f"sqlite:///{tmp_path / 'fuzz.db'}"
    upgrade(url)
    data = tmp_path / "data"
    init_test_keys(data)
    settings_ = Settings(data_dir=data, database_url=url)
    app = create_app(settings_, job_queue=NullJobQueue())
    with app.state.session_factory() as s:
        _row, secret = create_token(s, ["admin"], name="fuzz")
        s.commit()
    headers = {"Authorization": f"Bearer {secret}"}
    version_maker(app.state.session_factory, LocalBlobStore(settings_.resolved_blob_dir))(
        "clf", "1.0")
    with TestClient(app) as c:
        assert c.post("/v1/channels", json={"name": "prod"}, headers=headers).status_code == 201
        assert c.post("/v1/channels/prod/rollouts", headers=headers, json={
            "model": "clf", "version": "1.0", "percentage": 5}).status_code == 201
    return app, headers


def test_publishing_api_conforms_to_its_openapi_spec(seeded_app) -> None:
    app, headers = seeded_app
    fuzzed, statuses = fuzz_operations(app, headers, FUZZED_TAGS,
                                       examples=EXAMPLES_PER_OPERATION, config=FUZZ_CONFIG)
    assert fuzzed >= 15
    assert len(statuses) >= 150, len(statuses)
    assert any(200 <= s < 300 for s in statuses) and any(400 <= s < 500 for s in statuses)
