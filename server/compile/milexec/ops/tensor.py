"""Shape and layout MIL ops: reshape, transpose, squeeze, expand_dims, concat, stack, split,
slice_by_index / slice_by_size / slice_update, tile, pad, reverse, shape, fill, range_1d,
flatten2d, band_part, topk, argsort, one_hot, non_zero, depth_to_space and friends.
None of them does arithmetic, so none changes a value's precision."""

from __future__ import annotations

import numpy as np

from server.compile.milexec.registry import Array, OpCall, mil_op


@mil_op("reshape")
def reshape(op: OpCall) -> Array:
    x = op.arr("x")
    shape = op.ints("shape") or []
    shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]  # 0: copy (iOS17)
    return x.reshape(shape)


@mil_op("reshape_like")
def reshape_like(op: OpCall) -> Array:
    return op.arr("x").reshape(op.out_shapes[0] or ())


@mil_op("transpose")
def transpose(op: OpCall) -> Array:
    return np.transpose(op.arr("x"), op.ints("perm"))


@mil_op("squeeze")
def squeeze(op: OpCall) -> Array:
    x = op.arr("x")
    axes = op.ints("axes")
    return np.squeeze(x) if axes is None else np.squeeze(x, axis=tuple(axes))


@mil_op("expand_dims")
def expand_dims(op: OpCall) -> Array:
    x = op.arr("x")
    axes = op.ints("axes") or []
    rank = x.ndim + len(axes)
    return np.expand_dims(x, tuple(sorted(a % rank for a in axes)))


@mil_op("concat")
def concat(op: OpCall) -> Array:
    values = [np.asarray(v) for v in op.inputs["values"]]
    axis = int(op.scalar("axis"))
    if not op.scalar("interleave", False):
        return np.concatenate(values, axis=axis)
    stacked = np.stack(values, axis=axis + 1 if axis >= 0 else axis)
    shape = list(values[0].shape)
    shape[axis] = -1
    return stacked.reshape(shape)


@mil_op("stack")
def stack(op: OpCall) -> Array:
    return np.stack([np.asarray(v) for v in op.inputs["values"]], axis=int(op.scalar("axis")))


