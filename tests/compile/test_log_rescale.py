"""Log-power front ends normalized at run time (server/compile/log_rescale.py): the rewrite
leaves FP32 outputs as they were and makes the FP16 yardstick hold int16-range audio, over
the forms such front ends take (the square as Pow or as a product, one or two squares, a
filterbank or none, the floor as Clip, Max or an epsilon); the graphs it must not touch are
left alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from server.compile import BuildSpec, InputSpec, Pipeline, SourceFormat
from server.compile.gates.emulate import to_fp16
from server.compile.gates.metrics import snr_db
from server.compile.log_rescale import chains, rescale_logs
from server.compile.source import run_onnx_cpu

F = TensorProto.FLOAT
SAMPLES, WINDOW, HOP, BINS, MELS = 1760, 256, 160, 129, 24


def _stft_kernels() -> tuple[np.ndarray, np.ndarray]:
    n, k = np.arange(WINDOW), np.arange(BINS)[:, None]
    window = np.hanning(WINDOW)
    real = (window * np.cos(2 * np.pi * k * n / WINDOW)).astype(np.float32)
    imag = (-window * np.sin(2 * np.pi * k * n / WINDOW)).astype(np.float32)
    return real[:, None, :], imag[:, None, :]


def _mel() -> np.ndarray:
    """Triangular filters with Slaney-like normalization (columns sum to ~0.03)."""
    edges = np.linspace(0, BINS - 1, MELS + 2)
    bins = np.arange(BINS)[:, None]
    left, centre, right = edges[:-2], edges[1:-1], edges[2:]
    tri = np.maximum(0, np.minimum((bins - left) / (centre - left),
                                   (right - bins) / (right - centre)))
    return (tri * 0.03 / tri.sum(axis=0)).astype(np.float32)


def front_end(square: str = "pow", squares: int = 2, filterbank: bool = True,
              floor: str = "clip", bias: bool = False, power_output: bool = False,
              root: bool = False, magnitude: bool = False, branches: bool = False
              ) -> onnx.ModelProto:
    """openWakeWord's mel front end in small: STFT as two Convs, power, mel MatMul, floor,
    10·log10, top-80-dB clamp. `magnitude`: the power's square root, transposed and squared
    again (Basic Pitch's log(|CQT|² + ε)); `branches`: the real part as a Concat of two
    Convs over the bins and the imaginary part as the Neg of a Conv (Basic Pitch's octaves
    and its tf2onnx export)."""
    real, imag = _stft_kernels()
    inits = {"kr": real, "ki": imag, "mel": _mel(), "two": np.array(2.0, np.float32),
             "lo": np.array(1e-10, np.float32), "hi": np.array(np.inf, np.float32),
             "ten": np.array(10 / np.log(10), np.float32), "top": np.array(80, np.float32),
             "ax": np.array([1], np.int64), "br": np.full(BINS, 0.5, np.float32)}
    nodes = [helper.make_node("Unsqueeze", ["x", "ax"], ["x1"])]
    amplitudes = ["r", "i"][:squares]
    if branches:
        inits.update(kr_lo=real[:64], kr_hi=real[64:], ki_neg=-imag)
    for a, k in zip(amplitudes, ["kr", "ki"], strict=False):
        conv = {"kernel_shape": [WINDOW], "strides": [HOP]}
        if branches and a == "r":
            nodes += [helper.make_node("Conv", ["x1", "kr_lo"], ["rlo"], **conv),
                      helper.make_node("Conv", ["x1", "kr_hi"], ["rhi"], **conv),
                      helper.make_node("Concat", ["rlo", "rhi"], [f"{a}c"], axis=1)]
        elif branches:
            nodes += [helper.make_node("Conv", ["x1", "ki_neg"], ["ineg"], **conv),
                      helper.make_node("Neg", ["ineg"], [f"{a}c"])]
        else:
            nodes.append(helper.make_node("Conv", ["x1", k, *(["br"] if bias else [])],
                                          [f"{a}c"], **conv))
        nodes.append(helper.make_node("Transpose", [f"{a}c"], [a], perm=[0, 2, 1]))
        nodes.append(helper.make_node("Pow", [a, "two"], [f"{a}2"]) if square == "pow" else
                     helper.make_node("Mul", [a, a], [f"{a}2"]))
    power = "r2"
    if squares == 2:
        nodes.append(helper.make_node("Add", ["r2", "i2"], ["p"]))
        power = "p"
    if root or magnitude:
        nodes.append(helper.make_node("Sqrt", [power], ["pr"]))
        power = "pr"
    if magnitude:
        nodes += [helper.make_node("Transpose", ["pr"], ["prt"], perm=[0, 1, 2]),
                  helper.make_node("Pow", ["prt", "two"], ["pm"]) if square == "pow" else
                  helper.make_node("Mul", ["prt", "prt"], ["pm"])]
        power = "pm"
    if filterbank:
        nodes.append(helper.make_node("MatMul", [power, "mel"], ["m"]))
        power = "m"
    floored = {"clip": helper.make_node("Clip", [power, "lo", "hi"], ["f"]),
               "clip_min": helper.make_node("Clip", [power, "lo"], ["f"]),
               "max": helper.make_node("Max", [power, "lo"], ["f"]),
               "eps": helper.make_node("Add", [power, "lo"], ["f"])}[floor]
    nodes += [floored, helper.make_node("Log", ["f"], ["l"], name="log"),
              helper.make_node("Mul", ["l", "ten"], ["db"]),
              helper.make_node("ReduceMax", ["db"], ["peak"], keepdims=0),
              helper.make_node("Sub", ["peak", "top"], ["low"]),
              helper.make_node("Max", ["db", "low"], ["y"])]
    dims = [1, (SAMPLES - WINDOW) // HOP + 1, MELS if filterbank else BINS]
    outputs = [helper.make_tensor_value_info("y", F, dims)]
    if power_output:
        outputs.append(helper.make_tensor_value_info(power, F, dims))
    graph = helper.make_graph(nodes, "front_end",
                              [helper.make_tensor_value_info("x", F, [1, SAMPLES])], outputs,
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _audio(rng: np.random.Generator, level: float) -> np.ndarray:
    """A tone in noise at `level`, as int16 samples hold it: clipped to ±32767. (Unclipped,
    the noise's tails at level 32767 reached 65,580, past FP16's 65,504 — no FP16 graph
    holds that input, and no int16 recording has it.)"""
    t = np.arange(SAMPLES) / 16000
    tone = np.sin(2 * np.pi * rng.uniform(200, 3000) * t)
    samples = level * (0.7 * tone + 0.3 * rng.standard_normal(SAMPLES))
    return np.clip(samples, -32767, 32767)[None].astype(np.float32)


def _run(model: onnx.ModelProto, path: Path, feeds: list) -> list:
    onnx.save(model, str(path))
    return [o[0] for o in run_onnx_cpu(path, feeds)]


@settings(max_examples=24, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(square=st.sampled_from(["pow", "mul"]), squares=st.sampled_from([1, 2]),
       filterbank=st.booleans(), floor=st.sampled_from(["clip", "clip_min", "max", "eps"]),
       magnitude=st.booleans(), branches=st.booleans(),
       level=st.sampled_from([32767.0, 3000.0, 1.0]), seed=st.integers(0, 2 ** 16))
def test_the_rewrite_keeps_fp32_outputs_and_makes_fp16_hold_int16_audio(
        square: str, squares: int, filterbank: bool, floor: str, magnitude: bool,
        branches: bool, level: float, seed: int, tmp_path: Path) -> None:
    rng = np.random.default_rng(seed)
    model = front_end(square, squares, filterbank, floor, magnitude=magnitude,
                      branches=branches)
    feeds = [{"x": _audio(rng, level)} for _ in range(2)]
    before = _run(model, tmp_path / "before.onnx", feeds)
    assert rescale_logs(model) == ["log"]
    onnx.checker.check_model(model)
    after = _run(model, tmp_path / "after.onnx", feeds)
    for a, b in zip(before, after, strict=True):
        assert snr_db(a, b) > 90  # the same function, to FP32 rounding
    to_fp16(tmp_path / "after.onnx", tmp_path / "after16.onnx")
    half = [o[0] for o in run_onnx_cpu(tmp_path / "after16.onnx", feeds)]
    for a, h in zip(before, half, strict=True):
        assert snr_db(a, h) > 30, (snr_db(a, h), level)
    if level > 1000:  # without the rewrite, FP16 overflows at the square
        to_fp16(tmp_path / "before.onnx", tmp_path / "before16.onnx")
        plain = [o[0] for o in run_onnx_cpu(tmp_path / "before16.onnx", feeds)]
        assert all(not snr_db(a, p) > 30 for a, p in zip(before, plain, strict=True))


@pytest.mark.parametrize(("square", "floor"), [("pow", "clip"), ("mul", "max")])
def test_quiet_audio_loses_nothing_to_the_rewrite_at_fp16(square: str, floor: str,
                                                          tmp_path: Path) -> None:
    """Quiet audio (level 1) fits FP16 without the rewrite, and one real square without a
    filterbank is where FP16's own error is largest (bins near zero come from cancelling
    STFT sums: 35–45 dB). The input is divided by a power of two, so the rewritten graph's
    STFT reads the same FP16 samples as the plain one and its SNR is the plain graph's.
    (Divided by its exact peak, every sample was rounded once more: a median 1.8 dB lost,
    up to 5 dB on 30 inputs, and 27.8 dB on one generated example.)"""
    rng = np.random.default_rng(7)
    feeds = [{"x": _audio(rng, 1.0)} for _ in range(8)]
    model = front_end(square, squares=1, filterbank=False, floor=floor)
    before = _run(model, tmp_path / "before.onnx", feeds)
    to_fp16(tmp_path / "before.onnx", tmp_path / "before16.onnx")
    plain = [o[0] for o in run_onnx_cpu(tmp_path / "before16.onnx", feeds)]
    assert rescale_logs(model) == ["log"]
    _run(model, tmp_path / "after.onnx", feeds)
    to_fp16(tmp_path / "after.onnx", tmp_path / "after16.onnx")
    half = [o[0] for o in run_onnx_cpu(tmp_path / "after16.onnx", feeds)]
    lost = [snr_db(a, p) - snr_db(a, h) for a, p, h in zip(before, plain, half, strict=True)]
    assert max(lost) < 0.5, [round(x, 2) for x in lost]


def test_graphs_whose_log_is_not_of_a_power_spectrum_alone_are_left_untouched() -> None:
    # a bias makes the STFT affine; a chain tensor read elsewhere would change value; a
    # square root halves the degree, which the rewrite tracks only when it is squared again
    for model in (front_end(bias=True), front_end(power_output=True), front_end(root=True)):
        nodes = [n.SerializeToString() for n in model.graph.node]
        assert chains(model) == [] and rescale_logs(model) == []
        assert [n.SerializeToString() for n in model.graph.node] == nodes


def test_an_int16_audio_front_end_builds_at_fp16_on_every_platform(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    onnx.save(front_end(), str(tmp_path / "mel.onnx"))
    np.savez(tmp_path / "ref.npz", x=np.stack([_audio(rng, 32767.0) for _ in range(2)]))
    spec = BuildSpec(tmp_path / "mel.onnx", SourceFormat.ONNX,
                     {"default": (InputSpec("x", (1, SAMPLES)),)},
                     platforms=("onnx", "coreml", "qnn"), reference_path=tmp_path / "ref.npz")
    out = {o.platform: o for o in Pipeline().build(spec, tmp_path / "work")}
    assert {p: o.error for p, o in out.items() if o.state != "ready"} == {}
    for platform in ("coreml", "qnn"):
        gate = out[platform].gates["numeric"]
        assert out[platform].precision == "fp16" and gate["status"] == "passed", gate
        assert all(row["snr_db"] == "inf" or float(row["snr_db"]) > 30
                   for row in gate["vs_fp32"])
    assert out["onnx"].gates["shapes"]["passed"]


def test_the_log_power_of_an_input_itself_holds_at_fp16(tmp_path: Path) -> None:
    """`log(x² + 1e-10)` with amplitudes from 1e-6 to 1 (the precision-island tests' model
    before this rewrite): the squares and 1e-10 are 0 in FP16, so the plain yardstick is
    -inf; rescaled, the floor is representable and the yardstick holds."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "x"], ["p"]),
         helper.make_node("Add", ["p", "eps"], ["f"]),
         helper.make_node("Log", ["f"], ["y"], name="log")], "g",
        [helper.make_tensor_value_info("x", F, [1, 64])],
        [helper.make_tensor_value_info("y", F, [1, 64])],
        [numpy_helper.from_array(np.array(1e-10, np.float32), "eps")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    rng = np.random.default_rng(0)
    feeds = [{"x": (10.0 ** rng.uniform(-6, 0, (1, 64))).astype(np.float32)}]
    before = _run(model, tmp_path / "before.onnx", feeds)
    to_fp16(tmp_path / "before.onnx", tmp_path / "before16.onnx")
    plain = [o[0] for o in run_onnx_cpu(tmp_path / "before16.onnx", feeds)]
    assert not snr_db(before[0], plain[0]) > 30
    assert rescale_logs(model) == ["log"]
    _run(model, tmp_path / "after.onnx", feeds)
    to_fp16(tmp_path / "after.onnx", tmp_path / "after16.onnx")
    half = [o[0] for o in run_onnx_cpu(tmp_path / "after16.onnx", feeds)]
    assert snr_db(before[0], half[0]) > 30


def test_a_magnitude_squared_again_is_the_power_and_a_shape_read_changes_nothing() -> None:
    """sqrt(P)² behind a Transpose is P: the rewrite takes it (an unsquared root it does
    not: above); a `Shape` reading a chain tensor reads a shape the rewrite keeps."""
    model = front_end(magnitude=True, filterbank=False)
    model.graph.node.append(helper.make_node("Shape", ["prt"], ["prt_shape"]))
    model.graph.output.append(helper.make_tensor_value_info("prt_shape", TensorProto.INT64,
                                                            [3]))
    (chain,) = chains(model)
    ops = {model.graph.node[k].op_type for k in chain.power_nodes}
    assert {"Sqrt", "Transpose", "Pow"} <= ops


@pytest.mark.slow
def test_basic_pitchs_log_of_its_cqt_magnitude_holds_at_fp16(tmp_path: Path) -> None:
    """Basic Pitch (tf2onnx): log(|CQT|² + 1e-10), its CQT eight octaves of Pad, Conv,
    Neg and Concat, its magnitude sqrt(re² + im²) squared again. In FP16 the quiet bins
    and 1e-10 are 0 and the upload's outputs -inf; specialized (which rescales), every
    output holds above the FP16 gate's 30 dB, and FP32 is unchanged."""
    from server.compile.shapes import specialize
    from tests.corpus.models import corpus

    (model,) = corpus(["basic-pitch"])
    ref = np.load(model.reference)
    feeds = [{k: ref[k][i] for k in ref.files} for i in range(2)]
    rescaled, report = specialize(onnx.load(str(model.path)), model.inputs)
    assert report.logs_rescaled == (
        "model_1/normalized_log_1/Log;model_1/normalized_log_1/Log",)
    onnx.save(rescaled, str(tmp_path / "rescaled.onnx"))
    to_fp16(tmp_path / "rescaled.onnx", tmp_path / "rescaled16.onnx")
    to_fp16(model.path, tmp_path / "upload16.onnx")
    runs = {name: run_onnx_cpu(path, feeds) for name, path in (
        ("fp32", model.path), ("rescaled", tmp_path / "rescaled.onnx"),
        ("rescaled16", tmp_path / "rescaled16.onnx"), ("upload16", tmp_path / "upload16.onnx"))}

    def snr(name: str, k: int) -> float:
        def flat(samples: list) -> np.ndarray:
            return np.concatenate([np.ravel(s[k]) for s in samples])
        return snr_db(flat(runs["fp32"]), flat(runs[name]))

    for k in range(3):
        assert snr("rescaled", k) > 100  # the same function, to FP32 rounding
        assert snr("rescaled16", k) > 30, snr("rescaled16", k)
        assert not snr("upload16", k) > 30  # -inf: log(0)
