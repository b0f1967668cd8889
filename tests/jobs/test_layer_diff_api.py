"""The per-layer diff from upload to API: the in-process worker compiles a version for onnx
and coreml in the sandbox, the diff crosses the sandbox result and is stored with each build,
and `GET …/layers` pages it (layers × platform/precision), as an open read."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from server.compile.gates.layerdiff import MAX_LAYERS
from server.compile.sandbox_result import ResultError, _layer_diff
from tests.jobs.jobs_helpers import make_settings, publish_token, uploader
from tests.jobs.test_inprocess import CONV_INPUTS, wait_state


@pytest.mark.slow
def test_each_build_stores_its_layer_diff_and_the_api_pages_it(convnet_files, tmp_path):
    settings = make_settings(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "data")
    app = create_app(settings)
    with TestClient(app) as client:
        upload = uploader(client, publish_token(settings))
        upload("conv", "1.0.0", convnet_files.onnx, CONV_INPUTS, ["onnx", "coreml"],
               reference=convnet_files.reference)
        assert wait_state(client, "conv", "1.0.0") == "ready"
        anonymous = TestClient(app)  # an open read, like the builds
        first = anonymous.get("/v1/models/conv/versions/1.0.0/layers?limit=2").json()
        rest = anonymous.get(f"/v1/models/conv/versions/1.0.0/layers?offset="
                             f"{first['next_offset']}&limit=500").json()
        missing = anonymous.get("/v1/models/conv/versions/9.9.9/layers")
        too_big = anonymous.get("/v1/models/conv/versions/1.0.0/layers?limit=501")
    app.state.job_queue.close()
    cols = {(c["platform"], c["precision"]): c for c in first["columns"]}
    assert set(cols) == {("onnx", "fp32"), ("coreml", "fp16")}, first["columns"]
    assert "MIL executor" in cols[("coreml", "fp16")]["basis"]
    assert all(c["first_below"] is None and not c["unavailable"] for c in cols.values())
    assert len(first["layers"]) == 2 and first["next_offset"] == 2
    layers = first["layers"] + rest["layers"]
    assert len(layers) == first["total"] >= 5 and rest["next_offset"] is None
    assert [r["op"] for r in layers][:1] == ["Conv"]
    assert all(cell is not None and float(cell[0]) > 0.999 for r in layers for cell in r["cells"])
    assert missing.status_code == 404 and too_big.status_code == 422


def test_layer_diff_flood_from_the_sandbox_is_refused() -> None:
    row = ["t", "n", "Conv", 1.0, "inf"]
    with pytest.raises(ResultError, match="at most"):
        _layer_diff({"layers": [row] * 10_000})
    with pytest.raises(ResultError, match="malformed"):
        _layer_diff({"layers": [row] * (MAX_LAYERS + 1)})
    for bad in (["t", "n", "Conv", "nan?", 1.0], ["t" * 300, "n", "Conv", 1.0, 1.0],
                ["t", "n", 1.0, 1.0], "rows"):
        with pytest.raises(ResultError):
            _layer_diff({"layers": [bad]} if bad != "rows" else {"layers": bad})
    assert _layer_diff({"layers": [row]})["layers"] == [row]
