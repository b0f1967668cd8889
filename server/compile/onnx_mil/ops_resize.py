"""Resize and Upsample.

ONNX Resize is separable: along each resized axis the output is a fixed linear map of the
input (nearest, linear, cubic, antialias, every coordinate transformation mode). The rule asks
ONNX's reference implementation for that map (Resize applied to an identity matrix), so the
weights are ONNX's by construction, then emits the cheapest MIL form that is exactly that map:
- 4-D linear over H and W whose weights equal one of MIL `resize_bilinear`'s sampling modes
  → `resize_bilinear`;
- nearest whose source index is floor(i / k) for integer k (torch's `interpolate`) →
  `upsample_nearest_neighbor`; any other nearest → `gather` of the source rows;
- anything else → a matmul by the weight matrix along that axis.
`tf_crop_and_resize` (ROI crops with extrapolation) is refused.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from coremltools.converters.mil import Builder as mb

from server.compile.onnx_mil.context import NodeContext, dtype_of, shape_of
from server.compile.onnx_mil.registry import Outputs, onnx_op

_KEEP = ("mode", "coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside",
         "nearest_mode", "antialias")


# keep_aspect_ratio_policy: (input size, requested size) of the axis whose ratio won, and the
# requested size of this axis.
Aspect = tuple[int, int, int]


def _aspect_map(ctx: NodeContext, n_in: int, aspect: Aspect, opset: int) -> np.ndarray:
    """The map of one axis under keep_aspect_ratio_policy, from onnx.reference given the
    same two requested sizes: its output size rounds half up (round(n_in * ratio)) while the
    coordinates use the ratio itself, which no scales-only call reproduces. The probe is
    [n_in, det_in, n_in] with x[b, :, b] = 1, resized over axes 1 and 2; along axis 1 every
    output row of a Resize weighs its inputs to a sum of 1, so y[b, 0, :] is row b of M."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    det_in, det_want, want = aspect
    attrs = {k: v for k, v in ctx.attrs.items() if k in (*_KEEP, "keep_aspect_ratio_policy")}
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], axes=[1, 2], **attrs)
    x = np.zeros((n_in, det_in, n_in))
    x[np.arange(n_in), :, np.arange(n_in)] = 1.0
    (y,) = ReferenceEvaluator(node, opsets={"": opset}).run(
        None, {"x": x, "sizes": np.array([det_want, want], np.int64)})
    return np.asarray(y)[:, 0, :]


def _axis_map(ctx: NodeContext, n_in: int, n_out: int, scale: float | None,
              roi: tuple[float, float] | None = None, fill: float = 0.0,
              aspect: Aspect | None = None) -> np.ndarray:
    """The [n_in, n_out] matrix M with resize(x) = x @ M along one axis, from onnx.reference
    (with `roi`, tf_crop_and_resize's crop of this axis; `fill` is the extrapolation value,
    0 for the map itself, 1 on a zero input to find the extrapolated positions; `aspect`,
    keep_aspect_ratio_policy's sizes)."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    attrs = {k: v for k, v in ctx.attrs.items() if k in _KEEP}
    opset = max(ctx.opset, 11)
    if aspect is not None:
        return _aspect_map(ctx, n_in, aspect, opset)
    if opset < 18:
        attrs.pop("antialias", None)
    if roi is not None:
        attrs["coordinate_transformation_mode"] = "tf_crop_and_resize"
        attrs["extrapolation_value"] = fill
    inputs = ["x", "roi" if roi is not None else "", "scales" if scale is not None else ""]
    if scale is None:
        inputs.append("sizes")
    node = helper.make_node("Resize", inputs, ["y"], **attrs)
    feeds: dict[str, Any] = {"x": np.eye(n_in, dtype=np.float64) if not fill else
                             np.zeros((1, n_in))}
    if roi is not None:
        feeds["roi"] = np.array([0, roi[0], 1, roi[1]], np.float32)
    if scale is not None:
        feeds["scales"] = np.array([1.0, scale], np.float32)
    else:
        feeds["sizes"] = np.array([feeds["x"].shape[0], n_out], np.int64)
    (m,) = ReferenceEvaluator(node, opsets={"": opset}).run(None, feeds)
    return np.asarray(m)


def _rois(ctx: NodeContext, rank: int) -> list[tuple[float, float] | None]:
    """tf_crop_and_resize's per-axis (start, end), from the roi input over `axes`."""
    roi = ctx.const(1)
    assert roi is not None
    axes = [a % rank for a in ctx.attr("axes", list(range(rank)))]
    r = [float(v) for v in np.asarray(roi).reshape(-1)]
    out: list[tuple[float, float] | None] = [None] * rank
    for k, a in enumerate(axes):
        out[a] = (r[k], r[k + len(axes)])
    return out


