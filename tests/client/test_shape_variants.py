"""SDK side of issue 11: bundles with every input-shape variant (switched by name without a
reload), and releases that list failed platforms (their devices take the portable artifact)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from client_sdk import ModelNotLoadedError, ModelRuntime
from client_sdk.backends import open_backend
from client_sdk.install import SHAPE_ROLE_PREFIX, BundleStore, Member
from client_sdk.selection import select
from manifests import Artifact, DeviceProfile, Manifest, ModelEntry, Release, Rollout
from tests.client.onnx_models import check_whole, scaled_model

SHAPES = ("360p", "720p", "1080p")


def _art(platform: str, shape: str, fmt: str = "onnx", soc: str = "") -> Artifact:
    name = f"{platform}/{shape}/{soc}"
    return Artifact(platform=platform, variant=f"{shape}-fp32", format=fmt,
                    url=f"https://cdn.example/{name}", length=10,
                    sha256=hashlib.sha256(name.encode()).hexdigest(),
                    target={"shape_variant": shape, **({"soc": soc} if soc else {})})


def _manifest(*artifacts: Artifact, failed: list[str] | None = None) -> Manifest:
    release = Release("1.0", Rollout(share_ppm=1_000_000, salt="s"), list(artifacts),
                      failed_platforms=failed or [])
    return Manifest(channel="prod", serial=1, expires=2_000_000_000,
                    models={"up": ModelEntry([release])})


def test_all_shape_variants_puts_one_member_per_shape_in_the_plan() -> None:
    manifest = _manifest(*(_art("onnx", s) for s in SHAPES),
                         *(_art("qnn", s, "onnx-epcontext", "SM8650") for s in SHAPES))
    device = DeviceProfile("s24", "qnn", "SM8650", "v75")
    one = select(manifest, device, formats=["onnx-epcontext", "onnx"])
    all_ = select(manifest, device, formats=["onnx-epcontext", "onnx"],
                  all_shape_variants=["up"])

    assert [m.role for m, _ in one.plans[0].artifacts] == ["primary", "fallback"]
    roles = [(m.role, m.file, a.target["shape_variant"]) for m, a in all_.plans[0].artifacts]
    assert roles == [("primary", "primary.onnx", "360p"), ("fallback", "fallback.onnx", "360p"),
                     ("shape:720p", "shape-720p.onnx", "720p"),
                     ("shape:1080p", "shape-1080p.onnx", "1080p")]
    assert all(a.platform == "qnn" for m, a in all_.plans[0].artifacts if m.role != "fallback")


def test_a_shape_name_unsafe_as_a_file_name_is_not_installed() -> None:
    manifest = _manifest(_art("onnx", "360p"), _art("onnx", "../../etc"))
    plan = select(manifest, DeviceProfile("pc", "onnx"), formats=["onnx"],
                  all_shape_variants=["up"]).plans[0]
    assert [m.role for m, _ in plan.artifacts] == ["primary"]


def test_device_of_a_failed_platform_plans_the_portable_artifact_only_when_listed() -> None:
    arts = (_art("onnx", "default"), _art("qnn", "default", "onnx-epcontext", "SM8650"))
    mac = DeviceProfile("mac", "coreml", arch="arm64")
    listed = select(_manifest(*arts, failed=["coreml"]), mac, formats=["mlpackage", "onnx"])
    assert [a.platform for _, a in listed.plans[0].artifacts] == ["onnx"]
    unlisted = select(_manifest(*arts), mac, formats=["mlpackage", "onnx"])
    assert unlisted.plans == () and "includes this device" in unlisted.refused[0].reason


def _loaded_runtime(tmp: Path) -> tuple[ModelRuntime, list[str]]:
    """Three shape variants of one model (y = x * k, k = 1, 2, 3 tells them apart)."""
    staged = []
    for i, (shape, k) in enumerate(zip(SHAPES, (1.0, 2.0, 3.0), strict=True)):
        data = scaled_model(k)
        src = tmp / f"{shape}.onnx"
        src.write_bytes(data)
        role = "primary" if i == 0 else f"{SHAPE_ROLE_PREFIX}{shape}"
        staged.append((Member(role, "onnx", "onnx", f"{shape}-fp32",
                              f"{role.replace(':', '-')}.onnx",
                              hashlib.sha256(data).hexdigest(), len(data),
                              target={"shape_variant": shape}), src))
    bundle = BundleStore(tmp / "dev").stage("up", "1.0", staged)
    opened: list[str] = []

    def counting_open(b, m):  # type: ignore[no-untyped-def]
        opened.append(m.role)
        return open_backend(b, m)

    rt = ModelRuntime(tmp / "dev", backend_factory=counting_open)
    rt.swap(rt.prepare(bundle))
    return rt, opened


def test_runtime_switches_shape_variant_by_name_on_sessions_loaded_once(tmp_path: Path) -> None:
    rt, opened = _loaded_runtime(tmp_path)
    x = np.ones((1, 4), dtype=np.float32)
    assert opened == ["primary", "shape:720p", "shape:1080p"]
    for _ in range(3):
        for shape, k in zip(SHAPES, (1.0, 2.0, 3.0), strict=True):
            p = rt.predict("up", {"x": x}, shape_variant=shape)
            assert p.shape_variant == shape and check_whole(p.outputs, x) == k
    default = rt.predict("up", {"x": x})
    assert default.shape_variant == "360p" and check_whole(default.outputs, x) == 1.0
    assert len(opened) == 3  # no reload on any switch
    with pytest.raises(ModelNotLoadedError, match=r"no shape variant '4k'.*360p"):
        rt.predict("up", {"x": x}, shape_variant="4k")
