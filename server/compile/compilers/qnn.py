"""`qnn` platform: offline onnxruntime-qnn → EPContext ONNX with an embedded HTP context binary.

Settings (`settings["qnn"]`):
- `targets`: list of {"soc_model": "57", "htp_arch": "75", "name": "SM8650"}; one artifact per
  target (a context binary is built for one HTP generation). Default: SM8650 / v75.
- `precision`: unset (default: int8 when the version has calibration data, else fp16),
  "int8" (requires calibration data; weights 8-bit, activations per `activation_bits`),
  "w8a8", "w8a16", "w4a16" (INT4 weights, 16-bit activations; HTP v73 and later), "fp16",
  or "auto" (the precision search picks per target: server/compile/precision_search.py).
  Weights are quantized per output channel (Conv, Gemm; MatMul weights per column, signed:
  server/compile/qdq_prep.py); "w8a8-pt" and "w8a16-pt" quantize every weight per tensor,
  for graphs whose per-channel weights the HTP does not claim.
- `activation_bits`: 16 (default, "w8a16": the HTP's usual accuracy/speed trade-off) or 8
  for the QDQ activations of `precision: int8`.
- `keep_float_nodes`: ONNX node names kept at higher precision (mixed precision): at 16-bit
  weights where the HTP runs them (v73 and later, 16-bit activations; a Conv, MatMul or
  Gemm: qdq_prep.weights_at_16_bits), else left out of the quantization (onnxruntime's
  `nodes_to_exclude`: they run on dequantized values).
- `quantizer`: which backend makes the QDQ graph (server/compile/quantizers/): "ort"
  (default, onnxruntime's QNN QDQ flow) or, where the worker has AIMET, "aimet" (min-max
  PTQ), "aimet-adaround", "aimet-seqmse". The compile and the gates downstream are the same.
- `min_htp_share`: unset (default) fails the build when any node would run on the CPU;
  a number in (0, 1] accepts a partial offload when at least that share of the graph's
  nodes runs on the HTP (the rest runs on the device's CPU EP, named in the report).
- `fp32_nodes`: ONNX node names kept at FP32 on the device's CPU EP inside the same artifact
  (precision islands, FP16 builds only: server/compile/qnn_islands.py). Set by the pipeline
  when the HTP's FP16 loses the model at a node (server/compile/precision_islands.py), or by
  the version. The islands' nodes are not judged by `min_htp_share` (they are not nodes the
  HTP lacks); the build keeps at least `ISLAND_MIN_HTP_SHARE` of the nodes on the HTP.

Before compiling, the HTP probe (`server/compile/htp_support.py`) asks onnxruntime-qnn which
nodes the HTP takes; nodes it rejects that have an equivalent form the HTP runs are rewritten
(`server/compile/qnn_prep.py`: bool GatherND, Erf, Gelu, Trilu, matrix-product Einsum) and
probed again. Nodes still left on the CPU are named (op type, node name, why — for an Einsum,
what its equation does that a matrix product does not) with the HTP share of nodes and MACs.

INT8 quantizes with the version's calibration inputs only — never with made-up data; without
them the build compiles FP16 on the HTP and the report says INT8 needs calibration inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from server.compile.compilers.base import (
    Feeds,
    Outputs,
    ensure_onnx,
    int_setting,
    settings_for,
)
from server.compile.errors import (
    CalibrationError,
    CompilerUnavailableError,
    ConversionError,
    InvalidSourceError,
)
from server.compile.gates.layers import tapped
from server.compile.htp_child import ChildSession
from server.compile.htp_plan import htp_graph_path, plan_htp
from server.compile.htp_support import HtpAssignment
from server.compile.qnn_runtime import open_session, qnn_version
from server.compile.quantizers.base import QdqScheme, Quantizer
from server.compile.types import CompiledArtifact, CompileRequest, Precision, Target

DEFAULT_TARGETS = [{"name": "SM8650", "soc_model": "57", "htp_arch": "75"}]
NEEDS_CALIBRATION = ("INT8 needs calibration inputs: upload a calibration .npz with the version "
                     "to get an INT8 build; compiled FP16 on the HTP instead")


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over already-validated samples."""

    def __init__(self, samples: list[dict[str, Any]]) -> None:
        self._samples = samples
        self._it = iter(samples)

    def get_next(self) -> dict[str, Any] | None:
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = iter(self._samples)


# precision -> (weight bits, activation bits) of the QDQ scheme
QDQ_SCHEMES = {"w8a8": (8, 8), "w8a16": (8, 16), "w4a16": (4, 16),
               "w8a8-pt": (8, 8), "w8a16-pt": (8, 16)}
