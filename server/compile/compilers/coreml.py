"""`coreml` platform: coremltools → `.mlpackage` ML Program (for the Neural Engine).

Settings (`settings["coreml"]`): `precision` fp16 (default; the pipeline builds again at fp32
when FP16 itself loses the model, server/compile/fp32_default.py) | fp32 (| auto: the
precision search, server/compile/precision_search.py), `minimum_deployment_target` (e.g. "iOS17",
default), `weight_compression` none (default) | int8 | int8-block<N> | int4-block<N> |
palettize<B> (coreml_quant.py; block-wise and INT4 need iOS18), `weight_threshold` (weights
with fewer elements stay uncompressed; default 2048), `palettize_mode` uniform (default) |
kmeans (needs scikit-learn on the worker), `keep_ops` (MIL op names whose weights stay
uncompressed: mixed precision). A package with compressed weights has precision INT8 (its
weights are 8 bits or fewer): the numeric gate judges it against the FP32 source with the
INT8 thresholds, since no ONNX graph emulates Core ML's weight-only quantization.
Torch uploads convert with coremltools' torch frontend; ONNX uploads are translated to a MIL
program directly (server/compile/onnx_mil: one rule per ONNX operator, no torch detour), and a
node without a rule fails naming the node, its operator and opset.

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

from server.compile.compilers import coreml_quant
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


def _program_from_onnx(request: CompileRequest, target: Any) -> Any:
    """The ONNX graph translated to a MIL program directly (server/compile/onnx_mil): one
    rule per ONNX operator, shape arithmetic folded at the declared static shapes."""
    from server.compile.onnx_mil import program_from_onnx

    return program_from_onnx(request.onnx_path or request.source_path, request.inputs, target)


def contiguous_placeholders(program: Any) -> Any:
    """Gives every user input of an ExportedProgram a contiguous example layout.

    coremltools refuses a placeholder whose example tensor has a non-contiguous dim order
    ("Core ML does not have general support for non-contiguous dim order", naming nothing);
    such a layout is only how the example was strided at export (e.g. a permuted view). Core
    ML feeds are dense arrays, so the values the graph computes are the same."""
    import torch

    for node in program.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(val, torch.Tensor) and val.dim_order() != tuple(range(val.dim())):
            mode = getattr(val, "fake_mode", None)
            with mode if mode is not None else torch.no_grad():
                node.meta["val"] = torch.empty(val.shape, dtype=val.dtype, device=val.device)
    return program


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

    def __init__(self) -> None:
        # The last conversion, by what it depends on: the precision search compresses one
        # converted model several ways (coremltools' compression leaves its input intact).
        self._converted: tuple[tuple[Any, ...], Any] | None = None

    def _convert(self, request: CompileRequest, target: Any, precision: Precision) -> Any:
        import coremltools as ct
        import torch

        key = (request.source_path, request.source_format, request.shape_variant,
               request.inputs, request.onnx_path, precision, target)
        if self._converted is not None and self._converted[0] == key:
            return self._converted[1]
        onnx_source = request.source_format is SourceFormat.ONNX
        if onnx_source:
            program = _program_from_onnx(request, target)
        else:
            program = load_exported_program(request.source_path, request.source_format,
                                            request.inputs)
        kwargs: dict[str, Any] = {}
        if isinstance(program, torch.export.ExportedProgram):
            # The core ATen set: coremltools has no converter for many non-core ops
            # (new_ones, max_pool2d without indices, …) that export keeps.
            program = contiguous_placeholders(
                _fill_pool_defaults(program.run_decompositions()))
        if not onnx_source:  # a MIL program from ONNX already has typed inputs
            kwargs["inputs"] = [_tensor_type(ct, s) for s in request.inputs]
        mlmodel = ct.convert(
            program, convert_to="mlprogram", minimum_deployment_target=target,
            compute_precision=(ct.precision.FLOAT16 if precision is Precision.FP16
                               else ct.precision.FLOAT32), **kwargs)
        self._converted = (key, mlmodel)
        return mlmodel

    def compile(self, request: CompileRequest, workdir: Path) -> list[CompiledArtifact]:
        import coremltools as ct

        opts = settings_for(request, "coreml")
        wanted = str(opts.get("precision", "fp16"))
        if wanted == "auto":
            raise InvalidSourceError("coreml precision auto is resolved by the pipeline's "
                                     "precision search, not by the compiler")
        if wanted not in (Precision.FP16.value, Precision.FP32.value):
            raise InvalidSourceError("coreml precision must be fp16, fp32 or auto")
        precision = Precision(wanted)
        if precision not in (Precision.FP16, Precision.FP32):
            raise InvalidSourceError("coreml precision must be fp16 or fp32")
        target_name = str(opts.get("minimum_deployment_target", "iOS17"))
        try:
            target = getattr(ct.target, target_name)
        except AttributeError:
            raise InvalidSourceError(
                f"unknown Core ML deployment target {target_name!r}; use e.g. iOS16, iOS17, "
                "macOS14") from None
        compression = coreml_quant.parse(str(opts.get("weight_compression", "none")))
        keep_ops = keep_ops_of(opts)
        # Weights with fewer elements stay uncompressed (coremltools' default: 2048).
        threshold = int_setting(opts, "weight_threshold", 2048)
        palette_mode = str(opts.get("palettize_mode", "uniform"))
        if palette_mode not in ("uniform", "kmeans"):
            raise InvalidSourceError("palettize_mode must be uniform or kmeans")

        onnx_source = request.source_format is SourceFormat.ONNX
        if target < ct.target.iOS15:
            raise InvalidSourceError(f"Core ML ML Programs need iOS15 / macOS12 or newer, not "
                                     f"{target_name}")
        coreml_quant.check_target(compression, target_name, target)
        try:
            with quiet():
                mlmodel = coreml_quant.compress(self._convert(request, target, precision),
                                                compression, threshold, palette_mode, keep_ops)
        except (ConversionError, InvalidSourceError):
            raise
        except ImportError as e:  # e.g. kmeans palettization needs scikit-learn
            raise CompilerUnavailableError(
                f"Core ML compression needs a package this worker lacks: {e}") from e
        except Exception as e:
            ops = _unsupported_op(e)
            named = f" (operator {ops[0]})" if ops else ""
            what = ("re-export the ONNX graph without that operator" if onnx_source else
                    "re-export the torch program without that operator")
            raise ConversionError(
                f"coremltools could not convert the graph{named}: {type(e).__name__}: "
                f"{str(e)[:500]}. To compile for Core ML, {what}, or exclude the coreml "
                "platform for this model.", ops) from e
        out = workdir / "model.mlpackage"
        mlmodel.save(str(out))
        stabilize_manifest(out)
        scheme = compression.scheme
        variant = precision.value if scheme == "none" else f"{precision.value}-{scheme}"
        if keep_ops:
            variant += f"-keep{len(keep_ops)}"
        if request.shape_variant != "default":
            variant = f"{request.shape_variant}-{variant}"
        return [CompiledArtifact(
            path=out,
            target=Target(platform="coreml", variant=variant, format="mlpackage",
                          runtime="coreml", runtime_version=target_name),
            precision=precision if scheme == "none" else Precision.INT8,
            compile_settings={"precision": precision.value, "minimum_deployment_target":
                              target_name, "weight_compression": scheme,
                              "weight_threshold": threshold,
                              **({"palettize_mode": palette_mode}
                                 if compression.kind == "palettize" else {}),
                              **({"keep_ops": ",".join(keep_ops)} if keep_ops else {}),
                              "coremltools": ct.__version__},
            notes=([] if sys.platform == "darwin" else [EXECUTOR_NOTE]) + (
                [f"{coreml_quant.compressed_weights(mlmodel)} weight tensor(s) compressed "
                 f"({scheme}" + (f"; kept uncompressed: {', '.join(keep_ops)}" if keep_ops
                                 else "") + ")"] if scheme != "none" else []),
            extra={"numeric_runner": numeric_runner(precision)},
        )]

    def run(self, artifact: CompiledArtifact, feeds: Feeds) -> Outputs:
        import coremltools as ct

        from server.compile.onnx_mil.context import mil_name

        # The package's inputs carry MIL identifiers ('input:0' → 'input_0'); the feeds the
        # source's names.
        feeds = [{mil_name(k): v for k, v in f.items()} for f in feeds]
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



def keep_ops_of(opts: dict[str, object]) -> tuple[str, ...]:
    """The `keep_ops` setting (a list, or a comma-separated string) as op names."""
    value = opts.get("keep_ops") or ()
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise InvalidSourceError("coreml keep_ops must be a list of MIL op names")
    return tuple(str(v).strip() for v in items if str(v).strip())
