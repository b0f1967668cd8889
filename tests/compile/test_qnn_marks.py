"""Watermarks in QNN artifacts (server/compile/qnn_marks.py), on real HTP compiles: each
cohort's EPContext artifact is compiled from the HTP's source graph marked in the HTP's own
precision (FP16 floats, or the QDQ build's 8-bit weights), passes the gates, and its context
binary — as shipped, after 1% weight noise — names its cohort; the unmarked artifact, another
build and another key's cohorts give "none". The investigation the reader rests on is a test
too: the context binary stores each marked weight as one word one step off, and nothing else
changes but a few header words."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from server import watermark as wm
from server.compile import BuildSpec, InputSpec, Pipeline, SourceFormat, qnn_marks, weights
from server.compile.cohorts import WatermarkSpec
from server.compile.types import Precision

pytestmark = pytest.mark.slow
KEY = b"qnn watermark key for tests"
COHORTS = 4


@pytest.fixture(scope="module")
def convmlp(tmp_path_factory) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
    """Conv 3→64 (3×3, stride 2) → ReLU → Flatten → MatMul 4096×256 → ReLU → MatMul 256×10:
    1.05M weights (1% noise needs about a million: it is ten times a mark's FP16 step)."""
    from onnx import TensorProto, helper, numpy_helper

    from tests.compile.compile_models import onnx_model

    tmp = tmp_path_factory.mktemp("convmlp")
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal((64, 3, 3, 3)) * 0.2)
                                     .astype(np.float32), "conv_w"),
             numpy_helper.from_array((rng.standard_normal(64) * 0.1).astype(np.float32),
                                     "conv_b"),
             numpy_helper.from_array((rng.standard_normal((4096, 256)) / 64)
                                     .astype(np.float32), "fc_w"),
             numpy_helper.from_array((rng.standard_normal((256, 10)) / 16)
                                     .astype(np.float32), "out_w")]
    nodes = [helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["c"], pads=[1, 1, 1, 1],
                              strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("MatMul", ["f", "fc_w"], ["h"]),
             helper.make_node("Relu", ["h"], ["hr"]),
             helper.make_node("MatMul", ["hr", "out_w"], ["y"])]
    path = onnx_model(tmp / "convmlp.onnx", nodes,
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    ref = tmp / "convmlp.ref.npz"
    np.savez(ref, x=rng.standard_normal((8, 1, 3, 16, 16)).astype(np.float32))
    return path, ref


def build(convmlp, precision: str, where: Path, key: bytes = KEY):  # type: ignore[no-untyped-def]
    spec = BuildSpec(convmlp[0], SourceFormat.ONNX, {"default": (InputSpec("x", (1, 3, 16, 16)),)},
                     platforms=("qnn",), settings={"qnn": {"precision": precision}},
                     reference_path=convmlp[1],
                     calibration_path=convmlp[1] if precision == "int8" else None,
                     watermark=WatermarkSpec(COHORTS, key))
    (o,) = Pipeline().build(spec, where)
    assert o.state == "ready", o.error
    return o


@pytest.fixture(scope="module", params=["fp16", "int8"])
def built(request, convmlp, tmp_path_factory):  # type: ignore[no-untyped-def]
    where = tmp_path_factory.mktemp("qnn")
    o = build(convmlp, request.param, where)
    # The graph the HTP compiled: the source, or its QDQ form for the INT8 build.
    o.htp_source = convmlp[0] if request.param == "fp16" else \
        where / "default" / "qnn" / "model.qdq.onnx"
    return request.param, o


def binaries(o) -> tuple[bytes, list[bytes]]:  # type: ignore[no-untyped-def]
    return (qnn_marks.context_binary(o.artifact.path),
            [qnn_marks.context_binary(c.path) for c in o.cohorts])


def test_each_qnn_cohort_is_an_htp_compile_of_its_marked_graph_and_passes_the_gates(built):
    precision, o = built
    assert o.precision == precision and o.format == "onnx-epcontext"
    gate = o.gates["watermark"]
    assert gate["status"] == "passed" and gate["lowest_output_psnr_db"] > 60, gate
    assert len(o.cohorts) == COHORTS
    assert len({c.sha256 for c in o.cohorts} | {o.artifact.sha256}) == COHORTS + 1
    assert all(qnn_marks.is_epcontext(c.path) for c in o.cohorts)


def compile_noise(o, precision: str, where: Path) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The words in which two HTP compiles of the same unmarked graph differ: the header
    words a compile changes (ids, some offsets), found by compiling the graph once more."""
    from server.compile.htp_support import probe

    settings = o.compile_settings
    provider = {"soc_model": str(settings["soc_model"]), "htp_arch": str(settings["htp_arch"]),
                "offload_graph_io_quantization": "0"}
    if precision == "fp16":
        provider["enable_htp_fp16_precision"] = "1"
    probe(o.htp_source, provider, context_out=where / "again.ctx.onnx")
    again = qnn_marks.context_binary(where / "again.ctx.onnx")
    unmarked, _ = binaries(o)
    assert len(again) == len(unmarked)  # the layout does not depend on the compile
    out: np.ndarray = qnn_marks._steps(again, unmarked, qnn_marks.word_bytes(precision)) != 0
    return out


def test_the_context_binary_stores_each_marked_weight_as_one_word_one_step_off(built,
                                                                               tmp_path):
    precision, o = built
    word = qnn_marks.word_bytes(precision)
    unmarked, cohorts = binaries(o)
    steps = [qnn_marks._steps(b, unmarked, word) for b in cohorts]
    # A header word that a compile changes is sometimes a step off in every cohort too (in
    # one INT8 build of six, ~50 of them): those are not the marks this test is about.
    noise = compile_noise(o, precision, tmp_path)
    one_step = np.logical_and.reduce([np.abs(s) == 1 for s in steps]) & ~noise
    # Exactly as many words as the marked graph changes weights (1/32 of the floats, 1/8192
    # of the quantized ones when the build is INT8), the same positions in every cohort.
    marked = qnn_marks.mark_graph(o.htp_source, tmp_path / "c0.onnx", KEY, 0,
                                  Precision(precision))
    before = {t.name: t.values for t in weights.read(o.htp_source)}
    changed = sum(int((t.values != before[t.name]).sum())
                  for t in weights.read(tmp_path / "c0.onnx"))
    assert marked >= 1 and changed > 90
    # (A few are two bit patterns apart — one FP16 step down from a power of two, a byte
    # wrapping — and left out; a header word that this one extra compile happened not to
    # change is a rare extra: up to 3 seen in 30 runs.)
    assert 0.95 * changed <= int(one_step.sum()) <= changed + 8, (int(one_step.sum()), changed)
    # Header words that differ between any two compiles: usually 100–200, once 815 of the
    # 1.1M (a compile's header varies); a layout that moved with the values would change
    # nearly every word, so a thousandth of them is the bound.
    other = [int(((s != 0) & ~one_step).sum()) for s in steps]
    assert max(other) < steps[0].size / 1000, other
    # The cohorts' steps there are the keyed patterns' signs: ±1, about half each, and the
    # cohorts disagree on about half of the positions.
    signs = np.stack([s[one_step] for s in steps]).astype(np.int32)
    # (within 4 standard deviations: an INT8 build has only ~100 marked positions)
    assert abs(float(signs.mean())) < 4 / np.sqrt(signs.size)
    assert abs(float((signs[0] != signs[1]).mean()) - 0.5) < 2 / np.sqrt(signs.shape[1])


def test_a_shipped_qnn_artifact_names_its_cohort_and_still_does_after_noise(built):
    precision, o = built
    word = qnn_marks.word_bytes(precision)
    unmarked, cohorts = binaries(o)
    rng = np.random.default_rng(0)
    for c, blob in enumerate(cohorts):
        got = qnn_marks.identify_binary(blob, unmarked, cohorts, word)
        assert got.cohort == c and got.false_positive <= 1e-9, (c, got)
        if word == 2:  # 1% relative noise on every FP16 word of the binary
            vals = np.frombuffer(blob, np.float16).astype(np.float32)
            with np.errstate(invalid="ignore", over="ignore"):  # header words as FP16
                noisy = vals * (1 + 0.01 * rng.standard_normal(vals.size)).astype(np.float32)
            leaked = noisy.astype(np.float16).tobytes()
        else:  # a third of the bytes moved by a step (noise of σ = 0.5 steps, rounded)
            vals = np.frombuffer(blob, np.uint8).astype(np.int16)
            noise = np.rint(0.5 * rng.standard_normal(vals.size)).astype(np.int16)
            leaked = np.clip(vals + noise, 0, 255).astype(np.uint8).tobytes()
        got = qnn_marks.identify_binary(leaked, unmarked, cohorts, word)
        assert got.cohort == c and got.false_positive <= 1e-9, (c, "noise", got)
    assert qnn_marks.identify_binary(unmarked, unmarked, cohorts, word).cohort is None


def test_unmarked_foreign_and_other_keys_qnn_binaries_give_none(built, convmlp, tmp_path):
    precision, o = built
    word = qnn_marks.word_bytes(precision)
    unmarked, cohorts = binaries(o)
    other = build(convmlp, precision, tmp_path / "other", key=b"another server's key")
    _, theirs = binaries(other)
    for blob in theirs:  # same model, same layout, another key's marks
        got = qnn_marks.identify_binary(blob, unmarked, cohorts, word)
        assert got.cohort is None, got
    assert qnn_marks.identify_binary(b"\0" * 64, unmarked, cohorts, word).cohort is None


def test_an_int4_qnn_build_is_not_marked_and_says_why(convmlp, tmp_path):
    spec = BuildSpec(convmlp[0], SourceFormat.ONNX, {"default": (InputSpec("x", (1, 3, 16, 16)),)},
                     platforms=("qnn",), settings={"qnn": {"precision": "w4a16"}},
                     reference_path=convmlp[1], calibration_path=convmlp[1],
                     watermark=WatermarkSpec(COHORTS, KEY))
    (o,) = Pipeline().build(spec, tmp_path / "build")
    assert o.cohorts == [] and o.gates["watermark"]["status"] == "not_supported"
    assert "INT4 QNN builds" in o.gates["watermark"]["reason"]
    assert o.gates["watermark"]["marked_weights"] == 0


def test_marking_the_fp16_graph_moves_only_the_masked_weights_by_one_fp16_step(convmlp,
                                                                              tmp_path):
    qnn_marks.mark_graph(convmlp[0], tmp_path / "m.onnx", KEY, 1, Precision.FP16)
    before = {t.name: t.values for t in weights.read(convmlp[0])}
    for t in weights.read(tmp_path / "m.onnx"):
        old = before[t.name]
        moved = t.values != old
        if not t.markable:
            assert not moved.any()
            continue
        assert np.array_equal(np.flatnonzero(moved),
                              np.flatnonzero(wm.mask(KEY, t.name, old.size) & (old != 0)))
        f16 = old[moved].astype(np.float16)
        ulps = t.values[moved].astype(np.float16).view(np.int16).astype(np.int32) - \
            f16.view(np.int16).astype(np.int32)
        assert set(np.abs(ulps).tolist()) <= {1, 2}  # 2: one step down from a power of 2
        assert t.values.dtype == np.float32
        assert np.array_equal(t.values[moved].astype(np.float16).astype(np.float32),
                              t.values[moved])  # exactly FP16: the HTP keeps the step


def test_header_words_every_compile_moves_alike_do_not_name_a_cohort_in_a_foreign_binary():
    """Header words that each compile moves one step the same way are a step off in every
    cohort's binary and in any other binary compiled since. Scored as marks, a foreign
    binary's steps there agree with every cohort's (z ≈ √60 here, p ≈ 5e-13: a named
    cohort); positions that every cohort moved alike are left out."""
    rng = np.random.default_rng(11)
    unmarked = rng.integers(10, 240, 20_000).astype(np.uint8)
    marks = rng.choice(np.arange(1_000, 20_000), 400, replace=False)
    header = np.arange(100, 160)
    cohorts = []
    for _ in range(COHORTS):
        blob = unmarked.copy()
        blob[marks] += rng.choice(np.array([-1, 1], np.int8), marks.size).astype(np.uint8)
        blob[header] += 1
        cohorts.append(blob.tobytes())
    foreign = unmarked.copy()
    foreign[header] += 1  # compiled later, with no mark of this key
    got = qnn_marks.identify_binary(foreign.tobytes(), unmarked.tobytes(), cohorts, 1)
    assert got.cohort is None, got
    for c, blob in enumerate(cohorts):  # the marks still name their cohorts
        got = qnn_marks.identify_binary(blob, unmarked.tobytes(), cohorts, 1)
        assert got.cohort == c and got.false_positive <= 1e-9, (c, got)


def test_a_later_qnn_cohort_needing_a_thinner_share_makes_every_cohort_again_at_it(
        convmlp, tmp_path, monkeypatch):
    """Cohorts cost the outputs differently (vit-tiny: cohorts 0-3 fine, cohort 4 at 57.7 dB).
    Fault injection at the PSNR measurement: cohort 2's first copy reads 55 dB. Its reader
    needs every cohort on the same weights, so the build makes all four again under the
    weaker mark — the per-tensor plan, each tensor's mark compiled alone on the HTP —
    instead of failing, or shipping cohorts marked on different weights. (On a real model,
    ppocr-cls: tests/corpus/test_watermark_corpus.py with MODELFLEET_WATERMARK_CORPUS=all,
    and docs/benchmarks.md: 64/64 on QNN, where one FP16 step on one weight cost 54.8 dB.)"""
    from server.compile import cohorts as cohorts_mod

    real, calls = cohorts_mod.output_psnr_db, []

    def psnr(unmarked, marked):  # type: ignore[no-untyped-def]
        calls.append(real(unmarked, marked))
        return 55.0 if len(calls) == 3 else calls[-1]  # the third measurement: cohort 2

    monkeypatch.setattr(cohorts_mod, "output_psnr_db", psnr)
    o = build(convmlp, "fp16", tmp_path)
    gate = o.gates["watermark"]
    assert gate["status"] == "passed" and gate["plan"]["probed"] >= 3, gate
    assert len(calls) == 3 + COHORTS  # cohorts 0, 1, the refused 2, then all four again
    unmarked, blobs = binaries(o)
    moved = [int(np.count_nonzero(qnn_marks._steps(b, unmarked, 2) == 1) +
                 np.count_nonzero(qnn_marks._steps(b, unmarked, 2) == -1)) for b in blobs]
    assert max(moved) < 1.3 * min(moved), moved  # one share: alike, not 2 full and 2 thin
    for c, blob in enumerate(blobs):
        got = qnn_marks.identify_binary(blob, unmarked, blobs, 2)
        assert got.cohort == c and got.false_positive <= 1e-9, (c, got)