# Schemes with per-tensor weights: for a graph whose per-channel weight DequantizeLinear the
# HTP does not fold into its Conv and leaves to the CPU (server/compile/qdq_prep.py removes
# the known cause, biases shared through Identity; per tensor the HTP runs any of them).
PER_TENSOR = ("w8a8-pt", "w8a16-pt")
# INT4 weights on the HTP start with this generation (QNN SDK: 4-bit weights on v73+).
INT4_MIN_ARCH = 73
# FP16 arithmetic on the HTP starts with v69 (SM8450); v68 (SM8350, SA8295) runs only
# fixed point, so the precision search gives such a target a quantized artifact.
FP16_MIN_ARCH = 69
# A precision island may take at most this share of the graph's nodes off the HTP (why:
# docs/compile.md, "Precision islands"); a version's min_htp_share replaces it.
ISLAND_MIN_HTP_SHARE = 0.9


def quantize_qdq(src: Path, out: Path, calibration: list[dict[str, Any]],
                 activation_bits: int, per_channel: bool = True, weight_bits: int = 8,
                 keep_float: tuple[str, ...] = (), htp_arch: int = 0) -> Path:
    """The QDQ graph, written to `out`; the `keep_float` nodes get 16-bit weights rather
    than none where the HTP of `htp_arch` runs them (qdq_prep.weights_at_16_bits)."""
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import (
        get_qnn_qdq_config,
        qnn_preprocess_model,
    )

    from server.compile import qdq_prep

    prepared, prepped = qdq_prep.quantizer_inputs(out)
    src = qdq_prep.prepare(src, prepared, per_channel)
    # Fuses Erf sequences into Gelu (and similar): the HTP has no quantized Erf, and QDQ
    # pairs inserted between the pieces would otherwise block QNN's own fusion.
    model = prepped if qnn_preprocess_model(str(src), str(prepped)) else src
    act = QuantType.QUInt16 if activation_bits == 16 else QuantType.QUInt8
    # 4-bit weights symmetric, as the HTP takes them (QInt4 with a zero offset).
    weight = QuantType.QInt4 if weight_bits == 4 else QuantType.QUInt8
    kept = qdq_prep.fused_names(model, keep_float)
    wide: dict[str, list[dict[str, Any]]] = {}
    widened: set[str] = set()
    if activation_bits == 16 and per_channel and htp_arch >= qdq_prep.WIDE_WEIGHTS_MIN_ARCH:
        wide, widened = qdq_prep.weights_at_16_bits(model, set(kept), QuantType.QInt16)
    keep = tuple(dict.fromkeys([*(k for k in kept if k not in widened),
                                *qdq_prep.attention_mask_nodes(model)]))
    signed = QuantType.QInt4 if weight_bits == 4 else QuantType.QInt8
    overrides = qdq_prep.gather_tables_at_8_bits(model, QuantType.QUInt8, set(keep))
    if per_channel:
        overrides |= qdq_prep.matmul_weights_per_channel(model, signed, set(kept))
    overrides |= wide
    cfg = get_qnn_qdq_config(str(model), _Reader(calibration), activation_type=act,
                             weight_type=weight, per_channel=per_channel,
                             init_overrides=overrides or None,
                             nodes_to_exclude=list(keep) or None)
    quantize(str(model), str(out), cfg)
    return out


def targets_of(opts: dict[str, object]) -> list[dict[str, str]]:
    """The SoCs to build for, as `settings_map` wrote them (name, soc_model, htp_arch)."""
    targets = opts.get("targets") or DEFAULT_TARGETS
    if not isinstance(targets, list) or not all(isinstance(t, dict) for t in targets):
        raise InvalidSourceError("qnn targets must be a list of {soc_model, htp_arch} blocks")
    return [{str(k): str(v) for k, v in t.items()} for t in targets]


