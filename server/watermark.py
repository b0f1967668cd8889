"""Per-cohort fingerprints in a model's float weights, and naming the cohort of a leaked copy
(issue 23; the core only — not yet wired into the compile pipeline or a CLI, see
docs/security.md "Per-cohort watermarks").

Embedding (spread spectrum, in the precision the artifact really has): cohort c of a release
has a pattern of ±1 signs over the weights, drawn from a generator seeded with
HMAC-SHA256(secret, "mf-watermark:<c>"); every weight moves by `strength` (default 1) of its
own float16 step (ulp) in the pattern's direction, computed and rounded in the artifact's
dtype (float16 or float32) — a float16 weight moves by a whole float16 step, which no
float16 ↔ float32 round trip undoes; the change is the size of the rounding an FP16
conversion makes anyway (weight PSNR ≈ 75 dB). INT8 artifacts are not marked here (a step
of theirs is far above that size).

Identifying (informed: the server keeps each release's unmarked weights): d = leaked −
original, and for each cohort z_c = ⟨d, p_c⟩ / ‖d‖. The patterns are keyed random signs
independent of d for every cohort but the embedded one, so by Hoeffding's inequality
P(z_c ≥ t) ≤ exp(−t²/2) for each of them, whatever d is; the false-positive probability of
naming the best cohort is bounded by N·exp(−z²/2) (a union over the N cohorts), and a cohort
is named only when that bound is ≤ `max_false_positive` (default 1e-9). A foreign or
unmarked file gives "none".
"""

from __future__ import annotations

import hashlib
import hmac
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

Floats = np.ndarray[Any, np.dtype[np.floating[Any]]]
FLOAT_DTYPES = (np.float16, np.float32)
DEFAULT_STRENGTH = 1.0
MAX_FALSE_POSITIVE = 1e-9


@dataclass(frozen=True)
class Identified:
    """The best cohort (None: "none") and the bound on the chance that an unmarked or other
    cohort's file scores as high (`false_positive`), from the statistic `z`."""

    cohort: int | None
    z: float
    false_positive: float


def pattern(secret: bytes, cohort: int, n: int) -> np.ndarray[Any, np.dtype[np.int8]]:
    """Cohort `cohort`'s ±1 signs over `n` weights (keyed by the server secret)."""
    seed = hmac.new(secret, f"mf-watermark:{cohort}".encode(), hashlib.sha256).digest()
    rng = np.random.Generator(np.random.PCG64(int.from_bytes(seed, "big")))
    return (rng.integers(0, 2, n, dtype=np.int8) * 2 - 1).astype(np.int8)


def patterns(secret: bytes, cohorts: int, n: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    """All cohorts' patterns as rows of one float32 matrix (for vectorised scoring)."""
    return np.stack([pattern(secret, c, n) for c in range(cohorts)]).astype(np.float32)


def embed(weights: Floats, secret: bytes, cohort: int,
          strength: float = DEFAULT_STRENGTH) -> Floats:
    """`weights` (float16 or float32, any shape) carrying cohort `cohort`'s fingerprint, in
    the same dtype and shape."""
    if weights.dtype not in FLOAT_DTYPES:
        raise ValueError(f"watermarks go into float16/float32 weights, not {weights.dtype}")
    flat = weights.reshape(-1)
    step = np.spacing(np.abs(flat).astype(np.float16)).astype(np.float32)
    move = np.float32(strength)
    signs = pattern(secret, cohort, flat.size).astype(np.float32)
    marked = flat.astype(np.float32) + signs * step * move
    out: Floats = marked.astype(weights.dtype).reshape(weights.shape)
    return out


def scores(diff: Floats, rows: np.ndarray[Any, np.dtype[np.float32]]
           ) -> np.ndarray[Any, np.dtype[np.float64]]:
    """z for every copy (rows of `diff`: leaked − original, flattened) and every cohort's
    pattern (rows of `rows`): shape (copies, cohorts)."""
    d = np.atleast_2d(np.asarray(diff, dtype=np.float32))
    norm = np.linalg.norm(d, axis=1, keepdims=True).astype(np.float64)
    z = (d @ rows.T).astype(np.float64)
    out: np.ndarray[Any, np.dtype[np.float64]] = np.divide(
        z, norm, out=np.zeros_like(z), where=norm > 0)
    return out


def false_positive(z: float, cohorts: int) -> float:
    """The union (Hoeffding) bound on naming a cohort at statistic `z` by chance."""
    return min(1.0, cohorts * math.exp(-max(z, 0.0) ** 2 / 2))


def identify(leaked: Floats, original: Floats, secret: bytes, cohorts: int, *,
             max_false_positive: float = MAX_FALSE_POSITIVE) -> Identified:
    """The cohort whose fingerprint `leaked` carries, or None ("none")."""
    if leaked.size != original.size:
        return Identified(None, 0.0, 1.0)  # another model: nothing to compare
    diff = leaked.astype(np.float32).reshape(-1) - original.astype(np.float32).reshape(-1)
    z = scores(diff, patterns(secret, cohorts, original.size))[0]
    best = int(np.argmax(z))
    p = false_positive(float(z[best]), cohorts)
    return Identified(best if p <= max_false_positive else None, float(z[best]), p)


def psnr_db(original: Floats, marked: Floats) -> float:
    """Peak signal-to-noise ratio of `marked` against `original` (peak: max |original|)."""
    a, b = original.astype(np.float64), marked.astype(np.float64)
    mse = float(np.mean((a - b) ** 2))
    peak = float(np.max(np.abs(a)))
    return math.inf if mse == 0 else 10 * math.log10(peak * peak / mse)
