"""`coreml` platform: coremltools → `.mlpackage` ML Program (for the Neural Engine).

Settings (`settings["coreml"]`): `precision` fp16 (default) | fp32, `minimum_deployment_target`
(e.g. "iOS17", default), `weight_compression` none (default) | int8 | palettize4 | palettize6 |
palettize8, `weight_threshold` (weights with fewer elements stay uncompressed; default 2048),
`palettize_mode` uniform (default) | kmeans (needs scikit-learn on the worker).
Torch uploads convert directly; ONNX uploads go ONNX → torch (onnx2torch) → torch.export →
coremltools, and a graph that cannot make that trip fails with the operator
named and the advice to upload a torch ExportedProgram.

Compiling to `.mlmodelc` and running predictions needs macOS (Core ML framework). On macOS
`run` predicts with Core ML; elsewhere it executes the package's MIL program (the exact
program and weights the device gets) with the numpy reference executor
(server/compile/milexec), and the numeric gate report names that basis as its runner.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from server.compile.compilers.base import Feeds, Outputs, int_setting, settings_for
from server.compile.errors import CompilerUnavailableError, ConversionError, InvalidSourceError
from server.compile.quiet import quiet
from server.compile.source import load_exported_program
from server.compile.types import (
    CompiledArtifact,
    CompileRequest,
    Precision,
    SourceFormat,
    Target,
)

CORE_ML_RUNNER = "Core ML (macOS)"
EXECUTOR_NOTE = ("numerics by the MIL reference executor (numpy), not by Core ML itself: Core ML "
                 "executes only on macOS; the executor runs this package's MIL program and "
                 "weights op by op at the program's precision (docs/compile.md)")


def numeric_runner(precision: Precision) -> str:
    """What the numeric gate ran the package with on this machine."""
    if sys.platform == "darwin":
        return CORE_ML_RUNNER
    return f"mil reference executor (numpy, {precision.value})"


_COMPRESSIONS = ("none", "int8", "palettize4", "palettize6", "palettize8")


def _check_conversion(module: Any, request: CompileRequest) -> dict[str, Any] | None:
    """Core ML cannot run on Linux, so at least prove the ONNX → torch step kept the numbers:
    the torch module against onnxruntime on up to 4 real samples, at FP32 thresholds."""
    import torch

    from server.compile.gates import numeric
    from server.compile.source import load_samples, run_onnx_cpu

    if request.reference_path is None:
        return None
    feeds = load_samples(request.reference_path, request.inputs, request.shape_variant)[:4]
    expected = run_onnx_cpu(request.onnx_path or request.source_path, feeds)
    got = []
    with torch.no_grad():
        for f in feeds:
            try:
                res = module(*(torch.from_numpy(np.ascontiguousarray(f[s.name]))
                               for s in request.inputs))
            except Exception as e:
                raise ConversionError(
                    f"the ONNX → torch module (for Core ML) fails on the reference inputs: "
                    f"{type(e).__name__}: {str(e)[:300]}. Upload the model as a torch "
                    "ExportedProgram to compile it for Core ML.") from e
            flat = res if isinstance(res, (tuple, list)) else (res,)
            got.append([t.detach().numpy() for t in flat])
    t = numeric.thresholds_for(Precision.FP32)
    report = numeric.evaluate(numeric.compare(expected, got, t.topk), Precision.FP32, t,
                              len(feeds), runner="onnx2torch vs onnxruntime").to_dict()
    report["gate"] = "conversion"
    if not report["passed"]:
        raise ConversionError(
            f"ONNX → torch conversion (for Core ML) changed the outputs: {report['reason']}. "
            "Upload the model as a torch ExportedProgram to compile it for Core ML.")
    return report


def _program_from_onnx(request: CompileRequest) -> tuple[Any, dict[str, Any] | None]:
    """ONNX → torch module → ExportedProgram, or a traced TorchScript module when export
    trips on onnx2torch's value-dependent shape ops (tracing bakes those in as constants,
    which is exact for the static shapes we compile for)."""
    import torch

    from server.compile.onnx_to_torch import onnx_to_torch
    from server.compile.source import example_inputs

    module = onnx_to_torch(request.onnx_path or request.source_path)
    check = _check_conversion(module, request)
    args = tuple(torch.from_numpy(a) for a in example_inputs(request.inputs).values())
    try:
        with quiet():
            return torch.export.export(module, args), check
    except Exception as export_error:
        try:
            with quiet(), torch.no_grad():
                # torch.jit.trace has no annotations (torch 2.13)
                traced = torch.jit.trace(  # type: ignore[no-untyped-call]
                    module, args, check_trace=False)
                return traced, check
        except Exception as e:
            raise ConversionError(
                f"the onnx2torch module can be neither exported ({export_error}) nor traced "
                f"({type(e).__name__}: {e}). Upload the model as a torch ExportedProgram to "
                "compile it for Core ML.") from e


def _fill_pool_defaults(program: Any) -> Any:
    """torch.export drops pooling arguments left at their defaults (stride = kernel,
    padding 0); coremltools' converters index them positionally, so write them back."""
    import torch

    aten = torch.ops.aten
    pools = {aten.max_pool2d.default, aten.max_pool2d_with_indices.default,
             aten.avg_pool2d.default, aten.max_pool1d.default, aten.avg_pool1d.default}
    changed = False
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target in pools and len(node.args) == 2:
            node.args = (*node.args, node.args[1])
            changed = True
    if changed:
        program.graph_module.recompile()
    return program


