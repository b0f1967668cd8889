"""Schemathesis fuzzing of the builds endpoints from the app's OpenAPI spec: no 5xx, every
response conforms, invalid input is rejected (the same checks the registry's fuzz test runs)."""

from __future__ import annotations

import json

import schemathesis
from fastapi.testclient import TestClient

from server.app import create_app
from server.auth import create_token
from server.jobs.interface import NullJobQueue
from tests.jobs.jobs_helpers import make_settings
from tests.support.openapi_fuzz import NEGATIVE_REJECTIONS, fuzz_operations

CONFIG = schemathesis.Config.from_dict({
    "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", 401, 403, 404]},
               "negative_data_rejection": {"expected-statuses": NEGATIVE_REJECTIONS}},
})


def test_builds_endpoints_conform_to_the_openapi_spec(convnet_files, tmp_path):
    s = make_settings(f"sqlite:///{tmp_path / 'fuzz.db'}", tmp_path / "data")
    app = create_app(s, job_queue=NullJobQueue())
    with app.state.session_factory() as session:
        _row, secret = create_token(session, ["admin", "publish"], name="fuzz")
        session.commit()
    headers = {"Authorization": f"Bearer {secret}"}
    with TestClient(app) as c:
        assert c.post("/v1/models", json={"name": "seed"}, headers=headers).status_code == 201
        meta = {"version": "1.0.0", "platforms": ["onnx"],
                "inputs": [{"name": "image", "dtype": "float32", "shape": [1, 3, 16, 16]}]}
        r = c.post("/v1/models/seed/versions", headers=headers,
                   files={"model": ("m.onnx", convnet_files.onnx.read_bytes())},
                   data={"metadata": json.dumps(meta)})
        assert r.status_code == 201, r.text
    fuzzed, statuses = fuzz_operations(app, headers, {"builds"}, examples=30, config=CONFIG)
    assert statuses and all(s < 500 for s in statuses)
    assert fuzzed == 3  # list, retry, and the per-layer diff (`…/layers`)
