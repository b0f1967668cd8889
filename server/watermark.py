"""Per-cohort fingerprints in a model's weights, and naming the cohort of a leaked copy
(issue 23; wired in by server/compile/cohorts.py, named by `modelfleet watermark identify`,
see docs/security.md "Per-cohort watermarks").

Embedding (spread spectrum, in the precision the artifact really has): cohort c has, per
weight tensor, a pattern of ±1 signs drawn from a generator seeded with
HMAC-SHA256(key, "mf-watermark:<c>:<tensor name>") — keyed per tensor, so a copy whose
tensors were reordered, dropped or renamed by a re-quantizer is still scored on the ones it
kept. A keyed share `DENSITY` (1/32) of each tensor's weights — the same positions for every
cohort — moves in the pattern's direction: a float weight by `strength` (an integer k, 1 to
`MAX_STRENGTH`, chosen per artifact: `strength_for`) of its float16 steps (ulp), computed
and rounded in the artifact's dtype (a float16 weight moves by whole float16 steps, which no
float16 ↔ float32 round trip undoes), an INT8/UINT8 weight by one integer step; `share` < 1
moves only that share of the positions (a subset: the same draws under a lower density), for
models whose outputs cannot afford one step on all of them. Sparse, because a
float16 or int8 weight cannot move by less than a step, and a step on every weight costs the
outputs ≈ 15 dB more (√32); the detector knows the mask, so noise on the other weights does
not dilute it. Quantized weights are marked far more sparsely (`INT_DENSITY`, 1/8192): one
INT8 step is ~1/255 of a tensor's range, ~16× an FP16 step, and at 1/32 it cost a w8a16 QNN
build 40 dB against its unmarked outputs; at 1/8192, 63 dB (tests/compile/test_qnn_marks.py).
So an INT8 artifact needs ~400k quantized weights for a 1e-9 claim over 64 cohorts. At
1/32 a 1M-weight MLP's outputs stay at 68 dB (FP16 Core ML) and 75 dB
(FP32 ONNX) PSNR against the unmarked artifact's (server/compile/cohorts.py checks ≥ 60 dB).
Zeros (pruned weights), non-finite values and huge constants (|w| ≥ 1e4: masks, not weights)
stay as they are.

Identifying (informed: the server keeps each release's unmarked artifact): d = leaked −
original over the masked positions that carry a mark (not the zeros, non-finite values and
huge constants `embed` leaves alone) of the tensors both hold. Each difference is measured in
its own weight's mark step (r = d / step: ±strength as shipped) and weighted by the inverse
of the noise variance around it (`filtered`: a matched filter), that variance estimated from
r itself over the weights of about the same magnitude in the same tensor — so 1% noise
(which grows with |w|, ~15 steps), an INT8 re-quantization (the same absolute error on every
weight of a tensor: many steps of a small weight, few of a large one) and an FP16 round trip
are each scored with the weights that carry the mark best under them. (Unweighted, the large
weights' noise drowned every mark under 1% noise.) A leaked tensor whose values sit on one
uniform grid of at most 256 levels (`lattice`: re-quantized per tensor, INT8 or narrower,
and dequantized) is scored on that grid instead (`on_lattice`): the original is rounded
onto it too, so a weight whose mark the rounding erased scores 0 rather than its whole
rounding error, and one the mark carried across a boundary scores the mark's sign (on
per-tensor INT8, z 2–9× the filtered one; a per-channel or per-block grid is not one of
the flat tensor's values: it is read from the re-quantized file, server/compile/requantized.py).
Where the server knows which positions a mark moved (`moved`: any cohort's shipped copy
against the unmarked artifact — the same for every cohort), only those are scored: a
thinned mark (`share` < 1) or a tensor the mark plan left unmarked otherwise adds only
noise, and z under noise gains 1/√share. For each cohort z_c = ⟨x, p_c⟩ / ‖x‖ over
the filtered differences x. The weights depend only on the original and the leaked file, and
the patterns are keyed random signs independent of both for every cohort but the embedded
one, so by Hoeffding's inequality P(z_c ≥ t) ≤ exp(−t²/2) for each of them, whatever x is;
the false-positive probability of naming the best cohort is bounded by N·exp(−z²/2) (a union
over the N cohorts), and a cohort is named only when that bound is ≤ `max_false_positive`
(default 1e-9). A foreign or unmarked file gives "none". The detector does not need the
strength a copy was marked with: files marked before strengths existed (strength 1) are read
the same way.

Robustness, the arithmetic (docs/security.md): under 1% Gaussian noise of each weight's
magnitude an FP16 step is on average `STEP_PER_NOISE` (0.072) of the noise's σ, so n marked
weights at strength k score z ≈ 0.072·k·√n; naming one of 64 cohorts at 1e-9 needs 7.05.
`strength_for` picks the k that puts the expected z at `NOISE_Z`; its cost to the outputs is
20·log10(k) dB of PSNR, which server/compile/cohorts.py caps by what the gate allows.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

Floats = np.ndarray[Any, np.dtype[np.floating[Any]]]
Array = np.ndarray[Any, Any]
FLOAT_DTYPES = (np.float16, np.float32)
INT_DTYPES = (np.int8, np.uint8)
DEFAULT_STRENGTH = 1.0
DENSITY = 1 / 32  # share of a tensor's weights moved by one step (see the docstring)
INT_DENSITY = 1 / 8192  # the same for quantized (int8/uint8) weights (see the docstring)
LARGEST_MARKED = 1e4  # above: masks and sentinels (-1e9, 65504), never weights
MAX_FALSE_POSITIVE = 1e-9
# Strength (in FP16 steps): the expected z under 1% weight noise that `strength_for` aims at
# (7.05 names one of 64 cohorts at 1e-9; the z of one copy varies with a σ of ≈ 1, so 12 is
# 5 σ over it), the rms ratio of an FP16 step to 1% of |w| over a binade (100/1024 · √(3/8 /
# ln 2)), and the largest strength used (a bit-pattern distance qnn_marks.py still reads).
NOISE_Z = 12.0
STEP_PER_NOISE = 0.072
MAX_STRENGTH = 16
MIN_BUCKET = 64  # weights a noise estimate is made from, at least (`filtered`)
# A leaked tensor whose values sit on a grid of at most this many levels was re-quantized
# (`lattice`); dequantized float32 values sit within this share of a step of it.
MAX_LATTICE_LEVELS = 256
LATTICE_TOLERANCE = 1e-3


@dataclass(frozen=True)
class Identified:
    """The best cohort (None: "none") and the bound on the chance that an unmarked or other
    cohort's file scores as high (`false_positive`), from the statistic `z` over `weights`
    compared weights."""

    cohort: int | None
    z: float
    false_positive: float
    weights: int = 0


def _generator(key: bytes, cohort: int, name: str) -> np.random.Generator:
    seed = hmac.new(key, f"mf-watermark:{cohort}:{name}".encode(), hashlib.sha256).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(seed, "big")))


def pattern(secret: bytes, cohort: int, n: int, name: str = ""
            ) -> np.ndarray[Any, np.dtype[np.int8]]:
    """Cohort `cohort`'s ±1 signs over the `n` weights of tensor `name` (keyed)."""
    bits = np.unpackbits(np.frombuffer(_generator(secret, cohort, name).bytes((n + 7) // 8),
                                       dtype=np.uint8))[:n]
    return (bits.astype(np.int8) * 2 - 1).astype(np.int8)


def patterns(secret: bytes, cohorts: int, n: int, name: str = ""
             ) -> np.ndarray[Any, np.dtype[np.float32]]:
    """All cohorts' patterns as rows of one float32 matrix (for vectorised scoring)."""
    return np.stack([pattern(secret, c, n, name) for c in range(cohorts)]).astype(np.float32)


def density_for(dtype: Any) -> float:
    """The share of a tensor's weights marked: `INT_DENSITY` for quantized ones."""
    return INT_DENSITY if np.dtype(dtype) in INT_DTYPES else DENSITY


def mask(key: bytes, name: str, n: int, density: float = DENSITY
         ) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """The keyed `density` share of tensor `name`'s weights that carry the mark — one mask
    for every cohort, so two cohorts' copies differ only there (and patches stay small)."""
    return _generator(key, -1, name).random(n) < density


def embed(weights: Array, secret: bytes, cohort: int,
          strength: float = DEFAULT_STRENGTH, name: str = "", share: float = 1.0) -> Array:
    """`weights` (float16/float32, or int8/uint8 quantized ones; any shape) carrying cohort
    `cohort`'s fingerprint for tensor `name`, in the same dtype and shape: float weights
    `strength` FP16 steps off, on a `share` of the mask's positions (a subset of them: a
    lower density of the same draws, so the detector's mask still covers them)."""
    flat = weights.reshape(-1)
    signs = pattern(secret, cohort, flat.size, name) * \
        mask(secret, name, flat.size, density_for(weights.dtype) * share)
    if weights.dtype in INT_DTYPES:
        info = np.iinfo(weights.dtype)
        moved = flat.astype(np.int16) + signs
        return np.clip(moved, info.min, info.max).astype(weights.dtype).reshape(weights.shape)
    if weights.dtype not in FLOAT_DTYPES:
        raise ValueError(f"watermarks go into float16/float32/int8/uint8 weights, "
                         f"not {weights.dtype}")
    w32 = flat.astype(np.float32)
    keep = ~np.isfinite(w32) | (w32 == 0) | (np.abs(w32) >= LARGEST_MARKED)
    safe = np.where(keep, np.float32(1), w32)
    step = np.spacing(np.abs(safe).astype(np.float16)).astype(np.float32)
    marked = w32 + np.where(keep, np.float32(0), signs * step * np.float32(strength))
    out: Array = np.where(keep, flat, marked.astype(weights.dtype)).reshape(weights.shape)
    return out


def scores(diff: Floats, rows: np.ndarray[Any, np.dtype[np.float32]]
           ) -> np.ndarray[Any, np.dtype[np.float64]]:
    """z for every copy (rows of `diff`: its differences as `filtered` weighs them, over the
    marked positions) and every cohort's pattern (rows of `rows`): shape (copies, cohorts)."""
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
    """The cohort whose fingerprint `leaked` carries, or None ("none"): one flat tensor."""
    if leaked.size != original.size:
        return Identified(None, 0.0, 1.0)  # another model: nothing to compare
    return identify_tensors({"": leaked}, [("", original)], secret, cohorts,
                            max_false_positive=max_false_positive)


def identify_tensors(leaked: Mapping[str, Array], original: Iterable[tuple[str, Array]],
                     key: bytes, cohorts: int, *,
                     max_false_positive: float = MAX_FALSE_POSITIVE,
                     grids: Mapping[str, Lattice] | None = None,
                     moved: Mapping[str, Array] | None = None) -> Identified:
    """`identify` over a model's tensors: the original's (name, values as marked — float or
    quantized integers) against the leaked copy's values by name; a tensor the copy lacks,
    or holds with another size, is left out of both sides. `grids`: the grid a re-quantized
    copy tensor sits on, where its file says (server/compile/requantized.py); else it is
    read off the values (`lattice`). `moved` (`moved_positions`): where the marks sit, by
    tensor; a tensor it leaves out carries none and is not scored."""
    dots = np.zeros(cohorts, dtype=np.float64)
    norm2, compared = 0.0, 0
    for name, values in original:
        copy = leaked.get(name)
        if copy is None or copy.size != values.size:
            continue
        flat = values.reshape(-1)
        at = mask(key, name, flat.size, density_for(values.dtype)) & carries_mark(flat)
        if moved is not None:
            at &= moved.get(name, False)
        leaked_flat = copy.astype(np.float32).reshape(-1)
        grid = None
        if values.dtype in FLOAT_DTYPES:
            grid = (grids or {}).get(name) or lattice(leaked_flat)
        if grid is not None:
            x = on_lattice(leaked_flat[at], flat[at], grid.at(at))
        else:
            x = filtered(leaked_flat[at] - flat[at].astype(np.float32), flat[at])
        norm2 += float(np.dot(x, x))
        compared += x.size
        for c in range(cohorts):
            dots[c] += float(np.dot(x, pattern(key, c, flat.size, name)[at]))
    if norm2 <= 0:
        return Identified(None, 0.0, 1.0, compared)
    z = dots / math.sqrt(norm2)
    best = int(np.argmax(z))
    p = false_positive(float(z[best]), cohorts)
    return Identified(best if p <= max_false_positive else None, float(z[best]), p, compared)


def moved_positions(original: Iterable[tuple[str, Array]], marked: Mapping[str, Array]
                    ) -> dict[str, Array]:
    """Per tensor of the unmarked `original`, where a cohort's `marked` copy differs from
    it: the positions `embed` moved, the same for every cohort (its mask and share do not
    depend on the cohort, and a move is never zero), so the scores' null distribution is
    unchanged. A tensor the copy does not hold at that size is left out."""
    out = {}
    for name, values in original:
        copy = marked.get(name)
        if copy is not None and copy.size == values.size:
            out[name] = copy.reshape(-1) != values.reshape(-1)
    return out


def carries_mark(values: Array) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """Where `embed` may move a weight (by its value alone): not a zero, a non-finite value
    or a huge constant; for integers, not at the type's ends (a step there is clipped)."""
    out: np.ndarray[Any, np.dtype[np.bool_]]
    if values.dtype in INT_DTYPES:
        info = np.iinfo(values.dtype)
        out = (values > info.min) & (values < info.max)
        return out
    w = values.astype(np.float32)
    with np.errstate(invalid="ignore"):
        out = np.isfinite(w) & (w != 0) & (np.abs(w) < LARGEST_MARKED)
    return out


def filtered(diff: Floats, reference: Array) -> np.ndarray[Any, np.dtype[np.float64]]:
    """The matched filter (see the module docstring): each difference (the last axis of
    `diff`: leaked − original; rows are copies) in steps of its weight's mark (`reference`:
    the original's values there, float or integer), divided by the noise variance around it,
    estimated per bucket of about the same magnitude (one FP16 exponent, a quarter of its
    mantissa range: within a bucket |w| varies by < 25%; a bucket of fewer than
    `MIN_BUCKET` weights shares its neighbours'). It depends on the original and the leaked
    values only, never on a cohort's pattern: the Hoeffding bound holds for it."""
    d = np.nan_to_num(np.atleast_2d(np.asarray(diff, dtype=np.float64)),
                      nan=0.0, posinf=0.0, neginf=0.0)
    if reference.dtype in INT_DTYPES or reference.size == 0:
        r, bucket = d, np.zeros(reference.size, dtype=np.intp)
    else:
        a = np.minimum(np.abs(reference.astype(np.float32)), 65504).astype(np.float16)
        r = d / np.spacing(a).astype(np.float64)
        bucket = (a.view(np.uint16) >> 8).astype(np.intp)  # exponent, 2 mantissa bits
    group = _groups(bucket)
    counts = np.bincount(group).astype(np.float64)
    var = np.stack([np.bincount(group, weights=row * row, minlength=counts.size)
                    for row in r]) / np.maximum(counts, 1)
    v = var[:, group]
    out: np.ndarray[Any, np.dtype[np.float64]] = np.divide(
        r, v, out=np.zeros_like(r), where=v > 0)
    return out if np.ndim(diff) > 1 else out[0]


@dataclass(frozen=True)
class Lattice:
    """A grid of values, offset + step·q for integers q: one for a tensor, or one per weight
    (arrays over the flat tensor: a per-channel or per-block re-quantization's)."""

    step: float | Floats
    offset: float | Floats

    def at(self, where: np.ndarray[Any, np.dtype[np.bool_]]) -> Lattice:
        """The grid of the weights at `where`."""
        if np.ndim(self.step) == 0 and np.ndim(self.offset) == 0:
            return self
        return Lattice(np.broadcast_to(self.step, where.shape)[where],
                       np.broadcast_to(self.offset, where.shape)[where])


def lattice(values: Floats) -> Lattice | None:
    """The grid every finite value of a leaked tensor sits on, if it has at most
    `MAX_LATTICE_LEVELS` levels: a copy re-quantized per tensor (INT8 or narrower, symmetric
    or with a zero point) and dequantized, as onnxruntime's quantizers and a per-tensor INT8
    attack leave it. Else None (float weights, noise, a per-channel re-quantization: the
    matched filter scores those). The grid is read off the values alone: the smallest gap
    between distinct values, refined by least squares over every level."""
    v = values[np.isfinite(values)].astype(np.float64)
    u = np.unique(v)
    if u.size < 3 or u.size > MAX_LATTICE_LEVELS:
        return None
    step = float(np.diff(u).min())
    if not step > 0 or (u[-1] - u[0]) / step > MAX_LATTICE_LEVELS:
        return None
    q = np.rint((u - u[0]) / step)
    step = float(np.dot(u - u[0], q) / np.dot(q, q))
    if float(np.abs(u - u[0] - q * step).max()) > LATTICE_TOLERANCE * step:
        return None
    return Lattice(step, float(u[0]))


def on_lattice(leaked: Floats, original: Array, grid: Lattice
               ) -> np.ndarray[Any, np.dtype[np.float64]]:
    """The differences of a copy on `grid` (see `lattice`): each marked weight's level in the
    copy minus the level its original rounds to on the same grid, clipped to ±1. A mark that
    the re-quantization rounded away gives 0 — no noise, where the filtered difference
    would score the whole rounding error — and one that carried its weight across a
    rounding boundary gives the mark's sign, so an unmoved weight (a thinned share) adds
    nothing either. Like `filtered`, a function of the original and the leaked values only:
    the Hoeffding bound holds."""
    lv = np.rint((leaked.astype(np.float64) - grid.offset) / grid.step)
    ov = np.rint((original.astype(np.float64) - grid.offset) / grid.step)
    d = np.nan_to_num(lv - ov, nan=0.0, posinf=0.0, neginf=0.0)
    out: np.ndarray[Any, np.dtype[np.float64]] = np.clip(d, -1.0, 1.0)
    return out


def _groups(bucket: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Magnitude buckets merged in order of magnitude until each holds `MIN_BUCKET` weights
    (the last, smaller remainder joins the one before): one group index per weight."""
    counts = np.bincount(bucket)
    of_bucket, group, held = np.zeros(counts.size, dtype=np.intp), 0, 0
    for b in np.flatnonzero(counts):
        if held >= MIN_BUCKET:
            group, held = group + 1, 0
        of_bucket[b], held = group, held + int(counts[b])
    if held < MIN_BUCKET and group > 0:
        of_bucket[of_bucket == group] = group - 1
    out: np.ndarray[Any, Any] = of_bucket[bucket]
    return out


def noise_z(marked: int, strength: float, share: float = 1.0) -> float:
    """The z that `marked` float weights at `strength` FP16 steps are expected to score after
    1% Gaussian noise of each weight's magnitude (one copy's z varies around it by ≈ ±1);
    with a `share` of them moved, the others still scored: z falls by the share."""
    return STEP_PER_NOISE * strength * share * math.sqrt(max(marked, 0))


def strength_for(marked: int) -> int:
    """The strength (FP16 steps) at which `marked` weights score an expected z of `NOISE_Z`
    after 1% weight noise (`noise_z`), from 1 to `MAX_STRENGTH`."""
    need = NOISE_Z / max(noise_z(marked, 1), 1e-9)
    return int(min(MAX_STRENGTH, max(1, math.ceil(need))))


def release_key(secret: bytes, model: str, version: str) -> bytes:
    """One release's watermark key, derived from the server's secret: what a compile sandbox
    gets (it never sees the secret itself, so it learns only its own release's patterns)."""
    return hmac.new(secret, f"mf-watermark-release:{model}:{version}".encode(),
                    hashlib.sha256).digest()


def psnr_db(original: Floats, marked: Floats) -> float:
    """Peak signal-to-noise ratio of `marked` against `original` (peak: max |original|)."""
    a, b = original.astype(np.float64), marked.astype(np.float64)
    mse = float(np.mean((a - b) ** 2))
    peak = float(np.max(np.abs(a)))
    return math.inf if mse == 0 else 10 * math.log10(peak * peak / mse)
