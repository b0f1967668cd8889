"""Core ML's default precision, chosen from the numeric gate's evidence: FP16, unless FP16
itself loses the model.

A version that leaves the coreml `precision` unset gets FP16 (half the bytes, the Neural
Engine's precision). When that build fails the numeric gate *and* the gate's second question
says the precision is the cause — the source at FP16 against FP32 (`precision_cost`) is
below the seed thresholds — the pipeline builds the package again at FP32 compute precision
and ships that when it passes the FP32 gate (0.99999 / 80 dB against the FP32 source). So the
choice is automatic and truthful:
- a compile bug is not hidden: its FP16 build fails while FP16 itself costs the model nothing
  (no retry), or its FP32 build fails the stricter FP32 gate;
- a model FP16 serves keeps FP16 (its gate passes, no retry);
- the report says which precision was tried, why it was left and what FP32 then measured
  (`gates["precision_default"]`, the outcome's notes).
Basic Pitch's log-CQT (`log(|CQT|² + 1e-10)`: 1e-10 is 0 in FP16, so silent bins give
log 0 = -inf) is the corpus case: FP16 source SNR -inf against FP32, FP32 package passes.

An explicit `precision=fp16` keeps FP16 and fails with the advice; QNN has no higher
precision on the HTP, so this applies to Core ML only.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from server.compile.compilers.base import settings_for
from server.compile.types import CompileRequest

PLATFORMS = ("coreml",)


def _fp16_lost(outcome: Any) -> bool:
    num = outcome.gates.get("numeric") or {}
    cost = num.get("precision_cost") or {}
    return (outcome.state == "failed" and outcome.precision == "fp16"
            and num.get("status") == "failed" and cost.get("status") == "exceeds_seed")


def retry_request(platform: str, request: CompileRequest, outcomes: list[Any]
                  ) -> CompileRequest | None:
    """The same request at FP32 when the default-precision FP16 build failed because FP16
    itself loses the model; None otherwise."""
    opts = settings_for(request, platform)
    if platform not in PLATFORMS or "precision" in opts or len(outcomes) != 1 \
            or not _fp16_lost(outcomes[0]):
        return None
    return replace(request, settings={**request.settings,
                                      platform: {**opts, "precision": "fp32"}})


def why(fp16: Any) -> str:
    cost = fp16.gates["numeric"]["precision_cost"]
    where = ((fp16.gates["numeric"].get("layers") or {}).get("precision") or {})
    start = f"; the loss starts at {where['summary']}" if where.get("summary") else ""
    return (f"FP16 itself loses this model (source at FP16 vs FP32: {cost.get('reason')}"
            f"{start}) and the FP16 package failed the numeric gate")


def chosen(fp16: Any, fp32: Any) -> Any:
    """The FP32 outcome, carrying what the FP16 attempt measured."""
    fp32.gates["precision_default"] = {
        "tried": "fp16", "chosen": "fp32" if fp32.state == "ready" else None,
        "why": why(fp16), "fp16_error": fp16.error[:2000],
        "fp16_compile_seconds": round(fp16.compile_seconds, 3),
        "fp16_precision_cost": fp16.gates["numeric"]["precision_cost"].get("outputs", [])}
    fp32.compile_seconds += fp16.compile_seconds  # what the build cost, both attempts
    if fp32.state == "ready":
        fp32.notes.insert(0, f"precision fp32 chosen by default: {why(fp16)}; the FP32 "
                             "package passed its gate. Set precision=fp16 to insist on FP16")
    else:
        fp32.error = (f"{why(fp16)}: {fp16.error}; the FP32 rebuild failed too: "
                      f"{fp32.error}")
    return fp32
