"""The voice-activity structure of issue 19 (a scalar int64 sample rate, shape-decided `If`
nodes, an LSTM with a state input, a scalar probability out) uploads through the API and
builds ready for onnx and qnn; torch exports of nn.LSTM / nn.GRU build on both too."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from fastapi.testclient import TestClient

from server.compile import BuildSpec, InputSpec, Pipeline, SourceFormat
from tests.compile.vad_model import vad_feeds, vad_onnx
from tests.support.inprocess_app import inprocess_app, wait_settled

# FP16 on the HTP reaches ~40 dB SNR on this LSTM (cosine 0.99996): the FP16 default (60 dB)
# is the gate work of issue 19, not what these tests are about; the documented per-version
# override is used.
QNN = {"min_snr_db": 35}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[TestClient]:
    with inprocess_app(tmp_path) as client:
        yield client


def _ready_builds(server: TestClient, model: bytes, reference: io.BytesIO,
                 meta: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Uploads vad 1.0.0 and waits for it: it must be ready. Its builds by platform."""
    r = server.post("/v1/models/vad/versions",
                    files={"model": ("vad.onnx", model), "reference": ("ref.npz",
                                                                        reference.getvalue())},
                    data={"metadata": json.dumps(meta)})
    assert r.status_code == 201, r.text
    version = wait_settled(server, "vad", "1.0.0")
    builds = {b["platform"]: b for b in server.get(
        "/v1/models/vad/versions/1.0.0/builds?logs=false").json()}
    assert version["state"] == "ready", {p: b["error"] for p, b in builds.items()}
    return builds


def test_vad_uploads_and_builds_ready_for_onnx_and_qnn(server: TestClient,
                                                       tmp_path: Path) -> None:
    # Before: 201, then every build: "input 'sr' has shape (); every dimension must be a
    # positive integer".
    assert server.post("/v1/models", json={"name": "vad", "task": "other"}).status_code == 201
    buf = io.BytesIO()
    np.savez(buf, **vad_feeds(4))
    meta = {"version": "1.0.0", "platforms": {"onnx": {}, "qnn": QNN},
            "inputs": [{"name": "audio", "dtype": "float32", "shape": [1, 64]},
                       {"name": "state", "dtype": "float32", "shape": [2, 1, 16]},
                       {"name": "sr", "dtype": "int64", "shape": []}]}
    builds = _ready_builds(server, vad_onnx(tmp_path / "vad.onnx").read_bytes(), buf, meta)
    for platform, b in builds.items():
        assert b["gates"]["shapes"]["ifs_folded"] == 2, platform
        assert b["gates"]["numeric"]["status"] == "passed", (platform, b["gates"]["numeric"])
        assert b["gates"]["numeric"]["samples"] == 4
    htp = builds["qnn"]["gates"]["htp"]
    assert htp["cpu_nodes"] == [] and htp["node_share"] == 1.0  # the LSTM is the HTP's own


def test_the_onnx_artifact_keeps_the_scalar_input_and_output(tmp_path: Path) -> None:
    specs = (InputSpec("audio", (1, 64)), InputSpec("state", (2, 1, 16)),
             InputSpec("sr", (), "int64"))
    spec = BuildSpec(vad_onnx(tmp_path / "vad.onnx"), SourceFormat.ONNX, {"default": specs},
                     platforms=("onnx",))
    (o,) = Pipeline().build(spec, tmp_path / "work")
    assert o.state == "ready", o.error
    model = onnx.load(str(o.artifact.path))
    rank = {v.name: len(v.type.tensor_type.shape.dim) for v in [*model.graph.input,
                                                                 *model.graph.output]}
    assert rank == {"audio": 2, "state": 3, "sr": 0, "prob": 0, "state_out": 3}


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_torch_exported_rnn_builds_for_onnx_and_qnn(kind: str, tmp_path: Path) -> None:
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            rnn = torch.nn.LSTM if kind == "lstm" else torch.nn.GRU
            self.rnn = rnn(8, 16, batch_first=True, bidirectional=True)
            self.fc = torch.nn.Linear(32, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.rnn(x)[0])

    torch.manual_seed(0)
    ep = torch.export.export(Net().eval(), (torch.randn(1, 10, 8),))
    torch.export.save(ep, str(tmp_path / "rnn.pt2"))
    np.savez(tmp_path / "ref.npz", x=np.random.default_rng(0).standard_normal(
        (2, 1, 10, 8)).astype(np.float32))
    spec = BuildSpec(tmp_path / "rnn.pt2", SourceFormat.EXPORTED_PROGRAM,
                     {"default": (InputSpec("x", (1, 10, 8)),)}, platforms=("onnx", "qnn"),
                     reference_path=tmp_path / "ref.npz",
                     settings={"numeric": {"fp16": {"min_snr_db": 35.0}}})
    out = {o.platform: o for o in Pipeline().build(spec, tmp_path / "work")}
    assert all(o.state == "ready" for o in out.values()), {p: o.error for p, o in out.items()}
    assert out["qnn"].gates["htp"]["cpu_nodes"] == []
    exported = onnx.load(str(tmp_path / "work" / "default" / "source.onnx"))
    assert kind.upper() in {n.op_type for n in exported.graph.node}


