"""Declared shapes specialize a dynamic ONNX upload: one static graph per shape variant."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from server.compile import BuildSpec, InputSpec, Pipeline, SourceFormat
from server.compile.errors import InvalidSourceError
from server.compile.shapes import (
    ShapeSpecializationError,
    declared_shape_conflicts,
    input_dims,
    specialize,
    specialize_file,
)
from server.compile.source import run_onnx_cpu
from tests.compile.compile_models import P2O_DIMS, dynamic_upsampler_onnx, value_dependent_topk_onnx

RESOLUTIONS = {"360p": (1, 3, 36, 64), "720p": (1, 3, 72, 128), "1080p": (1, 3, 108, 192)}


@pytest.fixture(scope="module")
def upsampler(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dynamic_upsampler_onnx(tmp_path_factory.mktemp("shapes") / "p2o_like.onnx")


def _input_dims(model: onnx.ModelProto) -> list[list[int | str]]:
    return [[d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim]
            for i in model.graph.input]


def test_dynamic_p2o_dims_are_fixed_and_shape_arithmetic_folded(upsampler: Path) -> None:
    model = onnx.load(str(upsampler))
    static, report = specialize(model, (InputSpec("x", (1, 3, 32, 48)),))

    assert _input_dims(static) == [[1, 3, 32, 48]]
    assert report.fixed == {P2O_DIMS[0]: 1, P2O_DIMS[2]: 32, P2O_DIMS[3]: 48}
    # Shape → Slice → Mul → Concat became constants feeding Resize and Reshape.
    assert [n.op_type for n in static.graph.node] == ["Conv", "Relu", "Resize", "Reshape"]
    assert report.nodes_before == 12 and report.nodes_after == 4
    out = static.graph.output[0].type.tensor_type.shape
    assert [d.dim_value for d in out.dim] == [1, 4, 64 * 96]
    # The uploaded graph is left as it was (specialize works on a copy).
    assert _input_dims(model)[0] == list(P2O_DIMS)


def test_specialized_graph_computes_what_the_dynamic_upload_computes(
        upsampler: Path, tmp_path: Path) -> None:
    spec = InputSpec("x", (1, 3, 20, 30))
    specialize_file(upsampler, (spec,), tmp_path / "static.onnx")
    feeds = [{"x": np.random.default_rng(1).standard_normal(spec.shape).astype(np.float32)}]
    (want,), (got,) = run_onnx_cpu(upsampler, feeds), run_onnx_cpu(tmp_path / "static.onnx",
                                                                   feeds)
    np.testing.assert_array_equal(want[0], got[0])


def test_declared_size_contradicting_a_static_dim_names_input_dim_declared_and_actual(
        upsampler: Path) -> None:
    model = onnx.load(str(upsampler))
    with pytest.raises(InvalidSourceError) as err:
        specialize(model, (InputSpec("x", (1, 4, 32, 48)),))
    assert "input 'x' dim 1 is declared 4 but the ONNX graph fixes it at 3" in str(err.value)
    conflicts = declared_shape_conflicts(input_dims(model), {"720p": {"x": (1, 4, 72, 128)}})
    assert [(c.input, c.dim, c.declared, c.actual, c.variant) for c in conflicts] == [
        ("x", 1, 4, 3, "720p")]


def test_one_symbolic_dim_declared_with_two_sizes_is_refused(tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    from tests.compile.compile_models import onnx_model

    path = onnx_model(tmp_path / "two.onnx", [helper.make_node("Add", ["a", "b"], ["c"])],
                      [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 4]),
                       helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 4])],
                      [helper.make_tensor_value_info("c", TensorProto.FLOAT, ["n", 4])])
    conflicts = declared_shape_conflicts(input_dims(onnx.load(str(path))),
                                         {"default": {"a": (1, 4), "b": (2, 4)}})
    assert len(conflicts) == 1 and conflicts[0].input == "b" and conflicts[0].actual == "n"
    assert "symbolic dim 'n'" in conflicts[0].message()


def test_value_dependent_dim_is_named_with_the_node_that_needs_it(tmp_path: Path) -> None:
    path = value_dependent_topk_onnx(tmp_path / "topk.onnx")
    specs = (InputSpec("x", (1, 16)), InputSpec("k", (1,), "int64"))
    with pytest.raises(ShapeSpecializationError) as err:
        specialize_file(path, specs, tmp_path / "out.onnx")
    assert {(u.tensor, u.op_type, u.node) for u in err.value.unfixed} >= {
        ("values", "TopK", "topk_by_k")}
    assert "TopK node 'topk_by_k'" in str(err.value)

    # Through the pipeline: every platform's outcome carries the unfixed dims as a gate.
    outs = Pipeline().build(BuildSpec(path, SourceFormat.ONNX, {"default": specs},
                                      platforms=("onnx", "qnn")), tmp_path / "build")
    assert {o.state for o in outs} == {"failed"}
    assert outs[0].gates["shapes"]["passed"] is False
    assert outs[0].gates["shapes"]["unfixed"][0]["node"] == "topk_by_k"
    assert "topk_by_k" in outs[0].error


def test_reference_samples_per_shape_variant_are_picked_by_name(tmp_path: Path) -> None:
    from server.compile.errors import CalibrationError
    from server.compile.source import load_samples

    ref = tmp_path / "ref.npz"
    np.savez(ref, **{"x@small": np.zeros((3, 1, 4), np.float32),
                     "x": np.ones((1, 1, 8), np.float32)})
    small = load_samples(ref, (InputSpec("x", (1, 4)),), "small")
    assert len(small) == 3 and small[0]["x"].shape == (1, 4)
    plain = load_samples(ref, (InputSpec("x", (1, 8)),), "big")  # no x@big: x is used
    assert len(plain) == 1 and float(plain[0]["x"].sum()) == 8.0
    with pytest.raises(CalibrationError, match="give it its own array 'x@other'"):
        load_samples(ref, (InputSpec("x", (1, 16)),), "other")


def test_static_upload_passes_through_unchanged(tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    from tests.compile.compile_models import onnx_model

    path = onnx_model(tmp_path / "s.onnx", [helper.make_node("Relu", ["x"], ["y"])],
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    assert specialize_file(path, (InputSpec("x", (1, 4)),), tmp_path / "o.onnx") is None
    assert (tmp_path / "o.onnx").read_bytes() == path.read_bytes()


@pytest.mark.slow
def test_three_declared_resolutions_yield_one_static_artifact_per_variant_and_platform(
        upsampler: Path, tmp_path: Path) -> None:
    variants = {name: (InputSpec("x", shape),) for name, shape in RESOLUTIONS.items()}
    rng = np.random.default_rng(3)
    # Reference inputs per shape variant ("x@720p"), so the numeric gate runs on each.
    ref = tmp_path / "ref.npz"
    np.savez(ref, **{f"x@{name}": rng.standard_normal((2, *shape)).astype(np.float32)
                     for name, shape in RESOLUTIONS.items()})
    outs = Pipeline().build(BuildSpec(upsampler, SourceFormat.ONNX, variants,
                                      reference_path=ref), tmp_path)

    # An outcome's variant names precision and target ("720p-fp16"); its shape variant is
    # in the target.
    cells = {(o.target.get("shape_variant", o.variant), o.platform): o for o in outs}
    assert set(cells) == {(v, p) for v in RESOLUTIONS for p in ("onnx", "coreml", "qnn")}
    for (variant, platform), o in cells.items():
        assert o.state == "ready", (variant, platform, o.error)
        assert o.gates["shapes"]["fixed"][P2O_DIMS[2]] == RESOLUTIONS[variant][2]
        # The operator gate judged the specialized graph: its shape arithmetic is gone.
        assert "Shape" not in o.gates["operators"][0]["operators"]
        assert o.gates["operators"][0]["passed"]
        # Core ML's numerics: its package run by the MIL reference executor
        assert o.gates["numeric"]["status"] == "passed", (variant, platform, o.gates["numeric"])
        assert o.gates["numeric"]["samples"] == 2
    # Each variant's ONNX artifact is static at its own resolution.
    for variant, shape in RESOLUTIONS.items():
        art = tmp_path / variant / "source.onnx"
        assert _input_dims(onnx.load(str(art))) == [list(shape)]
        x = rng.standard_normal(shape).astype(np.float32)
        (got,) = run_onnx_cpu(art, [{"x": x}])
        assert got[0].shape == (1, 4, shape[2] * 2 * shape[3] * 2)
