"""Reads the MIL program of a saved `.mlpackage`: the function to run, its inputs and their
dtypes, and the values the program holds — immediate values and weights in the package's
blob file (`Data/com.apple.CoreML/weights/weight.bin`), decoded by coremltools' own milproto
reader (`_load_value` over `libmilstoragepython`'s `_BlobStorageReader`), sub-byte types
(int4, uint4, uint6, …) unpacked the same way coremltools does when it loads a package.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from server.compile.milexec.registry import MilExecError


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: np.dtype[Any]
    shape: tuple[int | None, ...] | None  # None: not a tensor (list, dict, state)


def np_dtype(proto_dtype: int) -> np.dtype[Any]:
    """The numpy dtype of a MIL proto `DataType`."""
    from coremltools.converters.mil.mil import types

    builtin = types.PROTO_TO_BUILTIN_TYPE[proto_dtype]
    if builtin is types.str:
        return np.dtype(object)
    out: np.dtype[Any] = np.dtype(types.nptype_from_builtin(builtin))
    return out


def tensor_spec(named: Any) -> TensorSpec:
    """A `NamedValueType` (an op output, a function or block input) as a TensorSpec."""
    kind = named.type.WhichOneof("type")
    if kind != "tensorType":
        return TensorSpec(named.name, np.dtype(object), None)
    t = named.type.tensorType
    dims = tuple(d.constant.size if d.WhichOneof("dimension") == "constant" else None
                 for d in t.dimensions)
    return TensorSpec(named.name, np_dtype(t.dataType), dims)


class ValueReader:
    """Decodes proto `Value`s; one blob reader per weight file, opened on first use."""

    def __init__(self, package: Path) -> None:
        from coremltools.converters.mil.frontend.milproto import load as milproto

        self._milproto = milproto
        self._context = milproto.TranscriptionContext(
            str(package / "Data" / "com.apple.CoreML" / "weights"))

    def read(self, value: Any) -> Any:
        kind = value.type.WhichOneof("type")
        if kind != "tensorType":
            raise MilExecError(f"a MIL value of type {kind} cannot be read by the executor")
        out = self._milproto._load_value(self._context, value)
        if isinstance(out, str):
            return out
        arr = np.asarray(out)
        want = np_dtype(value.type.tensorType.dataType)
        return arr if want == np.dtype(object) or arr.dtype == want else arr.astype(want)


def load_function(package: Path, function: str | None = None) -> tuple[Any, Any, str]:
    """The spec, the block to run (the function's specialization for its own opset) and the
    function's name: `function`, else the package's default function, else `main`."""
    import coremltools as ct

    if not (package / "Manifest.json").is_file():
        raise MilExecError(f"{package} is not an .mlpackage (no Manifest.json)")
    spec = ct.utils.load_spec(str(package))
    if spec.WhichOneof("Type") != "mlProgram":
        raise MilExecError(f"{package} holds a {spec.WhichOneof('Type')} model, not an ML "
                           "Program; the MIL executor runs ML Programs only")
    functions = spec.mlProgram.functions
    name = function or spec.description.defaultFunctionName or "main"
    if name not in functions:
        raise MilExecError(f"{package} has no MIL function {name!r} (it has "
                           f"{sorted(functions)})")
    fn = functions[name]
    if fn.opset not in fn.block_specializations:
        raise MilExecError(f"MIL function {name!r} has no block for its opset {fn.opset}")
    return spec, fn, name
