"""Reductions, softmax and normalisations, accumulated in float32 (rounded once to the
declared dtype by the executor): reduce_*, reduce_argmax/argmin, softmax, batch_norm,
instance_norm, layer_norm, l2_norm, local_response_norm, cumsum."""

from __future__ import annotations

from typing import Any

import numpy as np

from server.compile.milexec.ops.linear import wide
from server.compile.milexec.registry import Array, OpCall, mil_op


def _axes(op: OpCall, x: Array) -> tuple[int, ...]:
    axes = op.ints("axes")
    return tuple(range(x.ndim)) if axes is None else tuple(a % max(x.ndim, 1) for a in axes)


_REDUCE: dict[str, Any] = {
    "reduce_sum": lambda x, a, k: np.sum(x, axis=a, keepdims=k),
    "reduce_mean": lambda x, a, k: np.mean(x, axis=a, keepdims=k),
    "reduce_max": lambda x, a, k: np.max(x, axis=a, keepdims=k),
    "reduce_min": lambda x, a, k: np.min(x, axis=a, keepdims=k),
    "reduce_prod": lambda x, a, k: np.prod(x, axis=a, keepdims=k),
    "reduce_l1_norm": lambda x, a, k: np.sum(np.abs(x), axis=a, keepdims=k),
    "reduce_l2_norm": lambda x, a, k: np.sqrt(np.sum(x * x, axis=a, keepdims=k)),
    "reduce_sum_square": lambda x, a, k: np.sum(x * x, axis=a, keepdims=k),
    "reduce_log_sum": lambda x, a, k: np.log(np.sum(x, axis=a, keepdims=k)),
    "reduce_log_sum_exp": lambda x, a, k: _logsumexp(x, a, k),
}


def _logsumexp(x: Array, axes: tuple[int, ...], keep: bool) -> Array:
    m = np.max(x, axis=axes, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    out = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
    return np.asarray(out if keep else np.squeeze(out, axis=axes))


@mil_op(*_REDUCE)
def reduce(op: OpCall) -> Array:
    x = wide(op.arr("x"))
    return np.asarray(_REDUCE[op.type](x, _axes(op, x), bool(op.scalar("keep_dims", False))))


@mil_op("reduce_argmax", "reduce_argmin")
def arg_reduce(op: OpCall) -> Array:
    x = op.arr("x")
    axis = int(op.scalar("axis", -1))
    fn = np.argmax if op.type == "reduce_argmax" else np.argmin
    return np.asarray(fn(x, axis=axis, keepdims=bool(op.scalar("keep_dims", False))))


@mil_op("softmax")
def softmax(op: OpCall) -> Array:
    x = wide(op.arr("x"))
    axis = int(op.scalar("axis", -1))
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return np.asarray(e / np.sum(e, axis=axis, keepdims=True))


def _channel(v: Array, rank: int) -> Array:
    return wide(v).reshape(1, -1, *([1] * (rank - 2)))


@mil_op("batch_norm")
def batch_norm(op: OpCall) -> Array:
    x = wide(op.arr("x"))
    eps = float(op.scalar("epsilon", 1e-5))
    out = (x - _channel(op.arr("mean"), x.ndim)) / np.sqrt(
        _channel(op.arr("variance"), x.ndim) + eps)
    if "gamma" in op:
        out = out * _channel(op.arr("gamma"), x.ndim)
    if "beta" in op:
        out = out + _channel(op.arr("beta"), x.ndim)
    return out


def _normalize(x: Array, axes: tuple[int, ...], eps: float) -> Array:
    mean = np.mean(x, axis=axes, keepdims=True)
    var = np.mean(np.square(x - mean), axis=axes, keepdims=True)
    return np.asarray((x - mean) / np.sqrt(var + eps))


@mil_op("instance_norm")
def instance_norm(op: OpCall) -> Array:
    x = wide(op.arr("x"))
    out = _normalize(x, tuple(range(2, x.ndim)), float(op.scalar("epsilon", 1e-5)))
    if "gamma" in op:
        out = out * _channel(op.arr("gamma"), x.ndim)
    if "beta" in op:
        out = out + _channel(op.arr("beta"), x.ndim)
    return out


@mil_op("layer_norm")
def layer_norm(op: OpCall) -> Array:
    x = wide(op.arr("x"))
    axes = _axes(op, x)
    out = _normalize(x, axes, float(op.scalar("epsilon", 1e-5)))
    # gamma / beta have the shape of x over `axes` (MIL: the normalised dims, in order)
    shape = [x.shape[i] if i in axes else 1 for i in range(x.ndim)]
    if "gamma" in op:
        out = out * wide(op.arr("gamma")).reshape(shape)
    if "beta" in op:
        out = out + wide(op.arr("beta")).reshape(shape)
    return out


@mil_op("l2_norm")
def l2_norm(op: OpCall) -> Array:
    x = wide(op.arr("x"))
    eps = float(op.scalar("epsilon", 1e-6))
    # MIL: over the last three dims, the leading ones are batch (rank 3: all elements)
    axes = tuple(range(max(x.ndim - 3, 0), x.ndim))
    return np.asarray(x / np.sqrt(np.sum(x * x, axis=axes, keepdims=True) + eps))


@mil_op("local_response_norm")
def local_response_norm(op: OpCall) -> Array:
    x = wide(op.arr("x"))
    size = int(op.scalar("size"))
    alpha, beta, k = (float(op.scalar(n, d)) for n, d in
                      (("alpha", 1e-4), ("beta", 0.75), ("k", 1.0)))
    sq = np.square(x)
    lo, hi = (size - 1) // 2, size // 2
    padded = np.pad(sq, [(0, 0), (lo, hi), *([(0, 0)] * (x.ndim - 2))])
    window = sum(padded[:, i:i + x.shape[1]] for i in range(size))
    return x / np.power(k + alpha / size * window, beta)


@mil_op("cumsum")
def cumsum(op: OpCall) -> Array:
    x = wide(op.arr("x"))
    axis = int(op.scalar("axis", 0))
    if op.scalar("reverse", False):
        x = np.flip(x, axis)
    out = np.cumsum(x, axis=axis)
    if op.scalar("exclusive", False):
        out = out - x
    return np.flip(out, axis) if op.scalar("reverse", False) else out
