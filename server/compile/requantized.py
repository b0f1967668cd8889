"""A leaked copy's weights as `modelfleet watermark identify` compares them (issue 23): its
tensors by name (server/compile/weights.py `by_name`), plus — for the weights a re-quantizer
stored as integers — their dequantized values under the name the float original had, and the
grid each value sits on (server/watermark.py scores a weight on its grid: a mark the
rounding erased scores 0, one it carried across a boundary its sign).

Re-quantizers read here, each by its own format's rule:
- onnxruntime's quantizers, one scale per tensor: X → X_quantized, X_scale, X_zero_point
  (`by_name` dequantizes; the grid is the scale and zero point);
- coremltools.optimize (`linear_quantize_weights`), per tensor, per channel or per block:
  a weight const `W` becomes `W_quantized`, a `constexpr_affine_dequantize` (iOS16/17) or
  `constexpr_blockwise_shift_scale` (iOS18) op, decompressed by coremltools' own
  `decompress` of that op, the grid's step and offset by the same call on ones and zeros.

Anything else (palettized tables, per-channel ONNX scales) is compared as its values are:
the matched filter, or a per-tensor grid read off the values (`watermark.lattice`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from server.compile import weights
from server.watermark import Lattice

QUANTIZED_OPS = ("constexpr_affine_dequantize", "constexpr_blockwise_shift_scale")
CORE_ML_SUFFIX = "_quantized"  # coremltools names W's compressed op W_quantized
Values = np.ndarray[Any, Any]


def leaked_copy(path: Path) -> tuple[dict[str, Values], dict[str, Lattice]]:
    """The leaked file's tensors by name and the grids of its re-quantized ones (see the
    module docstring). Raises weights.WeightsError for a file that is not a model."""
    tensors = weights.read(path)
    copy = weights.by_name(tensors)
    grids = _onnx_grids(tensors, copy)
    if weights.kind_of(path) == "mlpackage":
        with weights.package_dir(path) as pkg:
            for name, values, grid in _core_ml_dequantized(pkg):
                copy.setdefault(name, values)
                grids.setdefault(name, grid)
    return copy, grids


def _onnx_grids(tensors: list[weights.Tensor], copy: dict[str, Values]
                ) -> dict[str, Lattice]:
    out = {}
    for t in tensors:
        base = t.name.removesuffix(weights.QUANTIZED_SUFFIX)
        scale, zero = copy.get(f"{base}_scale"), copy.get(f"{base}_zero_point")
        if base == t.name or scale is None or scale.size != 1:
            continue
        s = float(scale.reshape(-1)[0])
        zp = 0.0 if zero is None or zero.size != 1 else float(zero.reshape(-1)[0])
        out[base] = Lattice(s, -zp * s)
    return out


def _core_ml_dequantized(pkg: Path) -> list[tuple[str, Values, Lattice]]:
    """(original's name, dequantized float32 values, grid) of each weight that a
    coremltools re-quantization stored in a QUANTIZED_OPS op."""
    from server.compile.milexec.program import ValueReader, load_function

    _, fn, _ = load_function(pkg)
    reader = ValueReader(pkg)
    out = []
    for op in fn.block_specializations[fn.opset].operations:
        if op.type not in QUANTIZED_OPS or not op.outputs:
            continue
        v = {**{k: reader.read(a) for k, a in op.attributes.items() if k != "name"},
             **{k: reader.read(arg.value) for k, a in op.inputs.items()
                for arg in a.arguments if arg.WhichOneof("binding") == "value"}}
        affine = op.type == "constexpr_affine_dequantize"
        data = v["quantized_data" if affine else "data"]
        zero = v["zero_point"] if affine else v.get("offset")
        step = _dense(affine, v, np.ones_like(data), None).astype(np.float64).reshape(-1)
        offset = _dense(affine, v, np.zeros_like(data), zero).astype(np.float64).reshape(-1)
        values = _dense(affine, v, data, zero).astype(np.float32).reshape(-1)
        name = op.outputs[0].name.removesuffix(CORE_ML_SUFFIX)
        out.append((f"{name}:val", values, Lattice(step, offset)))
    return out


def _dense(affine: bool, v: dict[str, Any], q: Values, zero: Values | None) -> Values:
    """The op's dense weights for integers `q` and zero point / offset `zero` (None: 0),
    by coremltools' own `decompress` of the op: (q - zero) · scale, broadcast its way."""
    from coremltools.converters.mil.mil.ops.defs.iOS16 import constexpr_ops as ios16
    from coremltools.converters.mil.mil.ops.defs.iOS18 import compression as ios18

    if affine:
        z = np.zeros_like(v["zero_point"]) if zero is None else zero
        return np.asarray(ios16.constexpr_affine_dequantize.decompress(
            q, z, v["scale"], int(np.asarray(v["axis"]))))
    return np.asarray(ios18.constexpr_blockwise_shift_scale.decompress(q, v["scale"], zero))
