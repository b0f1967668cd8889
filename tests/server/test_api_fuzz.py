"""Schemathesis fuzzing from the app's own OpenAPI spec (bounded, SQLite): no 5xx, every
response conforms to the spec (status codes, content types, bodies) and invalid input is
rejected. Covers the registry core's operations (health, audit, models, versions); other
areas' routers can be added to FUZZED_TAGS once they are stable."""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient

from server.app import create_app
from server.auth import create_token
from server.db.migrate import upgrade
from server.jobs.interface import NullJobQueue
from server.settings import Settings
from tests.server.server_testdata import make_onnx_bytes
from tests.support.openapi_fuzz import NEGATIVE_REJECTIONS, fuzz_operations

FUZZED_TAGS = {"health", "audit", "models", "versions"}
EXAMPLES_PER_OPERATION = 30  # ~8 operations → a few hundred cases
# Schema-valid requests the service may still refuse on content the spec cannot express:
# a form string that must hold JSON metadata (422), a binary that must be a real model (415),
# a file over the size cap (413).
FUZZ_CONFIG = schemathesis.Config.from_dict({
    "checks": {"positive_data_acceptance": {
        "expected-statuses": ["2xx", 401, 403, 404, 409, 413, 415, 422]},
        "negative_data_rejection": {"expected-statuses": NEGATIVE_REJECTIONS}},
})


@pytest.fixture
def seeded_app(tmp_path: Path) -> tuple[FastAPI, dict[str, str]]:
    url = f"sqlite:///{tmp_path / 'fuzz.db'}"
    upgrade(url)
    # NullJobQueue: fuzz the API alone, without compile workers running in the background.
    app = create_app(Settings(data_dir=tmp_path / "data", database_url=url,
                              max_model_bytes=1024 * 1024, max_npz_bytes=256 * 1024),
                     job_queue=NullJobQueue())
    with app.state.session_factory() as s:
        _row, secret = create_token(s, ["admin"], name="fuzz")
        s.commit()
    headers = {"Authorization": f"Bearer {secret}"}
    # One model and version, so generated GETs can also hit the success paths.
    with TestClient(app) as c:
        assert c.post("/v1/models", json={"name": "seed"}, headers=headers).status_code == 201
        r = c.post("/v1/models/seed/versions", headers=headers,
                   files={"model": ("m.onnx", make_onnx_bytes(), "application/octet-stream")},
                   data={"metadata": '{"version": "1.0.0", "platforms": ["onnx"], "inputs": '
                                     '[{"name": "x", "dtype": "float32", "shape": [1, 3, 8, 8]}]}'})
        assert r.status_code == 201, r.text
    return app, headers


def test_api_conforms_to_its_openapi_spec(seeded_app: tuple[FastAPI, dict[str, str]]) -> None:
    app, headers = seeded_app
    fuzzed, statuses = fuzz_operations(app, headers, FUZZED_TAGS,
                                       examples=EXAMPLES_PER_OPERATION, config=FUZZ_CONFIG)
    assert fuzzed >= 8
    # The run was real: hundreds of calls, both accepted and rejected ones.
    assert len(statuses) >= 150, len(statuses)
    assert any(200 <= s < 300 for s in statuses) and any(400 <= s < 500 for s in statuses)
    print(f"fuzzed {fuzzed} operations, {len(statuses)} calls:",
          {s: statuses.count(s) for s in sorted(set(statuses))})
