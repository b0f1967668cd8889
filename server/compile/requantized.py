"""A leaked copy's weights as `modelfleet watermark identify` compares them (issue 23): its
tensors by name (server/compile/weights.py `by_name`), plus — for the weights a re-quantizer
stored as integers — their dequantized values under the name the float original had, and the
grid each value sits on (server/watermark.py scores a weight on its grid: a mark the
rounding erased scores 0, one it carried across a boundary its sign).

Re-quantizers read here, each by its own format's rule:
- onnxruntime's quantizers, static (QDQ) or dynamic, per tensor or per channel:
  X → X_quantized, X_scale, X_zero_point, dequantized along the axis of the op that reads
  it (`DequantizeLinear`'s own axis and block size, `MatMulInteger`, `ConvInteger`);
- coremltools.optimize (`linear_quantize_weights`), per tensor, per channel or per block:
  a weight const `W` becomes `W_quantized`, a `constexpr_affine_dequantize` (iOS16/17) or
  `constexpr_blockwise_shift_scale` (iOS18) op, decompressed by coremltools' own
  `decompress` of that op, the grid's step and offset by the same call on ones and zeros.

Anything else (palettized tables, another quantizer's names) is compared as its values are:
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
    if weights.kind_of(path) == "onnx":
        model = weights.load_onnx(path)  # once: its tensors and the ops that read them
        copy = weights.by_name(weights.onnx_tensors(model))
        return copy, _onnx_dequantized(model.graph, copy)
    copy = weights.by_name(weights.read(path))
    grids: dict[str, Lattice] = {}
    with weights.package_dir(path) as pkg:
        for name, values, grid in _core_ml_dequantized(pkg):
            copy.setdefault(name, values)
            grids.setdefault(name, grid)
    return copy, grids


def _onnx_dequantized(graph: Any, copy: dict[str, Values]) -> dict[str, Lattice]:
    """Adds to `copy` each weight onnxruntime's quantizers stored as X_quantized under its
    float name X, dequantized along the axis its consumer names, and returns the grids.
    Per tensor, per channel (QDQ `DequantizeLinear` axis, blocks too; `MatMulInteger`'s
    weight per column, `ConvInteger`'s per output channel, as the ops define them)."""
    dims = {init.name: tuple(init.dims) for init in graph.initializer}  # `read` flattens
    grids = {}
    for node in graph.node:
        if node.op_type not in CHANNEL_AXIS or len(node.input) < 2:
            continue
        at = 0 if node.op_type == "DequantizeLinear" else 1
        q_name = node.input[at]
        base = q_name.removesuffix(weights.QUANTIZED_SUFFIX)
        q, scale = copy.get(q_name), copy.get(f"{base}_scale")
        if base == q_name or q is None or scale is None or q.dtype.kind not in "iu":
            continue
        zero = copy.get(f"{base}_zero_point", np.zeros(1))
        attrs = {a.name: a.i for a in node.attribute}
        try:  # the leak's dims and attributes: any of them may be forged
            q = q.reshape(dims[q_name])
            axis = attrs.get("axis", CHANNEL_AXIS[node.op_type]) % max(q.ndim, 1)
            block = attrs.get("block_size", 0)
            step = _along(scale.reshape(dims[f"{base}_scale"]), q.shape, axis, block)
            zp = _along(zero.reshape(dims.get(f"{base}_zero_point", (1,))), q.shape, axis,
                        block)
        except (KeyError, ValueError) as e:
            raise weights.WeightsError(f"{node.op_type} of {base!r}: its weights and "
                                       f"parameters do not fit together ({e})") from None
        if step is None or zp is None:
            continue
        offset = -zp * step
        copy.setdefault(base, (q * step + offset).astype(np.float32).reshape(-1))
        if scale.size == 1 and zero.size == 1:  # one grid for the tensor: two numbers
            grids[base] = Lattice(float(step.flat[0]), float(offset.flat[0]))
        else:
            grids[base] = Lattice(step.reshape(-1), offset.reshape(-1))
    return grids


# The axis each consumer's per-channel parameters run along when it names none: ONNX's
# DequantizeLinear default (1), MatMulInteger's B per column (last), ConvInteger's W per
# output channel (0).
CHANNEL_AXIS = {"DequantizeLinear": 1, "MatMulInteger": -1, "ConvInteger": 0}


def _along(p: Values, shape: tuple[int, ...], axis: int, block: int) -> Values | None:
    """Per-tensor, per-channel or per-block parameters `p` broadcast to `shape` (None: a
    layout this file does not have)."""
    p = p.astype(np.float64)
    if p.size == 1:
        return np.full(shape, float(p.reshape(-1)[0]))
    if block > 0 and p.ndim == len(shape):  # ONNX's rule: ⌈shape/block⌉ along the axis
        fits = all(n == (-(-d // block) if i == axis else d)
                   for i, (n, d) in enumerate(zip(p.shape, shape, strict=True)))
        # indexed, not np.repeat(p, block): a forged block size must not allocate
        return np.take(p, np.arange(shape[axis]) // block, axis=axis) if fits else None
    if p.ndim != 1 or not shape or p.size != shape[axis]:
        return None
    view = [1] * len(shape)
    view[axis] = p.size
    return np.broadcast_to(p.reshape(view), shape)


def _core_ml_dequantized(pkg: Path) -> list[tuple[str, Values, Lattice]]:
    """(original's name, dequantized float32 values, grid) of each weight that a
    coremltools re-quantization stored in a QUANTIZED_OPS op."""
    from google.protobuf.message import DecodeError

    from server.compile.milexec.program import ValueReader, load_function
    from server.compile.milexec.registry import MilExecError

    try:
        _, fn, _ = load_function(pkg)
    except (MilExecError, DecodeError) as e:
        raise weights.WeightsError(f"{pkg.name}: {e}") from None
    reader = ValueReader(pkg)
    out = []
    for op in fn.block_specializations[fn.opset].operations:
        if op.type not in QUANTIZED_OPS or not op.outputs:
            continue
        name = op.outputs[0].name.removesuffix(CORE_ML_SUFFIX)
        try:  # the op's values and shapes are the leak's: any of them may be forged
            values, grid = _dequantized(op, reader)
        except (MilExecError, KeyError, ValueError, TypeError, IndexError, RuntimeError) as e:
            raise weights.WeightsError(f"{pkg.name}: its {op.type} op {name!r} cannot be "
                                       f"dequantized ({type(e).__name__}: {e})") from None
        out.append((f"{name}:val", values, grid))
    return out


def _dequantized(op: Any, reader: Any) -> tuple[Values, Lattice]:
    v = {**{k: reader.read(a) for k, a in op.attributes.items() if k != "name"},
         **{k: reader.read(arg.value) for k, a in op.inputs.items()
            for arg in a.arguments if arg.WhichOneof("binding") == "value"}}
    affine = op.type == "constexpr_affine_dequantize"
    data = np.asarray(v["quantized_data" if affine else "data"])
    zero = v["zero_point"] if affine else v.get("offset")
    axis = int(np.asarray(v.get("axis", 0))) if affine else 0
    for key in ("scale", "zero_point", "offset"):  # forged shapes could broadcast a
        if key in v and not _fits(np.asarray(v[key]), data.shape, affine, axis):  # bomb
            raise ValueError(f"{key} of shape {np.shape(v[key])} does not fit weights of "
                             f"shape {data.shape}")
    values = _dense(affine, v, data, zero).astype(np.float32).reshape(-1)
    step = _dense(affine, v, np.ones_like(data), None).astype(np.float64).reshape(-1)
    offset = _dense(affine, v, np.zeros_like(data), zero).astype(np.float64).reshape(-1)
    return values, Lattice(step, offset)


def _fits(p: Values, shape: tuple[int, ...], affine: bool, axis: int) -> bool:
    """Whether the op's rule spreads parameter `p` over exactly `shape`: affine, one value
    or one per slice along `axis`; blockwise, the data's rank, each dimension a divisor."""
    if affine:
        return p.size == 1 or (p.ndim == 1 and -len(shape) <= axis < len(shape)
                               and p.size == shape[axis])
    return p.ndim == len(shape) and all(0 < n <= d and d % n == 0
                                        for n, d in zip(p.shape, shape, strict=True))


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
