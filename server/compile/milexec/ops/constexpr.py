"""Compressed-weight MIL ops (`constexpr_*`, iOS16 and iOS18 forms, as coremltools.optimize
writes them): each is decompressed by coremltools' own `decompress` of that op definition,
so the executor sees exactly the dense weights Core ML materialises. The executor caches
them after the first run, as it does consts."""

from __future__ import annotations

from typing import Any

import numpy as np

from server.compile.milexec.registry import Array, OpCall, mil_op


def _defs() -> tuple[Any, Any]:
    from coremltools.converters.mil.mil.ops.defs.iOS16 import constexpr_ops as ios16
    from coremltools.converters.mil.mil.ops.defs.iOS18 import compression as ios18

    return ios16, ios18


@mil_op("constexpr_affine_dequantize")
def affine_dequantize(op: OpCall) -> Array:
    ios16, _ = _defs()
    return np.asarray(ios16.constexpr_affine_dequantize.decompress(
        op.arr("quantized_data"), op.arr("zero_point"), op.arr("scale"),
        int(op.scalar("axis"))))


@mil_op("constexpr_cast")
def constexpr_cast(op: OpCall) -> Array:
    return op.arr("source_val")  # the executor casts to the declared output dtype


@mil_op("constexpr_lut_to_dense")
def lut_to_dense(op: OpCall) -> Array:
    ios16, ios18 = _defs()
    if "shape" in op:  # iOS16: packed uint8 indices and a flat LUT
        return np.asarray(ios16.constexpr_lut_to_dense.decompress(
            op.arr("lut"), op.arr("indices"), op.arr("shape")))
    axis = op.get("vector_axis")
    return np.asarray(ios18.constexpr_lut_to_dense.decompress(
        op.arr("indices"), op.arr("lut"), None if axis is None else axis.item()))


@mil_op("constexpr_sparse_to_dense")
def sparse_to_dense(op: OpCall) -> Array:
    ios16, ios18 = _defs()
    if "shape" in op:  # iOS16: the mask packed in bits
        return np.asarray(ios16.constexpr_sparse_to_dense.decompress(
            op.arr("nonzero_data"), op.arr("mask"), op.arr("shape")))
    return np.asarray(ios18.constexpr_sparse_to_dense.decompress(
        op.arr("nonzero_data"), op.arr("mask")))


@mil_op("constexpr_blockwise_shift_scale")
def blockwise_shift_scale(op: OpCall) -> Array:
    _, ios18 = _defs()
    return np.asarray(ios18.constexpr_blockwise_shift_scale.decompress(
        op.arr("data"), op.arr("scale"), op.get("offset")))


@mil_op("constexpr_lut_to_sparse")
def lut_to_sparse(op: OpCall) -> tuple[Array, Array]:
    _, ios18 = _defs()
    axis = op.get("vector_axis")
    mask, data = ios18.constexpr_lut_to_sparse.decompress(
        op.arr("indices_mask"), op.arr("indices_nonzero_data"), op.arr("lut"),
        None if axis is None else axis.item())
    return np.asarray(mask), np.asarray(data)


@mil_op("constexpr_sparse_blockwise_shift_scale")
def sparse_blockwise_shift_scale(op: OpCall) -> tuple[Array, Array]:
    _, ios18 = _defs()
    mask, data = ios18.constexpr_sparse_blockwise_shift_scale.decompress(
        op.arr("data_mask"), op.arr("nonzero_data"), op.arr("scale"), op.get("offset"))
    return np.asarray(mask), np.asarray(data)


def _per_axis(v: Array, rank: int, axis: int | None) -> Array:
    """A scale or zero point (scalar, or 1-D along `axis`) shaped to broadcast against x."""
    v = v.astype(np.float32)
    if v.ndim == 0 or axis is None:
        return v
    shape = [1] * rank
    shape[int(axis) % rank] = -1
    return v.reshape(shape)


@mil_op("dequantize")
def dequantize(op: OpCall) -> Array:
    x = op.arr("input").astype(np.float32)
    axis, zp = op.scalar("axis"), op.get("zero_point")
    zero = 0 if zp is None else _per_axis(zp, x.ndim, axis)
    return np.asarray((x - zero) * _per_axis(op.arr("scale"), x.ndim, axis))


@mil_op("quantize")
def quantize(op: OpCall) -> Array:
    x = op.arr("input").astype(np.float32)
    axis, zp = op.scalar("axis"), op.get("zero_point")
    q = np.round(x / _per_axis(op.arr("scale"), x.ndim, axis))
    if zp is not None:
        q = q + _per_axis(zp, x.ndim, axis)
    info = np.iinfo(op.dtype)
    return np.clip(q, info.min, info.max)
