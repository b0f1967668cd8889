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


def test_a_scalar_input_spec_is_rank_zero() -> None:
    # Before: "input 'sr' has shape (); every dimension must be a positive integer".
    spec = InputSpec("sr", (), "int64")
    assert InputSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ValueError, match="positive integer"):
        InputSpec("x", (1, 0))


VAD_SPECS = (InputSpec("audio", (1, 64)), InputSpec("state", (2, 1, 16)),
             InputSpec("sr", (), "int64"))


def test_ifs_decided_by_shapes_are_folded_in_a_static_upload(tmp_path: Path) -> None:
    from tests.compile.vad_model import vad_feeds, vad_onnx

    src = vad_onnx(tmp_path / "vad.onnx")
    report = specialize_file(src, VAD_SPECS, tmp_path / "static.onnx")
    static = onnx.load(str(tmp_path / "static.onnx"))
    assert report is not None and report.ifs_folded == 2 and report.fixed == {}
    assert "If" not in {n.op_type for n in static.graph.node}
    assert "LSTM" in {n.op_type for n in static.graph.node}
    feeds = [{k: np.asarray(v[i]) for k, v in vad_feeds(3).items()} for i in range(3)]
    for want, got in zip(run_onnx_cpu(src, feeds), run_onnx_cpu(tmp_path / "static.onnx",
                                                                feeds), strict=True):
        assert got[0].shape == ()  # the probability stays a scalar
        for w, g in zip(want, got, strict=True):
            np.testing.assert_array_equal(w, g)


def test_an_if_on_input_values_is_computed_both_ways_for_either_value(tmp_path: Path
                                                                       ) -> None:
    """The If on the value of `sr` (no shape decides it) has plain-dataflow branches with
    the same static output: both run and Where keeps one (server/compile/if_select.py), so
    the static graph gives the source's outputs at 16 kHz and at 8 kHz. The refusal of an If
    that cannot be computed both ways, named with the input it reads: test_if_select.py."""
    from tests.compile.vad_model import vad_feeds, vad_onnx

    src = vad_onnx(tmp_path / "vad.onnx", sr_if=True)
    report = specialize_file(src, VAD_SPECS, tmp_path / "static.onnx")
    assert report is not None and report.ifs_folded == 2  # the shape-decided ones
    assert report.ifs_selected == ("sr_if",)
    assert "If" not in {n.op_type for n in onnx.load(str(tmp_path / "static.onnx")).graph.node}
    feeds = [{k: np.asarray(v[0]) for k, v in vad_feeds(1).items()} | {"sr": np.array(sr)}
             for sr in (16000, 8000)]
    for want, got in zip(run_onnx_cpu(src, feeds), run_onnx_cpu(tmp_path / "static.onnx",
                                                                feeds), strict=True):
        for w, g in zip(want, got, strict=True):
            np.testing.assert_array_equal(g, w)


def test_an_if_on_a_constant_input_is_folded(tmp_path: Path) -> None:
    """A graph input with an initializer of its name (an overridable default, which the
    declared inputs leave out) is a constant: an If on it is decided at build time."""
    from onnx import TensorProto, helper, numpy_helper

    def branch(op: str, out: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node(op, ["x"], [out])], op, [],
                                 [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])

    graph = helper.make_graph(
        [helper.make_node("Equal", ["mode", "one"], ["c"]),
         helper.make_node("If", ["c"], ["y"], name="mode_if", then_branch=branch("Neg", "a"),
                          else_branch=branch("Identity", "b"))], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("mode", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.array(1, np.int64), "mode"),
         numpy_helper.from_array(np.array(1, np.int64), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "m.onnx"))
    report = specialize_file(tmp_path / "m.onnx", (InputSpec("x", (1, 4)),),
                             tmp_path / "s.onnx")
    assert report is not None and report.ifs_folded == 1
    assert [n.op_type for n in onnx.load(str(tmp_path / "s.onnx")).graph.node] == ["Neg"]


