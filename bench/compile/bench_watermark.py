"""What per-cohort watermarks cost and how they hold (issue 23, docs/security.md):

    python -m bench.compile.bench_watermark [--models a,b] [--platforms onnx] [--cohorts 64]
                                            [--trials 10000]

Per corpus model (tests/corpus, fetched into ~/.cache/modelfleet/corpus) and platform, the
worker's pipeline runs twice in the same process — without a watermark (the baseline) and
with `--cohorts` cohorts — and the table shows: the baseline's state, how many cohort
artifacts passed (every one must, when the baseline does), the lowest output PSNR of a copy
against the unmarked artifact, compile seconds of both runs, the bytes stored (one artifact
vs every copy), the patch bytes from the unmarked artifact to cohort 0 and from cohort 0 to
cohort 1 (server/delta, as the patch worker makes them), and identification of cohort 1's
copy as shipped and after an FP16 round trip, INT8 re-quantization and 1% weight noise
(cohort, z), and the weakest cohort's strength (FP16 steps per marked weight) × share of the
marked positions, with the z it is expected to score after 1% noise (server/watermark.py).

Then the false-positive trial: `--trials` foreign files (a same-layout model with other
weights: 65,536 weights, fixed seed) against a marked original, scored as `identify` scores
(every cohort, masked positions), counting any named cohort — a wrong cohort — and the
highest z; and a tenth as many marked copies after an FP16 round trip, counting wrong and
missed cohorts. Both are scored with identify's filtered differences (server/watermark.py).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform as host
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

KEY = b"bench watermark release key"


def _build(model: Any, plat: str, workdir: Path, cohorts: int | None) -> tuple[Any, float]:
    from server.compile.cohorts import WatermarkSpec
    from server.compile.pipeline import BuildSpec, Pipeline
    from server.compile.settings_map import pipeline_settings

    spec = BuildSpec(source_path=model.path, source_format=model.fmt,
                     variants={"default": model.inputs}, platforms=(plat,),
                     settings=pipeline_settings(plat, model.platforms[plat]),
                     reference_path=model.reference,
                     watermark=WatermarkSpec(cohorts, KEY) if cohorts else None)
    started = time.monotonic()
    (out,) = Pipeline().build(spec, workdir)
    return out, time.monotonic() - started


def _patch_bytes(new: Path, base: Path, workdir: Path) -> int | None:
    from server.delta import make_patches
    from server.hashing import file_sha256

    workdir.mkdir(parents=True, exist_ok=True)
    made = make_patches(new, [(file_sha256(base)[0], base)], workdir)
    return made[0].length if made else None


def _tensors(p: Path, workdir: Path) -> list[Any]:
    from server.compile import weights
    from server.compile.packing import unpack_directory

    return weights.read(unpack_directory(p, workdir) if p.suffix == ".tar" else p)


def _attacked(values: np.ndarray, attack: str, rng: np.random.Generator) -> np.ndarray:
    """A leaked tensor after `attack` (as tests/publish/test_watermark_files.py does them to
    files): an FP16 round trip, per-tensor symmetric INT8 re-quantization (dequantized, as
    identify compares a re-quantized copy), or 1% Gaussian noise of each weight's magnitude
    (on integer weights: noise of σ = 0.5 steps, rounded)."""
    v = values.astype(np.float32)
    if values.dtype.kind in "iu" or attack == "shipped":
        return values if attack != "noise" else v + np.rint(0.5 * rng.standard_normal(v.size))
    if attack == "fp16":
        return v.astype(np.float16).astype(np.float32)
    if attack == "int8":
        scale = float(np.max(np.abs(v[np.isfinite(v)]), initial=0.0)) / 127 or 1.0
        return np.asarray(np.clip(np.rint(v / scale), -127, 127) * np.float32(scale))
    return np.asarray(v * (1 + 0.01 * rng.standard_normal(v.size)).astype(np.float32))


ATTACKS = ("shipped", "fp16", "int8", "noise")


def _identify(art: Path, copies: list[Path], c: int, cohorts: int, precision: str,
              workdir: Path) -> dict[str, Any]:
    """Cohort c's copy named as shipped and after each attack: {attack: (cohort, z)}."""
    from server import watermark as wm
    from server.compile import qnn_marks, weights

    rng = np.random.default_rng(c)
    out: dict[str, Any] = {}
    if qnn_marks.is_epcontext(art):  # attacks on the binary's stored words
        word = qnn_marks.word_bytes(precision)
        unmarked = qnn_marks.context_binary(art)
        blobs = [qnn_marks.context_binary(p) for p in copies]
        kind = np.float16 if word == 2 else np.uint8
        stored = np.frombuffer(blobs[c], kind)
        for attack in ATTACKS:
            if attack == "int8":  # needs the tensors' boundaries, which the binary hides
                out[attack] = None
                continue
            with np.errstate(all="ignore"):
                leaked = _attacked(stored, attack, rng)
                leaked = np.clip(leaked, 0, 255) if word == 1 else leaked
            got = qnn_marks.identify_binary(np.asarray(leaked).astype(kind).tobytes(),
                                            unmarked, blobs, word)
            out[attack] = (got.cohort, got.z)
        return out
    original = [(t.name, t.values) for t in _tensors(art, workdir / "orig") if t.markable]
    shipped = _tensors(copies[c], workdir / "copy")
    # where the marks sit, as identify reads them off the first cohort's copy
    moved = wm.moved_positions(original, weights.by_name(_tensors(copies[0], workdir / "c0")))
    for attack in ATTACKS:
        with np.errstate(all="ignore"):
            copy = {t.name: _attacked(t.values, attack, rng) for t in shipped}
        got = wm.identify_tensors(weights.by_name([weights.Tensor(n, v)
                                                   for n, v in copy.items()]),
                                  original, KEY, cohorts, moved=moved)
        out[attack] = (got.cohort, got.z)
    return out


