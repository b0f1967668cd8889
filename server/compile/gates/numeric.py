"""Numeric gate: does a compiled artifact agree with the FP32 source on reference inputs?

Pure math on arrays (cosine similarity, max abs diff, SNR in dB, top-k agreement for
classifier-shaped outputs) plus thresholds per precision that a version may override through
`settings["numeric"][precision] = {"min_cosine": .., "min_snr_db": .., "max_abs_diff": ..,
"min_topk_agreement": .., "topk": ..}`. An artifact that cannot run here gets an explicit
"not run" result with the reason, never a pass.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from server.compile.types import Precision


@dataclass(frozen=True)
class Thresholds:
    min_cosine: float
    min_snr_db: float
    max_abs_diff: float | None = None  # off by default: scale depends on the model
    min_topk_agreement: float = 0.9  # only for classifier-shaped outputs (2-D, >= 2 classes)
    topk: int = 5


DEFAULT_THRESHOLDS: dict[Precision, Thresholds] = {
    Precision.FP32: Thresholds(min_cosine=0.99999, min_snr_db=80.0),
    Precision.FP16: Thresholds(min_cosine=0.999, min_snr_db=60.0),
    Precision.INT8: Thresholds(min_cosine=0.995, min_snr_db=40.0),
}


def thresholds_for(precision: Precision, settings: dict[str, Any] | None = None) -> Thresholds:
    base = DEFAULT_THRESHOLDS[precision]
    override = ((settings or {}).get("numeric") or {}).get(precision.value) or {}
    known = set(asdict(base))
    unknown = set(override) - known
    if unknown:
        raise ValueError(f"unknown numeric threshold(s) {sorted(unknown)}; known: {sorted(known)}")
    return Thresholds(**{**asdict(base), **override})


@dataclass(frozen=True)
class OutputMetrics:
    index: int
    cosine: float
    max_abs_diff: float
    snr_db: float
    topk_agreement: float | None


def cosine(a: NDArray[Any], b: NDArray[Any]) -> float:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    na, nb = float(np.linalg.norm(a64)), float(np.linalg.norm(b64))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a64, b64) / (na * nb))


def snr_db(reference: NDArray[Any], candidate: NDArray[Any]) -> float:
    ref = reference.astype(np.float64).ravel()
    noise = float(np.sum((ref - candidate.astype(np.float64).ravel()) ** 2))
    signal = float(np.sum(ref**2))
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def topk_agreement(reference: NDArray[Any], candidate: NDArray[Any], k: int) -> float | None:
    """Mean overlap of the top-k class sets per row (1.0 = same k classes); None when the
    output is not classifier-shaped."""
    if reference.ndim != 2 or reference.shape[1] < 2:
        return None
    k = min(k, reference.shape[1])
    ref_top = np.argsort(-reference, axis=1)[:, :k]
    cand_top = np.argsort(-candidate, axis=1)[:, :k]
    overlap = [len(set(r) & set(c)) / k for r, c in zip(ref_top, cand_top, strict=True)]
    return float(np.mean(overlap))


def compare(reference: list[list[NDArray[Any]]], candidate: list[list[NDArray[Any]]],
            k: int = 5) -> list[OutputMetrics]:
    """Metrics per output, pooled over all samples (each sample is a list of outputs)."""
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
        # Classifier-shaped: each sample's output is (batch, classes).
        classifier = ref.ndim == 3
        metrics.append(OutputMetrics(
            index=i, cosine=cosine(ref, cand),
            max_abs_diff=float(np.max(np.abs(ref - cand))) if ref.size else 0.0,
            snr_db=snr_db(ref, cand),
            topk_agreement=topk_agreement(ref.reshape(-1, ref.shape[-1]),
                                          cand.reshape(-1, ref.shape[-1]), k)
            if classifier else None,
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

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict[str, Any]:
        return {"gate": "numeric", "status": self.status, "passed": self.passed,
                "precision": self.precision, "runner": self.runner, "samples": self.samples,
                "thresholds": self.thresholds, "outputs": self.outputs, "reason": self.reason}


def _num(x: float) -> float | str:
    # JSON has no infinity; an exact match reports "inf" as a string.
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf")


def evaluate(metrics: list[OutputMetrics], precision: Precision, t: Thresholds,
             samples: int, runner: str) -> NumericGateReport:
    """Applies thresholds; the first failing metric of each output is named in `reason`."""
    failures: list[str] = []
    rows = []
    for m in metrics:
        rows.append({"output": m.index, "cosine": _num(m.cosine),
                     "max_abs_diff": _num(m.max_abs_diff), "snr_db": _num(m.snr_db),
                     "topk_agreement": m.topk_agreement})
        if not m.cosine > t.min_cosine:
            failures.append(f"output {m.index}: cosine {m.cosine:.6f} <= {t.min_cosine}")
        if not m.snr_db > t.min_snr_db:
            failures.append(f"output {m.index}: SNR {m.snr_db:.1f} dB <= {t.min_snr_db} dB")
        if t.max_abs_diff is not None and not m.max_abs_diff <= t.max_abs_diff:
            failures.append(f"output {m.index}: max abs diff {m.max_abs_diff:.3g} > "
                            f"{t.max_abs_diff}")
        if m.topk_agreement is not None and m.topk_agreement < t.min_topk_agreement:
            failures.append(f"output {m.index}: top-{t.topk} agreement {m.topk_agreement:.3f} "
                            f"< {t.min_topk_agreement}")
    return NumericGateReport(
        status="failed" if failures else "passed", precision=precision.value,
        thresholds=asdict(t), outputs=rows, samples=samples, reason="; ".join(failures),
        runner=runner)


def not_run(precision: Precision, reason: str) -> NumericGateReport:
    return NumericGateReport(status="not_run", precision=precision.value, reason=reason)
