"""The numeric gate's two questions through the real pipeline and real runtimes: a faithful
compile passes by default, a damaged one fails naming the damaged layer first; the precision's
own cost is reported, localized, and fails only when the version opts in to the seed
thresholds, with advice the platform can follow; near-zero and all-zero outputs are explained
instead of reported as a bare cosine of 0."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from server.compile import InputSpec, SourceFormat
from server.compile.compilers.onnx import OnnxCompiler
from server.compile.compilers.qnn import QnnCompiler
from server.compile.gates import layers, numeric
from server.compile.gates.emulate import to_fp16
from server.compile.pipeline import BuildSpec, Pipeline
from server.compile.settings_map import pipeline_settings
from server.compile.source import run_onnx_cpu
from server.compile.types import CompiledArtifact, CompileRequest, Precision
from tests.compile.compile_models import ModelFiles, onnx_model


def _second_conv(path: Path) -> tuple[str, str]:
    convs = [n for n in onnx.load(str(path)).graph.node if n.op_type == "Conv"]
    return convs[1].name, convs[1].input[1]


class WeightScalingCompiler(OnnxCompiler):
    """A deliberately wrong compiler: ships the ONNX with one conv's weights scaled by 1.3."""

    def compile(self, request: CompileRequest, workdir: Path) -> list[CompiledArtifact]:
        (art,) = super().compile(request, workdir)
        model = onnx.load(str(art.path))
        _, weight = _second_conv(art.path)
        for t in model.graph.initializer:
            if t.name == weight:
                t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * 1.3, t.name))
        onnx.save(model, str(art.path))
        return [art]


def _scale_second_conv(src: Path, out: Path) -> Path:
    model = onnx.load(str(src))
    _, weight = _second_conv(src)
    for t in model.graph.initializer:
        if t.name == weight:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * 1.3, t.name))
    onnx.save(model, str(out))
    return out


class WeightScalingQnnCompiler(QnnCompiler):
    """A deliberately wrong QNN compile: the HTP gets the graph with one conv scaled by 1.3."""

    def compile(self, request: CompileRequest, workdir: Path) -> list[CompiledArtifact]:
        assert request.onnx_path is not None
        damaged = _scale_second_conv(request.onnx_path, workdir / "damaged.onnx")
        return super().compile(replace(request, onnx_path=damaged), workdir)


def _build(model: ModelFiles, platform: str, tmp: Path, flat: dict[str, object] | None = None,
           compilers: dict[str, type] | None = None) -> dict[str, object]:
    spec = BuildSpec(model.onnx, SourceFormat.ONNX, {"default": model.inputs},
                     platforms=(platform,), settings=pipeline_settings(platform, flat or {}),
                     reference_path=model.reference)
    (out,) = Pipeline(compilers=compilers).build(spec, tmp) if compilers else \
        Pipeline().build(spec, tmp)
    return {"state": out.state, "error": out.error, "numeric": out.gates["numeric"]}


def test_damaged_layer_fails_the_gate_naming_that_layer_first(convnet, tmp_path):
    node, _ = _second_conv(convnet.onnx)
    out = _build(convnet, "onnx", tmp_path, compilers={"onnx": WeightScalingCompiler})
    num = out["numeric"]
    assert out["state"] == "failed" and num["status"] == "failed"
    first = num["layers"]["faithful"]["first_below"]
    assert first["node"] == node and first["op"] == "Conv", first
    assert first["snr_db"] < 80 and num["layers"]["faithful"]["last_agreeing"] is not None
    assert node in out["error"] and "exclude the onnx platform" in out["error"]


def test_damaged_htp_compile_is_localized_on_the_htp_itself(convnet, tmp_path):
    """The QNN context binary exposes no intermediates: the walk compiles the artifact's graph
    on the same HTP with the tensors as outputs and names the damaged conv first."""
    node, _ = _second_conv(convnet.onnx)
    out = _build(convnet, "qnn", tmp_path, compilers={"qnn": WeightScalingQnnCompiler})
    num = out["numeric"]
    assert out["state"] == "failed" and num["status"] == "failed"
    walk = num["layers"]["faithful"]
    assert "onnxruntime-qnn" in walk["basis"] and walk["first_below"]["node"] == node, walk
    error = str(out["error"])
    assert node in error and "not from FP16 storage" in error and "higher" not in error


