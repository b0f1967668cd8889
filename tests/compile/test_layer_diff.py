"""The per-layer diff (seed §13.1) through the real pipeline on every runnable platform: each
artifact's intermediates against the FP32 source, the deliberately damaged layer named as the
first one below the thresholds (and by the failing gate), the report capped."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import onnx
import pytest

from server.compile import SourceFormat, htp_child, qdq_prep
from server.compile.compilers import qnn
from server.compile.compilers.coreml import CoreMLCompiler
from server.compile.gates import layerdiff, layers
from server.compile.pipeline import BuildOutcome, BuildSpec, Pipeline
from server.compile.settings_map import pipeline_settings
from server.compile.types import CompiledArtifact, CompileRequest
from tests.compile.compile_models import ModelFiles
from tests.compile.test_numeric_gate import (
    WeightScalingCompiler,
    WeightScalingQnnCompiler,
    _scale_second_conv,
    _second_conv,
)


class WeightScalingCoreMLCompiler(CoreMLCompiler):
    """A deliberately wrong Core ML compile: the package is built from the graph with one
    conv's weights scaled by 1.3."""

    def compile(self, request: CompileRequest, workdir: Path) -> list[CompiledArtifact]:
        assert request.onnx_path is not None
        damaged = _scale_second_conv(request.onnx_path, workdir / "damaged.onnx")
        return super().compile(replace(request, onnx_path=damaged), workdir)


DAMAGING = {"onnx": WeightScalingCompiler, "coreml": WeightScalingCoreMLCompiler,
            "qnn": WeightScalingQnnCompiler}


def _build(model: ModelFiles, platform: str, tmp: Path, damaged: bool,
           flat: dict[str, object] | None = None) -> BuildOutcome:
    spec = BuildSpec(model.onnx, SourceFormat.ONNX, {"default": model.inputs},
                     platforms=(platform,), settings=pipeline_settings(platform, flat or {}),
                     reference_path=model.reference)
    pipeline = Pipeline(compilers={platform: DAMAGING[platform]}) if damaged else Pipeline()
    (out,) = pipeline.build(spec, tmp)
    return out


@pytest.mark.parametrize("platform", ["onnx", "coreml", "qnn"])
def test_damaged_layer_is_the_first_failing_layer_of_the_diff_and_of_the_gate(
        convnet: ModelFiles, tmp_path: Path, platform: str) -> None:
    node, _ = _second_conv(convnet.onnx)
    out = _build(convnet, platform, tmp_path, damaged=True)
    diff = out.layer_diff
    assert diff["first_below"]["node"] == node and diff["first_below"]["op"] == "Conv", diff
    rows = {r[1]: r for r in diff["layers"]}
    t = diff["thresholds"]
    ahead = diff["layers"][:diff["first_below"]["index"]]
    assert ahead and all(float(r[3]) > t["min_cosine"] and float(r[4]) > t["min_snr_db"]
                         for r in ahead), ahead  # the layers before it still agree
    assert float(rows[node][4]) < t["min_snr_db"]
    # The failing gate names the same layer (its walk against the source at the precision).
    assert out.state == "failed" and node in out.error, out.error
    assert out.gates["numeric"]["layers"]["faithful"]["first_below"]["node"] == node


@pytest.mark.parametrize("platform", ["onnx", "coreml"])
def test_faithful_artifact_has_a_full_diff_with_no_layer_below(convnet: ModelFiles,
                                                                 tmp_path: Path,
                                                                 platform: str) -> None:
    out = _build(convnet, platform, tmp_path, damaged=False)
    diff = out.layer_diff
    assert out.state == "ready" and diff["first_below"] is None, diff
    assert diff["total"] == len(diff["layers"]) >= 5 and not diff["truncated"]
    assert diff["precision"] == ("fp32" if platform == "onnx" else "fp16")
    assert diff["fields"] == ["tensor", "node", "op", "cosine", "snr_db"]


def test_large_reports_are_capped(convnet: ModelFiles, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layerdiff, "MAX_LAYERS", 2)
    diff = _build(convnet, "onnx", tmp_path, damaged=False).layer_diff
    assert len(diff["layers"]) == 2 and diff["truncated"] and diff["total"] > 2


def test_layer_diff_off_skips_it_and_a_bad_value_says_so(convnet: ModelFiles,
                                                          tmp_path: Path) -> None:
    assert _build(convnet, "onnx", tmp_path / "a", False, {"layer_diff": "off"}).layer_diff == {}
    bad = _build(convnet, "onnx", tmp_path / "b", False, {"layer_diff": "maybe"})
    assert bad.state == "ready" and "layer_diff must be on or off" in bad.layer_diff["unavailable"]


