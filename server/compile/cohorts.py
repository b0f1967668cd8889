"""Per-cohort watermarked copies of a gated artifact (issue 23; docs/security.md).

A version with `watermark: {cohorts: N}` gets, for each ONNX, Core ML .mlpackage or QNN
artifact, N copies: copy c's weights carry cohort c's keyed fingerprint (server/watermark.py),
embedded in the dtype each weight really has after conversion and quantization. Every copy
passes two checks before it is packed, else the outcome fails naming the cohort:

- the watermark's own cost: each output of the copy against the unmarked artifact's, on the
  reference inputs, PSNR ≥ `MIN_PSNR_DB` (the seed's 60 dB; peak = max |unmarked output|;
  measured on a 1M-weight MLP: 68 dB as FP16 Core ML, 75 dB as FP32 ONNX);
- the version's numeric gate on the copy (the same call the unmarked one got) — except that
  an FP32 artifact's faithful SNR floor (80 dB, there to catch a broken compile, which the
  unmarked artifact has passed) is the watermark's 60 dB for its copies: their FP32 weights
  move by FP16 steps on purpose, so that an FP16 conversion cannot wash the mark out.

The strength (how many FP16 steps a marked float weight moves): `wm.strength_for` the marked
weights — what scores z ≈ 12 after 1% weight noise — capped by the outputs. Cohort 0 is the
probe: when its PSNR is under `MIN_PSNR_DB` + `PSNR_MARGIN_DB` the strength drops by the
excess (PSNR falls by 20·log10 of the strength) and cohort 0 is made again, down to 1 (the
scheme before strengths). A copy still under `MIN_PSNR_DB` at strength 1, or failing the
numeric gate, is made again weaker: at strength 1 a copy first gets a
per-tensor plan (mark_plan.py: the tensors the outputs cannot afford left unmarked, which
ppocr-det needs: 53 dB marked alike), then marks only a share (1/2, 1/4, …: 3 dB each) of
the marked positions (a subset chosen by the key alone, whatever the cohort's signs). The
other cohorts start where cohort 0 ended (the cost varies by a few dB between cohorts, so
each may still step down in strength; one that needs a thinner share or the plan makes
every cohort again at it, below). The gate record holds the weakest
strength and share any cohort got, and `noise_z`: the z the copies are expected to score
after 1% weight noise (`wm.noise_z`; ≥ 10 — 3 σ over the 7.05 that names one of 64 cohorts
— is robust). Without reference outputs to measure (a target not runnable here) the
strength stays 1.

Every cohort of a build marks the same weights — one plan and one share (the mask's subsets
are the same draws for every cohort): a later cohort that needs a thinner share or the plan
makes every cohort again at it. identify scores only the positions a mark moved, read off
one cohort's copy (server/services/watermarks.py), and a QNN binary's reader needs them all
alike. (Before, ONNX and Core ML cohorts each kept their own: ppocr-rec's cohort 0 marked 45
tensors its later cohorts' plan left alone, and scoring those diluted a noisy copy's z.)

A QNN artifact's weights are compiled into its context binary, so its copies are not
re-marked files but the HTP's source graph marked in the HTP's precision and compiled again
(server/compile/qnn_marks.py): one HTP compile per cohort, each gated like the others. The
QNN plan compiles each tensor's mark alone.

The key is the release's (server/watermark.release_key), never the server's secret: this
runs inside the compile sandbox.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from server import watermark as wm
from server.compile import mark_plan, qnn_marks, weights
from server.compile.compilers.base import Compiler
from server.compile.gates.numeric import thresholds_for
from server.compile.gates.verdict import Reference, numeric_gate
from server.compile.packing import PackedArtifact, pack
from server.compile.types import CompiledArtifact, CompileRequest, Precision

MIN_PSNR_DB = 60.0
PSNR_MARGIN_DB = 4.0  # kept over MIN_PSNR_DB by cohort 0, so the other cohorts pass too
THINNEST = 2  # a share keeps ≥ 2× min_marked weights: z ≥ 10 as shipped (7.05 names one)
MARKED_FORMATS = ("onnx", "mlpackage", "onnx-epcontext")
Log = Callable[[str], None]


@dataclass(frozen=True)
class WatermarkSpec:
    """What a build needs to mark: the number of cohorts and the release's key."""

    cohorts: int
    key: bytes

    def to_dict(self) -> dict[str, Any]:
        return {"cohorts": self.cohorts, "key": self.key.hex()}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> WatermarkSpec:
        return cls(int(raw["cohorts"]), bytes.fromhex(str(raw["key"])))


@dataclass
class CohortResult:
    packed: list[PackedArtifact]
    gate: dict[str, Any]
    error: str = ""