class FusedKernelsCompiler(OnnxCompiler):
    """A faithful graph whose runtime, as devices run it, computes something else: what
    onnxruntime's fused int8 kernels do to a fragile QDQ model (smart-turn's), here a 1.3×
    on the output that only the fused run shows."""

    def run(self, artifact: CompiledArtifact, feeds: list) -> list:
        return [[o * 1.3 for o in outs] for outs in super().run(artifact, feeds)]


def test_a_loss_only_the_fused_run_shows_is_put_in_the_fused_kernels(convnet, tmp_path):
    out = _build(convnet, "onnx", tmp_path, compilers={"onnx": FusedKernelsCompiler})
    walk = out["numeric"]["layers"]["faithful"]
    assert out["state"] == "failed" and walk["first_below"] is None, walk
    fused = walk["fused"]
    assert fused["loss_in_fused_kernels"] is True
    assert fused["unfused_vs_yardstick"][0]["snr_db"] > 100  # the graph: exact to float32
    assert fused["fused_vs_unfused"][0]["snr_db"] < 20
    assert "the loss is in onnxruntime's fused kernels, not in the graph" in out["error"]
    assert "appears only at the outputs" not in out["error"]


def test_the_fused_kernels_are_not_blamed_when_the_graph_itself_departs(convnet, tmp_path):
    """The walk compared one sample; when the artifact's unfused outputs depart from the
    yardstick on the others, the graph is not cleared and the walk's sentence stands."""
    from server.compile.gates.verdict import _fused_kernels

    feeds = [{"image": np.ones((1, 3, 16, 16), np.float32)}]
    (outs,) = run_onnx_cpu(convnet.onnx, feeds)
    walked = {"basis": "source at INT8 vs the artifact", "compared": 3, "first_below": None,
              "summary": "kept"}
    t = numeric.thresholds_for(Precision.INT8, {})
    _fused_kernels(walked, convnet.onnx, feeds, [[o * 1.3 for o in outs]],
                   [[o * 2.0 for o in outs]], t)
    assert walked["fused"]["loss_in_fused_kernels"] is False and walked["summary"] == "kept"
    found = {**walked, "first_below": {"node": "conv"}}
    found.pop("fused")
    _fused_kernels(found, convnet.onnx, feeds, [[o * 1.3 for o in outs]], [outs], t)
    assert "fused" not in found  # a layer was named: nothing to add


def test_faithful_compile_passes_with_no_layer_walk(convnet, tmp_path):
    out = _build(convnet, "onnx", tmp_path)
    assert out["state"] == "ready" and "layers" not in out["numeric"]


def test_unknown_precision_gate_value_fails_naming_the_setting(convnet, tmp_path):
    out = _build(convnet, "onnx", tmp_path, {"precision_gate": "strict"})
    assert out["state"] == "failed"
    assert "invalid numeric gate settings: precision_gate must be off or seed" in out["error"]


def _cancellation_onnx(path: Path) -> Path:
    """y = relu((x + 2048) - 2048) · 3: exact in FP32; in FP16 the 2048 offset leaves steps of
    2 for x, a real precision loss that starts at node `cancel`."""
    inits = [numpy_helper.from_array(np.array(2048.0, np.float32), "offset"),
             numpy_helper.from_array(np.array(3.0, np.float32), "three")]
    nodes = [helper.make_node("Add", ["x", "offset"], ["shifted"], name="shift"),
             helper.make_node("Sub", ["shifted", "offset"], ["back"], name="cancel"),
             helper.make_node("Relu", ["back"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "three"], ["y"], name="scale")]
    return onnx_model(path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                  [1, 64])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], inits)


def _cancellation(tmp: Path) -> ModelFiles:
    path = _cancellation_onnx(tmp / "cancel.onnx")
    ref = tmp / "ref.npz"
    np.savez(ref, x=np.random.default_rng(0).standard_normal((2, 1, 64)).astype(np.float32))
    return ModelFiles("cancel", (InputSpec("x", (1, 64)),), path, path, ref, ref)


