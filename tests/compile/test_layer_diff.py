"""The per-layer diff (seed §13.1) through the real pipeline on every runnable platform: each
artifact's intermediates against the FP32 source, the deliberately damaged layer named as the
first one below the thresholds (and by the failing gate), the report capped."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from server.compile import SourceFormat
from server.compile.compilers.coreml import CoreMLCompiler
from server.compile.gates import layerdiff
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
