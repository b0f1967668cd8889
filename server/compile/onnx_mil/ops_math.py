"""Rules for elementwise math, activations, comparisons, casts and reductions.

Each ONNX op maps to the MIL op of the same meaning (Add → add, PRelu → prelu, Max → maximum,
LeakyRelu → leaky_relu, …); where MIL has no single op the rule composes the op's defining
formula from elementwise MIL ops (Celu, Selu, HardSwish, Mish), never a different operator.
"""

from __future__ import annotations

from functools import reduce
from typing import Any

import numpy as np
from coremltools.converters.mil import Builder as mb

from server.compile.onnx_mil.context import NodeContext, dtype_of, is_const, mil_dtype, shape_of
from server.compile.onnx_mil.registry import Outputs, onnx_op

_BINARY = {"Add": mb.add, "Sub": mb.sub, "Mul": mb.mul, "Pow": mb.pow,
           "Equal": mb.equal, "Greater": mb.greater, "Less": mb.less,
           "GreaterOrEqual": mb.greater_equal, "LessOrEqual": mb.less_equal,
           "And": mb.logical_and, "Or": mb.logical_or, "Xor": mb.logical_xor}


def _pair(ctx: NodeContext) -> tuple[Any, Any]:
    a, b = ctx.raw(0), ctx.raw(1)
    if is_const(a) and not is_const(b):
        return ctx.as_var(ctx.like(a, b)), b
    va = ctx.as_var(a)
    return va, ctx.as_var(ctx.like(b, va))


@onnx_op(*_BINARY)
def binary(ctx: NodeContext) -> Outputs:
    x, y = _pair(ctx)
    op = ctx.node.op_type
    if op == "Pow" and dtype_of(x) == np.int32:
        x = ctx.as_var(x, np.float32)
        y = ctx.as_var(y, np.float32)
        return [mb.cast(x=mb.pow(x=x, y=y, name=ctx.tmp()), dtype="int32", name=ctx.name())]
    return [_BINARY[op](x=x, y=y, name=ctx.name())]


@onnx_op("Div")
def div(ctx: NodeContext) -> Outputs:
    x, y = _pair(ctx)
    if dtype_of(x) == np.int32:  # ONNX integer Div truncates toward zero
        q = mb.real_div(x=ctx.as_var(x, np.float32), y=ctx.as_var(y, np.float32),
                        name=ctx.tmp())
        t = mb.mul(x=mb.sign(x=q, name=ctx.tmp()),
                   y=mb.floor(x=mb.abs(x=q, name=ctx.tmp()), name=ctx.tmp()), name=ctx.tmp())
        return [mb.cast(x=t, dtype="int32", name=ctx.name())]
    return [mb.real_div(x=x, y=y, name=ctx.name())]


@onnx_op("Mod")
def mod(ctx: NodeContext) -> Outputs:
    x, y = _pair(ctx)
    if ctx.attr("fmod", 0) and dtype_of(x) != np.int32:
        # fmod: the remainder has the dividend's sign: x - trunc(x / y) * y
        q = mb.real_div(x=x, y=y, name=ctx.tmp())
        t = mb.mul(x=mb.sign(x=q, name=ctx.tmp()),
                   y=mb.floor(x=mb.abs(x=q, name=ctx.tmp()), name=ctx.tmp()), name=ctx.tmp())
        return [mb.sub(x=x, y=mb.mul(x=t, y=y, name=ctx.tmp()), name=ctx.name())]
    if ctx.attr("fmod", 0):  # integers: x - trunc(x / y) * y, the quotient in float32
        q = mb.real_div(x=ctx.as_var(x, np.float32), y=ctx.as_var(y, np.float32),
                        name=ctx.tmp())
        t = mb.cast(x=mb.mul(x=mb.sign(x=q, name=ctx.tmp()),
                             y=mb.floor(x=mb.abs(x=q, name=ctx.tmp()), name=ctx.tmp()),
                             name=ctx.tmp()), dtype="int32", name=ctx.tmp())
        return [mb.sub(x=x, y=mb.mul(x=t, y=y, name=ctx.tmp()), name=ctx.name())]
    return [mb.mod(x=x, y=y, name=ctx.name())]