def test_fp16_loss_of_the_model_itself_passes_by_default_and_says_where_it_starts(tmp_path):
    """On the HTP at FP16 the model loses what FP16 loses: the faithful check passes, the
    precision cost is reported below the seed thresholds and localized at `cancel`."""
    out = _build(_cancellation(tmp_path), "qnn", tmp_path / "b")
    num = out["numeric"]
    assert out["state"] == "ready", out["error"]
    cost = num["precision_cost"]
    assert cost["status"] == "exceeds_seed" and not cost["enforced"]
    assert float(cost["outputs"][0]["snr_db"]) < 40
    assert num["layers"]["precision"]["first_below"]["node"] == "cancel"


def test_seed_thresholds_on_opt_in_fail_with_advice_the_htp_can_follow(tmp_path):
    out = _build(_cancellation(tmp_path), "qnn", tmp_path / "b", {"precision_gate": "seed"})
    assert out["state"] == "failed"
    error = str(out["error"])
    assert "precision cost" in out["numeric"]["reason"] and "'cancel'" in error
    assert "higher precision" not in error.replace("no higher precision", "")
    assert "qnn has no higher precision than FP16" in error and "precision_gate=off" in error


def test_fp16_yardstick_keeps_constants_fp16_cannot_hold_at_fp32(tmp_path):
    """PP-OCR's detector has a BatchNormalization variance of 1e7: cast to FP16 (max 65504)
    it would emulate a 38× error no device has (compilers fold it into the conv)."""
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
             "g": np.ones(4, np.float32), "b": np.zeros(4, np.float32),
             "m": np.zeros(4, np.float32), "v": np.full(4, 1e7, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["y"],
                              name="bn")]
    src = onnx_model(tmp_path / "bn.onnx", nodes,
                     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                     [numpy_helper.from_array(v, k) for k, v in inits.items()])
    feeds = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32) * 100}]
    expected = run_onnx_cpu(src, feeds)[0][0]
    got = run_onnx_cpu(to_fp16(src, tmp_path / "bn16.onnx"), feeds)[0][0]
    assert numeric.cosine(expected, got) > 0.9999
    kept = {n.name for n in onnx.load(str(tmp_path / "bn16.onnx")).graph.node
            if n.op_type == "BatchNormalization"}
    assert kept == {"bn"}


def test_layer_walk_treats_values_beyond_fp16_as_saturated(tmp_path):
    """An attention mask of -3.4e38 is -65504 in FP16 and still masks: not a loss."""
    inits = [numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "neg")]
    nodes = [helper.make_node("Greater", ["x", "zero"], ["keep"], name="keep"),
             helper.make_node("Where", ["keep", "x", "neg"], ["masked"], name="mask"),
             helper.make_node("Softmax", ["masked"], ["y"], axis=-1, name="softmax")]
    inits.append(numpy_helper.from_array(np.array(0.0, np.float32), "zero"))
    src = onnx_model(tmp_path / "m.onnx", nodes,
                     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], inits)
    fp16 = to_fp16(src, tmp_path / "m16.onnx")
    x = {"x": np.linspace(-1, 1, 16, dtype=np.float32)[None]}
    raw = layers.first_divergence(src, fp16, x, 0.999, 40.0, "raw")
    assert raw.first is not None and raw.first.node == "mask"
    clipped = layers.first_divergence(src, fp16, x, 0.999, 40.0, "clipped", clip=65504.0)
    assert clipped.first is None and clipped.compared == 2


def _judge(reference, candidate, at_precision=None):  # type: ignore[no-untyped-def]
    return numeric.judge(reference, at_precision or reference, candidate, Precision.FP16, {},
                         classifier=False, runner="test", basis="test")


def test_near_zero_output_is_judged_by_max_abs_and_says_so():
    """PP-OCR's detector on random inputs gives a probability map ≤ 7e-5; the HTP's FP16
    returns zeros: cosine 0, yet every value is within 7e-5."""
    ref = [[np.full((1, 64), 5e-5, np.float32)]]
    ok = _judge(ref, [[np.zeros((1, 64), np.float32)]])
    assert ok.status == "passed" and "near zero" in ok.notes[0]
    bad = _judge(ref, [[np.full((1, 64), 0.01, np.float32)]])
    assert bad.status == "failed" and "near-zero output" in bad.reason


