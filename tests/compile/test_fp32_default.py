"""Core ML's default precision follows the gate's evidence: a model that FP16 itself loses
(a log-power front end, `log(x² + 1e-10)`: 1e-10 and the small powers are 0 in FP16) ships at
FP32 when the version left `precision` unset, and says why; an explicit fp16 keeps failing
with the advice; a model FP16 serves stays FP16 with no second build."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from server.compile import BuildSpec, InputSpec, Pipeline, SourceFormat
from server.compile.pipeline import BuildOutcome
from tests.compile.compile_models import onnx_model

SPEC = (InputSpec("x", (1, 64)),)


def _log_power(path: Path, eps: float) -> Path:
    nodes = [helper.make_node("Mul", ["x", "x"], ["power"], name="square"),
             helper.make_node("Add", ["power", "eps"], ["floored"], name="add_eps"),
             helper.make_node("Log", ["floored"], ["y"], name="log_power")]
    return onnx_model(path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                  [1, 64])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
                      # A floor per bin: the log-power rewrite (log_rescale.py) scales only
                      # scalar floors, so FP16 still loses this model at eps 1e-10.
                      [numpy_helper.from_array(np.full((1, 64), eps, np.float32), "eps")])


def _build(tmp_path: Path, eps: float, coreml: dict[str, str]) -> BuildOutcome:
    rng = np.random.default_rng(0)
    # Quiet and loud bins, as a spectrum has: amplitudes from 1e-6 to 1.
    x = (10.0 ** rng.uniform(-6, 0, (2, 1, 64))).astype(np.float32)
    np.savez(tmp_path / "ref.npz", x=x)
    spec = BuildSpec(_log_power(tmp_path / "m.onnx", eps), SourceFormat.ONNX,
                     {"default": SPEC}, platforms=("coreml",),
                     settings={"coreml": coreml}, reference_path=tmp_path / "ref.npz")
    (out,) = Pipeline().build(spec, tmp_path / "build")
    return out


@pytest.mark.slow
def test_a_model_fp16_itself_loses_ships_at_fp32_by_default_and_says_why(
        tmp_path: Path) -> None:
    out = _build(tmp_path, 1e-10, {})
    assert out.state == "ready", out.error
    assert out.precision == "fp32"
    num = out.gates["numeric"]
    assert num["status"] == "passed" and num["precision"] == "fp32"
    assert num["runner"] == "mil reference executor (numpy, fp32)"
    choice = out.gates["precision_default"]
    assert choice["tried"] == "fp16" and choice["chosen"] == "fp32"
    assert "FP16 itself loses this model" in choice["why"]
    assert "numeric gate failed" in choice["fp16_error"]
    assert "precision fp32 chosen by default" in out.notes[0]


@pytest.mark.slow
def test_an_explicit_fp16_keeps_fp16_and_fails_with_the_advice(tmp_path: Path) -> None:
    out = _build(tmp_path, 1e-10, {"precision": "fp16"})
    assert out.state == "failed" and out.precision == "fp16"
    assert "precision_default" not in out.gates
    assert "set the coreml setting precision=fp32" in out.error


@pytest.mark.slow
def test_a_model_fp16_serves_stays_fp16_with_one_build(tmp_path: Path) -> None:
    # eps 1e-2 and no bin below it: FP16 keeps this model (no retry, no FP32 package).
    out = _build(tmp_path, 1e-2, {})
    assert out.state == "ready", out.error
    assert out.precision == "fp16"
    assert "precision_default" not in out.gates
    assert not (tmp_path / "build" / "default" / "coreml" / "fp32").exists()