def _tensor_type(ct: Any, spec: Any) -> Any:
    """An input as Core ML takes it: integer inputs (token ids) as int32 — left to
    coremltools they become float16 in an FP16 program, and ids above 2048 lose their low
    bits (2677 arrives as 2676)."""
    if str(spec.dtype).startswith(("int", "uint")):
        return ct.TensorType(name=spec.name, shape=spec.shape, dtype=np.int32)
    return ct.TensorType(name=spec.name, shape=spec.shape)


def _unsupported_op(err: Exception) -> list[str]:
    text = str(err)
    marker = "Unsupported fx node "
    for key in (marker, "op '", "Op \""):
        if key in text:
            rest = text.split(key, 1)[1]
            return [rest.replace('"', "'").split("'")[0].split(",")[0].strip()]
    return []


class CoreMLCompiler:
    platform = "coreml"

    def compile(self, request: CompileRequest, workdir: Path) -> list[CompiledArtifact]:
        import coremltools as ct
        import torch

        opts = settings_for(request, "coreml")
        precision = Precision(str(opts.get("precision", "fp16")))
        if precision not in (Precision.FP16, Precision.FP32):
            raise InvalidSourceError("coreml precision must be fp16 or fp32")
        target_name = str(opts.get("minimum_deployment_target", "iOS17"))
        try:
            target = getattr(ct.target, target_name)
        except AttributeError:
            raise InvalidSourceError(
                f"unknown Core ML deployment target {target_name!r}; use e.g. iOS16, iOS17, "
                "macOS14") from None
        compression = str(opts.get("weight_compression", "none"))
        # Weights with fewer elements stay uncompressed (coremltools' default: 2048).
        threshold = int_setting(opts, "weight_threshold", 2048)
        palette_mode = str(opts.get("palettize_mode", "uniform"))
        if palette_mode not in ("uniform", "kmeans"):
            raise InvalidSourceError("palettize_mode must be uniform or kmeans")
        if compression not in _COMPRESSIONS:
            raise InvalidSourceError(f"weight_compression must be one of {_COMPRESSIONS}")

        check = None
        if request.source_format is SourceFormat.ONNX:
            program, check = _program_from_onnx(request)
        else:
            program = load_exported_program(request.source_path, request.source_format,
                                            request.inputs)
        try:
            with quiet():
                if isinstance(program, torch.export.ExportedProgram):
                    # The core ATen set: coremltools has no converter for many non-core ops
                    # (new_ones, max_pool2d without indices, …) that export keeps.
                    program = _fill_pool_defaults(program.run_decompositions())
                mlmodel = ct.convert(
                    program, convert_to="mlprogram", minimum_deployment_target=target,
                    compute_precision=(ct.precision.FLOAT16 if precision is Precision.FP16
                                       else ct.precision.FLOAT32),
                    inputs=[_tensor_type(ct, s) for s in request.inputs],
                )
                mlmodel = _compress(mlmodel, compression, threshold, palette_mode)
        except (ConversionError, InvalidSourceError):
            raise
        except ImportError as e:  # e.g. kmeans palettization needs scikit-learn
            raise CompilerUnavailableError(
                f"Core ML compression needs a package this worker lacks: {e}") from e
        except Exception as e:
            ops = _unsupported_op(e)
            named = f" (operator {ops[0]})" if ops else ""
            raise ConversionError(
                f"coremltools could not convert the graph{named}: {type(e).__name__}: "
                f"{str(e)[:500]}. Upload a torch ExportedProgram without that operator, or "
                "exclude the coreml platform for this model.", ops) from e
        out = workdir / "model.mlpackage"
        mlmodel.save(str(out))
        stabilize_manifest(out)
        variant = precision.value if compression == "none" else f"{precision.value}-{compression}"
        if request.shape_variant != "default":
            variant = f"{request.shape_variant}-{variant}"
        return [CompiledArtifact(
            path=out,
            target=Target(platform="coreml", variant=variant, format="mlpackage",
                          runtime="coreml", runtime_version=target_name),
            precision=precision,
            compile_settings={"precision": precision.value, "minimum_deployment_target":
                              target_name, "weight_compression": compression,
                              "weight_threshold": threshold,
                              **({"palettize_mode": palette_mode}
                                 if compression.startswith("palettize") else {}),
                              "coremltools": ct.__version__},
            notes=[] if sys.platform == "darwin" else [EXECUTOR_NOTE],
            extra={"numeric_runner": numeric_runner(precision),
                   **({"conversion_check": check} if check else {})},
        )]

    def run(self, artifact: CompiledArtifact, feeds: Feeds) -> Outputs:
        import coremltools as ct

        if sys.platform != "darwin":
            from server.compile.milexec import MilExecutor

            ex = MilExecutor(artifact.path)
            return [[np.asarray(out[n], np.float32) if out[n].dtype == np.float16 else out[n]
                     for n in ex.output_names] for out in (ex.run(f) for f in feeds)]
        model = ct.models.MLModel(str(artifact.path))
        names = [o.name for o in model.get_spec().description.output]
        outs = []
        for f in feeds:
            pred = model.predict({k: np.asarray(v) for k, v in f.items()})
            outs.append([np.asarray(pred[n]) for n in names])
        return outs