def test_runs_are_bounded_by_tensor_count_and_by_bytes() -> None:
    order = [(f"t{i}", f"n{i}", "Relu") for i in range(7)]
    sizes = {"t0": 40, "t1": 40, "t2": 95, "t3": 10, "t4": 10, "t5": 10}  # t6 unknown

    def names(parts: list[list[tuple[str, str, str]]]) -> list[list[str]]:
        return [[t for t, _, _ in p] for p in parts]

    assert names(list(layers.batches(order, 3))) == [["t0", "t1", "t2"], ["t3", "t4", "t5"],
                                                     ["t6"]]
    # 100 bytes a run: t2 alone (t1 or t3 beside it is over), an unknown size counts 4 MiB.
    assert names(list(layers.batches(order, 10, sizes, 100))) == [
        ["t0", "t1"], ["t2"], ["t3", "t4", "t5"], ["t6"]]
    assert names(list(layers.batches(order, 2, sizes, 100))) == [
        ["t0", "t1"], ["t2"], ["t3", "t4"], ["t5"], ["t6"]]


def test_qnn_layer_diff_compiles_the_graph_once_per_htp_byte_budget(
        convnet: ModelFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each diagnostic HTP compile costs about the same whatever its outputs: the diff asks
    for all the tensors HTP_BYTES allows at once (one compile for a small model) and, over the
    budget, for consecutive runs that still cover every tensor."""
    compiles: list[int] = []

    class Counting(htp_child.ChildSession):
        def run(self, names: list[str], feeds: dict[str, Any]) -> list[Any]:
            assert self.model.name == "layers.htp.onnx"
            compiles.append(len(onnx.load(str(self.model)).graph.output))
            return super().run(names, feeds)

    monkeypatch.setattr(qnn, "ChildSession", Counting)
    whole = _build(convnet, "qnn", tmp_path / "a", damaged=False).layer_diff
    assert len(compiles) == 1 and whole["total"] == len(whole["layers"]) >= 5, whole
    sizes = layers.tensor_bytes(onnx.load(str(convnet.onnx)))
    rows = {r[0] for r in whole["layers"]}
    budget = max(sizes[t] for t in rows) + 1  # forces several runs
    monkeypatch.setattr(layerdiff, "HTP_BYTES", budget)
    compiles.clear()
    split = _build(convnet, "qnn", tmp_path / "b", damaged=False).layer_diff
    assert len(compiles) >= 2 and [r[0] for r in split["layers"]] == [
        r[0] for r in whole["layers"]], (compiles, split)


def test_qnn_int8_layer_diff_reads_each_quantized_unit_whole_through_taps(
        convnet: ModelFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The W8A16 artifact's walk: the graph compiled for it holds every quantized unit the
    artifact holds (no graph output feeds a QuantizeLinear, qdq_prep.tap_quantized), and
    each layer is reported under its own source tensor name."""
    graphs: list[tuple[onnx.ModelProto, list[str]]] = []

    class Recording(htp_child.ChildSession):
        def run(self, names: list[str], feeds: dict[str, Any]) -> list[Any]:
            graphs.append((onnx.load(str(self.model)), list(names)))
            return super().run(names, feeds)

    monkeypatch.setattr(qnn, "ChildSession", Recording)
    spec = BuildSpec(convnet.onnx, SourceFormat.ONNX, {"default": convnet.inputs},
                     platforms=("qnn",), settings=pipeline_settings("qnn", {
                         "precision": "int8", "soc": "SM8650"}),
                     reference_path=convnet.reference, calibration_path=convnet.calibration)
    (out,) = Pipeline().build(spec, tmp_path)
    assert out.state == "ready" and out.precision == "int8", out.error
    assert graphs
    taps: list[str] = []
    for graph, asked in graphs:
        quantized = {n.input[0] for n in graph.graph.node if n.op_type == "QuantizeLinear"}
        outputs = {o.name for o in graph.graph.output}
        taps = [n.removesuffix(qdq_prep.TAP_SUFFIX) for n in asked
                if n.endswith(qdq_prep.TAP_SUFFIX)]
        assert taps and not quantized & outputs
        assert set(asked) <= outputs  # every tensor asked for, tapped or not, is an output
    diff = out.layer_diff
    rows = [r[0] for r in diff["layers"]]
    assert "unavailable" not in diff and len(rows) == diff["total"] >= 4
    assert set(taps) <= set(rows)  # each tapped tensor reported by its own name


def test_qnn_layer_walk_children_run_inside_the_compile_sandbox(
        convnet: ModelFiles, tmp_path: Path) -> None:
    """Production builds run in the bubblewrap sandbox: the walk's HTP child starts there
    too (the sandbox's own Python and code paths, its limits) and the diff is complete."""
    from server.compile.sandbox import SandboxedPipeline, SandboxPolicy

    spec = BuildSpec(convnet.onnx, SourceFormat.ONNX, {"default": convnet.inputs},
                     platforms=("qnn",), settings=pipeline_settings("qnn", {}),
                     reference_path=convnet.reference)
    (out,) = SandboxedPipeline(SandboxPolicy()).build(spec, tmp_path)
    assert out.state == "ready", out.error
    diff = out.layer_diff
    assert "unavailable" not in diff, diff
    assert len(diff["layers"]) == diff["total"] >= 5