def test_a_version_that_allows_if_keeps_a_value_dependent_if(tmp_path: Path) -> None:
    """allow_ops=If (the operator gate's per-version allow list): the If on `sr` is kept for
    the runtimes that execute control flow, as before the fold existed."""
    from tests.compile.vad_model import vad_feeds, vad_onnx

    src = vad_onnx(tmp_path / "vad.onnx", sr_if=True)
    np.savez(tmp_path / "ref.npz", **vad_feeds(2))
    spec = BuildSpec(src, SourceFormat.ONNX, {"default": VAD_SPECS}, platforms=("onnx",),
                     settings={"operator_gate": {"allow": ["If"]}},
                     reference_path=tmp_path / "ref.npz")
    (out,) = Pipeline().build(spec, tmp_path / "work")
    assert out.state == "ready", out.error
    assert out.gates["numeric"]["status"] == "passed"
    kept = onnx.load(str(out.artifact.path))
    assert [n.name for n in kept.graph.node if n.op_type == "If"] == ["sr_if"]
    assert out.gates["shapes"]["ifs_folded"] == 2


def _torch_pad_onnx(path: Path) -> Path:
    """A static graph whose Pad amounts are computed the way torch exports F.pad (and spox
    inlines Silero's STFT padding): ConstantOfShape → Concat → Reshape → Slice → Transpose →
    Reshape → Cast; shape inference alone leaves the Pad's output dims unknown."""
    from onnx import TensorProto, helper, numpy_helper

    from tests.compile.compile_models import onnx_model

    def const(name: str, values: list[int]) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(values, np.int64), name)

    nodes = [
        helper.make_node("ConstantOfShape", ["two"], ["zeros"],
                         value=numpy_helper.from_array(np.array([0], np.int64))),
        helper.make_node("Concat", ["amounts", "zeros"], ["flat"], axis=0),
        helper.make_node("Reshape", ["flat", "pairs"], ["paired"]),
        helper.make_node("Slice", ["paired", "m1", "big", "zero", "m1"], ["reversed"]),
        helper.make_node("Transpose", ["reversed"], ["onnx_order"], perm=[1, 0]),
        helper.make_node("Reshape", ["onnx_order", "m1"], ["pads64"]),
        helper.make_node("Cast", ["pads64"], ["pads"], to=TensorProto.INT64),
        helper.make_node("Pad", ["x", "pads"], ["padded"], name="stft_pad", mode="reflect"),
        helper.make_node("Relu", ["padded"], ["y"]),
    ]
    inits = [const("two", [2]), const("amounts", [0, 3]), const("pairs", [-1, 2]),
             const("m1", [-1]), const("big", [-2**63 + 1]), const("zero", [0])]
    return onnx_model(path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                  [1, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 11])], inits)


def test_a_static_upload_with_computed_pad_amounts_is_folded_until_every_dim_is_static(
        tmp_path: Path) -> None:
    """Before: the static upload was copied unchanged and the operator gate refused it with
    "dynamic_shape … at graph/stft_pad" (silero_vad_openvino_16k.onnx, spox opset 16)."""
    from server.compile.gates.operators import check_onnx
    from server.compile.shapes import unfixed_dims

    src = _torch_pad_onnx(tmp_path / "pad.onnx")
    assert [u.node for u in unfixed_dims(onnx.load(str(src)))][:1] == ["stft_pad"]
    report = specialize_file(src, (InputSpec("x", (1, 8)),), tmp_path / "static.onnx")
    static = onnx.load(str(tmp_path / "static.onnx"))
    assert report is not None and report.fixed == {}
    assert unfixed_dims(static) == []
    assert check_onnx(static, "qnn", []).passed
    assert [n.op_type for n in static.graph.node] == ["Pad", "Relu"]  # the uploaded ops kept
    feeds = [{"x": np.arange(8, dtype=np.float32).reshape(1, 8) - 4}]
    (want,), (got,) = run_onnx_cpu(src, feeds), run_onnx_cpu(tmp_path / "static.onnx", feeds)
    assert got[0].shape == (1, 11)
    np.testing.assert_array_equal(want[0], got[0])
