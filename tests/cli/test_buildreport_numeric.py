"""The build report shows the numeric gate's two questions apart: the verdict against the
source at the artifact's precision, and what that precision costs with where the loss starts
(from a real gate report: the FP16 cancellation model of tests/compile/test_numeric_gate.py)."""

from __future__ import annotations

import io

import numpy as np
from rich.console import Console

from server.commands.buildreport import print_builds
from server.compile.gates import numeric
from server.compile.types import Precision


def _text(gates: dict[str, object]) -> str:
    doc = {"model": "m", "version": "1.0.0", "state": "ready", "builds": [
        {"platform": "qnn", "variant": "default", "state": "succeeded", "attempts": 1,
         "artifact": None, "artifacts": [], "gates": gates, "error": ""}]}
    buf = io.StringIO()
    print_builds(Console(file=buf, width=100, markup=False, highlight=False), doc)
    return " ".join(buf.getvalue().split())


def test_report_names_both_questions_and_where_the_precision_loss_starts() -> None:
    rng = np.random.default_rng(0)
    ref = [[rng.standard_normal((1, 256))]]
    at_fp16 = [[ref[0][0] + rng.standard_normal((1, 256)) * 0.01]]  # FP16 costs ~40 dB
    report = numeric.judge(ref, at_fp16, at_fp16, Precision.FP16, {}, classifier=False,
                           runner="QnnCompiler", basis="the source at FP16")
    report.layers = {"precision": {"summary": "source FP32 vs source at FP16: agreement first "
                                              "falls below the threshold at Sub node 'cancel'"}}
    text = _text({"numeric": report.to_dict()})
    assert "numeric passed (cos 1, SNR inf dB vs the source at FP16)" in text
    assert "precision FP16 vs FP32: cos 0.9999" in text
    assert "below the seed thresholds (reported only)" in text and "Sub node 'cancel'" in text


def test_fp32_build_shows_no_precision_row() -> None:
    ref = [[np.ones((1, 4))]]
    report = numeric.judge(ref, ref, ref, Precision.FP32, {}, classifier=False, runner="x",
                           basis="the FP32 source")
    text = _text({"numeric": report.to_dict()})
    assert "numeric passed" in text and "precision" not in text.replace("fp32", "")


def test_near_zero_output_note_is_shown() -> None:
    ref = [[np.full((1, 64), 5e-5)]]
    report = numeric.judge(ref, ref, [[np.zeros((1, 64))]], Precision.FP16, {},
                           classifier=False, runner="x", basis="the source at FP16")
    text = _text({"numeric": report.to_dict()})
    assert "note output 0 is near zero on every reference sample" in text


def test_report_shows_the_precision_search_frontier() -> None:
    frontier = {"gate": "precision_search", "fp32_bytes": 40000, "tried": [
        {"candidate": "int4-block32", "outcome": "gate failed", "bytes": 6884,
         "compile_seconds": 2.1, "vs_fp32": {"cosine": 0.988391, "snr_db": 16.2,
                                             "max_abs_diff": 0.26},
         "reason": "output 0: SNR 16.2 dB <= 40.0 dB"},
        {"candidate": "int8", "outcome": "passed", "bytes": 9764, "compile_seconds": 1.9,
         "vs_fp32": {"cosine": 0.99997, "snr_db": 41.5, "max_abs_diff": 0.016}}],
        "skipped": [{"candidate": "fp16", "why": "HTP v68 has no FP16 arithmetic"}],
        "winner": {"candidate": "int8", "why": "int8 is the smallest candidate that passed"}}
    text = _text({"precision_search": frontier})
    assert ("search int4-block32, 6,884 B, cos 0.988391, SNR 16.2 dB, max abs 0.26, 2.1 s: "
            "gate failed (output 0: SNR 16.2 dB <= 40.0 dB)") in text
    assert "int8, 9,764 B, cos 0.99997, SNR 41.5 dB, max abs 0.016, 1.9 s: passed;" in text
    assert "fp16 skipped: HTP v68 has no FP16 arithmetic" in text
    assert "chosen: int8 is the smallest candidate that passed" in text
