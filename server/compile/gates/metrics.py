"""Agreement of two arrays: cosine similarity, max abs diff, SNR in dB, top-k overlap. Pure math
on numpy arrays, shared by the numeric gate (outputs) and the layer walk (intermediates)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray


# `np.asarray(..., float64)` rather than `.astype(float64)`: the layer walk passes arrays that
# are float64 already, and a copy of every intermediate tensor per metric was most of a big
# model's per-layer diff (PP-OCR det at 640x640: a third of its build).
def _flat64(a: NDArray[Any]) -> NDArray[np.float64]:
    return np.asarray(a, dtype=np.float64).ravel()


def cosine(a: NDArray[Any], b: NDArray[Any]) -> float:
    a64, b64 = _flat64(a), _flat64(b)
    na, nb = float(np.linalg.norm(a64)), float(np.linalg.norm(b64))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0 or not (math.isfinite(na) and math.isfinite(nb)):
        return 0.0
    return float(np.dot(a64, b64) / (na * nb))


def snr_db(reference: NDArray[Any], candidate: NDArray[Any],
           diff: NDArray[Any] | None = None) -> float:
    """`diff`: `reference - candidate` in float64 when the caller has it already."""
    ref = _flat64(reference)
    d = _flat64(candidate if diff is None else diff)
    if diff is None:
        d = ref - d
    noise = float(np.sum(d**2))
    signal = float(np.sum(ref**2))
    if not math.isfinite(noise):
        return -math.inf
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def topk_agreement(reference: NDArray[Any], candidate: NDArray[Any], k: int) -> float | None:
    """Mean overlap of the top-k class sets per row (1.0 = same k classes); None when the
    output is not (rows, classes) with at least 2 classes."""
    if reference.ndim != 2 or reference.shape[1] < 2:
        return None
    k = min(k, reference.shape[1])
    ref_top = np.argsort(-reference, axis=1)[:, :k]
    cand_top = np.argsort(-candidate, axis=1)[:, :k]
    overlap = [len(set(r) & set(c)) / k for r, c in zip(ref_top, cand_top, strict=True)]
    return float(np.mean(overlap))