@mil_op("split")
def split(op: OpCall) -> tuple[Array, ...]:
    x = op.arr("x")
    axis = int(op.scalar("axis"))
    sizes = op.ints("split_sizes")
    if sizes is None:
        n = int(op.scalar("num_splits"))
        step = -(-x.shape[axis] // n)  # MIL: the last piece may be smaller
        sizes = [min(step, x.shape[axis] - i * step) for i in range(n)]
    return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


def _index_slices(op: OpCall, x: Array) -> tuple[tuple[slice | int, ...], list[int]]:
    from coremltools.converters.mil.mil.ops.defs._utils import (
        get_squeeze_axes,
        solve_slice_by_index_slice,
    )

    squeeze_mask = op.get("squeeze_mask")
    slices = solve_slice_by_index_slice(
        x.shape, op.arr("begin"), op.arr("end"), op.get("stride"), op.get("begin_mask"),
        op.get("end_mask"), squeeze_mask)
    return tuple(slices), list(get_squeeze_axes(squeeze_mask, x.ndim))


@mil_op("slice_by_index")
def slice_by_index(op: OpCall) -> Array:
    x = op.arr("x")
    slices, squeeze_axes = _index_slices(op, x)
    out = x[slices]
    return np.squeeze(out, axis=tuple(squeeze_axes)) if squeeze_axes else out


@mil_op("slice_update")
def slice_update(op: OpCall) -> Array:
    x = op.arr("x").copy()
    slices, squeeze_axes = _index_slices(op, x)
    update = op.arr("update")
    if squeeze_axes:
        update = np.expand_dims(update, tuple(squeeze_axes))
    x[slices] = update.reshape(x[slices].shape)
    return x


@mil_op("slice_by_size")
def slice_by_size(op: OpCall) -> Array:
    x = op.arr("x")
    begin, size = op.ints("begin") or [], op.ints("size") or []
    return x[tuple(slice(b, x.shape[i] if s == -1 else b + s)
                   for i, (b, s) in enumerate(zip(begin, size, strict=True)))]


@mil_op("tile")
def tile(op: OpCall) -> Array:
    return np.tile(op.arr("x"), op.ints("reps") or [])


@mil_op("pad")
def pad(op: OpCall) -> Array:
    x = op.arr("x")
    p = op.ints("pad") or []
    p = [0] * (2 * x.ndim - len(p)) + p  # pads cover the last len(pad)/2 dims
    widths = [(p[2 * i], p[2 * i + 1]) for i in range(x.ndim)]
    mode = op.scalar("mode", "constant")
    if mode == "constant":
        return np.pad(x, widths, constant_values=op.scalar("constant_val", 0.0))
    if mode in ("reflect", "replicate"):
        return np.pad(x, widths, mode="edge" if mode == "replicate" else "reflect")
    raise op.unsupported(f"pad mode {mode!r}")


@mil_op("reverse")
def reverse(op: OpCall) -> Array:
    x = op.arr("x")
    axes = op.ints("axes")
    return np.flip(x, axis=None if axes is None else tuple(axes))


@mil_op("shape")
def shape(op: OpCall) -> Array:
    return np.asarray(op.arr("x").shape, np.int32)


@mil_op("fill")
def fill(op: OpCall) -> Array:
    return np.full(op.ints("shape") or [], op.scalar("value", 0.0))


@mil_op("fill_like")
def fill_like(op: OpCall) -> Array:
    return np.full(op.arr("ref_tensor").shape, op.scalar("value", 0.0))


@mil_op("range_1d")
def range_1d(op: OpCall) -> Array:
    return np.arange(op.scalar("start"), op.scalar("end"), op.scalar("step"))


@mil_op("flatten2d")
def flatten2d(op: OpCall) -> Array:
    x = op.arr("x")
    axis = int(op.scalar("axis", 1)) % max(x.ndim, 1)
    return x.reshape(int(np.prod(x.shape[:axis])), -1)


@mil_op("band_part")
def band_part(op: OpCall) -> Array:
    x = op.arr("x")
    lower, upper = int(op.scalar("lower", -1)), int(op.scalar("upper", -1))
    m, n = x.shape[-2:]
    i, j = np.arange(m)[:, None], np.arange(n)[None, :]
    keep = ((lower < 0) | (i - j <= lower)) & ((upper < 0) | (j - i <= upper))
    return np.where(keep, x, np.zeros((), x.dtype))


@mil_op("topk")
def topk(op: OpCall) -> Array | tuple[Array, ...]:
    x = op.arr("x")
    axis, k = int(op.scalar("axis", -1)), int(op.scalar("k", 1))
    asc = bool(op.scalar("ascending", False))
    order = np.argsort(x if asc else -x, axis=axis, kind="stable")
    idx = np.take(order, np.arange(min(k, x.shape[axis])) if k >= 0 else
                  np.arange(x.shape[axis]), axis=axis)
    values = np.take_along_axis(x, idx, axis=axis)
    if not op.scalar("return_indices", True):
        return values
    return values, idx


@mil_op("argsort")
def argsort(op: OpCall) -> Array:
    x = op.arr("x")
    asc = bool(op.scalar("ascending", False))
    return np.argsort(x if asc else -x, axis=int(op.scalar("axis", -1)), kind="stable")


@mil_op("one_hot")
def one_hot(op: OpCall) -> Array:
    idx = op.arr("indices")
    depth = int(op.scalar("one_hot_vector_size"))
    axis = int(op.scalar("axis", -1))
    hot = np.arange(depth) == idx[..., None]
    out = np.where(hot, op.scalar("on_value", 1), op.scalar("off_value", 0))
    return np.moveaxis(out, -1, axis % (idx.ndim + 1))


@mil_op("non_zero")
def non_zero(op: OpCall) -> Array:
    return np.transpose(np.nonzero(op.arr("x")))


def _block(op: OpCall) -> int:
    for key in ("block_size", "upscale_factor", "downscale_factor"):
        if key in op:
            return int(op.scalar(key))
    raise op.unsupported("no block size")


@mil_op("depth_to_space", "pixel_shuffle")
def depth_to_space(op: OpCall) -> Array:
    x, b = op.arr("x"), _block(op)
    n, c, h, w = x.shape
    # depth_to_space is DCR ordering (TF); pixel_shuffle is CRD (PyTorch)
    if op.type == "depth_to_space":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


@mil_op("space_to_depth", "pixel_unshuffle")
def space_to_depth(op: OpCall) -> Array:
    x, b = op.arr("x"), _block(op)
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b)
    if op.type == "space_to_depth":
        y = y.transpose(0, 3, 5, 1, 2, 4)
    else:
        y = y.transpose(0, 1, 3, 5, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


@mil_op("sliding_windows")
def sliding_windows(op: OpCall) -> Array:
    x = op.arr("x")
    axis, size = int(op.scalar("axis")) % x.ndim, int(op.scalar("size"))
    stride = int(op.scalar("stride", 1))
    win = np.lib.stride_tricks.sliding_window_view(x, size, axis=axis)
    win = np.take(win, np.arange(0, win.shape[axis], stride), axis=axis)
    return np.moveaxis(win, -1, axis + 1)
