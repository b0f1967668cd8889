"""qnn-hub through an injected client: a fake for the tests, a contract that the fake (and our
`HubClient` protocol) call `qai_hub` exactly as its real signatures allow, and a live test that
runs only with a qai-hub config. Nothing here reaches the network."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import pytest

from server.compile import CompileRequest, CompilerUnavailableError, SourceFormat
from server.compile.compilers.qnn_hub import HubClient, QnnHubCompiler, _translate
from server.compile.errors import ConversionError, TransientCompileError
from tests.compile.fake_qai_hub import FakeHub, FakeJob, FakeModel


def _params(fn: Any) -> list[tuple[str, Any]]:
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()
            if p.name != "self"]


def _names(fn: Any) -> list[str]:
    return [n for n, _ in _params(fn)]


def test_fake_and_protocol_match_qai_hub_signatures():
    import qai_hub
    from qai_hub.client import CompileJob, Model

    pairs = [
        (FakeHub.submit_compile_job, qai_hub.submit_compile_job),
        (HubClient.submit_compile_job, qai_hub.submit_compile_job),
        (FakeJob.wait, CompileJob.wait),
        (FakeJob.get_target_model, CompileJob.get_target_model),
        (FakeModel.download, Model.download),
    ]
    for ours, real in pairs:
        assert _names(ours) == _names(real), (ours, real)
    # Defaults matter too: the compiler relies on them (e.g. single_compile, retry).
    assert _params(FakeHub.submit_compile_job)[2:] == _params(qai_hub.submit_compile_job)[2:]
    assert _names(FakeHub.Device) == _names(qai_hub.Device) == _names(HubClient.Device)


def test_compile_submits_onnx_with_runtime_and_device_and_downloads_the_binary(convnet, tmp_path):
    hub = FakeHub()
    req = CompileRequest(convnet.onnx, SourceFormat.ONNX, convnet.inputs,
                         settings={"qnn-hub": {"device": "Samsung Galaxy S24 (Family)"}})
    (art,) = QnnHubCompiler(hub).compile(req, tmp_path)

    sent = hub.submitted[0]
    assert sent["options"] == "--target_runtime qnn_context_binary"
    assert sent["device"]["name"] == "Samsung Galaxy S24 (Family)"
    assert sent["input_specs"] == {"image": ((1, 3, 16, 16), "float32")}
    assert sent["model_bytes"] == convnet.onnx.read_bytes()
    assert art.path.read_bytes().startswith(b"QNN-CONTEXT-BINARY:")
    assert art.target.platform == "qnn-hub" and art.target.format == "qnn_context_binary"
    assert art.target.variant == \
        "qnn_context_binary-samsung-galaxy-s24-family"
    assert not art.runnable_here and "hosted devices" in art.not_runnable_reason


def test_chipset_selection_and_dlc_runtime(convnet, tmp_path):
    hub = FakeHub()
    req = CompileRequest(convnet.pt2, SourceFormat.EXPORTED_PROGRAM, convnet.inputs,
                         settings={"qnn-hub": {"chipset": "qualcomm-snapdragon-8gen3",
                                               "target_runtime": "qnn_dlc"}})
    (art,) = QnnHubCompiler(hub).compile(req, tmp_path)
    assert hub.submitted[0]["device"]["attributes"] == ["chipset:qualcomm-snapdragon-8gen3"]
    assert hub.submitted[0]["model_bytes"] == b"<ExportedProgram>"
    assert art.path.suffix == ".dlc"


def test_failed_job_is_a_conversion_error_with_hubs_message(convnet, tmp_path):
    req = CompileRequest(convnet.onnx, SourceFormat.ONNX, convnet.inputs,
                         settings={"qnn-hub": {"device": "X"}})
    with pytest.raises(ConversionError, match="GridSample"):
        QnnHubCompiler(FakeHub(fail=True)).compile(req, tmp_path)


def test_rate_limits_and_outages_are_transient_for_retry(convnet, tmp_path):
    from qai_hub.client import InternalError, RateLimitedError, UserError

    assert isinstance(_translate(RateLimitedError("slow down")), TransientCompileError)
    assert isinstance(_translate(InternalError("500")), TransientCompileError)
    assert isinstance(_translate(ConnectionError("offline")), TransientCompileError)
    assert isinstance(_translate(UserError("bad model")), ConversionError)
    req = CompileRequest(convnet.onnx, SourceFormat.ONNX, convnet.inputs,
                         settings={"qnn-hub": {"device": "X"}})
    with pytest.raises(TransientCompileError):
        QnnHubCompiler(FakeHub(raise_error=RateLimitedError("429"))).compile(req, tmp_path)


def test_without_a_config_the_real_client_is_never_built():
    # The autouse fixture points QAIHUB_CLIENT_INI at a missing file: no import, no network.
    with pytest.raises(CompilerUnavailableError, match="qai-hub configure"):
        QnnHubCompiler.from_environment()


REAL_CONFIG = Path.home() / ".qai_hub" / "client.ini"


@pytest.mark.live_qai_hub
@pytest.mark.skipif(not REAL_CONFIG.is_file(), reason="no qai-hub config (~/.qai_hub/client.ini)")
def test_live_compile_on_ai_hub(convnet, tmp_path, monkeypatch):
    monkeypatch.setenv("QAIHUB_CLIENT_INI", str(REAL_CONFIG))
    device = os.environ.get("MODELFLEET_QAI_HUB_DEVICE", "Samsung Galaxy S24 (Family)")
    req = CompileRequest(convnet.onnx, SourceFormat.ONNX, convnet.inputs,
                         settings={"qnn-hub": {"device": device}})
    (art,) = QnnHubCompiler.from_environment().compile(req, tmp_path)
    assert art.path.stat().st_size > 0