def _mil_bilinear(n_in: int, n_out: int, mode: str) -> np.ndarray:
    """The weights of MIL resize_bilinear's sampling grid (its documented formulas)."""
    i = np.arange(n_out, dtype=np.float64)
    if mode == "UNALIGN_CORNERS":
        g = i * (n_in / n_out) + 0.5 * (n_in / n_out) - 0.5
    else:  # STRICT_ALIGN_CORNERS
        g = i * ((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(1)
    g = np.clip(g, 0, n_in - 1)
    lo = np.floor(g).astype(int)
    hi = np.minimum(lo + 1, n_in - 1)
    frac = g - lo
    m = np.zeros((n_in, n_out))
    m[lo, np.arange(n_out)] += 1 - frac
    m[hi, np.arange(n_out)] += frac
    return m


def _targets(ctx: NodeContext, shape: tuple[int, ...]
             ) -> tuple[list[int], list[float | None], dict[int, Aspect]]:
    """Output size and ONNX scale (None when sizes were given) per axis, and the axes sized
    by keep_aspect_ratio_policy."""
    rank = len(shape)
    if ctx.node.op_type == "Upsample":
        scales = ctx.const(1) if ctx.opset >= 9 else np.array(ctx.attr("scales"))
        assert scales is not None
        s = [float(v) for v in np.asarray(scales).reshape(-1)]
        return [math.floor(d * v) for d, v in zip(shape, s, strict=True)], list(s), {}
    axes = [a % rank for a in ctx.attr("axes", list(range(rank)))]
    scales = ctx.const(2) if ctx.has(2) and ctx.opset >= 11 else (
        ctx.const(1) if ctx.opset < 11 else None)
    sizes = ctx.const(3) if ctx.has(3) else None
    out: list[int] = list(shape)
    per: list[float | None] = [1.0] * rank
    if sizes is not None and np.asarray(sizes).size:
        want = [int(v) for v in np.asarray(sizes).reshape(-1)]
        policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            r = [want[k] / shape[a] for k, a in enumerate(axes)]
            common = min(r) if policy == "not_larger" else max(r)
            det = r.index(common)
            aspect = {a: (shape[axes[det]], want[det], want[k]) for k, a in enumerate(axes)}
            for a in axes:
                # ONNX rounds half up (int(x + 0.5)); Python's round() rounds half to even.
                out[a], per[a] = int(shape[a] * common + 0.5), common
            return out, per, aspect
        for k, a in enumerate(axes):
            out[a], per[a] = want[k], None
        return out, per, {}
    if scales is None or not np.asarray(scales).size:
        ctx.fail("Resize needs constant scales or sizes")
    assert scales is not None
    for k, a in enumerate(axes):
        v = float(np.asarray(scales).reshape(-1)[k])
        out[a], per[a] = math.floor(shape[a] * v), v
    return out, per, {}


def _crop_and_resize(ctx: NodeContext, x: Any, shape: tuple[int, ...], out: list[int],
                     scales: list[float | None]) -> Any:
    """tf_crop_and_resize: the per-axis maps of the crop, then the extrapolation value
    wherever any axis samples outside the input."""
    rois = _rois(ctx, len(shape))
    fill = float(ctx.attr("extrapolation_value", 0.0))
    y, outside = x, np.zeros([1] * len(shape), bool)
    for a in range(len(shape)):
        roi = rois[a]
        if roi is None or (roi == (0.0, 1.0) and out[a] == shape[a]):
            continue
        y = _along(ctx, y, a, _axis_map(ctx, shape[a], out[a], scales[a], roi))
        edge = _axis_map(ctx, shape[a], out[a], scales[a], roi, fill=1.0).reshape(-1) != 0
        outside = outside | edge.reshape([-1 if i == a else 1 for i in range(len(shape))])
    if outside.any():
        y = mb.select(cond=outside, a=np.array(fill, dtype_of(x)), b=y, name=ctx.tmp())
    return mb.identity(x=y, name=ctx.name())


def _along(ctx: NodeContext, x: Any, axis: int, m: np.ndarray) -> Any:
    rank = len(shape_of(x))
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    moved = x if axis == rank - 1 else mb.transpose(x=x, perm=perm, name=ctx.tmp())
    y = mb.matmul(x=moved, y=m.astype(dtype_of(x)), name=ctx.tmp())
    return y if axis == rank - 1 else mb.transpose(x=y, perm=perm, name=ctx.tmp())


@onnx_op("Resize", "Upsample")
def resize(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    shape = shape_of(x)
    out, scales, aspect = _targets(ctx, shape)
    if ctx.attr("coordinate_transformation_mode") == "tf_crop_and_resize":
        return [_crop_and_resize(ctx, x, shape, out, scales)]
    changed = [a for a in range(len(shape)) if out[a] != shape[a] or (
        scales[a] is not None and scales[a] != 1.0)]
    maps = {a: _axis_map(ctx, shape[a], out[a], scales[a], aspect=aspect.get(a))
            for a in changed}
    mode = str(ctx.attr("mode", "nearest"))
    if mode == "nearest":
        src = {a: np.argmax(m, axis=0) for a, m in maps.items()}
        ks = {a: out[a] // shape[a] for a in changed}
        if len(shape) == 4 and set(changed) <= {2, 3} and all(
                out[a] % shape[a] == 0 and np.array_equal(src[a], np.arange(out[a]) // ks[a])
                for a in changed):
            return [mb.upsample_nearest_neighbor(
                x=x, scale_factor_height=ks.get(2, 1), scale_factor_width=ks.get(3, 1),
                name=ctx.name())]
        y = x
        for a in changed:
            y = mb.gather(x=y, indices=src[a].astype(np.int32), axis=a, name=ctx.tmp())
        return [mb.identity(x=y, name=ctx.name())]
    if mode == "linear" and len(shape) == 4 and set(changed) == {2, 3}:
        for sm in ("UNALIGN_CORNERS", "STRICT_ALIGN_CORNERS"):
            if all(np.allclose(maps[a], _mil_bilinear(shape[a], out[a], sm), atol=1e-6)
                   for a in changed):
                return [mb.resize_bilinear(x=x, target_size_height=out[2],
                                           target_size_width=out[3], sampling_mode=sm,
                                           name=ctx.name())]
    y = x
    for a in changed:
        y = _along(ctx, y, a, maps[a])
    return [mb.identity(x=y, name=ctx.name())]