def test_cosine_zero_says_the_artifact_output_is_all_zeros():
    ref = [[np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)]]
    report = _judge(ref, [[np.zeros((1, 64), np.float32)]])
    assert report.status == "failed" and "the artifact's output 0 is all zeros" in report.reason


def test_compile_loss_beyond_what_fp16_allows_fails_even_when_fp16_is_fine():
    rng = np.random.default_rng(0)
    ref = [[rng.standard_normal((1, 512))]]
    fp16 = [[ref[0][0] + rng.standard_normal((1, 512)) * 1e-4]]  # 80 dB: FP16's own cost
    broken = [[ref[0][0] + rng.standard_normal((1, 512)) * 0.1]]  # 20 dB
    report = _judge(ref, broken, fp16)
    assert report.status == "failed" and report.precision_cost["status"] == "within_seed"
    assert _judge(ref, [[ref[0][0] + rng.standard_normal((1, 512)) * 3e-3]], fp16).passed


def test_seed_gate_stops_an_artifact_far_from_fp32_behind_a_faithful_yardstick():
    """ppocr-cls at W8A16 with one conv kept float: the QDQ yardstick 46.5 dB from FP32 and
    the HTP artifact ~20 dB from the yardstick passed both checks, so the precision search
    shipped an "INT8-threshold" artifact 19.9 dB from FP32. Opted in, the seed thresholds hold
    for the artifact itself."""
    rng = np.random.default_rng(0)
    ref = [[rng.standard_normal((1, 512))]]
    qdq = [[ref[0][0] + rng.standard_normal((1, 512)) * 5e-3]]  # 46 dB: within the seed's 40
    drifted = [[qdq[0][0] + rng.standard_normal((1, 512)) * 0.09]]  # 21 dB from both
    judged = {gate: numeric.judge(ref, qdq, drifted, Precision.INT8, {"precision_gate": gate},
                                  classifier=False, runner="test", basis="the QDQ source")
              for gate in ("off", "seed")}
    assert judged["off"].status == "passed"  # faithful to its yardstick at the INT8 default
    seed = judged["seed"]
    assert seed.status == "failed" and seed.precision_cost["status"] == "within_seed"
    assert "artifact vs FP32: output 0: SNR 2" in seed.reason
    close = [[qdq[0][0] + rng.standard_normal((1, 512)) * 1e-3]]
    assert numeric.judge(ref, qdq, close, Precision.INT8, {"precision_gate": "seed"},
                         classifier=False, runner="test", basis="the QDQ source").passed


