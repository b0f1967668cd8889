"""Builds one model version for every requested platform and shape variant, with gates.

For each shape variant: export the FP32 ONNX once (shared by the ONNX and QNN compilers and by
the operator gate; a dynamic ONNX upload is specialized to the variant's declared shapes here,
see shapes.py, so every gate and compiler judges the static graph), compute the source's FP32
reference outputs once, then per platform:
operator gate on that graph → compile → operator gate on the compiled graph (Core ML spec) →
numeric gate → deterministic packing. Each (platform, variant) yields one `BuildOutcome`;
a failure of one platform never hides the others. Only `TransientCompileError` escapes, so
the job layer can retry the whole build later.

A platform whose `precision` is "auto" is compiled by the precision search instead
(precision_search.py), once per target (each QNN SoC gets its own winner), under one budget
of compile seconds for the whole build; the winner goes through the same packing.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from server.compile import (
    fp32_default,
    precision_islands,
    precision_search,
    quantized_upload,
    target_precision,
)
from server.compile.cohorts import WatermarkSpec, build_cohorts
from server.compile.compilers.base import Compiler, settings_for
from server.compile.compilers.registry import default_compilers
from server.compile.dequantize import dequantize_file
from server.compile.errors import CompileError, ConversionError, TransientCompileError
from server.compile.gates import layerdiff
from server.compile.gates.numeric import NumericGateReport, compare
from server.compile.gates.operators import check_mlpackage, check_onnx, deny_list
from server.compile.gates.support import check_support
from server.compile.gates.verdict import Reference as _Reference
from server.compile.gates.verdict import failure_message, log_lines, numeric_gate
from server.compile.heap import frozen_heap
from server.compile.packing import PackedArtifact, pack
from server.compile.shapes import ShapeSpecializationError, specialize_file
from server.compile.source import export_onnx, load_samples, reference_outputs, run_onnx_cpu
from server.compile.types import CompiledArtifact, CompileRequest, InputSpec, SourceFormat

DEFAULT_PLATFORMS = ("onnx", "coreml", "qnn")
# Reference samples the numeric gate runs: emulated HTP takes ~10 s per 224×224 sample for a
# 20M-parameter net, so a version's reference set is cut to this many (setting overrides).
DEFAULT_NUMERIC_SAMPLES = 16
Log = Callable[[str], None]


def layer_diff_setting(settings: Mapping[str, Any]) -> str:
    """The setting `layer_diff`: "on" (default) or "off" (the per-layer diff runs the artifact
    once more per chunk of tensors; on QNN, one more HTP compile per 160 tensors)."""
    return str(settings.get("layer_diff", "on")).lower()


@dataclass(frozen=True)
class BuildSpec:
    source_path: Path
    source_format: SourceFormat
    # shape variant name -> static input specs, e.g. {"default": (InputSpec("x", (1, 3)),)}
    variants: Mapping[str, tuple[InputSpec, ...]]
    platforms: tuple[str, ...] = DEFAULT_PLATFORMS
    settings: dict[str, Any] = field(default_factory=dict)
    calibration_path: Path | None = None
    reference_path: Path | None = None
    # Per-cohort watermarked copies of every readable artifact (server/compile/cohorts.py).
    watermark: WatermarkSpec | None = None


@dataclass
class BuildOutcome:
    platform: str
    variant: str
    state: str  # "ready" | "failed"
    gates: dict[str, Any] = field(default_factory=dict)
    artifact: PackedArtifact | None = None
    target: dict[str, str] = field(default_factory=dict)
    format: str = ""
    precision: str = ""
    compile_settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error: str = ""
    compile_seconds: float = 0.0
    # The per-layer diff against the FP32 source (gates/layerdiff.py), capped; {} when off.
    layer_diff: dict[str, Any] = field(default_factory=dict)
    # A watermarked version's copies, cohort c at index c (the unmarked `artifact` beside).
    cohorts: list[PackedArtifact] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "platform": self.platform, "variant": self.variant, "state": self.state,
            "format": self.format, "precision": self.precision, "target": self.target,
            "compile_settings": self.compile_settings, "gates": self.gates,
            "notes": self.notes, "error": self.error,
            "compile_seconds": round(self.compile_seconds, 3),
            "layer_diff": self.layer_diff,
            "artifact": None if self.artifact is None else {
                "sha256": self.artifact.sha256, "length": self.artifact.length,
                "packing": self.artifact.packing},
            "cohorts": [{"sha256": c.sha256, "length": c.length, "packing": c.packing}
                        for c in self.cohorts],
        }


def _failed(platform: str, variant: str, error: str, gates: dict[str, Any]) -> BuildOutcome:
    return BuildOutcome(platform=platform, variant=variant, state="failed", gates=gates,
                        error=error)


class Pipeline:
    def __init__(self, compilers: Mapping[str, Callable[[], Compiler]] | None = None,
                 log: Log | None = None) -> None:
        self._factories = dict(compilers or default_compilers())
        self._log = log or (lambda _msg: None)

    def build(self, spec: BuildSpec, workdir: Path) -> list[BuildOutcome]:
        unknown = [p for p in spec.platforms if p not in self._factories]
        if unknown:
            raise CompileError(f"unknown platform(s) {unknown}; known: {sorted(self._factories)}")
        budget = precision_search.budget_of(spec.settings)
        outcomes: list[BuildOutcome] = []
        with frozen_heap():  # each ct.convert's gc.collect() skips the imported libraries
            for variant, inputs in spec.variants.items():
                vdir = workdir / variant
                vdir.mkdir(parents=True, exist_ok=True)
                outcomes.extend(self._build_variant(spec, variant, inputs, vdir, budget))
        return outcomes

    def _build_variant(self, spec: BuildSpec, variant: str, inputs: tuple[InputSpec, ...],
                       vdir: Path, budget: precision_search.Budget) -> list[BuildOutcome]:
        log = self._log
        log(f"[{variant}] exporting FP32 ONNX from {spec.source_format.value} source")
        shape_gate: dict[str, Any] = {}
        source, dequantized = spec.source_path, None
        try:
            if spec.source_format is SourceFormat.ONNX:
                onnx_path = vdir / "source.onnx"
                dequantized = dequantize_file(spec.source_path, vdir / "dequantized.onnx")
                if dequantized is not None:
                    source = vdir / "dequantized.onnx"
                    log(f"[{variant}] {dequantized.note()}")
                allowed = spec.settings.get("operator_gate", {}).get("allow", [])
                specialized = specialize_file(source, inputs, onnx_path,
                                              allow_ifs="If" in allowed)
                if specialized is not None:
                    shape_gate = {"passed": True, "fixed": specialized.fixed,
                                  "nodes_before": specialized.nodes_before,
                                  "nodes_after": specialized.nodes_after,
                                  "ifs_folded": specialized.ifs_folded,
                                  "ifs_selected": list(specialized.ifs_selected)}
                    log(f"[{variant}] {specialized.note()}")
            elif any(i.value is not None for i in inputs):
                raise CompileError(
                    f"input(s) {[i.name for i in inputs if i.value is not None]} declare a "
                    f"constant value, which only an ONNX upload binds; export the "
                    f"{spec.source_format.value} model with that value fixed instead")
            else:
                onnx_path = export_onnx(spec.source_path, spec.source_format, inputs,
                                        vdir / "source.onnx")
        except CompileError as e:
            log(f"[{variant}] source unusable: {e}")
            gates: dict[str, Any] = {}
            if isinstance(e, ShapeSpecializationError):
                gates["shapes"] = {"passed": False, "unfixed": [u.to_dict() for u in e.unfixed]}
            return [_failed(p, variant, str(e), gates) for p in spec.platforms]
        feeds, reference, ref_reason = self._reference(spec, inputs, variant, source)
        agreement: dict[str, Any] = {}
        if dequantized is not None:
            agreement = {"ops": dequantized.ops,
                         **_upload_agreement(spec.source_path, feeds, reference)}
            departs = _rewrite_departs(agreement)
            if departs:
                log(f"[{variant}] {departs}")
                return [_failed(p, variant, departs, {"dequantized": agreement})
                        for p in spec.platforms]
        outcomes = []
        for platform in spec.platforms:
            # Inputs bound to their declared value are constants of the graph, not inputs.
            request = CompileRequest(
                source_path=source, source_format=spec.source_format,
                inputs=tuple(i for i in inputs if i.value is None),
                shape_variant=variant, settings=spec.settings,
                calibration_path=spec.calibration_path, onnx_path=onnx_path,
                reference_path=spec.reference_path or spec.calibration_path,
                quantized_upload=spec.source_path if dequantized is not None else None,
                bound_inputs=tuple(i.name for i in inputs if i.value is not None))
            outcomes.extend(self._build_platform(platform, request, vdir / platform,
                                                 _Reference(feeds, reference, ref_reason),
                                                 budget, spec.watermark))
        if shape_gate:
            # The gates above judged the specialized graph; say so on every outcome.
            for o in outcomes:
                o.gates["shapes"] = shape_gate
                o.notes.insert(0, "dynamic ONNX specialized to the declared shapes"
                               if shape_gate["fixed"] else
                               "static ONNX folded at the declared shapes (If nodes with a "
                               "constant condition)")
        if dequantized is not None:
            for o in outcomes:
                o.gates["dequantized"] = agreement
                o.notes.insert(0, dequantized.note() + (
                    f" (the upload against its FP32 rewrite: {agreement['summary']})"
                    if "summary" in agreement else ""))
        return outcomes

    def _reference(self, spec: BuildSpec, inputs: tuple[InputSpec, ...], variant: str,
                   source: Path) -> tuple[list[Any], list[Any] | None, str]:
        # Reference inputs, else the calibration inputs (also real data); never invented ones.
        path = spec.reference_path or spec.calibration_path
        if path is None:
            return [], None, "not run: the version has no reference or calibration inputs"
        try:
            limit = int(spec.settings.get("numeric_samples", DEFAULT_NUMERIC_SAMPLES))
            feeds = load_samples(path, inputs, variant)[:max(limit, 1)]
            ref = reference_outputs(source, spec.source_format, inputs, feeds)
        except CompileError as e:
            return [], None, f"not run: reference inputs unusable: {e}"
        self._log(f"[{variant}] FP32 reference computed on {len(feeds)} sample(s) "
                  f"from {path.name}")
        return feeds, ref, ""

    def _build_platform(self, platform: str, request: CompileRequest, pdir: Path,
                        ref: _Reference, budget: precision_search.Budget,
                        watermark: WatermarkSpec | None = None) -> list[BuildOutcome]:
        log = self._log
        variant = request.shape_variant
        if pdir.exists():
            shutil.rmtree(pdir)
        pdir.mkdir(parents=True)
        assert request.onnx_path is not None
        gate = check_onnx(request.onnx_path, platform,
                          deny_list(platform, "onnx", request.settings))
        gates: dict[str, Any] = {"operators": [gate.to_dict()]}
        log(f"[{variant}/{platform}] {gate.summary()}")
        if not gate.passed:
            return [_failed(platform, variant, gate.summary(), gates)]
        try:
            support = check_support(request, platform)
        except TransientCompileError:
            raise
        except CompileError as e:
            return [_failed(platform, variant, str(e), gates)]
        if support is not None:
            gates["support"] = support.to_dict()
            log(f"[{variant}/{platform}] {support.summary()}; {support.advice}")
            if not support.passed:
                return [_failed(platform, variant, f"{support.summary()}. {support.advice}",
                                gates)]
        if platform == "onnx" and request.quantized_upload is not None:
            return self._quantized_upload(request, pdir, gates, ref, watermark)
        if settings_for(request, platform).get("precision") == "auto":
            return self._search(platform, request, pdir, gates, ref, budget, watermark)
        return self._as_set(platform, request, pdir, gates, ref, watermark)

    def _quantized_upload(self, request: CompileRequest, pdir: Path, gates: dict[str, Any],
                          ref: _Reference, watermark: WatermarkSpec | None
                          ) -> list[BuildOutcome]:
        """The onnx platform's build of a quantized upload: the upload's own int8 graph when
        it ships as it is and passes its gates, else the FP32 rewrite with a note saying why
        (quantized_upload.py)."""
        tag = f"[{request.shape_variant}/onnx]"
        try:
            why = quantized_upload.why_not(request, watermark is not None)
        except CompileError as e:
            return [_failed("onnx", request.shape_variant, str(e), gates)]
        if not why:
            started = time.monotonic()
            try:
                art = quantized_upload.compile_kept(request, pdir / "int8")
            except CompileError as e:
                why = str(e)
            else:
                art.target = replace(art.target, shape_variant=request.shape_variant)
                gate = check_onnx(art.path, "onnx", deny_list("onnx", "onnx", request.settings))
                self._log(f"{tag} the upload's int8 graph: {gate.summary()}")
                why = "" if gate.passed else f"the int8 graph: {gate.summary()}"
            if not why:
                kept = self._check_and_pack(
                    self._factories["onnx"](), art,
                    {**gates, "operators": [*gates["operators"], gate.to_dict()]}, ref,
                    request, pdir / "int8", time.monotonic() - started)
                if kept.state == "ready":
                    return [kept]
                why = f"the int8 graph failed its gates: {kept.error}"
        self._log(f"{tag} shipping the FP32 rewrite: {why}")
        outcomes = self._as_set("onnx", request, pdir, gates, ref, watermark)
        for o in outcomes:
            o.notes.append(f"the FP32 rewrite ships, not the upload's int8 graph: {why}")
        return outcomes

    def _as_set(self, platform: str, request: CompileRequest, pdir: Path,
                gates: dict[str, Any], ref: _Reference, watermark: WatermarkSpec | None
                ) -> list[BuildOutcome]:
        """The build at the precision the settings name; with none named, FP16 and — where
        FP16 loses the model — an FP32 package (fp32_default.py) or QNN precision islands."""
        outcomes = self._compile_and_check(platform, request, pdir, gates, ref, watermark)
        retry = fp32_default.retry_request(platform, request, outcomes)
        if retry is None:
            return self._islands(platform, request, pdir, gates, ref, watermark, outcomes)
        self._log(f"[{request.shape_variant}/{platform}] {fp32_default.why(outcomes[0])}; "
                  "building at FP32")
        again = self._compile_and_check(platform, retry, pdir / "fp32", gates, ref, watermark)
        return [fp32_default.chosen(outcomes[0], o) for o in again]

    def _islands(self, platform: str, request: CompileRequest, pdir: Path,
                 gates: dict[str, Any], ref: _Reference, watermark: WatermarkSpec | None,
                 outcomes: list[BuildOutcome]) -> list[BuildOutcome]:
        """QNN FP16 builds the HTP's FP16 loses at a node: that region again at FP32 on the
        CPU EP (precision_islands.py), one extra compile per region, at most MAX_ROUNDS."""
        if "fp32_nodes" in settings_for(request, platform) or not ref.feeds:
            return outcomes  # the version chose its islands itself
        names = {i.name for i in request.inputs}
        feeds = {k: v for k, v in ref.feeds[0].items() if k in names}
        islands: tuple[str, ...] = ()
        for k in range(precision_islands.MAX_ROUNDS):
            found = precision_islands.diagnose(platform, request, outcomes, islands, feeds)
            if found is None:
                return outcomes
            self._log(f"[{request.shape_variant}/{platform}] "
                      f"{precision_islands.why_island(found)}; building with that island")
            again = self._compile_and_check(platform, found.request, pdir / f"island{k}",
                                            gates, ref, watermark)
            outcomes = [precision_islands.chosen(outcomes[0], o, found) for o in again]
            islands = tuple(dict.fromkeys([*islands, *found.region]))
            request = found.request
            if all(o.state == "ready" for o in outcomes):
                break
        return outcomes

    def _compile_and_check(self, platform: str, request: CompileRequest, pdir: Path,
                           gates: dict[str, Any], ref: _Reference,
                           watermark: WatermarkSpec | None) -> list[BuildOutcome]:
        """Compile (one per precision the targets need), then gate and pack each artifact."""
        log = self._log
        variant = request.shape_variant
        pdir.mkdir(parents=True, exist_ok=True)
        gates = dict(gates)
        started = time.monotonic()
        try:
            compiler = self._factories[platform]()
            subs = target_precision.split(request) if platform == "qnn" else [request]
            artifacts = []
            for i, sub in enumerate(subs):  # one compile per precision the targets need
                sdir = pdir if len(subs) == 1 else pdir / f"precision{i}"
                sdir.mkdir(parents=True, exist_ok=True)
                artifacts += compiler.compile(sub, sdir)
            for a in artifacts:
                a.target = replace(a.target, shape_variant=variant)
        except TransientCompileError:
            raise
        except CompileError as e:
            log(f"[{variant}/{platform}] compile failed: {e}")
            if isinstance(e, ConversionError) and e.operators:
                gates["conversion"] = {"passed": False, "operators": e.operators,
                                       "nodes": e.nodes, "summary": str(e)}
            return [_failed(platform, variant, str(e), gates)]
        seconds = time.monotonic() - started
        log(f"[{variant}/{platform}] compiled {len(artifacts)} artifact(s) in {seconds:.2f}s")
        return [self._check_and_pack(compiler, a, dict(gates), ref, request, pdir,
                                     seconds / max(len(artifacts), 1), watermark=watermark)
                for a in artifacts]

    def _search(self, platform: str, request: CompileRequest, pdir: Path,
                gates: dict[str, Any], ref: _Reference, budget: precision_search.Budget,
                watermark: WatermarkSpec | None) -> list[BuildOutcome]:
        """The precision search, once per target (a QNN build names several SoCs)."""
        from server.compile.compilers.qnn import targets_of

        opts = settings_for(request, platform)
        targets = targets_of(opts) if platform == "qnn" else [None]
        outcomes = []
        for t in targets:
            req, tdir = request, pdir
            if t is not None:
                req = replace(request, settings={**request.settings,
                                                 platform: {**opts, "targets": [t]}})
                tdir = pdir / t.get("name", t["soc_model"]).lower()
            try:
                compiler = self._factories[platform]()
                found = precision_search.search(compiler, platform, req, ref, tdir, budget,
                                                self._log)
            except TransientCompileError:
                raise
            except CompileError as e:
                outcomes.append(_failed(platform, request.shape_variant, str(e), dict(gates)))
                continue
            here = {**gates, "precision_search": found.frontier}
            if found.artifact is None and found.frontier["tried"]:
                outcomes += self._default_after_search(platform, req, tdir, here, ref,
                                                       watermark, found)
                continue
            if found.artifact is None:
                outcomes.append(_failed(platform, request.shape_variant, found.error, here))
                continue
            found.artifact.target = replace(found.artifact.target,
                                            shape_variant=request.shape_variant)
            chosen = next(r for r in found.frontier["tried"]
                          if r["candidate"] == found.frontier["winner"]["candidate"])
            outcomes.append(self._check_and_pack(
                compiler, found.artifact, here, ref, req, tdir,
                float(chosen.get("compile_seconds", 0.0)), found.report, watermark))
        return outcomes

    def _default_after_search(self, platform: str, request: CompileRequest, pdir: Path,
                              gates: dict[str, Any], ref: _Reference,
                              watermark: WatermarkSpec | None,
                              found: precision_search.SearchResult) -> list[BuildOutcome]:
        """No candidate passed its gate: the float build the version gets with no precision
        set (`_as_set`: FP16, then an FP32 Core ML package or QNN precision islands where
        FP16 loses the model), so `auto` never fails where that default ships. Never the
        default's INT8 (a QNN build with calibration inputs): the search has just measured
        it against FP32 and turned it down; a target without FP16 (HTP v68) fails instead.
        Outside the search's budget: it is the build the version would have had anyway."""
        from server.compile.compilers.qnn import FP16_MIN_ARCH, targets_of

        opts = {k: v for k, v in settings_for(request, platform).items()
                if k not in precision_search.SEARCH_SETTINGS}
        if platform == "qnn":
            (target,) = targets_of(opts)
            if int(target.get("htp_arch", FP16_MIN_ARCH)) < FP16_MIN_ARCH:
                return [_failed(platform, request.shape_variant, found.error, gates)]
            opts["precision"] = "fp16"
        found.frontier["fallback"] = {"to": "the default float precision",
                                      "why": found.error[:900]}
        self._log(f"[{request.shape_variant}/{platform}] {found.error[:300]}; building at the "
                  "default float precision instead")
        plain = replace(request, settings={**request.settings, platform: opts})
        return self._as_set(platform, plain, pdir / "default", gates, ref, watermark)

    def _check_and_pack(self, compiler: Compiler, art: CompiledArtifact, gates: dict[str, Any],
                        ref: _Reference, request: CompileRequest, pdir: Path, seconds: float,
                        judged: NumericGateReport | None = None,
                        watermark: WatermarkSpec | None = None) -> BuildOutcome:
        """Operator gate on the compiled graph, numeric gate (`judged`: already run by the
        precision search, with the settings its candidate was built with), per-layer diff,
        watermarked cohort copies and packing."""
        log = self._log
        t = art.target
        tag = f"[{t.variant}/{t.platform}]"
        out = BuildOutcome(platform=t.platform, variant=t.variant, state="failed",
                           target=t.to_dict(), format=t.format, precision=art.precision.value,
                           compile_settings=dict(art.compile_settings), notes=list(art.notes),
                           compile_seconds=seconds)
        ok = True
        if "htp" in art.extra:
            gates["htp"] = art.extra["htp"]
        if art.path.is_dir() and art.path.suffix == ".mlpackage":
            mil = check_mlpackage(art.path, t.platform, deny_list(t.platform, "mil"))
            gates["operators"] = [*gates["operators"], mil.to_dict()]
            log(f"{tag} {mil.summary()}")
            ok = mil.passed
            if not ok:
                out.error = mil.summary()
        num = judged or numeric_gate(compiler, art, request, ref, pdir.parent)
        gates["numeric"] = num.to_dict()
        log(f"{tag} numeric gate {num.status}" + (f": {num.reason}" if num.reason else ""))
        for line in log_lines(num):
            log(f"{tag} {line}")
        wanted = layer_diff_setting(request.settings)
        if wanted not in ("on", "off"):
            out.layer_diff = {"unavailable": f"the setting layer_diff must be on or off, not "
                                             f"{wanted[:40]!r}"}
        elif wanted == "on" and ref.outputs is not None and request.onnx_path is not None:
            out.layer_diff = layerdiff.for_artifact(compiler, art, request.onnx_path,
                                                    ref.feeds[0])
            first = out.layer_diff.get("first_below")
            if first:
                log(f"{tag} per-layer diff vs FP32: first layer below the "
                    f"{art.precision.value.upper()} thresholds is {first['op']} node "
                    f"{first['node']!r} (cosine {first['cosine']}, SNR {first['snr_db']} dB)")
        if num.status == "failed":
            ok = False
            out.error = out.error or failure_message(num, art, t.platform)
        out.gates = gates
        if ok and watermark is not None:
            started = time.monotonic()
            marked = build_cohorts(compiler, art, request, ref, pdir, watermark, log)
            gates["watermark"] = {**marked.gate,
                                  "seconds": round(time.monotonic() - started, 3)}
            out.cohorts = marked.packed
            if marked.error:
                ok, out.error = False, marked.error
                log(f"{tag} {marked.error}")
        if ok:
            out.artifact = pack(art.path, pdir / "packed" / t.variant)
            out.state = "ready"
            log(f"{tag} packed {out.artifact.length} bytes sha256={out.artifact.sha256[:16]}…")
        return out


