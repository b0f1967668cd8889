"""`qnn` platform: offline onnxruntime-qnn → EPContext ONNX with an embedded HTP context binary.

Settings (`settings["qnn"]`):
- `targets`: list of {"soc_model": "57", "htp_arch": "75", "name": "SM8650"}; one artifact per
  target (a context binary is built for one HTP generation). Default: SM8650 / v75.
- `precision`: "auto" (default: int8 when the version has calibration data, else fp16),
  "int8" (requires calibration data) or "fp16".
- `activation_bits`: 16 (default, "w8a16": the HTP's usual accuracy/speed trade-off) or 8
  for the QDQ activations; weights are always 8-bit.

INT8 quantizes with the version's calibration inputs only — never with made-up data; without
them the build compiles FP16 on the HTP and the report says INT8 needs calibration inputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from server.compile.compilers.base import (
    Feeds,
    Outputs,
    ensure_onnx,
    int_setting,
    settings_for,
)
from server.compile.errors import CalibrationError, ConversionError, InvalidSourceError
from server.compile.qnn_runtime import qnn_version, session
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


def quantize_qdq(src: Path, out: Path, calibration: list[dict[str, Any]],
                 activation_bits: int, per_channel: bool = True) -> Path:
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import (
        get_qnn_qdq_config,
        qnn_preprocess_model,
    )

    # Fuses Erf sequences into Gelu (and similar): the HTP has no quantized Erf, and QDQ
    # pairs inserted between the pieces would otherwise block QNN's own fusion.
    prepped = out.with_name(out.stem + ".prep.onnx")
    model = prepped if qnn_preprocess_model(str(src), str(prepped)) else src
    act = QuantType.QUInt16 if activation_bits == 16 else QuantType.QUInt8
    cfg = get_qnn_qdq_config(str(model), _Reader(calibration), activation_type=act,
                             weight_type=QuantType.QUInt8, per_channel=per_channel)
    quantize(str(model), str(out), cfg)
    return out


def _targets(opts: dict[str, object]) -> list[dict[str, str]]:
    """The SoCs to build for, as `settings_map` wrote them (name, soc_model, htp_arch)."""
    targets = opts.get("targets") or DEFAULT_TARGETS
    if not isinstance(targets, list) or not all(isinstance(t, dict) for t in targets):
        raise InvalidSourceError("qnn targets must be a list of {soc_model, htp_arch} blocks")
    return [{str(k): str(v) for k, v in t.items()} for t in targets]


class QnnCompiler:
    platform = "qnn"

    def compile(self, request: CompileRequest, workdir: Path) -> list[CompiledArtifact]:
        from server.compile.source import load_samples, quiet

        opts = settings_for(request, "qnn")
        wanted = str(opts.get("precision", "auto"))
        if wanted not in ("auto", "int8", "fp16"):
            raise InvalidSourceError("qnn precision must be auto, int8 or fp16")
        act_bits = int_setting(opts, "activation_bits", 16)
        if act_bits not in (8, 16):
            raise InvalidSourceError("qnn activation_bits must be 8 or 16")
        if wanted == "int8" and request.calibration_path is None:
            raise CalibrationError(NEEDS_CALIBRATION.split(":")[0] + ": this version has none")
        notes: list[str] = []
        src = ensure_onnx(request, workdir)
        if request.calibration_path is not None and wanted != "fp16":
            samples = load_samples(request.calibration_path, request.inputs)
            with quiet():
                model = quantize_qdq(src, workdir / "model.qdq.onnx", samples, act_bits)
            precision = Precision.INT8
            notes.append(f"QDQ-quantized (uint8 weights, uint{act_bits} activations) with "
                         f"{len(samples)} calibration samples")
        else:
            model, precision = src, Precision.FP16
            if wanted != "fp16":
                notes.append(NEEDS_CALIBRATION)
        artifacts = []
        for t in _targets(opts):
            soc, arch = str(t["soc_model"]), str(t["htp_arch"])
            name = str(t.get("name", f"soc{soc}"))
            label = "int8" if precision is Precision.INT8 and act_bits == 8 else \
                ("w8a16" if precision is Precision.INT8 else "fp16")
            variant = f"{label}-{name.lower()}"
            if request.shape_variant != "default":
                variant = f"{request.shape_variant}-{variant}"
            out = workdir / f"model.{name.lower()}.ctx.onnx"
            provider = {"soc_model": soc, "htp_arch": arch}
            if precision is Precision.FP16:
                provider["enable_htp_fp16_precision"] = "1"
            try:
                session(model, provider_options=provider, context_out=out)
            except Exception as e:
                raise ConversionError(
                    f"QNN HTP compile for {name} (soc_model {soc}, v{arch}) failed: "
                    f"{str(e)[:600]}. The operator gate passed, so an operator or data type "
                    "in the graph is not supported by this HTP; see the QNN EP operator list."
                ) from e
            artifacts.append(CompiledArtifact(
                path=out,
                target=Target(platform="qnn", variant=variant, format="onnx-epcontext",
                              soc=name, arch=f"v{arch}", runtime="onnxruntime-qnn",
                              runtime_version=qnn_version()),
                precision=precision,
                compile_settings={"precision": precision.value, "soc_model": soc,
                                  "htp_arch": arch, "activation_bits": act_bits,
                                  "context_embed_mode": 1},
                notes=list(notes),
                extra={"provider_options": provider},
            ))
        return artifacts

    def run(self, artifact: CompiledArtifact, feeds: Feeds) -> Outputs:
        """Runs the EPContext model on the HTP backend (emulated on x86)."""
        import numpy as np

        sess = session(artifact.path, provider_options=artifact.extra.get("provider_options"))
        return [[np.asarray(o) for o in sess.run(None, f)] for f in feeds]