class QnnCompiler:
    platform = "qnn"

    def __init__(self, quantizers: Mapping[str, Quantizer] | None = None) -> None:
        # The QDQ backends a version may pick with `quantizer` (compilers/registry.py gives
        # them); without any, onnxruntime's flow (`quantize_qdq`) is the only one.
        self._quantizers = dict(quantizers or {})

    def compile(self, request: CompileRequest, workdir: Path) -> list[CompiledArtifact]:
        from server.compile.quiet import quiet
        from server.compile.source import load_samples

        opts = settings_for(request, "qnn")
        wanted = str(opts.get("precision", "default"))
        if wanted == "auto":
            raise InvalidSourceError("qnn precision auto is resolved by the pipeline's "
                                     "precision search, not by the compiler")
        if wanted not in ("default", "int8", "fp16", *QDQ_SCHEMES):
            raise InvalidSourceError("qnn precision must be auto, int8, w8a8, w8a16, w4a16, "
                                     "w8a8-pt, w8a16-pt or fp16")
        act_bits = int_setting(opts, "activation_bits", 16)
        if act_bits not in (8, 16):
            raise InvalidSourceError("qnn activation_bits must be 8 or 16")
        weight_bits, act_bits = QDQ_SCHEMES.get(wanted, (8, act_bits))
        per_channel = wanted not in PER_TENSOR
        if wanted not in ("default", "fp16") and request.calibration_path is None:
            raise CalibrationError(NEEDS_CALIBRATION.split(":")[0] + ": this version has none")
        min_share = min_htp_share(opts.get("min_htp_share"))
        keep_float = _names(opts.get("keep_float_nodes"))
        fp32_nodes = _names(opts.get("fp32_nodes"), "fp32_nodes")
        backend = str(opts.get("quantizer", "ort"))
        quantizer = self._quantizer(  # checked before anything slow runs
            backend, needed=request.calibration_path is not None and wanted != "fp16")
        notes: list[str] = []
        src = ensure_onnx(request, workdir)
        refuse_wide_int64(src)
        if weight_bits == 4:
            _refuse_int4_before_v73(opts)
        if request.calibration_path is not None and wanted != "fp16":
            samples = load_samples(request.calibration_path, request.inputs,
                                   request.shape_variant)
            scheme = QdqScheme(weight_bits, act_bits, per_channel=per_channel,
                               keep_float=keep_float,
                               htp_arch=min(int(t["htp_arch"]) for t in targets_of(opts)))
            if quantizer is None:
                with quiet():
                    model = quantize_qdq(src, workdir / "model.qdq.onnx", samples, act_bits,
                                         per_channel=per_channel, weight_bits=weight_bits,
                                         keep_float=keep_float, htp_arch=scheme.htp_arch)
            else:
                model = quantizer.quantize(src, workdir / "model.qdq.onnx", samples, scheme)
            precision = Precision.INT8
            if backend != "ort":
                notes.append(f"quantized by {backend}")
            notes.append(f"QDQ-quantized ({'int4' if weight_bits == 4 else 'uint8'} weights "
                         f"per {'channel' if per_channel else 'tensor'}, "
                         f"uint{act_bits} activations) with {len(samples)} calibration samples"
                         + _kept_note(model, keep_float))
        else:
            model, precision = src, Precision.FP16
            if wanted != "fp16":
                notes.append(NEEDS_CALIBRATION)
        if fp32_nodes and precision is not Precision.FP16:
            raise InvalidSourceError("qnn fp32_nodes (precision islands) applies to FP16 "
                                     "builds; this one is INT8 (use keep_float_nodes there)")
        artifacts = []
        for t in targets_of(opts):
            soc, arch = str(t["soc_model"]), str(t["htp_arch"])
            name = str(t.get("name", f"soc{soc}"))
            label = f"w{weight_bits}a{act_bits}" if precision is Precision.INT8 else "fp16"
            if precision is Precision.INT8 and not per_channel:
                label += "-pt"
            if weight_bits == 8 and act_bits == 8 and wanted in ("int8", "default"):
                label = "int8"  # the name this scheme has always had
            if keep_float:
                label += f"-keep{len(keep_float)}"
            variant = f"{label}-{name.lower()}"
            if request.shape_variant != "default":
                variant = f"{request.shape_variant}-{variant}"
            out = workdir / f"model.{name.lower()}.ctx.onnx"
            # Keep the graph-boundary Quantize/Dequantize on the HTP too (onnxruntime-qnn
            # otherwise leaves them to the CPU EP).
            provider = {"soc_model": soc, "htp_arch": arch, "offload_graph_io_quantization": "0"}
            if precision is Precision.FP16:
                provider["enable_htp_fp16_precision"] = "1"
            where = f"{name} (soc_model {soc}, v{arch})"
            if fp32_nodes:
                assignment, rewrites = _with_islands(model, fp32_nodes, provider, out,
                                                     workdir, name, min_share, where)
                variant = f"{variant}-fp32x{len(fp32_nodes)}"
            else:
                assignment, rewrites = plan_htp(model, provider, out, workdir, name)
            compiled = htp_graph_path(workdir, name) if rewrites else model
            target_notes = [*notes, *rewrites]
            lacking = _lacking(assignment)
            if lacking.cpu_nodes:
                _accept_partial(lacking, min_share, where)
                target_notes.append(f"partial offload accepted (min_htp_share {min_share}): "
                                    + lacking.summary())
            artifacts.append(CompiledArtifact(
                path=out,
                target=Target(platform="qnn", variant=variant, format="onnx-epcontext",
                              soc=name, arch=f"v{arch}", runtime="onnxruntime-qnn",
                              runtime_version=qnn_version()),
                precision=precision,
                compile_settings={"precision": precision.value, "soc_model": soc,
                                  "htp_arch": arch, "activation_bits": act_bits,
                                  **({"weight_bits": weight_bits,
                                      "weight_granularity": "channel" if per_channel
                                      else "tensor"}
                                     if precision is Precision.INT8 else {}),
                                  **({"keep_float_nodes": ",".join(keep_float)}
                                     if keep_float else {}),
                                  **({"quantizer": backend}
                                     if precision is Precision.INT8 and backend != "ort"
                                     else {}),
                                  **({"fp32_nodes": ",".join(fp32_nodes)} if fp32_nodes
                                     else {}),
                                  # The device allows the CPU EP for exactly these artifacts
                                  # (client_sdk/backends.py).
                                  **({"cpu_nodes": len(assignment.cpu_nodes)}
                                     if assignment.cpu_nodes else {}),
                                  "context_embed_mode": 1},
                notes=target_notes,
                extra={"provider_options": provider,
                       # The numeric gate's INT8 yardstick: this graph on the CPU provider.
                       **({"qdq_model": str(model)} if precision is Precision.INT8 else {}),
                       # The graph the context binary was compiled from (layer diagnostics;
                       # an island artifact is several context binaries: none).
                       **({"htp_graph": str(compiled)} if not fp32_nodes else
                          {"fp32_nodes": list(fp32_nodes)}),
                       "htp": {**assignment.to_dict(), "rewritten": rewrites},
                       "cpu_fallback": bool(assignment.cpu_nodes)},
            ))
        return artifacts

    def _quantizer(self, name: str, needed: bool) -> Quantizer | None:
        """The backend named by the `quantizer` setting (None: the built-in onnxruntime
        flow); one that cannot run here fails the build only when it would be `needed`."""
        backend = self._quantizers.get(name)
        if backend is None and name != "ort":
            raise InvalidSourceError(f"qnn quantizer must be one of "
                                     f"{', '.join(sorted({'ort', *self._quantizers}))}, "
                                     f"not {name!r}")
        why = backend.unavailable() if backend is not None and needed else ""
        if why:
            raise CompilerUnavailableError(f"qnn quantizer {name}: {why}")
        return backend

    def run(self, artifact: CompiledArtifact, feeds: Feeds) -> Outputs:
        """Runs the EPContext model on the HTP backend (emulated on x86)."""
        import numpy as np

        sess = open_session(artifact.path,
                            provider_options=artifact.extra.get("provider_options"),
                            allow_cpu_fallback=bool(artifact.extra.get("cpu_fallback")))
        return [[np.asarray(o) for o in sess.run(None, f)] for f in feeds]

    def intermediates(self, artifact: CompiledArtifact) -> tuple[Path, Any] | None:
        """(the graph the artifact was compiled from, an opener of HTP sessions on that graph
        with extra outputs): the context binary itself exposes no intermediate tensors, so
        the layer walk compiles the same graph on the same HTP with them as outputs."""
        graph = artifact.extra.get("htp_graph")
        if not graph or not Path(str(graph)).is_file():
            return None
        workdir = artifact.path.parent

        def opener(model: Any) -> Any:
            import onnx

            path = workdir / "layers.htp.onnx"
            onnx.save(model, str(path))
            # In a child bounded in CPU seconds: the HTP's prepare of a graph does not
            # always end (htp_child.py).
            return ChildSession(path, provider_options=artifact.extra.get("provider_options"),
                                allow_cpu_fallback=True)
        # Quantized units stay whole: their outputs are read through taps (htp_child.py).
        return Path(str(graph)), tapped(opener)


