"""Per-cohort watermarks, the core (server/watermark.py, manifests/cohorts.py): the cohort of
a marked copy is named after float16 ↔ float32 round trips, INT8 re-quantization and 1%
weight noise, with a false-positive bound ≤ 1e-9; unmarked, foreign and other servers'
files give "none" — over 10,000 foreign trials, never a wrong cohort."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from manifests import cohort_of
from server import watermark as wm

SECRET = b"server watermark secret for tests"
COHORTS = 64
N = 1_500_000  # the sparse (1/32) mark needs ≳ 1M weights for a per-tensor INT8 re-quantization
VECTORS = Path(__file__).resolve().parents[2] / "manifests" / "vectors" / "cohorts.json"


def model_weights(seed: int, n: int = N) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * 0.05).astype(np.float32)


def int8_requantized(w: np.ndarray) -> np.ndarray:
    scale = np.abs(w).max() / 127
    return (np.clip(np.round(w / scale), -127, 127) * scale).astype(np.float32)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_marked_copy_names_its_cohort_after_each_attack(dtype):
    original = model_weights(1).astype(dtype)
    marked = wm.embed(original, SECRET, 17)
    assert marked.dtype == dtype and marked.shape == original.shape
    assert wm.psnr_db(original, marked) > 60
    noise = np.random.default_rng(2).standard_normal(N).astype(np.float32)
    m32 = marked.astype(np.float32)
    attacked = {
        "as shipped": marked,
        "fp16 -> fp32": m32,
        "fp32 -> fp16 -> fp32": m32.astype(np.float16).astype(np.float32),
        "int8 re-quantized": int8_requantized(m32),
        "1% weight noise": m32 + noise * 0.01 * np.abs(m32),
    }
    for name, copy in attacked.items():
        got = wm.identify(copy, original, SECRET, COHORTS)
        assert got.cohort == 17, (name, got)
        assert got.false_positive <= 1e-9, (name, got)


def test_unmarked_foreign_and_other_servers_files_give_none():
    original = model_weights(1)
    assert wm.identify(original, original, SECRET, COHORTS).cohort is None
    rounded = original.astype(np.float16).astype(np.float32)
    assert wm.identify(rounded, original, SECRET, COHORTS).cohort is None
    assert wm.identify(model_weights(3), original, SECRET, COHORTS).cohort is None
    other_server = wm.embed(original, b"another server's secret", 17)
    assert wm.identify(other_server, original, SECRET, COHORTS).cohort is None
    assert wm.identify(model_weights(1, N // 2), original, SECRET, COHORTS).cohort is None


def test_ten_thousand_foreign_files_never_name_a_cohort():
    n, trials = 65_536, 10_000
    original = model_weights(1, n)
    marked = wm.mask(SECRET, "", n)  # identify's statistic: over the marked positions,
    rows = wm.patterns(SECRET, COHORTS, n)[:, marked]  # the differences filtered as it does
    rng = np.random.default_rng(4)
    worst = 0.0
    for _ in range(trials // 1000):
        foreign = (rng.standard_normal((1000, n)) * 0.05).astype(np.float32)
        z = wm.scores(wm.filtered((foreign - original)[:, marked], original[marked]), rows)
        worst = max(worst, float(z.max()))
    assert wm.false_positive(worst, COHORTS) > 1e-9, worst  # never named
    assert worst < 7.05  # the statistic a claim at 1e-9 with 64 cohorts needs


def test_cohort_rule_matches_its_vectors_and_an_independent_reimplementation():
    vectors = json.loads(VECTORS.read_text())
    assert len(vectors) >= 8
    for v in vectors:
        got = cohort_of(v["salt"], v["device_id"], v["cohorts"])
        digest = hashlib.sha256(f"cohort:{v['salt']}:{v['device_id']}".encode()).digest()
        assert got == v["cohort"] == int.from_bytes(digest[:8], "big") % v["cohorts"]
    with pytest.raises(ValueError):
        cohort_of("s", "d", 0)


def test_cohorts_spread_devices_evenly():
    counts = np.bincount([cohort_of("release-9", f"device-{i}", 64) for i in range(64_000)],
                         minlength=64)
    assert counts.min() > 800 and counts.max() < 1200


def small_model(seed: int) -> dict[str, np.ndarray]:
    """≈ 75k weights shaped like a small corpus model (detector-torchscript: 72k): conv
    kernels of a few scales, normalization scales near 1, biases, and gpt2's causal
    attention mask (float32's lowest value: a constant, never a weight)."""
    rng = np.random.default_rng(seed)
    out = {f"conv{i}": (rng.standard_normal(n) * s).astype(np.float32)
           for i, (n, s) in enumerate([(18_432, 0.08), (36_864, 0.03), (16_384, 0.01)])}
    out["norm"] = (1 + 0.1 * rng.standard_normal(2048)).astype(np.float32)
    out["bias"] = (rng.standard_normal(1024) * 0.2).astype(np.float32)
    out["mask"] = np.where(rng.random(1024) < 0.5, np.finfo(np.float32).min,
                           0).astype(np.float32)
    return out


def noisy(tensors: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """1% Gaussian noise of each weight's magnitude, on every tensor (the mask too)."""
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        return {n: (v * (1 + 0.01 * rng.standard_normal(v.size))).astype(np.float32)
                for n, v in tensors.items()}


def marked_positions(tensors: dict[str, np.ndarray]) -> int:
    return sum(int((wm.mask(SECRET, n, v.size) & wm.carries_mark(v)).sum())
               for n, v in tensors.items())


def test_one_percent_noise_names_the_cohort_of_a_small_model_at_its_strength():
    original = small_model(7)
    n = marked_positions(original)
    strength = wm.strength_for(n)
    assert 2 <= strength <= wm.MAX_STRENGTH and wm.noise_z(n, strength) >= wm.NOISE_Z
    named = 0
    for c in range(8):
        copy = {k: wm.embed(v, SECRET, c, strength, name=k) for k, v in original.items()}
        got = wm.identify_tensors(noisy(copy, c), original.items(), SECRET, COHORTS)
        assert got.cohort in (c, None), (c, got)  # never a wrong cohort
        named += got.cohort == c and got.false_positive <= 1e-9
        # the arithmetic's floor (FP16-subnormal weights, whose step is a larger share of
        # them, score above it)
        assert got.z > wm.noise_z(n, strength) - 4, got
    assert named == 8
    # At one FP16 step (the scheme before strengths) the same noise leaves too little.
    weak = {k: wm.embed(v, SECRET, 3, 1, name=k) for k, v in original.items()}
    got = wm.identify_tensors(noisy(weak, 3), original.items(), SECRET, COHORTS)
    assert got.cohort is None and got.z < 7.05, got


def test_an_attention_mask_of_float32_min_does_not_hide_the_mark_under_noise():
    """1% noise of -3.4e38 overflows: the mask was scored, its difference's square was inf,
    and gpt2-tiny's FP32 copy read "none". Constants embed never moves are not scored."""
    original = small_model(8)
    copy = {k: wm.embed(v, SECRET, 5, 16, name=k) for k, v in original.items()}
    attacked = noisy(copy, 1)
    assert not np.isfinite(attacked["mask"]).all()  # the attack really overflowed
    got = wm.identify_tensors(attacked, original.items(), SECRET, COHORTS)
    assert got.cohort == 5 and got.false_positive <= 1e-9, got


def test_the_filtered_statistic_beats_the_plain_difference_under_noise_and_int8():
    """Weighing each difference by the noise around it (wm.filtered) names copies the plain
    difference (z over leaked − original) cannot: 1% noise is largest on the largest
    weights, INT8 rounding on the smallest ones (in FP16 steps)."""
    original = {k: v for k, v in small_model(9).items() if k != "mask"}
    copy = {k: wm.embed(v, SECRET, 2, 4, name=k) for k, v in original.items()}

    def requantized(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: int8_requantized(v) for k, v in t.items()}

    for attacked in (noisy(copy, 2), requantized(copy)):
        at = {k: wm.mask(SECRET, k, v.size) & wm.carries_mark(v) for k, v in original.items()}
        d = np.concatenate([(attacked[k] - v)[at[k]] for k, v in original.items()])
        x = np.concatenate([wm.filtered((attacked[k] - v)[at[k]], v[at[k]])
                            for k, v in original.items()])
        rows = np.concatenate([wm.patterns(SECRET, COHORTS, v.size, k)[:, at[k]]
                               for k, v in original.items()], axis=1)
        plain, weighed = wm.scores(d, rows)[0], wm.scores(x, rows)[0]
        assert int(np.argmax(weighed)) == 2 and weighed.max() > 1.15 * plain[2], \
            (plain[2], weighed.max())


def test_int8_requantized_copy_of_a_thinned_mark_is_named_on_its_lattice():
    """A per-tensor INT8 re-quantization rounds most one-step marks away and adds a rounding
    error 20× the mark to every weight: the filtered difference scores that error and a
    thinned mark (1/8 of the positions moved) drowns in it. The copy's values sit on the
    re-quantizer's grid, so the detector rounds the original onto the same grid: a mark
    that carried its weight across a boundary shows its sign, every other weight 0."""
    n = 400_000
    original = model_weights(1, n).astype(np.float16)
    at = wm.mask(SECRET, "", n) & wm.carries_mark(original)
    rows = wm.patterns(SECRET, COHORTS, n)[:, at]
    for cohort in (17, 5):
        leaked = int8_requantized(wm.embed(original, SECRET, cohort, 4, share=1 / 8)
                                  .astype(np.float32))
        got = wm.identify(leaked, original, SECRET, COHORTS)
        assert got.cohort == cohort and got.false_positive <= 1e-9, got
        filtered = wm.scores(wm.filtered(leaked[at] - original[at].astype(np.float32),
                                         original[at]), rows)[0]
        assert filtered.max() < 7.05, filtered.max()  # what the filter alone makes of it


def test_foreign_requantized_files_never_name_a_cohort_on_their_lattice():
    n, trials = 16_384, 2_000
    original = model_weights(1, n).astype(np.float16)
    at = wm.mask(SECRET, "", n) & wm.carries_mark(original)
    rows = wm.patterns(SECRET, COHORTS, n)[:, at]
    rng = np.random.default_rng(5)
    worst = 0.0
    for _ in range(trials):
        foreign = int8_requantized((rng.standard_normal(n) * 0.05).astype(np.float32))
        grid = wm.lattice(foreign)
        assert grid is not None
        worst = max(worst, float(wm.scores(wm.on_lattice(foreign[at], original[at], grid),
                                           rows).max()))
    assert worst < 7.05 and wm.false_positive(worst, COHORTS) > 1e-9, worst


@settings(max_examples=60, deadline=None)
@given(bits=st.integers(2, 8), symmetric=st.booleans(), scale_exp=st.floats(-8, 2),
       seed=st.integers(0, 2**32 - 1))
def test_a_per_tensor_requantization_is_read_as_its_grid_and_costs_no_unmarked_weight(
        bits, symmetric, scale_exp, seed):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(4096) * 10 ** scale_exp).astype(np.float32)
    if symmetric:
        qmax = 2 ** (bits - 1) - 1
        scale, zero, lo, hi = np.abs(w).max() / qmax, 0, -qmax, qmax
    else:
        scale = (w.max() - min(w.min(), 0)) / (2**bits - 1)
        zero = int(np.rint(-min(w.min(), 0) / scale))
        lo, hi = 0, 2**bits - 1
    q = np.clip(np.rint(w / np.float32(scale)) + zero, lo, hi)
    leaked = ((q - zero) * np.float32(scale)).astype(np.float32)
    grid = wm.lattice(leaked)
    assert grid is not None and grid.step == pytest.approx(scale, rel=1e-5)
    # the unmarked original rounds to exactly the copy's levels: nothing to score
    assert not wm.on_lattice(leaked, w, grid).any()


def test_float_weights_noise_and_wide_fp16_tensors_are_no_lattice():
    w = model_weights(2, 65_536)
    assert wm.lattice(w) is None
    assert wm.lattice(w.astype(np.float16).astype(np.float32)) is None
    assert wm.lattice(int8_requantized(w) * (1 + 1e-3 * model_weights(3, 65_536))) is None
    assert wm.lattice(np.full(100, 0.5, np.float32)) is None  # one level is no grid


def test_thinned_mark_after_noise_is_named_on_the_positions_it_moved():
    """A mark thinned to 1/16 of its positions (a model whose outputs cannot afford more),
    at strength 4, after 1% noise: scored over every masked position, the 15/16 it never
    moved add only noise and the copy reads "none"; scored over the positions the server
    knows it moved (any cohort's copy against the unmarked one), the same copy names its
    cohort. A tensor the plan left unmarked is not scored at all."""
    n = 1_000_000
    original = {"w": model_weights(1, n).astype(np.float16), "head": model_weights(2, 4096)}
    plan = {"w": 1 / 16, "head": 0.0}  # share per tensor; head left unmarked

    def copy_of(cohort: int) -> dict[str, np.ndarray]:
        return {k: wm.embed(v, SECRET, cohort, 4, name=k, share=plan[k]) if plan[k] else v
                for k, v in original.items()}

    moved = wm.moved_positions(original.items(), copy_of(0))
    assert moved["w"].sum() == pytest.approx(n / 32 / 16, rel=0.05) and not moved["head"].any()
    rng = np.random.default_rng(6)
    for cohort in (17, 40):
        leaked = {k: v.astype(np.float32) * (1 + 0.01 * rng.standard_normal(v.size)
                                             ).astype(np.float32)
                  for k, v in copy_of(cohort).items()}
        blind = wm.identify_tensors(leaked, original.items(), SECRET, COHORTS)
        assert blind.cohort is None, blind
        got = wm.identify_tensors(leaked, original.items(), SECRET, COHORTS, moved=moved)
        assert got.cohort == cohort and got.false_positive <= 1e-9, got
        assert got.weights == moved["w"].sum() - (~wm.carries_mark(original["w"])
                                                  & moved["w"]).sum()


def test_foreign_files_never_name_a_cohort_on_the_moved_positions():
    """The moved positions depend on the key and the original only, never on a cohort's
    signs: foreign files scored there stay under the bound (2,000 trials)."""
    n = 262_144
    original = {"w": model_weights(1, n).astype(np.float16)}
    moved = wm.moved_positions(original.items(), {
        "w": wm.embed(original["w"], SECRET, 0, 1, name="w", share=1 / 4)})
    at = wm.mask(SECRET, "w", n) & wm.carries_mark(original["w"]) & moved["w"]
    rows = wm.patterns(SECRET, COHORTS, n, "w")[:, at]
    rng = np.random.default_rng(7)
    worst = 0.0
    for _ in range(trials := 2_000):
        foreign = (rng.standard_normal(at.sum()) * 0.05).astype(np.float32)
        x = wm.filtered(foreign - original["w"][at].astype(np.float32), original["w"][at])
        worst = max(worst, float(wm.scores(x, rows).max()))
    assert trials == 2_000 and worst < 7.05 and wm.false_positive(worst, COHORTS) > 1e-9, worst
    leaked = {"w": (rng.standard_normal(n) * 0.05).astype(np.float32)}
    assert wm.identify_tensors(leaked, original.items(), SECRET, COHORTS,
                               moved=moved).cohort is None
