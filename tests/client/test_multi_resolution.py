"""Multi-resolution end to end: a dynamic ONNX upload with three declared resolutions yields
three static artifacts per platform, and a device installs all three in one bundle and
switches between them without reloading a model.

Real server app (in-process job queue, real compilers), real SDK on the CPU ONNX backend.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from fastapi.testclient import TestClient

from client_sdk import DeviceProfile, ModelRuntime, Outcome, Updater, UpdaterConfig
from client_sdk.backends import open_backend
from client_sdk.install import Bundle, Member
from tests.client.test_against_server import AppTransport
from tests.compile.compile_models import dynamic_upsampler_onnx
from tests.support.inprocess_app import inprocess_app, wait_settled

RESOLUTIONS = {"360p": [1, 3, 36, 64], "720p": [1, 3, 72, 128], "1080p": [1, 3, 108, 192]}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[TestClient]:
    with inprocess_app(tmp_path) as client:
        yield client


@pytest.mark.slow
def test_three_resolutions_build_three_static_artifacts_per_platform_and_switch_on_device(
        server: TestClient, tmp_path: Path) -> None:
    model = dynamic_upsampler_onnx(tmp_path / "up.onnx").read_bytes()
    assert server.post("/v1/models", json={"name": "up", "task": "other"}).status_code == 201
    meta = {"version": "1.0.0", "platforms": ["onnx", "coreml", "qnn"],
            "inputs": [{"name": "x", "dtype": "float32", "shapes": RESOLUTIONS}]}
    ref = io.BytesIO()  # reference inputs per shape variant: the numeric gate runs on each
    gen = np.random.default_rng(5)
    np.savez(ref, **{f"x@{n}": gen.standard_normal((1, *s)).astype(np.float32)
                     for n, s in RESOLUTIONS.items()})
    r = server.post("/v1/models/up/versions",
                    files={"model": ("up.onnx", model), "reference": ("ref.npz", ref.getvalue())},
                    data={"metadata": json.dumps(meta)})
    assert r.status_code == 201, r.text
    state = wait_settled(server, "up", "1.0.0")["state"]
    builds = server.get("/v1/models/up/versions/1.0.0/builds?logs=false").json()
    assert state == "ready", [(b["platform"], b["variant"], b["error"]) for b in builds]
    cells = {(b["platform"], b["variant"]) for b in builds if b["state"] == "succeeded"}
    assert cells == {(p, v) for p in ("onnx", "coreml", "qnn") for v in RESOLUTIONS}
    for b in builds:
        assert b["gates"]["shapes"]["fixed"]["p2o.DynamicDimension.1"] == RESOLUTIONS[
            b["variant"]][2]
        assert b["gates"]["numeric"]["status"] == "passed", b["gates"]  # coreml: MIL executor

    r = server.post("/v1/channels/prod/rollouts",
                    json={"model": "up", "version": "1.0.0", "percentage": 100})
    assert r.status_code == 201, r.text

    opened: list[str] = []

    def counting_open(bundle: Bundle, member: Member):  # type: ignore[no-untyped-def]
        opened.append(member.role)
        return open_backend(bundle, member)

    runtime = ModelRuntime(tmp_path / "device", backend_factory=counting_open)
    up = Updater(UpdaterConfig(
        base_url="http://testserver", channel="prod",
        pinned_root=server.get("/v1/root/1.json").content,
        device=DeviceProfile("pc-1", "onnx", arch="x86_64"), data_dir=tmp_path / "device",
        transport=AppTransport(server), runtime=runtime, formats=["onnx"],
        all_shape_variants=["up"]))
    result = up.check_once()
    assert result.outcome is Outcome.UPDATED, result
    bundle = runtime.store.active("up")
    assert bundle is not None
    assert sorted(m.target["shape_variant"] for m in bundle.members) == sorted(RESOLUTIONS)
    for m in bundle.members:  # each member is a static graph at its own resolution
        graph = onnx.load(str(bundle.path / m.file))
        dims = [d.dim_value for d in graph.graph.input[0].type.tensor_type.shape.dim]
        assert dims == RESOLUTIONS[m.target["shape_variant"]]

    rng = np.random.default_rng(0)
    loaded = runtime.loaded("up") or runtime.load_active("up")
    primary = loaded.shape_variants[0]
    first = runtime.predict("up", {"x": rng.standard_normal(RESOLUTIONS[primary]).astype(
        np.float32)})
    assert first.shape_variant == primary and set(loaded.shape_variants) == set(RESOLUTIONS)
    loads = len(opened)
    assert loads == 3  # every variant's session loaded once, up front
    for _ in range(3):
        for name, shape in RESOLUTIONS.items():
            p = runtime.predict("up", {"x": rng.standard_normal(shape).astype(np.float32)},
                                shape_variant=name)
            assert p.shape_variant == name
            assert p.outputs["y"].shape == (1, 4, shape[2] * 2 * shape[3] * 2)
    assert len(opened) == loads  # switching never reloaded a session