def stabilize_manifest(package: Path) -> None:
    """Replaces the random item UUIDs coremltools writes into Manifest.json with ones derived
    from each item's path, so converting the same model twice gives identical bytes (and the
    packed archive an identical sha256). Core ML only uses them to look items up."""
    import json
    import uuid

    manifest = package / "Manifest.json"
    data = json.loads(manifest.read_text(encoding="utf-8"))
    entries = data.get("itemInfoEntries", {})
    mapping = {old: str(uuid.uuid5(uuid.NAMESPACE_URL, f"modelfleet:{info.get('path', old)}"))
               .upper() for old, info in entries.items()}
    data["itemInfoEntries"] = {mapping[k]: v for k, v in sorted(
        entries.items(), key=lambda kv: mapping[kv[0]])}
    root = data.get("rootModelIdentifier")
    if root in mapping:
        data["rootModelIdentifier"] = mapping[root]
    tmp = manifest.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=4, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(manifest)


def _compress(mlmodel: Any, compression: str, threshold: int, palette_mode: str) -> Any:
    if compression == "none":
        return mlmodel
    from coremltools.optimize import coreml as cto

    if compression == "int8":
        cfg = cto.OptimizationConfig(global_config=cto.OpLinearQuantizerConfig(
            mode="linear_symmetric", dtype="int8", weight_threshold=threshold))
        return cto.linear_quantize_weights(mlmodel, config=cfg)
    nbits = int(compression.removeprefix("palettize"))
    cfg = cto.OptimizationConfig(global_config=cto.OpPalettizerConfig(
        mode=palette_mode, nbits=nbits, weight_threshold=threshold))
    return cto.palettize_weights(mlmodel, config=cfg)