def _upload_agreement(upload: Path, feeds: list[dict[str, Any]],
                      reference: list[list[Any]] | None) -> dict[str, Any]:
    """How far the upload itself (its run-time activation rounding, on onnxruntime) is from
    its FP32 rewrite on the reference inputs: what the devices gain back, reported."""
    if reference is None or not feeds:
        return {"upload_vs_fp32": [], "reason": "not measured: no reference inputs"}
    rows = [m.row() for m in compare(reference, run_onnx_cpu(upload, feeds), 5, False)]
    summary = ", ".join(f"output {r['output']}: cosine {_fmt(r['cosine'], '.6f')}, SNR "
                        f"{_fmt(r['snr_db'], '.1f')} dB" for r in rows)
    return {"upload_vs_fp32": rows, "summary": summary}


# A quantized upload's own rounding keeps it near its FP32 rewrite (int8 models: cosine
# 0.98–0.9996 in the outside set); far below, the rewrite computes something else (a dropped
# fused ReLU read -0.05), and building from it would ship another model.
REWRITE_MIN_COSINE = 0.9


def _rewrite_departs(agreement: dict[str, Any]) -> str:
    """Why the FP32 rewrite of a quantized upload cannot stand for it, or ""."""
    far = [r for r in agreement.get("upload_vs_fp32", [])
           if not isinstance(r["cosine"], float) or r["cosine"] < REWRITE_MIN_COSINE]
    if not far:
        return ""
    return ("the FP32 rewrite of this quantized upload departs from the upload itself on the "
            f"reference inputs ({agreement['summary']}; at least cosine "
            f"{REWRITE_MIN_COSINE} is expected of an int8 model's own rounding), so it does "
            "not compute what the upload does and nothing is built from it. Upload the FP32 "
            "model it was quantized from, and report the model: the rewrite "
            "(server/compile/dequantize.py) misses one of its constructs")


def _fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, float) else str(value)