def test_an_if_on_a_scalar_input_declared_with_its_value_folds_for_every_platform(
        server: TestClient, tmp_path: Path) -> None:
    """Silero VAD's `If` on its sample rate: declared `"value": 16000`, the build binds `sr`
    as a constant, the If folds, and onnx, coreml and qnn build ready (without the value the
    build refuses the If by name: test_shapes.py)."""
    assert server.post("/v1/models", json={"name": "vad", "task": "other"}).status_code == 201
    buf = io.BytesIO()
    np.savez(buf, **vad_feeds(2))
    meta = {"version": "1.0.0", "platforms": {"onnx": {}, "coreml": {}, "qnn": QNN},
            "inputs": [{"name": "audio", "dtype": "float32", "shape": [1, 64]},
                       {"name": "state", "dtype": "float32", "shape": [2, 1, 16]},
                       {"name": "sr", "dtype": "int64", "shape": [], "value": 16000}]}
    model = vad_onnx(tmp_path / "vad.onnx", sr_if=True).read_bytes()
    builds = _ready_builds(server, model, buf, meta)
    for platform, b in builds.items():
        assert b["gates"]["shapes"]["ifs_folded"] == 3, platform  # sr_if with the shape Ifs
        assert b["gates"]["numeric"]["status"] == "passed", (platform, b["gates"]["numeric"])


def test_the_artifact_of_a_declared_constant_input_does_not_take_it(tmp_path: Path) -> None:
    np.savez(tmp_path / "ref.npz", **vad_feeds(2))
    specs = (InputSpec("audio", (1, 64)), InputSpec("state", (2, 1, 16)),
             InputSpec("sr", (), "int64", value=16000))
    spec = BuildSpec(vad_onnx(tmp_path / "vad.onnx", sr_if=True), SourceFormat.ONNX,
                     {"default": specs}, platforms=("onnx",),
                     reference_path=tmp_path / "ref.npz")
    (o,) = Pipeline().build(spec, tmp_path / "work")
    assert o.state == "ready", o.error
    model = onnx.load(str(o.artifact.path))
    assert [v.name for v in model.graph.input] == ["audio", "state"]
    assert "If" not in {n.op_type for n in model.graph.node}


def test_a_constant_value_on_a_non_scalar_input_is_refused_at_upload(
        server: TestClient, tmp_path: Path) -> None:
    assert server.post("/v1/models", json={"name": "vad", "task": "other"}).status_code == 201
    meta = {"version": "1.0.0", "platforms": ["onnx"],
            "inputs": [{"name": "audio", "dtype": "float32", "shape": [1, 64], "value": 1.0},
                       {"name": "state", "dtype": "float32", "shape": [2, 1, 16]},
                       {"name": "sr", "dtype": "int64", "shape": []}]}
    r = server.post("/v1/models/vad/versions",
                    files={"model": ("vad.onnx", vad_onnx(tmp_path / "vad.onnx").read_bytes())},
                    data={"metadata": json.dumps(meta)})
    assert r.status_code == 422, r.text
    assert "metadata.inputs[0].value" in r.text and "scalar" in r.text
