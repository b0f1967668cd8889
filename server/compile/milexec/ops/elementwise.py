"""Elementwise MIL ops: binary arithmetic and comparisons (numpy broadcasting, as MIL's),
unary math and activations. Each computes from its inputs' own dtype (float16 arithmetic in
numpy is float16 in, one rounding out) or, for composite activations, in float32 and is
rounded once to the declared output dtype by the executor."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from server.compile.milexec.registry import Array, OpCall, mil_op

_BINARY: dict[str, Any] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "pow": np.power,
    "maximum": np.maximum, "minimum": np.minimum,
    "equal": np.equal, "not_equal": np.not_equal, "less": np.less, "less_equal": np.less_equal,
    "greater": np.greater, "greater_equal": np.greater_equal,
    "logical_and": np.logical_and, "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
}


@mil_op(*_BINARY)
def binary(op: OpCall) -> Array:
    x, y = op.arr("x"), op.arr("y")
    if op.type == "pow" and x.dtype.kind == "i" and y.dtype.kind == "i":
        return np.power(x.astype(np.int64), y.astype(np.int64))
    return np.asarray(_BINARY[op.type](x, y))


@mil_op("real_div")
def real_div(op: OpCall) -> Array:
    x, y = op.arr("x"), op.arr("y")
    if op.dtype.kind == "i":  # integer division as Core ML does it: the quotient truncated
        return np.trunc(np.true_divide(x, y))
    return np.true_divide(x, y)


@mil_op("floor_div")
def floor_div(op: OpCall) -> Array:
    return np.floor_divide(op.arr("x"), op.arr("y"))


@mil_op("mod")
def mod(op: OpCall) -> Array:
    return np.mod(op.arr("x"), op.arr("y"))  # Python's %: the sign of the divisor


@mil_op("select")
def select(op: OpCall) -> Array:
    return np.where(op.arr("cond").astype(bool), op.arr("a"), op.arr("b"))


def _f32(x: Array) -> Array:
    return x.astype(np.float32) if x.dtype == np.float16 else x


def _erf(x: Array) -> Array:
    """erf in float64 from Numerical Recipes' erfc Chebyshev fit (absolute error < 1.2e-7,
    float32's epsilon; math.erf per element is 40× slower on a transformer's GELUs)."""
    z = np.abs(x.astype(np.float64))
    t = 1 / (1 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (
        0.09678418 + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (
            1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    return np.asarray(np.sign(x) * (1 - t * np.exp(poly)))

_UNARY: dict[str, Any] = {
    "abs": np.abs, "acos": np.arccos, "asin": np.arcsin, "atan": np.arctan,
    "atanh": np.arctanh, "ceil": np.ceil, "cos": np.cos, "cosh": np.cosh, "exp": np.exp,
    "exp2": np.exp2, "floor": np.floor, "sign": np.sign, "sin": np.sin, "sinh": np.sinh,
    "sqrt": np.sqrt, "square": np.square, "tan": np.tan, "tanh": np.tanh,
    "logical_not": np.logical_not, "identity": lambda x: x,
    "round": np.round,  # MIL's value inference: numpy's round (half to even)
    "erf": _erf,
    "relu": lambda x: np.maximum(x, 0),
    "relu6": lambda x: np.clip(x, 0, 6),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "softplus": lambda x: np.logaddexp(0, x),
    "softsign": lambda x: x / (1 + np.abs(x)),
}


@mil_op(*_UNARY)
def unary(op: OpCall) -> Array:
    x = op.arr("x")
    return np.asarray(_UNARY[op.type](_f32(x) if x.dtype.kind == "f" else x))


@mil_op("inverse", "log", "rsqrt")
def with_epsilon(op: OpCall) -> Array:
    x = _f32(op.arr("x"))
    eps = op.scalar("epsilon", {"inverse": 1e-4, "log": 1e-45, "rsqrt": 1e-12}[op.type])
    if op.type == "inverse":
        return np.asarray(1 / (x + eps))
    if op.type == "log":
        return np.asarray(np.log(x + eps))
    return np.asarray(1 / np.sqrt(x + eps))


@mil_op("clip")
def clip(op: OpCall) -> Array:
    return np.minimum(np.maximum(op.arr("x"), op.arr("alpha")), op.arr("beta"))


@mil_op("leaky_relu", "elu", "thresholded_relu", "threshold", "clamped_relu",
        "linear_activation", "scaled_tanh", "sigmoid_hard", "softplus_parametric", "prelu")
def parametric(op: OpCall) -> Array:
    x = _f32(op.arr("x"))
    a = _f32(op.arr("alpha"))
    b = _f32(op.get("beta", np.float32(0)))
    if op.type == "leaky_relu":
        return np.where(x >= 0, x, a * x)
    if op.type == "elu":
        return np.where(x > 0, x, a * (np.exp(x) - 1))
    if op.type == "thresholded_relu":
        return np.where(x > a, x, 0)
    if op.type == "threshold":
        return np.maximum(x, a)
    if op.type == "clamped_relu":
        return np.minimum(np.where(x >= 0, x, a * x), b)
    if op.type == "linear_activation":
        return a * x + b
    if op.type == "scaled_tanh":
        return np.asarray(a * np.tanh(b * x))
    if op.type == "sigmoid_hard":
        return np.asarray(np.clip(a * x + b, 0, 1))
    channel = (1, -1, *([1] * (x.ndim - 2)))  # per-channel alpha/beta on axis 1
    if op.type == "softplus_parametric":
        return np.asarray(a.reshape(channel) * np.logaddexp(0, b.reshape(channel) * x))
    return np.where(x >= 0, x, a.reshape(channel) * x)  # prelu


@mil_op("gelu")
def gelu(op: OpCall) -> Array:
    x = _f32(op.arr("x"))
    mode = op.scalar("mode", "EXACT")
    if mode == "EXACT":
        return np.asarray((0.5 * x * (1 + _erf(x / math.sqrt(2)))).astype(x.dtype))
    if mode == "TANH_APPROXIMATION":
        return np.asarray(0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))))
    if mode == "SIGMOID_APPROXIMATION":
        return np.asarray(x / (1 + np.exp(-1.702 * x)))
    raise op.unsupported(f"gelu mode {mode!r}")


@mil_op("cast")
def cast(op: OpCall) -> Array:
    x = op.arr("x")
    if op.dtype.kind in "iu" and x.dtype.kind == "f":
        return np.trunc(x)  # the executor converts to the declared integer dtype
    return x