@onnx_op("Max", "Min", "Sum", "Mean")
def variadic(ctx: NodeContext) -> Outputs:
    op = {"Max": mb.maximum, "Min": mb.minimum, "Sum": mb.add, "Mean": mb.add}[
        ctx.node.op_type]
    vals = [ctx.raw(i) for i in range(ctx.n_inputs)]
    ref = next((v for v in vals if not is_const(v)), vals[0])
    vs = [ctx.as_var(ctx.like(v, ref)) for v in vals]
    if len(vs) == 1:
        out = mb.identity(x=vs[0], name=ctx.tmp())
    else:
        out = reduce(lambda a, b: op(x=a, y=b, name=ctx.tmp()), vs)
    if ctx.node.op_type == "Mean":
        out = mb.real_div(x=out, y=np.array(len(vs), dtype_of(out)), name=ctx.tmp())
    return [mb.identity(x=out, name=ctx.name())]


_UNARY = {"Abs": mb.abs, "Acos": mb.acos, "Asin": mb.asin, "Atan": mb.atan, "Atanh": mb.atanh,
          "Ceil": mb.ceil, "Cos": mb.cos, "Cosh": mb.cosh, "Erf": mb.erf, "Exp": mb.exp,
          "Floor": mb.floor, "Log": mb.log, "Not": mb.logical_not, "Relu": mb.relu,
          "Sigmoid": mb.sigmoid, "Sign": mb.sign, "Sin": mb.sin, "Sinh": mb.sinh,
          "Softsign": mb.softsign, "Sqrt": mb.sqrt, "Tan": mb.tan, "Tanh": mb.tanh,
          "Reciprocal": mb.inverse, "Identity": mb.identity, "Softplus": mb.softplus}


