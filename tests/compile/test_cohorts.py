"""Per-cohort watermarked artifacts in the compile pipeline (server/compile/cohorts.py): every
readable artifact of a watermarked version gets one marked, gated, packed copy per cohort;
each copy's weights carry its own cohort's fingerprint in the artifact's own dtype; a copy
whose watermark would move the outputs past the gate fails the build naming the cohort."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from server import watermark as wm
from server.compile import BuildSpec, Pipeline, SourceFormat, weights
from server.compile import cohorts as cohorts_mod
from server.compile.cohorts import WatermarkSpec
from server.compile.packing import unpack_directory

KEY = b"release watermark key for tests"
COHORTS = 4


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A 64 → 1024 → 1024 → 10 MLP (1.1M weights): big enough for a 1e-9 claim."""
    from onnx import TensorProto, helper, numpy_helper

    from tests.compile.compile_models import onnx_model

    tmp = tmp_path_factory.mktemp("mlp")
    rng = np.random.default_rng(5)
    dims = (64, 1024, 1024, 10)
    inits, nodes, x = [], [], "x"
    for i, (a, b) in enumerate(itertools.pairwise(dims)):
        inits += [numpy_helper.from_array(
            (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32), f"w{i}"),
            numpy_helper.from_array((rng.standard_normal(b) * 0.1).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"])]
        x = f"a{i}"
        if i < len(dims) - 2:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"]))
            x = f"r{i}"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    path = onnx_model(tmp / "mlp.onnx", nodes,
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    ref = tmp / "mlp.ref.npz"
    np.savez(ref, x=rng.standard_normal((4, 1, 64)).astype(np.float32))
    return path, ref


def mlp_spec(mlp, platforms, watermark):  # type: ignore[no-untyped-def]
    from server.compile import InputSpec

    return BuildSpec(mlp[0], SourceFormat.ONNX, {"default": (InputSpec("x", (1, 64)),)},
                     platforms=platforms, reference_path=mlp[1], watermark=watermark)


def by_platform(outcomes):  # type: ignore[no-untyped-def]
    return {o.platform: o for o in outcomes}


def tensors(path, tmp):  # type: ignore[no-untyped-def]
    if path.suffix == ".tar":
        path = unpack_directory(path, tmp)
    return {t.name: t.values for t in weights.read(path)}


@pytest.mark.slow
def test_each_cohort_gets_a_gated_artifact_marked_in_its_own_dtype(mlp, tmp_path):
    spec = mlp_spec(mlp, ("onnx", "coreml"), WatermarkSpec(COHORTS, KEY))
    out = by_platform(Pipeline().build(spec, tmp_path / "build"))
    for platform, o in out.items():
        assert o.state == "ready", (platform, o.error)
        assert len(o.cohorts) == COHORTS
        gate = o.gates["watermark"]
        assert gate["status"] == "passed" and gate["lowest_output_psnr_db"] > 60
        shas = {c.sha256 for c in o.cohorts} | {o.artifact.sha256}
        assert len(shas) == COHORTS + 1  # every cohort differs, and from the unmarked one
        original = tensors(o.artifact.path, tmp_path / f"{platform}-orig")
        marked = [t for t in original.values() if t.size >= weights.MIN_ELEMENTS]
        assert sum(t.size for t in marked) > 1_000_000
        for c, packed in enumerate(o.cohorts):
            copy = tensors(packed.path, tmp_path / f"{platform}-{c}")
            assert {n: v.dtype for n, v in copy.items()} == \
                {n: v.dtype for n, v in original.items()}
            got = wm.identify_tensors(copy, original.items(), KEY, COHORTS)
            assert got.cohort == c, (platform, c, got)
    # Core ML holds FP16 weights: the marks are whole FP16 steps in FP16.
    coreml = tensors(out["coreml"].artifact.path, tmp_path / "dtype")
    assert any(v.dtype == np.float16 for v in coreml.values())


def test_a_watermark_that_moves_outputs_past_the_gate_fails_naming_the_cohort(
        convnet, tmp_path, monkeypatch):
    monkeypatch.setattr(wm, "DEFAULT_STRENGTH", 1.0)
    strong = wm.embed
    monkeypatch.setattr(cohorts_mod.wm, "embed",
                        lambda v, k, c, strength=1.0, name="": strong(v, k, c, 4000.0, name))
    spec = BuildSpec(convnet.onnx, SourceFormat.ONNX, {"default": convnet.inputs},
                     platforms=("onnx",), reference_path=convnet.reference,
                     watermark=WatermarkSpec(COHORTS, KEY))
    (o,) = Pipeline().build(spec, tmp_path / "build")
    assert o.state == "failed" and o.artifact is None and not o.cohorts
    assert "cohort 0" in o.error
    assert o.gates["watermark"]["status"] == "failed"


def test_without_a_watermark_nothing_is_marked_or_run(convnet, tmp_path, monkeypatch):
    def refuse(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("marked a version without a watermark")

    monkeypatch.setattr("server.compile.pipeline.build_cohorts", refuse)
    spec = BuildSpec(convnet.onnx, SourceFormat.ONNX, {"default": convnet.inputs},
                     platforms=("onnx",), reference_path=convnet.reference)
    (o,) = Pipeline().build(spec, tmp_path / "build")
    assert o.state == "ready" and o.cohorts == [] and "watermark" not in o.gates
    assert "cohorts" in o.to_dict() and o.to_dict()["cohorts"] == []


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int8])
def test_embed_keeps_dtype_zeros_and_sentinels(dtype):
    rng = np.random.default_rng(0)
    if dtype is np.int8:
        w = rng.integers(-128, 128, 5000).astype(np.int8)
    else:
        w = (rng.standard_normal(5000) * 0.1).astype(dtype)
        w[:10] = 0
        w[10] = -1e4 if dtype is np.float16 else -1e9
    m = wm.embed(w, KEY, 3, name="t")
    assert m.dtype == w.dtype and m.shape == w.shape
    if dtype is np.int8:
        moved = (m.astype(int) != w.astype(int)).mean()
        assert 0 < moved < 2 * wm.DENSITY
        assert np.abs(m.astype(int) - w.astype(int)).max() == 1
    else:
        assert (m[:11] == w[:11]).all()
        assert 0.5 * wm.DENSITY < (m[11:] != w[11:]).mean() < 2 * wm.DENSITY
