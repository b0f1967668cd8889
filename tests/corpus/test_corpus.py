"""Real models through the product: the all-MiniLM-L6-v2 upload cases of issue 11 through the
API on onnx, coreml and qnn, and the support gate agreeing with the compilers on corpus models.

Slow (a 22.7M-parameter encoder on emulated HTP); the models are built once into the corpus
cache (tests/corpus/fetch.py) and reused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from server.compile import CompileRequest
from server.compile.errors import ConversionError
from server.compile.gates.support import check_support
from server.compile.settings_map import pipeline_settings
from tests.corpus.models import CorpusModel, corpus
from tests.jobs.jobs_helpers import make_settings, publish_token, uploader
from tests.jobs.test_inprocess import wait_state

pytestmark = pytest.mark.slow


def _upload_and_wait(model: CorpusModel, tmp_path: Path) -> list[dict[str, Any]]:
    settings = make_settings(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "data")
    app = create_app(settings)
    try:
        with TestClient(app) as client:
            upload = uploader(client, publish_token(settings))
            # One reference sample per platform keeps this under a few minutes on 2 cores.
            platforms = {p: {**v, "numeric_samples": 1} for p, v in model.platforms.items()}
            upload("minilm", "1.0.0", model.path, [s.to_dict() for s in model.inputs],
                   platforms, reference=model.reference)
            state = wait_state(client, "minilm", "1.0.0", timeout=1200)
            builds: list[dict[str, Any]] = client.get(
                "/v1/models/minilm/versions/1.0.0/builds").json()
    finally:
        app.state.job_queue.close()
    assert state == "ready", [(b["platform"], b["error"]) for b in builds]
    return builds


def _assert_upload_case(builds: list[dict[str, Any]]) -> None:
    by = {b["platform"]: b for b in builds}
    assert sorted(by) == ["coreml", "onnx", "qnn"]
    assert all(b["state"] == "succeeded" for b in builds)
    onnx_num = by["onnx"]["gates"]["numeric"]
    assert onnx_num["status"] == "passed" and onnx_num["precision"] == "fp32"
    qnn = by["qnn"]
    num = qnn["gates"]["numeric"]
    # FP16 on the HTP at the default thresholds, judged against the source at FP16; the FP16
    # cost itself (source at FP16 vs FP32) is reported beside it.
    assert num["status"] == "passed" and num["precision"] == "fp16"
    assert num["thresholds"]["min_cosine"] == 0.999
    assert float(num["outputs"][0]["cosine"]) > 0.999
    assert num["thresholds"]["min_snr_db"] == 30.0
    assert float(num["precision_cost"]["outputs"][0]["cosine"]) > 0.999
    assert qnn["gates"]["htp"]["node_share"] == 1.0 and qnn["gates"]["htp"]["cpu_nodes"] == []
    coreml = by["coreml"]
    assert coreml["artifact"]["format"] == "mlpackage"
    assert coreml["gates"]["numeric"]["status"] == "passed", coreml["gates"]["numeric"]
    assert coreml["gates"]["numeric"]["runner"] == "mil reference executor (numpy, fp16)"


def test_minilm_dynamo_opset20_onnx_upload_is_ready_on_onnx_coreml_and_qnn(tmp_path):
    """Issue 11's first case: Gelu/IsNaN at opset 20 used to stop Core ML, a bool GatherND
    the HTP rejects (unnamed) used to stop QNN."""
    (model,) = corpus(["minilm-l6-dynamo"])
    assert model.params == 22_713_216 and model.exporter == "dynamo opset 20"
    builds = _upload_and_wait(model, tmp_path)
    _assert_upload_case(builds)
    qnn = next(b for b in builds if b["platform"] == "qnn")
    assert any("GatherND" in n for n in qnn["gates"]["htp"]["rewritten"])
    coreml = next(b for b in builds if b["platform"] == "coreml")
    # ONNX → MIL directly: one MIL op per ONNX Gelu / LayerNormalization / Softmax, no torch
    # detour (and so no conversion check of one).
    ops = coreml["gates"]["operators"][-1]["operators"]
    assert ops.get("gelu") == 6 and ops.get("layer_norm") == 13 and ops.get("softmax") == 6
    assert "conversion" not in coreml["gates"]


def test_minilm_exported_program_upload_is_ready_on_onnx_coreml_and_qnn(tmp_path):
    """Issue 11's second case: `Unsupported fx node new_ones` stopped Core ML for the .pt2."""
    (model,) = corpus(["minilm-l6-pt2"])
    _assert_upload_case(_upload_and_wait(model, tmp_path))


def _compiles(model: CorpusModel, platform: str, tmp_path: Path) -> bool:
    from server.compile.compilers.registry import default_compilers
    from server.compile.source import export_onnx

    onnx_path = export_onnx(model.path, model.fmt, model.inputs, tmp_path / "src.onnx")
    request = CompileRequest(model.path, model.fmt, model.inputs, onnx_path=onnx_path,
                             settings=pipeline_settings(platform, model.platforms[platform]),
                             reference_path=model.reference)
    try:
        default_compilers()[platform]().compile(request, tmp_path)
    except ConversionError:
        return False
    return True


@pytest.mark.parametrize("name,platform", [("resnet-torchscript", "coreml"),
                                           ("detector-torchscript", "qnn"),
                                           ("unet-dynamo", "qnn"),
                                           ("bert-small-torchscript", "qnn")])
def test_support_gate_predicts_the_compile_on_corpus_models(name, platform, tmp_path):
    from server.compile.source import export_onnx

    (model,) = corpus([name])
    onnx_path = export_onnx(model.path, model.fmt, model.inputs, tmp_path / "gate.onnx")
    request = CompileRequest(model.path, model.fmt, model.inputs, onnx_path=onnx_path,
                             settings=pipeline_settings(platform, model.platforms[platform]))
    try:
        report = check_support(request, platform)
        assert report is not None
        gate_passed, summary = report.passed, report.summary()
    except ConversionError as e:  # the probe itself could not build the graph
        gate_passed, summary = False, str(e)
    (tmp_path / "c").mkdir()
    assert gate_passed == _compiles(model, platform, tmp_path / "c"), summary
