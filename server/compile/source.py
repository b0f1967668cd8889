"""Loading an uploaded model and turning it into the two forms compilers consume.

- `load_exported_program`: any torch source (ExportedProgram .pt2 or TorchScript) as a static
  `torch.export.ExportedProgram` for the given input specs (Core ML, ONNX export).
- `export_onnx`: a single-file FP32 ONNX with static shapes and the declared input names
  (ONNX artifact, QNN, operator gate, reference run). Static ONNX sources are passed through;
  dynamic ones are specialized to the declared shapes (server/compile/shapes.py).
- `reference_outputs`: FP32 outputs of the *source* model on the reference inputs, computed
  without any conversion so the numeric gate compares against the original, not a copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from server.compile.errors import CalibrationError, InvalidSourceError
from server.compile.quiet import quiet
from server.compile.types import InputSpec, SourceFormat

# Largest sample count read from a calibration / reference .npz (memory and time cap).
MAX_SAMPLES = 256
ONNX_OPSET = 18  # opset of the ONNX we export from torch uploads

_DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32,
           "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_}


def numpy_dtype(spec: InputSpec) -> Any:
    try:
        return _DTYPES[spec.dtype]
    except KeyError:
        raise InvalidSourceError(
            f"input {spec.name!r} has dtype {spec.dtype!r}; supported: {', '.join(_DTYPES)}"
        ) from None


def example_inputs(specs: tuple[InputSpec, ...]) -> dict[str, NDArray[Any]]:
    """Zeros of the declared shapes: only used to trace shapes, never as calibration data."""
    return {s.name: np.zeros(s.shape, dtype=numpy_dtype(s)) for s in specs}


def sample_key(name: str, variant: str) -> str:
    """The .npz array holding input `name`'s samples for one shape variant."""
    return f"{name}@{variant}"


def load_samples(path: Path, specs: tuple[InputSpec, ...], variant: str = ""
                 ) -> list[dict[str, NDArray[Any]]]:
    """Reads an .npz of inputs into per-sample feeds, checking names, shapes and dtypes.

    A version with several shape variants may give each its own samples: an array named
    `<input>@<variant>` (e.g. `image@720p`) is used for that variant instead of `<input>`.
    An input declared with a constant `value` takes that value in every sample."""
    constants = {s.name: np.asarray(s.value).astype(numpy_dtype(s)) for s in specs
                 if s.value is not None}
    specs = tuple(s for s in specs if s.value is None)
    try:
        npz = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise CalibrationError(f"cannot read {path.name} as .npz: {e}") from e
    with npz:
        keys = {s.name: sample_key(s.name, variant)
                if variant and sample_key(s.name, variant) in npz.files else s.name
                for s in specs}
        missing = [s.name for s in specs if keys[s.name] not in npz.files]
        if missing:
            raise CalibrationError(
                f"{path.name} lacks arrays for inputs {missing}; it has {sorted(npz.files)}. "
                "Save one array per input name, shaped (N, *input_shape) (or one per input and "
                "shape variant, named '<input>@<variant>')."
            )
        batches: dict[str, NDArray[Any]] = {}
        counts = set()
        for s in specs:
            arr = npz[keys[s.name]]
            if tuple(arr.shape) == s.shape:
                arr = arr[None]
            if tuple(arr.shape[1:]) != s.shape:
                raise CalibrationError(
                    f"{path.name}[{keys[s.name]!r}] has shape {arr.shape}; expected "
                    f"(N, *{s.shape})" + (f" for shape variant {variant!r} (give it its own "
                                          f"array {sample_key(s.name, variant)!r})"
                                          if variant and keys[s.name] == s.name else "")
                )
            batches[s.name] = arr[:MAX_SAMPLES].astype(numpy_dtype(s), copy=False)
            counts.add(batches[s.name].shape[0])
    if len(counts) != 1 or 0 in counts:
        raise CalibrationError(f"{path.name}: every input needs the same, non-zero sample count")
    n = counts.pop()
    # np.asarray: indexing a (N,) batch of a scalar input gives a numpy scalar, which
    # onnxruntime refuses; a 0-d array is what a rank-0 input takes.
    return [{**{k: np.asarray(v[i]) for k, v in batches.items()}, **constants}
            for i in range(n)]


def _torch_inputs(specs: tuple[InputSpec, ...]) -> tuple[Any, ...]:
    import torch

    return tuple(torch.from_numpy(a) for a in example_inputs(specs).values())