def _kept_note(qdq: Path, keep_float: tuple[str, ...]) -> str:
    """What became of the `keep_float` nodes, read from the QDQ graph itself."""
    from server.compile import qdq_prep

    if not keep_float:
        return ""
    wide = qdq_prep.sixteen_bit_weight_readers(qdq)
    at16 = [k for k in keep_float if wide & set(qdq_prep.fused_names(qdq, (k,)))]
    left = [k for k in keep_float if k not in at16]
    return "".join([f"; kept at 16-bit weights: {', '.join(at16)}" if at16 else "",
                    f"; kept unquantized: {', '.join(left)}" if left else ""])


def _names(value: object, key: str = "keep_float_nodes") -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else (value or [])
    if not isinstance(items, list | tuple):
        raise InvalidSourceError(f"qnn {key} must be a list of ONNX node names")
    return tuple(str(v).strip() for v in items if str(v).strip())


ISLAND_WHY = "precision island"  # the prefix of an island node's `why` (qnn_islands.py)


def _lacking(assignment: HtpAssignment) -> HtpAssignment:
    """The split with only the nodes the HTP lacks named (not the precision islands)."""
    from dataclasses import replace

    return replace(assignment, cpu_nodes=[n for n in assignment.cpu_nodes
                                          if not n.why.startswith(ISLAND_WHY)])