_WARM: set[str] = set()


def cell(model: Any, plat: str, cohorts: int, workdir: Path) -> dict[str, Any]:
    if plat not in _WARM:  # imports and caches, once per platform, not timed
        _build(model, plat, workdir / "warm", None)
        _WARM.add(plat)
    base, base_s = _build(model, plat, workdir / "base", None)
    row: dict[str, Any] = {"model": model.name, "platform": plat, "base": base.state,
                           "base_s": base_s}
    if base.state != "ready":
        row["error"] = base.error[:120]
        return row
    marked, marked_s = _build(model, plat, workdir / "marked", cohorts)
    gate = marked.gates.get("watermark", {})
    num = (marked.gates.get("numeric") or {}).get("outputs") or [{}]
    row.update(state=marked.state, marked_s=marked_s, gate=gate.get("status"),
               passed=len(marked.cohorts), psnr=gate.get("lowest_output_psnr_db"),
               error=(marked.error or gate.get("reason", ""))[:160],
               artifact_bytes=base.artifact.length, marked_weights=gate.get("marked_weights"),
               strength=gate.get("strength"), share=gate.get("share"),
               noise_z=gate.get("noise_z"),
               snr=min((float(o.get("snr_db", np.inf)) for o in num), default=None))
    if marked.state == "ready" and marked.cohorts:
        unmarked = marked.artifact.path
        row["stored_bytes"] = sum(c.length for c in marked.cohorts)
        row["patch_unmarked_to_c0"] = _patch_bytes(marked.cohorts[0].path, unmarked,
                                                   workdir / "d0")
        row["patch_c0_to_c1"] = _patch_bytes(marked.cohorts[1].path, marked.cohorts[0].path,
                                             workdir / "d1")
        row["identify"] = _identify(unmarked, [c.path for c in marked.cohorts], 1, cohorts,
                                    marked.precision, workdir / "id")
    shutil.rmtree(workdir, ignore_errors=True)
    return row