@onnx_op(*_UNARY)
def unary(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    op = ctx.node.op_type
    if op in ("Abs", "Sign", "Relu") and dtype_of(x) == np.int32:
        f = mb.cast(x=x, dtype="fp32", name=ctx.tmp())
        return [mb.cast(x=_UNARY[op](x=f, name=ctx.tmp()), dtype="int32", name=ctx.name())]
    if op == "Reciprocal":
        return [mb.inverse(x=x, epsilon=np.array(0.0, dtype_of(x)), name=ctx.name())]
    return [_UNARY[op](x=x, name=ctx.name())]


@onnx_op("IsNaN")
def is_nan(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    return [mb.not_equal(x=x, y=x, name=ctx.name())]  # NaN is the one value unequal to itself


@onnx_op("IsInf")
def is_inf(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    pos, neg = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    if pos and neg:
        return [mb.equal(x=mb.abs(x=x, name=ctx.tmp()), y=np.array(np.inf, dtype_of(x)),
                         name=ctx.name())]
    if not pos and not neg:
        return [np.zeros(shape_of(x), np.bool_)]
    return [mb.equal(x=x, y=np.array(np.inf if pos else -np.inf, dtype_of(x)),
                     name=ctx.name())]


@onnx_op("Neg")
def neg(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    return [mb.mul(x=x, y=np.array(-1, dtype_of(x)), name=ctx.name())]


@onnx_op("Round")
def round_(ctx: NodeContext) -> Outputs:
    return [mb.round(x=ctx.var(0), name=ctx.name())]  # MIL round: half to even, as ONNX


@onnx_op("Acosh", "Asinh")
def inverse_hyperbolic(ctx: NodeContext) -> Outputs:
    # acosh(x) = log(x + sqrt(x² - 1)); asinh(x) = log(x + sqrt(x² + 1)): their definitions.
    x = ctx.var(0)
    one = np.array(-1.0 if ctx.node.op_type == "Acosh" else 1.0, dtype_of(x))
    r = mb.sqrt(x=mb.add(x=mb.mul(x=x, y=x, name=ctx.tmp()), y=one, name=ctx.tmp()),
                name=ctx.tmp())
    return [mb.log(x=mb.add(x=x, y=r, name=ctx.tmp()), name=ctx.name())]


def _f(ctx: NodeContext, name: str, default: float, like: Any = None) -> Any:
    """Attribute `name` as a scalar in the dtype of `like` (input 0 when omitted)."""
    return np.array(ctx.attr(name, default), dtype_of(ctx.raw(0) if like is None else like))


@onnx_op("LeakyRelu")
def leaky_relu(ctx: NodeContext) -> Outputs:
    return [mb.leaky_relu(x=ctx.var(0), alpha=_f(ctx, "alpha", 0.01), name=ctx.name())]


@onnx_op("Elu")
def elu(ctx: NodeContext) -> Outputs:
    return [mb.elu(x=ctx.var(0), alpha=_f(ctx, "alpha", 1.0), name=ctx.name())]


@onnx_op("ThresholdedRelu")
def thresholded_relu(ctx: NodeContext) -> Outputs:
    return [mb.thresholded_relu(x=ctx.var(0), alpha=_f(ctx, "alpha", 1.0), name=ctx.name())]


@onnx_op("HardSigmoid")
def hard_sigmoid(ctx: NodeContext) -> Outputs:
    return [mb.sigmoid_hard(x=ctx.var(0), alpha=_f(ctx, "alpha", 0.2),
                            beta=_f(ctx, "beta", 0.5), name=ctx.name())]


@onnx_op("HardSwish")
def hard_swish(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    hs = mb.sigmoid_hard(x=x, alpha=np.array(1 / 6, dtype_of(x)),
                         beta=np.array(0.5, dtype_of(x)), name=ctx.tmp())
    return [mb.mul(x=x, y=hs, name=ctx.name())]


@onnx_op("Selu")
def selu(ctx: NodeContext) -> Outputs:
    alpha, gamma = _f(ctx, "alpha", 1.67326319217681884765625), _f(
        ctx, "gamma", 1.05070102214813232421875)
    e = mb.elu(x=ctx.var(0), alpha=alpha, name=ctx.tmp())
    return [mb.mul(x=e, y=gamma, name=ctx.name())]


@onnx_op("Celu")
def celu(ctx: NodeContext) -> Outputs:
    # max(0, x) + min(0, alpha * (exp(x / alpha) - 1)) == elu(x / alpha) * alpha
    alpha = _f(ctx, "alpha", 1.0)
    x = ctx.var(0)
    e = mb.elu(x=mb.real_div(x=x, y=alpha, name=ctx.tmp()), alpha=np.array(1, dtype_of(x)),
               name=ctx.tmp())
    return [mb.mul(x=e, y=alpha, name=ctx.name())]


@onnx_op("Mish")
def mish(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    t = mb.tanh(x=mb.softplus(x=x, name=ctx.tmp()), name=ctx.tmp())
    return [mb.mul(x=x, y=t, name=ctx.name())]


@onnx_op("Swish", since=24)
def swish(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    alpha = _f(ctx, "alpha", 1.0)
    s = mb.sigmoid(x=mb.mul(x=x, y=alpha, name=ctx.tmp()), name=ctx.tmp())
    return [mb.mul(x=x, y=s, name=ctx.name())]


@onnx_op("Gelu", since=20)
def gelu(ctx: NodeContext) -> Outputs:
    mode = "TANH_APPROXIMATION" if ctx.attr("approximate", "none") == "tanh" else "EXACT"
    return [mb.gelu(x=ctx.var(0), mode=mode, name=ctx.name())]


@onnx_op("PRelu")
def prelu(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    slope = ctx.raw(1)
    rank = len(shape_of(x))
    if is_const(slope) and rank >= 3 and 1 <= np.ndim(slope) <= rank:
        c = shape_of(x)[1]
        try:  # MIL prelu: one slope per channel (axis 1) of a rank ≥ 3 input
            per_channel = np.broadcast_to(np.asarray(slope, dtype_of(x)),
                                          (1, c) + (1,) * (rank - 2))
        except ValueError:
            per_channel = None
        if per_channel is not None and np.broadcast_shapes(np.shape(slope), shape_of(x)) == \
                shape_of(x):
            return [mb.prelu(x=x, alpha=per_channel.reshape(c).copy(), name=ctx.name())]
    # Any other slope shape: PRelu's definition, max(0, x) + slope * min(0, x).
    sv = ctx.as_var(ctx.like(slope, x))
    zero = np.array(0, dtype_of(x))
    pos = mb.maximum(x=x, y=zero, name=ctx.tmp())
    negp = mb.mul(x=mb.minimum(x=x, y=zero, name=ctx.tmp()), y=sv, name=ctx.tmp())
    return [mb.add(x=pos, y=negp, name=ctx.name())]


@onnx_op("Clip")
def clip(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    if ctx.opset < 11:
        lo, hi = ctx.attr("min"), ctx.attr("max")
    else:
        lo = None if not ctx.has(1) else ctx.raw(1)
        hi = None if not ctx.has(2) else ctx.raw(2)
    out = x
    if lo is not None:
        out = mb.maximum(x=out, y=ctx.as_var(ctx.like(np.asarray(lo) if isinstance(
            lo, (float, int)) else lo, x)), name=ctx.tmp())
    if hi is not None:
        out = mb.minimum(x=out, y=ctx.as_var(ctx.like(np.asarray(hi) if isinstance(
            hi, (float, int)) else hi, x)), name=ctx.tmp())
    return [mb.identity(x=out, name=ctx.name())]


@onnx_op("Where")
def where(ctx: NodeContext) -> Outputs:
    a, b = ctx.raw(1), ctx.raw(2)
    ref = b if is_const(a) and not is_const(b) else a
    cond = ctx.var(0, np.bool_)
    out = np.broadcast_shapes(shape_of(cond), shape_of(a), shape_of(b))
    if np.broadcast_shapes(shape_of(a), shape_of(b)) != out:
        # MIL select takes its output shape from a and b: widen a to the condition's shape
        a = np.broadcast_to(ctx.like(a, ref), out).copy() if is_const(a) else _widen(ctx, a, out)
    va = ctx.as_var(ctx.like(a, ref))
    vb = ctx.as_var(ctx.like(b, va))
    return [mb.select(cond=cond, a=va, b=vb, name=ctx.name())]


def _widen(ctx: NodeContext, v: Any, out: tuple[int, ...]) -> Any:
    s = shape_of(v)
    padded = (1,) * (len(out) - len(s)) + s
    if padded != s:
        v = mb.reshape(x=v, shape=list(padded), name=ctx.tmp())
    return mb.tile(x=v, reps=[o // p for o, p in zip(out, padded, strict=True)], name=ctx.tmp())


_CAST = {1: np.float32, 10: np.float16, 6: np.int32, 7: np.int32, 9: np.bool_,
         2: np.int32, 3: np.int32, 4: np.int32, 5: np.int32, 12: np.int32, 13: np.int32}


@onnx_op("Cast", "CastLike")
def cast(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    if ctx.node.op_type == "CastLike":
        target = dtype_of(ctx.raw(1))
    else:
        to = int(ctx.attr("to"))
        if to not in _CAST:
            ctx.fail(f"cast to ONNX type {to} ({_type_name(to)}): Core ML computes in "
                     "float32, float16, int32 and bool only")
        target = np.dtype(_CAST[to])
    if dtype_of(x) == target:
        return [mb.identity(x=x, name=ctx.name())]
    if target == np.int32 and dtype_of(x).kind == "f":
        # ONNX float → int truncates toward zero; MIL cast does too.
        pass
    return [mb.cast(x=x, dtype=mil_dtype(target), name=ctx.name())]


def _type_name(to: int) -> str:
    import onnx

    try:
        return str(onnx.TensorProto.DataType.Name(to))
    except ValueError:
        return "unknown"


# ---- reductions --------------------------------------------------------------------------

_REDUCE = {"ReduceSum": mb.reduce_sum, "ReduceMean": mb.reduce_mean,
           "ReduceMax": mb.reduce_max, "ReduceMin": mb.reduce_min,
           "ReduceProd": mb.reduce_prod, "ReduceL1": mb.reduce_l1_norm,
           "ReduceL2": mb.reduce_l2_norm, "ReduceLogSum": mb.reduce_log_sum,
           "ReduceLogSumExp": mb.reduce_log_sum_exp, "ReduceSumSquare": mb.reduce_sum_square}
# Opset at which each reduction's axes moved from an attribute to an input.
_AXES_INPUT = {"ReduceSum": 13}


def reduce_axes(ctx: NodeContext, rank: int) -> list[int] | None:
    """The axes a reduction reduces (None = all), from the attribute or input 1."""
    since = _AXES_INPUT.get(ctx.node.op_type, 18)
    axes = ctx.ints(1) if ctx.opset >= since else ctx.attr("axes")
    if axes is None or len(axes) == 0:
        if ctx.attr("noop_with_empty_axes", 0):
            return []
        return None
    return [int(a) % max(rank, 1) for a in axes]


@onnx_op(*_REDUCE)
def reduce_op(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    rank = len(shape_of(x))
    axes = reduce_axes(ctx, rank)
    keep = bool(ctx.attr("keepdims", 1))
    if axes == []:
        return [mb.identity(x=x, name=ctx.name())]
    if rank == 0:
        return [mb.identity(x=x, name=ctx.name())]
    op = _REDUCE[ctx.node.op_type]
    # All axes spelled out: coremltools' reduce_transposes pass reads `axes` of every
    # reduction after a transpose (KeyError: 'axes' when it is left to default).
    kw: dict[str, Any] = {"x": x, "keep_dims": keep, "name": ctx.name(),
                          "axes": np.array(range(rank) if axes is None else axes, np.int32)}
    if dtype_of(x) == np.int32 and ctx.node.op_type not in ("ReduceMax", "ReduceMin",
                                                           "ReduceSum", "ReduceProd"):
        kw["x"] = mb.cast(x=x, dtype="fp32", name=ctx.tmp())
    if dtype_of(x) == np.bool_:  # any / all: the max / min of the values as int32
        kw["x"], kw["name"] = mb.cast(x=x, dtype="int32", name=ctx.tmp()), ctx.tmp()
        return [mb.cast(x=op(**kw), dtype="bool", name=ctx.name())]
    return [op(**kw)]


@onnx_op("ArgMax", "ArgMin")
def arg_reduce(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    axis = int(ctx.attr("axis", 0))
    keep = bool(ctx.attr("keepdims", 1))
    if ctx.attr("select_last_index", 0):
        # The last index of the extreme value: reverse, take the first, map back.
        n = shape_of(x)[axis]
        rev = mb.reverse(x=x, axes=[axis], name=ctx.tmp())
        op = mb.reduce_argmax if ctx.node.op_type == "ArgMax" else mb.reduce_argmin
        i = op(x=rev, axis=axis, keep_dims=keep, name=ctx.tmp())
        return [mb.sub(x=np.int32(n - 1), y=i, name=ctx.name())]
    op = mb.reduce_argmax if ctx.node.op_type == "ArgMax" else mb.reduce_argmin
    return [op(x=x, axis=axis, keep_dims=keep, name=ctx.name())]
