"""The per-layer diff (seed §13.1) through the real pipeline on every runnable platform: each
artifact's intermediates against the FP32 source, the deliberately damaged layer named as the
first one below the thresholds (and by the failing gate), the report capped."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import onnx
import pytest

from server.compile import SourceFormat, qnn_runtime
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
    real = qnn_runtime.open_session

    def counting(path: Path, **kw: object) -> object:
        if Path(path).name == "layers.htp.onnx":
            compiles.append(len(onnx.load(str(path)).graph.output))
        return real(path, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(qnn, "open_session", counting)
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
