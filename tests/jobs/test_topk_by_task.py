"""Top-k agreement needs the model's task: the worker hands the task to the numeric gate, so
the conv net's (1, 10) output is checked as a classifier when the model says `classification`
and is not when the same graph is registered with task `other` (issue 19: top-k had been
applied to a 256-wide embedding by shape alone)."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient

from server.app import create_app
from tests.jobs.jobs_helpers import make_settings, publish_token
from tests.jobs.test_inprocess import CONV_INPUTS, wait_state


def test_topk_is_checked_only_for_a_model_whose_task_is_classification(convnet_files, tmp_path):
    settings = make_settings(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "data")
    app = create_app(settings)
    headers = {"Authorization": f"Bearer {publish_token(settings)}"}
    topk = {}
    try:
        with TestClient(app) as client:
            for name, task in (("classifier", "classification"), ("encoder", "other")):
                r = client.post("/v1/models", json={"name": name, "task": task},
                                headers=headers)
                assert r.status_code == 201, r.text
                meta = {"version": "1.0.0", "platforms": {"onnx": {}}, "inputs": CONV_INPUTS}
                path: Path = convnet_files.onnx
                r = client.post(f"/v1/models/{name}/versions", headers=headers,
                                files={"model": (path.name, path.read_bytes()),
                                       "reference": ("ref.npz",
                                                     convnet_files.reference.read_bytes())},
                                data={"metadata": json.dumps(meta)})
                assert r.status_code == 201, r.text
            for name in ("classifier", "encoder"):
                assert wait_state(client, name, "1.0.0") == "ready"
                (build,) = client.get(f"/v1/models/{name}/versions/1.0.0/builds").json()
                topk[name] = build["gates"]["numeric"]["outputs"][0]["topk_agreement"]
    finally:
        app.state.job_queue.close()
    assert topk == {"classifier": 1.0, "encoder": None}
