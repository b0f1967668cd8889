"""Schemathesis fuzzing of the builds endpoints from the app's OpenAPI spec: no 5xx, every
response conforms, invalid input is rejected (the same checks the registry's fuzz test runs)."""

from __future__ import annotations

import json

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from jobs_helpers import make_settings
from schemathesis import GenerationMode

from server.app import create_app
from server.auth import create_token
from server.jobs.interface import NullJobQueue

CONFIG = schemathesis.Config.from_dict({
    "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", 401, 403, 404]}},
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
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=CONFIG)
    fuzzed = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if "builds" not in (operation.tags or []):
            continue
        fuzzed += 1

        @given(case=operation.as_strategy(GenerationMode.POSITIVE)
               | operation.as_strategy(GenerationMode.NEGATIVE))
        @settings(max_examples=30, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case) -> None:  # type: ignore[no-untyped-def]
            case.call_and_validate(headers=headers)

        try:
            check()
        except Exception as e:
            raise AssertionError(f"{operation.label}: {e}") from e
    assert fuzzed == 2
