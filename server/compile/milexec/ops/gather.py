"""Indexing MIL ops: gather, gather_along_axis, gather_nd, scatter, scatter_along_axis,
scatter_nd (modes update, add, sub, mul, div, max, min). Negative indices count from the
end, as MIL allows."""

from __future__ import annotations

from typing import Any

import numpy as np

from server.compile.milexec.registry import Array, OpCall, mil_op


def _wrap(idx: Array, size: int) -> Array:
    idx = idx.astype(np.int64)
    return np.where(idx < 0, idx + size, idx)


@mil_op("gather")
def gather(op: OpCall) -> Array:
    x, idx = op.arr("x"), op.arr("indices")
    axis = int(op.scalar("axis", 0)) % x.ndim
    batch = int(op.scalar("batch_dims", 0))
    idx = _wrap(idx, x.shape[axis])
    if batch == 0:
        return np.take(x, idx, axis=axis)
    lead = x.shape[:batch]
    xs = x.reshape(-1, *x.shape[batch:])
    ids = idx.reshape(-1, *idx.shape[batch:])
    out = np.stack([np.take(a, i, axis=axis - batch) for a, i in zip(xs, ids, strict=True)])
    return out.reshape(*lead, *out.shape[1:])


@mil_op("gather_along_axis")
def gather_along_axis(op: OpCall) -> Array:
    x = op.arr("x")
    axis = int(op.scalar("axis", 0)) % x.ndim
    return np.take_along_axis(x, _wrap(op.arr("indices"), x.shape[axis]), axis=axis)


def _nd_index(x: Array, idx: Array, batch: int) -> tuple[Any, ...]:
    """Index arrays selecting x[b..., idx[b..., :]] for gather_nd / scatter_nd."""
    depth = idx.shape[-1]
    cols = [_wrap(idx[..., i], x.shape[batch + i]) for i in range(depth)]
    grids = np.meshgrid(*(np.arange(n) for n in idx.shape[:batch]), indexing="ij") \
        if batch else []
    extra = (1,) * (idx.ndim - 1 - batch)
    return (*(g.reshape(g.shape + extra) for g in grids), *cols)


@mil_op("gather_nd")
def gather_nd(op: OpCall) -> Array:
    x, idx = op.arr("x"), op.arr("indices")
    return np.asarray(x[_nd_index(x, idx, int(op.scalar("batch_dims", 0)))])


_MODES: dict[str, Any] = {"add": np.add, "sub": np.subtract, "mul": np.multiply,
                          "div": np.divide, "max": np.maximum, "min": np.minimum}


def _scatter(op: OpCall, data: Array, index: tuple[Any, ...], updates: Array) -> Array:
    out = data.copy()
    mode = str(op.scalar("mode", "add"))
    if mode == "update":
        out[index] = updates
        return out
    if mode not in _MODES:
        raise op.unsupported(f"scatter mode {mode!r}")
    _MODES[mode].at(out, index, updates)
    return out


@mil_op("scatter")
def scatter(op: OpCall) -> Array:
    data, idx, upd = op.arr("data"), op.arr("indices"), op.arr("updates")
    axis = int(op.scalar("axis", 0)) % data.ndim
    index: list[slice | Array] = [slice(None)] * data.ndim
    index[axis] = _wrap(idx, data.shape[axis])
    # one advanced index in place: data[index] has MIL's updates shape
    return _scatter(op, data, tuple(index), upd)


@mil_op("scatter_along_axis")
def scatter_along_axis(op: OpCall) -> Array:
    data, idx, upd = op.arr("data"), op.arr("indices"), op.arr("updates")
    axis = int(op.scalar("axis", 0)) % data.ndim
    grids = list(np.meshgrid(*(np.arange(n) for n in idx.shape), indexing="ij"))
    grids[axis] = _wrap(idx, data.shape[axis])
    return _scatter(op, data, tuple(grids), upd)


@mil_op("scatter_nd")
def scatter_nd(op: OpCall) -> Array:
    data, idx, upd = op.arr("data"), op.arr("indices"), op.arr("updates")
    return _scatter(op, data, _nd_index(data, idx, 0), upd)
