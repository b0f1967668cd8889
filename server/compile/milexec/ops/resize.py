"""Image resizing MIL ops on the last two dims: upsample_bilinear / upsample_nearest_neighbor
(scale factors), resize_bilinear / resize_nearest_neighbor (target sizes, MIL's sampling
modes) and iOS17's `resize`. Bilinear is separable: one linear interpolation per axis in
float32, with the sampling grids exactly as the MIL op docs define them."""

from __future__ import annotations

import math

import numpy as np

from server.compile.milexec.ops.linear import wide
from server.compile.milexec.registry import Array, OpCall, mil_op


def grid(mode: str, n_in: int, n_out: int) -> Array:
    """Source coordinates of each output position (MIL resize_bilinear's sampling modes)."""
    i = np.arange(n_out, dtype=np.float64)
    if mode in ("STRICT_ALIGN_CORNERS", "ALIGN_CORNERS"):
        if n_out == 1:
            g = np.full(1, (n_in - 1) / 2 if mode == "ALIGN_CORNERS" else 0.0)
        else:
            g = i * (n_in - 1) / (n_out - 1)
    elif mode == "DEFAULT":
        g = i * n_in / n_out
    elif mode == "OFFSET_CORNERS":
        delta = max(1, n_in - 1) / n_out
        g = 0.5 * delta + i * delta
    elif mode in ("UNALIGN_CORNERS", "HALF_PIXEL"):
        g = (i + 0.5) * n_in / n_out - 0.5
    else:
        raise ValueError(f"sampling mode {mode!r}")
    return np.asarray(np.clip(g, 0, n_in - 1))


def _linear_axis(x: Array, axis: int, g: Array) -> Array:
    lo = np.floor(g).astype(np.int64)
    hi = np.minimum(lo + 1, x.shape[axis] - 1)
    shape = [1] * x.ndim
    shape[axis] = -1
    frac = (g - lo).astype(np.float32).reshape(shape)
    return np.asarray(np.take(x, lo, axis=axis) * (1 - frac) + np.take(x, hi, axis=axis) * frac)


def bilinear(x: Array, size: tuple[int, ...], mode: str) -> Array:
    """`x` interpolated to `size` over its last len(size) dims."""
    x = wide(x)
    for axis, n in zip(range(-len(size), 0), size, strict=True):
        x = _linear_axis(x, x.ndim + axis, grid(mode, x.shape[axis], n))
    return x


def nearest(x: Array, size: tuple[int, ...]) -> Array:
    for axis, n in zip(range(-len(size), 0), size, strict=True):
        n_in = x.shape[axis]
        idx = np.minimum(np.floor(np.arange(n) * (n_in / n)).astype(np.int64), n_in - 1)
        x = np.take(x, idx, axis=x.ndim + axis)
    return x


def _scaled(op: OpCall, x: Array) -> tuple[int, int]:
    return (math.floor(x.shape[-2] * float(op.scalar("scale_factor_height", 1))),
            math.floor(x.shape[-1] * float(op.scalar("scale_factor_width", 1))))


@mil_op("upsample_bilinear")
def upsample_bilinear(op: OpCall) -> Array:
    x = op.arr("x")
    align = bool(op.scalar("align_corners", True))
    half = bool(op.scalar("half_pixel_centers", not align))
    mode = "STRICT_ALIGN_CORNERS" if align else ("UNALIGN_CORNERS" if half else "DEFAULT")
    return bilinear(x, _scaled(op, x), mode)


@mil_op("upsample_nearest_neighbor")
def upsample_nearest_neighbor(op: OpCall) -> Array:
    x = op.arr("x")
    return nearest(x, _scaled(op, x))


@mil_op("resize_bilinear")
def resize_bilinear(op: OpCall) -> Array:
    size = (int(op.scalar("target_size_height", 1)), int(op.scalar("target_size_width", 1)))
    return bilinear(op.arr("x"), size, str(op.scalar("sampling_mode", "DEFAULT")))


@mil_op("resize_nearest_neighbor")
def resize_nearest_neighbor(op: OpCall) -> Array:
    size = (int(op.scalar("target_size_height")), int(op.scalar("target_size_width")))
    return nearest(op.arr("x"), size)


@mil_op("resize")
def resize(op: OpCall) -> Array:
    x = op.arr("x")
    dims = int(op.scalar("resized_dims"))
    shape = (op.ints("shape") or [])[len(op.ints("shape") or []) - dims:]
    size = tuple(n if n > 0 else x.shape[x.ndim - dims + i] for i, n in enumerate(shape))
    if op.scalar("interpolation_mode", "LINEAR") == "NEAREST_NEIGHBOR":
        return nearest(x, size)
    return bilinear(x, size, str(op.scalar("sampling_mode", "DEFAULT")))


@mil_op("crop")
def crop(op: OpCall) -> Array:
    x = op.arr("x")
    (top, bottom), (left, right) = op.ints("crop_height") or [0, 0], \
        op.ints("crop_width") or [0, 0]
    return x[..., top:x.shape[-2] - bottom, left:x.shape[-1] - right]