def output_psnr_db(unmarked: list[Any], marked: list[Any]) -> float:
    """The lowest PSNR over outputs and samples (peak: max |unmarked output|)."""
    worst = math.inf
    for u_sample, m_sample in zip(unmarked, marked, strict=True):
        for u, m in zip(u_sample, m_sample, strict=True):
            worst = min(worst, wm.psnr_db(np.asarray(u, dtype=np.float64).reshape(-1),
                                          np.asarray(m, dtype=np.float64).reshape(-1)))
    return worst


def mark_copy(src: Path, dest: Path, key: bytes, cohort: int, strength: int = 1,
              share: float = 1.0, share_of: Callable[[str], float] = mark_plan.everything
              ) -> Path:
    """A copy of the artifact `src` (file or .mlpackage directory) at `dest`, marked; tensor
    t on `share` × `share_of(t)` of its marked positions (0: left as it is)."""
    if dest.exists():
        shutil.rmtree(dest) if dest.is_dir() else dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dest)
    else:
        shutil.copyfile(src, dest)

    def change(name: str, values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        part = share * share_of(name)
        return wm.embed(values, key, cohort, strength, name=name, share=part) if part > 0 \
            else values

    weights.rewrite(dest, change)
    return dest


def min_marked(cohorts: int) -> int:
    """The fewest marked weights whose exact copy can score the z that names one of
    `cohorts` cohorts (z = √marked at best; N·exp(−z²/2) ≤ the bound)."""
    return math.ceil(2 * math.log(cohorts / wm.MAX_FALSE_POSITIVE))


def marked_per_tensor(art: CompiledArtifact, graph: Path | None, probe: Path,
                      spec: WatermarkSpec) -> dict[str, int]:
    """How many weights cohort 0's mark moves in each tensor of `art` (of the HTP's source
    `graph` for a QNN artifact), from a marked probe copy."""
    if graph is not None:
        if not graph.is_file():
            return {}
        src, copy = graph, probe / "graph.onnx"
        qnn_marks.mark_graph(src, copy, spec.key, 0, art.precision)
    else:
        src, copy = art.path, mark_copy(art.path, probe / art.path.name, spec.key, 0)
    try:
        before = {t.name: t.values for t in weights.read(src)}
        moved = {t.name: mark_plan.changed(before[t.name], t.values)
                 for t in weights.read(copy) if t.name in before}
        return {n: k for n, k in moved.items() if k}
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def build_cohorts(compiler: Compiler, art: CompiledArtifact, request: CompileRequest,
                  ref: Reference, pdir: Path, spec: WatermarkSpec, log: Log) -> CohortResult:
    """The N marked, gated and packed copies of `art` (or the first failure)."""
    fmt = art.target.format
    if fmt not in MARKED_FORMATS:
        why = (f"{fmt} artifacts are not marked: their weights are compiled for the target "
               "and cannot be read back (docs/security.md)")
        return CohortResult([], {"status": "not_supported", "reason": why})
    graph = Path(str(art.extra.get("htp_graph", ""))) if fmt == qnn_marks.EPCONTEXT_FORMAT \
        else None
    per_tensor = marked_per_tensor(art, graph, pdir / "cohorts" / "probe", spec)
    moved, needed = sum(per_tensor.values()), min_marked(spec.cohorts)
    if moved < needed:
        why = (f"the mark moves {moved} weight(s) of this artifact, fewer than the {needed} "
               f"that naming one of {spec.cohorts} cohorts at a false-positive probability "
               f"≤ {wm.MAX_FALSE_POSITIVE:g} needs even as shipped (FP16/FP32 and 8-bit "
               "weights are marked; sub-byte and palettized ones, and INT4 QNN builds, not)")
        return CohortResult([], {"status": "not_supported", "reason": why,
                                 "marked_weights": moved})
    unmarked = compiler.run(art, ref.feeds) if ref.outputs is not None and \
        art.runnable_here else None
    worst_psnr, packed = math.inf, list[PackedArtifact]()
    strength = wm.strength_for(moved) if unmarked is not None else 1
    marks: list[tuple[int, float]] = []  # each packed cohort's (strength, share)
    tag = f"[{art.target.variant}/{art.target.platform}]"
    start_share = 1.0
    c, k, share = 0, strength, start_share
    plan: mark_plan.MarkPlan | None = None  # per-tensor shares, once thinning alike is due
    plan_tried = replanned = False
    base = moved  # the weights marked at share 1 (fewer under a plan)

    def qnn_probe(_: Path, dest: Path, share_of: Callable[[str], float]) -> Path:
        """Cohort 0's mark on the `share_of` tensors of the HTP's graph, compiled."""
        assert graph is not None
        qnn_marks.mark_graph(graph, dest.parent / "graph.onnx", spec.key, 0, art.precision,
                             1, 1.0, share_of)
        return qnn_marks.compile_cohort(art, dest.parent / "graph.onnx", dest).path

    def planned(proposal: tuple[int, float] | None) -> tuple[int, float] | None:
        """In place of the first thinning at strength 1: the per-tensor plan (mark_plan.py;
        for QNN each tensor's mark compiled alone), when it still names the cohort with
        room; else `proposal`."""
        nonlocal plan, base, plan_tried, replanned
        if plan_tried or unmarked is None or proposal is None \
                or proposal[0] != 1 or k != 1 or proposal[1] >= share:
            return proposal
        plan_tried = True
        made = mark_plan.plan(
            compiler, art, ref.feeds, unmarked, spec.key, pdir / "cohorts" / "plan",
            MIN_PSNR_DB + PSNR_MARGIN_DB,
            (lambda src, dest, share_of: mark_copy(src, dest, spec.key, 0, 1, 1.0, share_of))
            if graph is None else qnn_probe, log,
            None if graph is None else per_tensor)
        if made.marked < THINNEST * min_marked(spec.cohorts):
            log(f"{tag} mark plan: the outputs afford {made.marked} marked weight(s), too "
                "few to name a cohort; thinning every tensor alike")
            return proposal
        log(f"{tag} mark plan: {made.marked} of {moved} marked weights, "
            f"{len(made.unmarked)} tensor(s) left unmarked (the most costly: "
            f"{', '.join(made.unmarked[:3]) or 'none'})")
        plan, base, replanned = made, made.marked, True
        return 1, 1.0

    def start_over(weaker: tuple[int, float] | None) -> bool:
        """A cohort after the probe that needs a thinner share or a new plan: every
        cohort must be on the same positions (identify scores the positions a mark moved,
        read off one cohort; a QNN binary's reader needs them all), so all start again at
        it (the packed ones are dropped)."""
        nonlocal c, k, share, strength, start_share, worst_psnr, packed, marks, replanned
        fresh, replanned = replanned, False
        if c == 0 or weaker is None or (weaker[1] >= share and not fresh):
            return False
        log(f"{tag} cohort {c} needs share {weaker[1]:g}; every cohort is made again at it "
            "(they must all mark the same weights)")
        c, (k, share) = 0, weaker
        strength, start_share = weaker
        worst_psnr, packed, marks = math.inf, [], []
        return True

    while c < spec.cohorts:
        try:
            marked = _cohort_artifact(art, graph, pdir / "cohorts" / str(c), spec, c, k, share,
                                      plan.share_of if plan else mark_plan.everything)
        except Exception as e:  # the cohort's failure, named, not the worker's crash
            return CohortResult([], _gate(spec, worst_psnr, "failed", marks),
                                f"cohort {c}'s copy could not be made: {str(e)[:300]}")
        copy = marked.path
        if unmarked is not None:
            psnr = output_psnr_db(unmarked, compiler.run(marked, ref.feeds))
            retry = planned(_retry(k, share, psnr, c == 0, base * share, spec.cohorts))
            if start_over(retry):
                shutil.rmtree(copy.parent)
                continue
            if retry is not None:
                log(f"{tag} cohort {c}'s watermark at strength {k}, share {share:g} costs "
                    f"the outputs {psnr:.1f} dB PSNR; trying strength {retry[0]}, share "
                    f"{retry[1]:g}")
                k, share = retry
                if c == 0:  # the probe: where every other cohort starts
                    strength, start_share = k, share
                shutil.rmtree(copy.parent)
                continue
            worst_psnr = min(worst_psnr, psnr)
            if psnr < MIN_PSNR_DB:
                return CohortResult([], _gate(spec, worst_psnr, "failed", marks),
                                    f"cohort {c}'s watermark moves the outputs too much "
                                    f"(PSNR {psnr:.1f} dB < {MIN_PSNR_DB:.0f} dB, even at "
                                    f"strength {k} on {share:g} of the marked weights)")
        num = numeric_gate(compiler, marked, _marked_request(request), ref, pdir.parent)
        halved = planned(_halved(k, share, base * share, spec.cohorts)) \
            if num.status == "failed" else None
        if start_over(halved):
            shutil.rmtree(copy.parent)
            continue
        if num.status == "failed" and halved is not None:
            log(f"{tag} cohort {c}'s artifact at strength {k}, share {share:g} failed the "
                f"numeric gate ({num.reason[:120]}); trying strength {halved[0]}, share "
                f"{halved[1]:g}")
            k, share = halved
            if c == 0:
                strength, start_share = k, share
            shutil.rmtree(copy.parent)
            continue
        if num.status == "failed":
            return CohortResult([], _gate(spec, worst_psnr, "failed", marks),
                                f"cohort {c}'s artifact failed the numeric gate: {num.reason}")
        packed.append(pack(copy, pdir / "packed-cohorts" / str(c)))
        shutil.rmtree(copy.parent)  # packed; the unpacked copy is no longer needed
        marks.append((k, share))
        c, k, share = c + 1, strength, start_share
    status = "passed" if unmarked is not None else "not_run"
    gate = _gate(spec, worst_psnr, status, marks)
    log(f"{tag} {spec.cohorts} watermarked cohort artifacts {status} at strength "
        f"{gate['strength']}" + (f", lowest output PSNR {worst_psnr:.1f} dB"
                                 if unmarked is not None else ""))
    floats = art.precision is not Precision.INT8  # INT8 marks are integer steps, not k
    noise = min(wm.noise_z(moved, k, share * base / moved) for k, share in marks)
    return CohortResult(packed, {**gate, "marked_weights": moved,
                                 "noise_z": round(noise, 1) if floats else None,
                                 **({"plan": plan.summary()} if plan and base != moved
                                    else {})})


def _retry(strength: int, share: float, psnr: float, probe: bool, marked: float,
           cohorts: int) -> tuple[int, float] | None:
    """A weaker (strength, share) for a cohort whose copy costs the outputs `psnr`, or None
    to keep it: under `MIN_PSNR_DB` (the probe, cohort 0: under it + `PSNR_MARGIN_DB`) the
    strength drops by the excess; at strength 1 a copy marks fewer weights — halved once per
    3 dB of the excess — while they still name the cohort as shipped with room (`THINNEST`
    × `min_marked`) (a cohort after the probe that needs it: `start_over`)."""
    if not psnr < MIN_PSNR_DB + (PSNR_MARGIN_DB if probe else 0):
        return None
    if strength > 1:
        return _weaker(strength, psnr), share
    if psnr < MIN_PSNR_DB:  # the outputs' error power falls with the share: 3 dB a halving
        excess = min(MIN_PSNR_DB + PSNR_MARGIN_DB - psnr, 100.0)  # -inf: as far as it goes
        return _halved(strength, share, marked, cohorts,
                       math.ceil(excess / (10 * math.log10(2))))
    return None


def _halved(strength: int, share: float, marked: float, cohorts: int, times: int = 1
            ) -> tuple[int, float] | None:
    """Half the strength, or at strength 1 the share halved `times` times (or as often as
    the marked weights still name the cohort with room: `THINNEST` × `min_marked`; see `_retry`);
    None: no weaker mark names the cohort."""
    if strength > 1:
        return strength // 2, share
    room = math.floor(math.log2(max(marked, 1) / (THINNEST * min_marked(cohorts))))
    if room < 1:
        return None
    return 1, share / 2 ** max(1, min(times, room))


def _weaker(strength: int, psnr: float) -> int:
    """The strength whose PSNR keeps `PSNR_MARGIN_DB` over the gate's, from `psnr` at
    `strength` (the outputs' error grows in proportion to the strength); below `strength`."""
    excess = MIN_PSNR_DB + PSNR_MARGIN_DB - psnr
    return max(1, min(strength - 1, math.floor(strength * 10 ** (-excess / 20))))


def _cohort_artifact(art: CompiledArtifact, graph: Path | None, where: Path,
                     spec: WatermarkSpec, c: int, strength: int, share: float,
                     share_of: Callable[[str], float]) -> CompiledArtifact:
    """Cohort c's copy of `art`: the artifact re-marked, or — for a QNN artifact — the HTP's
    source `graph` marked and compiled again (qnn_marks.py)."""
    if graph is None:
        return replace(art, path=mark_copy(art.path, where / art.path.name, spec.key, c,
                                           strength, share, share_of))
    qnn_marks.mark_graph(graph, where / "graph.onnx", spec.key, c, art.precision, strength,
                         share, share_of)
    return qnn_marks.compile_cohort(art, where / "graph.onnx", where / art.path.name)


def _marked_request(request: CompileRequest) -> CompileRequest:
    numeric = dict(request.settings.get("numeric") or {})
    fp32 = dict(numeric.get(Precision.FP32.value) or {})
    floor = thresholds_for(Precision.FP32, request.settings).min_snr_db
    fp32["min_snr_db"] = min(floor, MIN_PSNR_DB)
    numeric[Precision.FP32.value] = fp32
    return replace(request, settings={**request.settings, "numeric": numeric})


def _gate(spec: WatermarkSpec, worst_psnr: float, status: str,
          marks: list[tuple[int, float]]) -> dict[str, Any]:
    """The watermark gate's record; `strength`/`share`: the weakest any cohort got."""
    return {"status": status, "cohorts": spec.cohorts, "min_psnr_db": MIN_PSNR_DB,
            "strength": min((k for k, _ in marks), default=None),
            "share": min((s for _, s in marks), default=None),
            "lowest_output_psnr_db": None if math.isinf(worst_psnr) else round(worst_psnr, 2)}