def trials(n_trials: int, cohorts: int, n: int = 65_536) -> dict[str, Any]:
    from server import watermark as wm

    rng = np.random.default_rng(2026)
    original = (rng.standard_normal(n) * 0.05).astype(np.float32)
    mask = wm.mask(KEY, "w", n)
    rows = wm.patterns(KEY, cohorts, n, "w")[:, mask]
    worst, named, started = 0.0, 0, time.monotonic()
    for done in range(0, n_trials, 1000):
        batch = min(1000, n_trials - done)
        foreign = (rng.standard_normal((batch, n)) * 0.05).astype(np.float32)
        z = wm.scores(wm.filtered((foreign - original)[:, mask], original[mask]), rows)
        worst = max(worst, float(z.max()))
        named += int(sum(wm.false_positive(float(v), cohorts) <= wm.MAX_FALSE_POSITIVE
                         for v in z.max(axis=1)))
    wrong = missed = 0
    for t in range(n_trials // 10):  # marked copies: 1/10 as many (each is a real embed)
        c = t % cohorts
        copy = wm.embed(original, KEY, c, name="w").astype(np.float16).astype(np.float32)
        z = wm.scores(wm.filtered((copy - original)[mask][None, :], original[mask]), rows)[0]
        best = int(np.argmax(z))
        if wm.false_positive(float(z[best]), cohorts) > wm.MAX_FALSE_POSITIVE:
            missed += 1
        elif best != c:
            wrong += 1
    return {"foreign": n_trials, "named": named, "worst_z": worst,
            "worst_bound": wm.false_positive(worst, cohorts), "marked": n_trials // 10,
            "wrong": wrong, "missed": missed, "seconds": time.monotonic() - started}


def _mb(n: int | None) -> str:
    return "—" if n is None else f"{n / 1e6:.2f}"


def _kb(n: int | None) -> str:
    return "—" if n is None else f"{n / 1e3:.1f}"


def _named(r: dict[str, Any]) -> str:
    """Cohort 1's copy: named cohort (z) as shipped / FP16 round trip / INT8 / 1% noise."""
    if "identify" not in r:
        return "—"
    return " / ".join("—" if got is None else "none" if got[0] is None
                      else f"{got[0]} ({got[1]:.0f})" for got in (r["identify"][a]
                                                            for a in ATTACKS))


def _strength(r: dict[str, Any]) -> str:
    """The weakest cohort's strength and share, and the z expected after 1% noise."""
    if r.get("strength") is None:
        return "—"
    share = r.get("share") or 1
    return f"{r['strength']}" + ("" if share == 1 else f" × 1/{round(1 / share)}") + \
        ("" if r.get("noise_z") is None else f" ({r['noise_z']:.0f})")


def table(rows: list[dict[str, Any]], cohorts: int) -> str:
    lines = [f"| model | platform | gate without (SNR dB) | {cohorts} cohorts passed "
             "| marked weights | strength × share (noise z) | lowest PSNR dB "
             "| compile s without / with "
             "| stored MB one / all | patch kB unmarked→c0 / c0→c1 "
             "| identify c1: shipped / FP16 / INT8 / 1% noise |", "|" + "---|" * 11]
    for r in rows:
        if r["base"] != "ready":
            lines.append(f"| {r['model']} | {r['platform']} | {r['base']} | — (baseline "
                         f"fails: {r.get('error', '')}) | | | | {r['base_s']:.1f} | | | |")
            continue
        snr = "" if r.get("snr") in (None, np.inf) else f" ({r['snr']:.0f})"
        passed = f"{r['passed']}/{cohorts}" + ("" if r["state"] == "ready" and r["passed"]
                                               else f" — {r['gate']}: {r['error']}")
        lines.append(
            f"| {r['model']} | {r['platform']} | ready{snr} | {passed} | "
            f"{r.get('marked_weights')} | {_strength(r)} | {r['psnr']} | "
            f"{r['base_s']:.1f} / {r['marked_s']:.1f} | {_mb(r['artifact_bytes'])} / "
            f"{_mb(r.get('stored_bytes'))} | {_kb(r.get('patch_unmarked_to_c0'))} / "
            f"{_kb(r.get('patch_c0_to_c1'))} | {_named(r)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.corpus.models import corpus

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="comma-separated corpus model names (default: all)")
    ap.add_argument("--platforms", default="onnx,coreml,qnn")
    ap.add_argument("--cohorts", type=int, default=64)
    ap.add_argument("--trials", type=int, default=10_000)
    args = ap.parse_args(argv)
    print(f"# {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {host.node()}, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    if args.trials:  # --trials 0: the corpus cells only
        t = trials(args.trials, args.cohorts)
        print(f"foreign files: {t['foreign']}, cohorts named (wrong): {t['named']}, highest "
              f"z {t['worst_z']:.2f} (bound {t['worst_bound']:.3g}); marked copies after "
              f"FP16: {t['marked']}, wrong cohort {t['wrong']}, missed {t['missed']} "
              f"({t['seconds']:.0f} s)")
    rows = []
    wanted = args.models.split(",") if args.models else None
    models = corpus(wanted)
    if wanted:  # in the order asked for (small models first: a slow one last)
        models.sort(key=lambda m: wanted.index(m.name))
    for m in models:
        for plat in args.platforms.split(","):
            with tempfile.TemporaryDirectory(prefix="mf-bench-wm-") as tmp:
                try:
                    rows.append(cell(m, plat, args.cohorts, Path(tmp)))
                except Exception as e:  # one model's crash is its row, not the bench's end
                    rows.append({"model": m.name, "platform": plat, "base": "crashed",
                                 "base_s": 0.0, "error": f"{type(e).__name__}: {e}"[:120]})
            print(table(rows[-1:], args.cohorts).splitlines()[-1], flush=True)
    print(table(rows, args.cohorts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