@pytest.mark.slow
def test_lstm_over_160_steps_names_where_the_htp_fp16_loss_starts(tmp_path):
    """A 2-layer LSTM over 160 steps: FP16 storage alone keeps 70 dB, the HTP's FP16
    arithmetic 32.7 dB (passes the 30 dB default). A version asking 40 dB fails, and the walk
    on the HTP names the first LSTM node as where the loss starts."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(40, 64, num_layers=2, batch_first=True)
            self.proj = torch.nn.Linear(64, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(self.lstm(x)[0][:, -1])

    torch.manual_seed(0)
    path = tmp_path / "lstm.onnx"
    torch.onnx.export(Net().eval(), (torch.randn(1, 160, 40),), str(path), dynamo=False,
                      opset_version=14, input_names=["x"])
    ref = tmp_path / "ref.npz"
    np.savez(ref, x=np.random.default_rng(0).standard_normal((1, 1, 160, 40)).astype(np.float32))
    model = ModelFiles("lstm", (InputSpec("x", (1, 160, 40)),), path, path, ref, ref)
    out = _build(model, "qnn", tmp_path / "b", {"min_snr_db": 40})
    num = out["numeric"]
    assert out["state"] == "failed" and num["precision_cost"]["status"] == "within_seed"
    first = num["layers"]["faithful"]["first_below"]
    assert first["op"] == "LSTM" and first["node"] == "/lstm/LSTM", first


@pytest.mark.slow
def test_ppocr_detector_on_random_inputs_is_explained_not_reported_as_cosine_zero(tmp_path):
    """Issue 19's "cosine 0.000000": PP-OCR's detector on inputs in [0, 1) outputs a
    probability map of at most 6.8e-5, which the HTP's FP16 returns as zeros. Judged by max abs
    diff with a note saying why; the FP16 yardstick stays sane (the BatchNorm variance of 1e7
    kept FP32: cast to 65504 it gave max 1.0 where FP32 has 6.8e-5)."""
    from tests.corpus.fetch import ppocr_model

    ref = tmp_path / "ref.npz"
    np.savez(ref, x=np.random.default_rng(0).random((1, 1, 3, 640, 640)).astype(np.float32))
    path = ppocr_model("det")
    model = ModelFiles("det", (InputSpec("x", (1, 3, 640, 640)),), path, path, ref, ref)
    # The per-layer diff (tests/compile/test_layer_diff.py) would compile this 640×640
    # detector on the emulated HTP once more per 160 tensors; this case is about the gate.
    out = _build(model, "qnn", tmp_path / "b", {"numeric_samples": 1, "layer_diff": "off"})
    num = out["numeric"]
    assert out["state"] == "ready", out["error"]
    assert "near zero on every reference sample" in num["notes"][0]
    assert float(num["outputs"][0]["max_abs_diff"]) < 1e-4
    cost = num["precision_cost"]
    assert cost["status"] == "within_seed" and float(cost["outputs"][0]["max_abs_diff"]) < 1e-5


def test_a_yardstick_that_fp16_breaks_is_reported_as_the_precisions_loss(tmp_path: Path) -> None:
    """Basic Pitch's log-CQT at FP16 gives infinities: the source at FP16 scores SNR -inf
    against FP32, and the failure says that precision loses the model (before, it said the
    loss came "from the compile, not from FP16 storage")."""
    from server.compile.gates.verdict import failure_message
    from server.compile.types import Target

    ref = [[np.linspace(-1, 1, 64, dtype=np.float32)]]
    broken = [[np.full(64, -np.inf, np.float32)]]
    report = numeric.judge(ref, broken, broken, Precision.FP16, {}, classifier=False,
                           runner="test", basis="the source at FP16")
    assert report.status == "failed"
    art = CompiledArtifact(tmp_path / "m.bin", Target("qnn", "x", "qnn_context"),
                           Precision.FP16, {})
    msg = failure_message(report, art, "qnn")
    assert "itself loses this model" in msg and "not the compile's" in msg
    assert "so the loss comes from the compile" not in msg
    # SNR -inf fails every threshold, so lowering min_snr_db is not offered.
    assert "lowering min_cosine" not in msg and "no threshold accepts it" in msg
    assert "the artifact itself scores cosine" in msg  # against FP32: its own figure
    assert "exclude the qnn platform" in msg


def test_a_finite_loss_keeps_the_advice_to_accept_it_by_lowering_the_thresholds(
        tmp_path: Path) -> None:
    from server.compile.gates.verdict import failure_message
    from server.compile.types import Target

    ref = [[np.linspace(-1, 1, 64, dtype=np.float32)]]
    noisy = [[ref[0][0] + np.random.default_rng(0).standard_normal(64).astype(np.float32)
              * 0.1]]
    report = numeric.judge(ref, ref, noisy, Precision.FP16, {}, classifier=False,
                           runner="test", basis="the source at FP16")
    assert report.status == "failed"
    art = CompiledArtifact(tmp_path / "m.bin", Target("qnn", "x", "qnn_context"),
                           Precision.FP16, {})
    msg = failure_message(report, art, "qnn")
    assert "lowering min_cosine / min_snr_db in the version's qnn settings" in msg
    assert "no threshold accepts it" not in msg


def test_layer_metrics_are_the_definitions_on_float32_and_float64_tensors():
    """The layer walk's figures (computed from one float64 conversion and one difference per
    tensor) are cosine, SNR and max abs diff as defined, whatever the inputs' dtype."""
    from server.compile.gates.metrics import cosine, snr_db

    rng = np.random.default_rng(3)
    ref = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    cand = ref + rng.standard_normal(ref.shape).astype(np.float32) * 0.01
    r64, c64 = ref.astype(np.float64).ravel(), cand.astype(np.float64).ravel()
    want_cos = float(r64 @ c64 / (np.sqrt(r64 @ r64) * np.sqrt(c64 @ c64)))
    want_snr = 10 * np.log10(np.sum(r64**2) / np.sum((r64 - c64) ** 2))
    for a, b in ((ref, cand), (ref.astype(np.float64), cand.astype(np.float64))):
        m = layers.layer_metrics(a, b.reshape(-1), "n", "Conv", "t")  # flat: reshaped
        assert m.cosine == pytest.approx(want_cos, abs=1e-12)
        assert m.snr_db == pytest.approx(want_snr, rel=1e-12)
        assert m.max_abs_diff == pytest.approx(float(np.max(np.abs(r64 - c64))), rel=1e-12)
        assert snr_db(a, b) == m.snr_db and cosine(a, b) == m.cosine
    assert ref.dtype == np.float32 and np.array_equal(ref.ravel(), r64)  # inputs untouched
    nan = cand.copy()
    nan.flat[0] = np.nan
    m = layers.layer_metrics(ref, nan, "n", "Conv", "t")
    assert (m.cosine, m.snr_db) == (0.0, -np.inf)  # a NaN output: no agreement at all
    assert m.max_abs_diff == pytest.approx(float(np.max(np.abs(r64 - c64)[1:])), rel=1e-12)
    same = layers.layer_metrics(ref, ref, "n", "Conv", "t")
    assert (same.cosine, same.snr_db, same.max_abs_diff) == (pytest.approx(1.0), np.inf, 0.0)