def _with_islands(model: Path, fp32_nodes: tuple[str, ...], provider: dict[str, str],
                  out: Path, workdir: Path, name: str, min_share: float | None, where: str
                  ) -> tuple[HtpAssignment, list[str]]:
    from server.compile.qnn_islands import compile_with_islands

    try:
        assignment, notes = compile_with_islands(model, list(fp32_nodes), provider, out,
                                                 workdir, name)
    except (InvalidSourceError, ConversionError):
        raise
    except Exception as e:
        raise ConversionError(f"QNN HTP compile with precision islands for {where} failed: "
                              f"{str(e)[:600]}") from e
    floor = ISLAND_MIN_HTP_SHARE if min_share is None else min_share
    if assignment.node_share < floor:
        raise ConversionError(
            f"QNN HTP for {where}: the precision island ({', '.join(fp32_nodes[:6])}) leaves "
            f"only {100 * assignment.node_share:.1f}% of nodes on the HTP, below "
            f"{floor} ({'min_htp_share' if min_share is not None else 'the island default'}"
            f"): {assignment.summary()}. Set min_htp_share lower to accept it, or change the "
            "model where FP16 loses it.", list(dict.fromkeys(n.op for n in assignment.cpu_nodes)),
            [n.to_dict() for n in assignment.cpu_nodes])
    return assignment, notes


def _refuse_int4_before_v73(opts: dict[str, object]) -> None:
    old = [t for t in targets_of(opts) if int(t["htp_arch"]) < INT4_MIN_ARCH]
    if old:
        named = ", ".join(f"{t.get('name', t['soc_model'])} (v{t['htp_arch']})" for t in old)
        raise InvalidSourceError(
            f"qnn precision w4a16 needs HTP v{INT4_MIN_ARCH} or later (INT4 weights); {named} "
            "is older. Use w8a16 for those targets, or precision auto to pick per target.")


def refuse_wide_int64(model: Path) -> None:
    """Fails naming each int64 constant the HTP's 32-bit integers cannot hold."""
    import onnx

    from server.compile.qnn_prep import int64_out_of_int32_range

    wide = int64_out_of_int32_range(onnx.load(str(model)))
    if wide:
        named = "; ".join(f"{c} (input of {op} node {n!r})" for c, n, op in wide[:8])
        raise ConversionError(
            f"int64 constant(s) outside the int32 range, which the HTP computes in 32 bits: "
            f"{named}. Export with values that fit in int32 (e.g. a finite mask value), or "
            "exclude the qnn platform.", list(dict.fromkeys(op for _, _, op in wide)),
            [{"op": op, "node": n, "why": f"int64 constant {c} outside int32"}
             for c, n, op in wide])


def min_htp_share(value: object) -> float | None:
    if value is None or value == "":
        return None
    try:
        share = float(str(value))
    except ValueError:
        share = -1.0
    if not 0.0 < share <= 1.0:
        raise InvalidSourceError(f"qnn min_htp_share must be a number in (0, 1], not {value!r}")
    return share


def _accept_partial(assignment: HtpAssignment, min_share: float | None, target: str) -> None:
    nodes = [n.to_dict() for n in assignment.cpu_nodes]
    ops = list(dict.fromkeys(n.op for n in assignment.cpu_nodes))
    if min_share is None:
        raise ConversionError(
            f"QNN HTP for {target}: {assignment.summary()}. These would run on the CPU. "
            "Remove or replace those operators in the exported graph, or accept a partial "
            "offload with the qnn setting min_htp_share (e.g. 0.95).", ops, nodes)
    if assignment.node_share < min_share:
        raise ConversionError(
            f"QNN HTP for {target}: only {100 * assignment.node_share:.1f}% of nodes on the "
            f"HTP, below min_htp_share {min_share}: {assignment.summary()}", ops, nodes)