def load_exported_program(path: Path, fmt: SourceFormat, specs: tuple[InputSpec, ...]) -> Any:
    """A static ExportedProgram of a torch source for exactly these input shapes."""
    import torch

    args = _torch_inputs(specs)
    try:
        if fmt is SourceFormat.EXPORTED_PROGRAM:
            ep = torch.export.load(str(path))
        elif fmt is SourceFormat.TORCHSCRIPT:
            # TorchScript is the legacy format; convert once to an ExportedProgram.
            from torch._export.converter import TS2EPConverter

            # torch.jit.load has no annotations (torch 2.13)
            scripted = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]
            ep = TS2EPConverter(scripted, args).convert()
        else:
            raise InvalidSourceError(f"{fmt} is not a torch format")
    except InvalidSourceError:
        raise
    except Exception as e:
        raise InvalidSourceError(
            f"cannot load {path.name} as {fmt.value}: {type(e).__name__}: {e}. Save it with "
            "torch.export.save(torch.export.export(model, args), 'model.pt2')."
        ) from e
    declared = [tuple(n.meta["val"].shape) for n in ep.graph.nodes
                if n.op == "placeholder" and n.name in ep.graph_signature.user_inputs]
    if len(declared) != len(specs):
        raise InvalidSourceError(
            f"the program takes {len(declared)} inputs but {len(specs)} input specs were given"
        )
    static = all(all(isinstance(d, int) for d in shape) for shape in declared)
    if static and [tuple(shape) for shape in declared] == [s.shape for s in specs]:
        return ep
    try:
        # A program with dynamic dims (or other sizes) is specialised to this variant's shapes.
        return torch.export.export(ep.module(), args)
    except Exception as e:
        raise InvalidSourceError(
            f"the program was exported for input shapes {declared} and cannot run at "
            f"{[s.shape for s in specs]}: {e}. Export it with torch.export Dim for the sizes "
            "you declare as shape variants, or upload one program per shape."
        ) from e


def export_onnx(path: Path, fmt: SourceFormat, specs: tuple[InputSpec, ...], out: Path) -> Path:
    """Writes a single-file FP32 ONNX of the source to `out` with static shapes (static ONNX
    sources are copied as is, dynamic ones specialized to `specs`)."""
    if fmt is SourceFormat.ONNX:
        # A dynamic graph is specialized to the declared shapes; a static one passes through.
        from server.compile.shapes import specialize_file

        specialize_file(path, specs, out)
        return out
    import torch

    ep = load_exported_program(path, fmt, specs)
    try:
        with quiet():
            torch.onnx.export(ep, (), str(out), dynamo=True, external_data=False,
                              opset_version=ONNX_OPSET, input_names=[s.name for s in specs],
                              optimize=True, verify=False)
    except Exception as e:
        raise InvalidSourceError(f"torch.onnx.export failed: {type(e).__name__}: {e}") from e
    return out


def run_onnx_cpu(model_path: Path, feeds: list[dict[str, NDArray[Any]]]
                 ) -> list[list[NDArray[Any]]]:
    """Runs an ONNX model on the onnxruntime CPU provider, one output list per sample."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(model_path), sess_options=opts,
                                providers=["CPUExecutionProvider"])
    return [[np.asarray(o) for o in sess.run(None, f)] for f in feeds]


def _onnx_reference_evaluator(path: Path, feeds: list[dict[str, NDArray[Any]]],
                              ort_error: Exception) -> list[list[NDArray[Any]]]:
    """The source run by the ONNX reference implementation (numpy, exact to the spec), for a
    graph onnxruntime's CPU kernels cannot load (e.g. a batch-first LSTM: no layout-1 kernel).
    Slow, so only when onnxruntime refused the source; when it cannot run the source either
    (an operator no runtime knows), onnxruntime's own error stands and fails the build."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    try:
        evaluator = ReferenceEvaluator(onnx.load(str(path)))
        return [[np.asarray(o) for o in evaluator.run(None, f)] for f in feeds]
    except Exception:
        raise ort_error from None


def reference_outputs(path: Path, fmt: SourceFormat, specs: tuple[InputSpec, ...],
                      feeds: list[dict[str, NDArray[Any]]]) -> list[list[NDArray[Any]]]:
    """FP32 outputs of the unconverted source on each reference sample."""
    if fmt is SourceFormat.ONNX:
        try:
            return run_onnx_cpu(path, feeds)
        except Exception as e:  # onnxruntime's errors are untyped
            return _onnx_reference_evaluator(path, feeds, e)
    import torch

    module = load_exported_program(path, fmt, specs).module()
    outs: list[list[NDArray[Any]]] = []
    with torch.no_grad():
        for f in feeds:
            res = module(*(torch.from_numpy(np.ascontiguousarray(f[s.name])) for s in specs))
            flat = res if isinstance(res, (tuple, list)) else (res,)
            outs.append([t.detach().cpu().numpy() for t in flat])
    return outs