def test_a_mask_of_infinities_both_sides_hold_is_not_a_failing_layer() -> None:
    """An additive attention mask of -inf in the source and in the artifact still masks:
    the tensor is compared on its finite values (it was SNR -inf through inf - inf and
    became the first failing layer of every INT8 transformer build with such a mask)."""
    rng = np.random.default_rng(5)
    scores = rng.standard_normal((4, 16)).astype(np.float32)
    masked = np.where(np.triu(np.ones((4, 16), bool), 1), -np.inf, scores)
    close = np.where(np.isinf(masked), masked, masked + 0.001 * rng.standard_normal((4, 16)))
    m = layers.layer_metrics(masked, close, "n", "Add", "t")
    finite = np.isfinite(masked)
    assert m.snr_db == pytest.approx(float(layers.snr_db(masked[finite], close[finite])))
    assert 40 < m.snr_db < 80 and m.cosine > 0.9999 and m.max_abs_diff < 0.01
    assert not m.below(0.995, 40.0)
    assert layers.layer_metrics(masked, masked, "n", "Add", "t").snr_db == np.inf
    # An infinity on one side only is still no agreement at all.
    broken = close.copy()
    broken[0, 0] = -np.inf
    assert layers.layer_metrics(masked, broken, "n", "Add", "t").snr_db == -np.inf
    flipped = np.where(np.isinf(masked), np.inf, close)
    assert layers.layer_metrics(masked, flipped, "n", "Add", "t").snr_db == -np.inf


def test_a_yardstick_left_with_less_signal_than_the_gate_asks_is_the_precisions_loss(
        tmp_path: Path) -> None:
    """Magika at FP16 before its sums were prescaled: the FP16 yardstick kept SNR -0.2 dB
    against FP32 (finite), and the failure said "keeps SNR -0.2 dB …, so the loss comes from
    the compile" — blaming the compile for the precision's loss."""
    from server.compile.gates.verdict import failure_message
    from server.compile.types import Target

    rng = np.random.default_rng(0)
    ref = [[rng.standard_normal(64).astype(np.float32)]]
    lost = [[ref[0][0] + rng.standard_normal(64).astype(np.float32)]]  # ~0 dB of signal
    worse = [[rng.standard_normal(64).astype(np.float32) * 50]]
    report = numeric.judge(ref, lost, worse, Precision.FP16, {}, classifier=False,
                           runner="test", basis="the source at FP16")
    assert report.status == "failed"
    assert report.precision_cost["status"] == "exceeds_seed"
    art = CompiledArtifact(tmp_path / "m.bin", Target("qnn", "x", "qnn_context"),
                           Precision.FP16, {})
    msg = failure_message(report, art, "qnn")
    assert "itself loses this model (SNR" in msg and "not the compile's" in msg
    assert "so the loss comes from the compile" not in msg
    assert "the artifact itself scores cosine" in msg
    assert "lowering min_cosine" in msg  # finite: a threshold can still accept it
