"""Numeric gate: did the compiler keep what the artifact's precision allows, and what does that
precision cost this model?

Two questions, answered separately on the version's reference inputs:

1. **Faithful** (decides the gate by default): the artifact against the source run at the
   artifact's precision (`emulate.py`: FP32 source, FP16-converted source, QDQ source). Per
   output, cosine > `min_cosine` and SNR > `min_snr_db` — or, when the precision itself already
   loses more on this model, no worse than that loss by `margin_db` (so a model whose FP16 is
   inherently lossy is not blamed on the compiler, while a broken compile still fails).
2. **Precision cost** (always reported): the source at the precision against the FP32 source.
   It fails the gate only when the version opts in (`precision_gate: seed`) to the seed's
   thresholds (FP16: cosine > 0.999, max abs < 1e-3, SNR > 60 dB; INT8: 0.995, 0.5, 40 dB);
   the artifact itself must then also meet them against the FP32 source.

A version overrides the faithful thresholds with `settings["numeric"][precision] = {..}`
(keys of `Thresholds`). Top-k agreement is checked only on classifier outputs: the model's
task is `classification` and the output is 2-D (batch, classes). An output that is near zero
on every reference sample (max |value| < `NEAR_ZERO`) has no signal that cosine or SNR can
judge at reduced precision; it is judged by max abs diff and the report says so. An artifact
that cannot run here gets an explicit "not run" result with the reason, never a pass.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from server.compile.gates.metrics import cosine, snr_db, topk_agreement
from server.compile.types import Precision

__all__ = [
    "NumericGateReport",
    "OutputMetrics",
    "Thresholds",
    "compare",
    "cosine",
    "evaluate",
    "judge",
    "not_run",
    "snr_db",
    "thresholds_for",
    "topk_agreement",
]


@dataclass(frozen=True)
class Thresholds:
    min_cosine: float
    min_snr_db: float
    max_abs_diff: float | None = None  # off by default: scale depends on the model
    min_topk_agreement: float = 0.9  # only for classifier outputs
    topk: int = 5
    # Faithful check only: allowed excess over the precision's own loss on this model, in dB.
    margin_db: float | None = None


# Faithful-check defaults (artifact vs the source at the same precision); why these values:
# docs/compile.md, "Numeric gate".
DEFAULT_THRESHOLDS: dict[Precision, Thresholds] = {
    Precision.FP32: Thresholds(min_cosine=0.99999, min_snr_db=80.0),
    Precision.FP16: Thresholds(min_cosine=0.999, min_snr_db=30.0, margin_db=10.0),
    Precision.INT8: Thresholds(min_cosine=0.99, min_snr_db=20.0, margin_db=10.0),
}
# The seed's thresholds, for the precision cost (source at precision vs FP32 source); a version
# enforces them with the setting `precision_gate: seed`.
SEED_THRESHOLDS: dict[Precision, Thresholds] = {
    Precision.FP16: Thresholds(min_cosine=0.999, min_snr_db=60.0, max_abs_diff=1e-3),
    Precision.INT8: Thresholds(min_cosine=0.995, min_snr_db=40.0, max_abs_diff=0.5),
}
# Below this magnitude an FP16 / INT8 output carries no signal cosine or SNR can judge (the
# HTP returns 0 for sigmoid outputs of 7e-5); judged by max abs diff against it instead.
NEAR_ZERO = 1e-3


def thresholds_for(precision: Precision, settings: dict[str, Any] | None = None) -> Thresholds:
    base = DEFAULT_THRESHOLDS[precision]
    override = ((settings or {}).get("numeric") or {}).get(precision.value) or {}
    known = set(asdict(base))
    unknown = set(override) - known
    if unknown:
        raise ValueError(f"unknown numeric threshold(s) {sorted(unknown)}; known: {sorted(known)}")
    return Thresholds(**{**asdict(base), **override})


def precision_gate_enforced(settings: dict[str, Any] | None) -> bool:
    value = str((settings or {}).get("precision_gate", "off")).lower()
    if value not in ("off", "seed"):
        raise ValueError(f"precision_gate must be off or seed, not {value!r}")
    return value == "seed"


@dataclass(frozen=True)
class OutputMetrics:
    index: int
    cosine: float
    max_abs_diff: float
    snr_db: float
    topk_agreement: float | None
    scale: float = math.inf  # max |reference value| over the samples

    def row(self) -> dict[str, Any]:
        return {"output": self.index, "cosine": _num(self.cosine),
                "max_abs_diff": _num(self.max_abs_diff), "snr_db": _num(self.snr_db),
                "topk_agreement": self.topk_agreement}


def compare(reference: list[list[NDArray[Any]]], candidate: list[list[NDArray[Any]]],
            k: int = 5, classifier: bool = False) -> list[OutputMetrics]:
    """Metrics per output, pooled over all samples (each sample is a list of outputs); top-k
    agreement only when `classifier` (the model's task) and the output is (batch, classes)."""
    if len(reference) != len(candidate) or not reference:
        raise ValueError("reference and candidate need the same, non-zero number of samples")
    n_out = len(reference[0])
    if any(len(c) != n_out for c in candidate):
        raise ValueError(f"candidate produced a different number of outputs than {n_out}")
    metrics = []
    for i in range(n_out):
        ref = np.stack([np.asarray(s[i], dtype=np.float64) for s in reference])
        cand = np.stack([np.asarray(s[i], dtype=np.float64).reshape(np.shape(reference[j][i]))
                         for j, s in enumerate(candidate)])
        diff = np.abs(ref - cand)
        metrics.append(OutputMetrics(
            index=i, cosine=cosine(ref, cand),
            max_abs_diff=float(np.nanmax(np.where(np.isnan(diff), np.inf, diff)))
            if ref.size else 0.0,
            snr_db=snr_db(ref, cand),
            topk_agreement=topk_agreement(ref.reshape(-1, ref.shape[-1]),
                                          cand.reshape(-1, ref.shape[-1]), k)
            if classifier and ref.ndim == 3 else None,
            scale=float(np.max(np.abs(ref))) if ref.size else 0.0,
        ))
    return metrics


@dataclass
class NumericGateReport:
    status: str  # "passed" | "failed" | "not_run"
    precision: str
    thresholds: dict[str, Any] = field(default_factory=dict)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    samples: int = 0
    reason: str = ""  # why not run, or which metric failed
    runner: str = ""
    basis: str = ""  # what the artifact was compared with
    vs_fp32: list[dict[str, Any]] = field(default_factory=list)
    precision_cost: dict[str, Any] = field(default_factory=dict)
    layers: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict[str, Any]:
        doc = {"gate": "numeric", "status": self.status, "passed": self.passed,
               "precision": self.precision, "runner": self.runner, "samples": self.samples,
               "thresholds": self.thresholds, "outputs": self.outputs, "reason": self.reason}
        for key in ("basis", "vs_fp32", "precision_cost", "layers", "notes"):
            if getattr(self, key):
                doc[key] = getattr(self, key)
        return doc


def _num(x: float) -> float | str:
    # JSON has no infinity; an exact match reports "inf" as a string.
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf")


def _failures(m: OutputMetrics, t: Thresholds, near_zero: float | None) -> list[str]:
    """What output `m` misses under `t` (empty: it passes)."""
    if near_zero is not None and m.scale < near_zero:
        if m.max_abs_diff <= near_zero:
            return []
        return [f"output {m.index}: max abs diff {m.max_abs_diff:.3g} > {near_zero} on a "
                f"near-zero output (max |value| {m.scale:.3g})"]
    out = []
    if not m.cosine > t.min_cosine:
        out.append(f"output {m.index}: cosine {m.cosine:.6f} <= {t.min_cosine:.6g}")
    if not m.snr_db > t.min_snr_db:
        out.append(f"output {m.index}: SNR {m.snr_db:.1f} dB <= {t.min_snr_db:.1f} dB")
    if t.max_abs_diff is not None and not m.max_abs_diff <= t.max_abs_diff:
        out.append(f"output {m.index}: max abs diff {m.max_abs_diff:.3g} > {t.max_abs_diff}")
    if m.topk_agreement is not None and m.topk_agreement < t.min_topk_agreement:
        out.append(f"output {m.index}: top-{t.topk} agreement {m.topk_agreement:.3f} "
                   f"< {t.min_topk_agreement}")
    return out


def evaluate(metrics: list[OutputMetrics], precision: Precision, t: Thresholds,
             samples: int, runner: str) -> NumericGateReport:
    """Applies thresholds; the first failing metric of each output is named in `reason`."""
    failures = [f for m in metrics for f in _failures(m, t, None)]
    return NumericGateReport(
        status="failed" if failures else "passed", precision=precision.value,
        thresholds=asdict(t), outputs=[m.row() for m in metrics], samples=samples,
        reason="; ".join(failures), runner=runner)


def allowed(t: Thresholds, cost: OutputMetrics | None) -> Thresholds:
    """The faithful thresholds for one output: the absolute ones, relaxed to the precision's
    own loss on this model (minus `margin_db`) when that loss is larger."""
    if cost is None or t.margin_db is None:
        return t
    snr = min(t.min_snr_db, cost.snr_db - t.margin_db) if math.isfinite(cost.snr_db) \
        else t.min_snr_db
    slack = (1.0 - cost.cosine) * 10 ** (t.margin_db / 10)
    return replace(t, min_snr_db=snr, min_cosine=min(t.min_cosine, 1.0 - slack))


def _anomaly(name: str, outputs: list[list[NDArray[Any]]], i: int) -> str | None:
    """Says what is wrong with output `i` when its values explain a cosine of 0."""
    arrays = [np.asarray(s[i]) for s in outputs]
    if any(not np.all(np.isfinite(a.astype(np.float64))) for a in arrays):
        return f"{name} output {i} holds NaN or infinity"
    if all(not np.any(a) for a in arrays):
        return f"{name} output {i} is all zeros"
    return None


def judge(reference: list[list[NDArray[Any]]], at_precision: list[list[NDArray[Any]]] | None,
          candidate: list[list[NDArray[Any]]], precision: Precision,
          settings: dict[str, Any] | None, *, classifier: bool, runner: str, basis: str,
          no_yardstick: str = "") -> NumericGateReport:
    """Both questions for one artifact. `at_precision` None: no emulation of the source at
    this precision (`no_yardstick` says why); the artifact is then judged against the FP32
    source with the seed thresholds, as the only honest fallback."""
    t = thresholds_for(precision, settings)
    enforce = precision_gate_enforced(settings)
    seed = SEED_THRESHOLDS.get(precision)
    near_zero = None if precision is Precision.FP32 else NEAR_ZERO
    vs_fp32 = compare(reference, candidate, t.topk, classifier)
    report = NumericGateReport(status="passed", precision=precision.value, runner=runner,
                               samples=len(candidate), basis=basis,
                               vs_fp32=[m.row() for m in vs_fp32])
    failures: list[str] = []
    costs: list[OutputMetrics | None]
    if precision is Precision.FP32 or seed is None:
        faithful, costs = vs_fp32, [None] * len(vs_fp32)
        report.precision_cost = {"status": "none", "reason": "FP32: the source's precision"}
    elif at_precision is None:
        faithful, costs = vs_fp32, [None] * len(vs_fp32)
        t = seed
        report.precision_cost = {"status": "not_measured", "reason": no_yardstick}
        report.basis = "the FP32 source with the seed thresholds (" + no_yardstick + ")"
    else:
        faithful = compare(at_precision, candidate, t.topk, classifier)
        measured = compare(reference, at_precision, seed.topk, classifier)
        costs = list(measured)
        cost_failures = [f for m in measured for f in _failures(m, seed, near_zero)]
        report.precision_cost = {
            "status": "exceeds_seed" if cost_failures else "within_seed",
            "enforced": enforce, "thresholds": asdict(seed),
            "outputs": [m.row() for m in measured], "reason": "; ".join(cost_failures)}
        if enforce:
            failures += [f"precision cost: {f}" for f in cost_failures]
            if not cost_failures:
                # The seed's thresholds are the shipped model's: the artifact itself against
                # FP32 too (a QDQ yardstick 46 dB from FP32, with an artifact 20 dB from the
                # yardstick, passes both checks above at 20 dB from FP32).
                failures += [f"artifact vs FP32: {f}" for m in vs_fp32
                             for f in _failures(m, seed, near_zero)]
    rows = []
    for m, cost in zip(faithful, costs, strict=True):
        need = allowed(t, cost)
        rows.append({**m.row(), "required": {"min_cosine": need.min_cosine,
                                             "min_snr_db": _num(need.min_snr_db)}})
        miss = _failures(m, need, near_zero)
        if near_zero is not None and m.scale < near_zero:
            report.notes.append(
                f"output {m.index} is near zero on every reference sample (max |value| "
                f"{m.scale:.3g} < {near_zero}): cosine and SNR say nothing at "
                f"{precision.value}, so it was judged by max abs diff. Reference inputs like "
                "the real data (normalized as the model expects) exercise it fully.")
        elif m.cosine == 0.0:
            why = _anomaly("the artifact's", candidate, m.index) or _anomaly(
                "the yardstick's", at_precision or reference, m.index)
            if why:
                miss = [f"{f} ({why})" if "cosine" in f else f for f in miss]
        failures += miss
    report.outputs, report.thresholds = rows, asdict(t)
    report.status = "failed" if failures else "passed"
    report.reason = "; ".join(failures)
    return report


def not_run(precision: Precision, reason: str) -> NumericGateReport:
    return NumericGateReport(status="not_run", precision=precision.value, reason=reason)
