"""Rules for convolutions, pooling, normalizations, Gemm/MatMul and softmax.

Padding is resolved here, not left to MIL's pad types: ONNX `auto_pad` (SAME_UPPER,
SAME_LOWER, VALID) and `ceil_mode` become explicit begin/end pads computed with ONNX's own
output-size formulas, so MIL sees `pad_type="custom"` and the output shape ONNX defines.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from coremltools.converters.mil import Builder as mb

from server.compile.onnx_mil.context import (
    NodeContext,
    TransposedConst,
    dtype_of,
    is_const,
    shape_of,
)
from server.compile.onnx_mil.registry import Outputs, onnx_op


def _spatial(ctx: NodeContext, x_shape: tuple[int, ...], kernel: list[int], ceil: bool = True
             ) -> tuple[list[int], list[int], list[int], list[int]]:
    """strides, dilations, begin pads, end pads (auto_pad and ceil_mode resolved)."""
    n = len(kernel)
    strides = list(ctx.attr("strides", [1] * n))
    dil = list(ctx.attr("dilations", [1] * n))
    pads = list(ctx.attr("pads", [0] * 2 * n))
    begin, end = pads[:n], pads[n:]
    auto = ctx.attr("auto_pad", "NOTSET")
    ins = x_shape[2:]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        for i in range(n):
            out = math.ceil(ins[i] / strides[i])
            total = max((out - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - ins[i], 0)
            small = total // 2
            begin[i], end[i] = (small, total - small) if auto == "SAME_UPPER" else (
                total - small, small)
    elif auto == "VALID":
        begin, end = [0] * n, [0] * n
    if ceil and ctx.attr("ceil_mode", 0):
        for i in range(n):
            eff = (kernel[i] - 1) * dil[i] + 1
            span = ins[i] + begin[i] + end[i] - eff
            out = math.ceil(span / strides[i]) + 1
            if (out - 1) * strides[i] >= ins[i] + begin[i]:
                out -= 1  # a window may not start in the end padding
            end[i] += max((out - 1) * strides[i] + eff - (ins[i] + begin[i] + end[i]), 0)
    return strides, dil, begin, end


def _interleave(begin: list[int], end: list[int]) -> np.ndarray:
    return np.array([p for pair in zip(begin, end, strict=True) for p in pair], np.int32)


@onnx_op("Conv")
def conv(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    w = ctx.raw(1)
    w_shape = shape_of(w)
    strides, dil, begin, end = _spatial(ctx, shape_of(x), list(w_shape[2:]))
    kw: dict[str, Any] = {}
    if ctx.has(2):
        kw["bias"] = ctx.like(ctx.raw(2), x)
    return [mb.conv(x=x, weight=ctx.like(w, x), strides=strides, dilations=dil,
                    pad_type="custom", pad=_interleave(begin, end),
                    groups=int(ctx.attr("group", 1)), name=ctx.name(), **kw)]


@onnx_op("ConvTranspose")
def conv_transpose(ctx: NodeContext) -> Outputs:
    """The full transposed convolution, then ONNX's pads / output_padding as a crop (and a
    zero extension where output_padding reaches past it), then the bias."""
    x = ctx.var(0)
    w = ctx.like(ctx.const(1), x)
    n = w.ndim - 2
    ins = shape_of(x)[2:]
    k = list(w.shape[2:])
    strides = list(ctx.attr("strides", [1] * n))
    dil = list(ctx.attr("dilations", [1] * n))
    out_pad = list(ctx.attr("output_padding", [0] * n))
    pads = list(ctx.attr("pads", [0] * 2 * n))
    begin, end = pads[:n], pads[n:]
    full = [strides[i] * (ins[i] - 1) + (k[i] - 1) * dil[i] + 1 for i in range(n)]
    out_shape = ctx.attr("output_shape")
    auto = ctx.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        want = list(out_shape)[-n:] if out_shape is not None else [
            ins[i] * strides[i] for i in range(n)]
        for i in range(n):
            total = full[i] + out_pad[i] - want[i]
            small = total // 2
            begin[i], end[i] = (total - small, small) if auto == "SAME_LOWER" else (
                small, total - small)
    elif out_shape is not None:  # the output starts at the full result's origin
        want = list(out_shape)[-n:]
        begin = [0] * n
        end = [full[i] + out_pad[i] - want[i] for i in range(n)]
    elif auto == "VALID":
        begin, end = [0] * n, [0] * n
    y = mb.conv_transpose(x=x, weight=w, strides=strides, dilations=dil, pad_type="valid",
                          groups=int(ctx.attr("group", 1)), name=ctx.tmp())
    size = [full[i] + out_pad[i] - begin[i] - end[i] for i in range(n)]
    # Output index o reads full index o + begin: crop what lies inside, zeros outside.
    lo = [max(begin[i], 0) for i in range(n)]
    hi = [min(begin[i] + size[i], full[i]) for i in range(n)]
    if lo != [0] * n or hi != full:
        y = mb.slice_by_index(x=y, begin=[0, 0, *lo], end=[0, 0, *hi],
                              begin_mask=[True, True] + [False] * n,
                              end_mask=[True, True] + [False] * n, name=ctx.tmp())
    front = [max(-begin[i], 0) for i in range(n)]
    back = [max(begin[i] + size[i] - full[i], 0) for i in range(n)]
    if any(front) or any(back):
        y = mb.pad(x=y, pad=_interleave(front, back), mode="constant",
                   constant_val=np.array(0, dtype_of(x)), name=ctx.tmp())
    if ctx.has(2):
        b = np.asarray(ctx.like(ctx.const(2), x)).reshape((1, -1) + (1,) * n)
        y = mb.add(x=y, y=b, name=ctx.tmp())
    return [mb.identity(x=y, name=ctx.name())]


def _taps(ctx: NodeContext, x: Any, k: list[int], s: list[int], d: list[int],
          begin: list[int], end: list[int], fill: float) -> tuple[list[Any], list[Any], list[int]]:
    """A pooling window by its definition: one strided slice of the padded input per kernel
    tap. Returns the slices, each tap's first padded coordinates and the output size."""
    n = len(k)
    xs = shape_of(x)
    if any(begin) or any(end):
        x = mb.pad(x=x, pad=_interleave(begin, end), mode="constant",
                   constant_val=np.array(fill, dtype_of(x)), name=ctx.tmp())
    padded = [xs[2 + i] + begin[i] + end[i] for i in range(n)]
    out = [(padded[i] - ((k[i] - 1) * d[i] + 1)) // s[i] + 1 for i in range(n)]
    slices, starts = [], []
    for tap in np.ndindex(*k):
        b = [tap[i] * d[i] for i in range(n)]
        e = [b[i] + (out[i] - 1) * s[i] + 1 for i in range(n)]
        slices.append(mb.slice_by_index(x=x, begin=[0, 0, *b], end=[0, 0, *e],
                                        stride=[1, 1, *s], begin_mask=[True, True] + [False] * n,
                                        end_mask=[True, True] + [False] * n, name=ctx.tmp()))
        starts.append(b)
    return slices, starts, out


def _tap_count(mask: np.ndarray, starts: list[Any], s: list[int], out: list[int]) -> np.ndarray:
    """How many taps of each output window land where `mask` (padded spatial dims) is 1."""
    total = np.zeros(out)
    for b in starts:
        total += mask[tuple(slice(b[i], b[i] + (out[i] - 1) * s[i] + 1, s[i])
                            for i in range(len(out)))]
    return total


def _max_with_indices(ctx: NodeContext, x: Any, k: list[int], s: list[int], d: list[int],
                      begin: list[int], end: list[int]) -> list[Any]:
    """MaxPool and its Indices (flat, row- or column-major per storage_order): the running
    max over the taps, each tap's constant source index kept where it is strictly larger
    (so the first maximal tap wins)."""
    xs = shape_of(x)
    n = len(k)
    slices, starts, out = _taps(ctx, x, k, s, d, begin, end, -np.inf)
    spatial = xs[2:]
    col_major = bool(ctx.attr("storage_order", 0))
    plane = int(np.prod(spatial))
    base = (np.arange(xs[0] * xs[1]) * plane).reshape(xs[0], xs[1], *([1] * n))
    best, idx = slices[0], None
    for t, (sl, b) in enumerate(zip(slices, starts, strict=True)):
        coords = np.meshgrid(*[np.arange(out[i]) * s[i] + b[i] - begin[i] for i in range(n)],
                             indexing="ij")
        order = list(range(n))[::-1] if col_major else list(range(n))
        flat = np.zeros(out, np.int64)
        for i in order:
            flat = flat * spatial[i] + coords[i]
        tap_idx = (base + flat[None, None]).astype(np.int32)
        if t == 0:
            idx = mb.const(val=np.broadcast_to(tap_idx, (xs[0], xs[1], *out)).copy(),
                           name=ctx.tmp())
            continue
        better = mb.greater(x=sl, y=best, name=ctx.tmp())
        best = mb.select(cond=better, a=sl, b=best, name=ctx.tmp())
        idx = mb.select(cond=better, a=tap_idx, b=idx, name=ctx.tmp())
    return [mb.identity(x=best, name=ctx.name(0)), mb.identity(x=idx, name=ctx.name(1))]


def _sum_pool(ctx: NodeContext, x: Any, k: list[int], s: list[int], d: list[int],
              begin: list[int], end: list[int]) -> tuple[Any, list[Any], list[int]]:
    slices, starts, out = _taps(ctx, x, k, s, d, begin, end, 0.0)
    total = slices[0]
    for sl in slices[1:]:
        total = mb.add(x=total, y=sl, name=ctx.tmp())
    return total, starts, out


@onnx_op("MaxPool", "AveragePool", "LpPool")
def pool(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    k = list(ctx.attr("kernel_shape"))
    s, d, begin, end = _spatial(ctx, shape_of(x), k)
    op = ctx.node.op_type
    dilated = any(v != 1 for v in d)
    if op == "MaxPool":
        if len(ctx.node.output) > 1 and ctx.node.output[1]:
            return _max_with_indices(ctx, x, k, s, d, begin, end)
        if dilated:
            slices, _, _ = _taps(ctx, x, k, s, d, begin, end, -np.inf)
            best = slices[0]
            for sl in slices[1:]:
                best = mb.maximum(x=best, y=sl, name=ctx.tmp())
            return [mb.identity(x=best, name=ctx.name())]
        return [mb.max_pool(x=x, kernel_sizes=k, strides=s, pad_type="custom",
                            pad=_interleave(begin, end), name=ctx.name())]
    if op == "LpPool":
        p = float(ctx.attr("p", 2))
        if p == 2 and not dilated:
            return [mb.l2_pool(x=x, kernel_sizes=k, strides=s, pad_type="custom",
                               pad=_interleave(begin, end), name=ctx.name())]
        # (Σ |x|^p)^(1/p) over each window, by definition
        xp = mb.pow(x=mb.abs(x=x, name=ctx.tmp()), y=np.array(p, dtype_of(x)), name=ctx.tmp())
        total, _, _ = _sum_pool(ctx, xp, k, s, d, begin, end)
        return [mb.pow(x=total, y=np.array(1 / p, dtype_of(x)), name=ctx.name())]
    include = bool(ctx.attr("count_include_pad", 0))
    if dilated:
        total, starts, out = _sum_pool(ctx, x, k, s, d, begin, end)
        _, _, pb, pe = _spatial(ctx, shape_of(x), k, ceil=False)
        declared = pb + pe
        spatial = shape_of(x)[2:]
        mask = np.zeros([spatial[i] + begin[i] + end[i] for i in range(len(k))])
        if include:  # the declared pads count, ceil_mode's extension does not
            lo = [begin[i] - declared[i] for i in range(len(k))]
            hi = [begin[i] + spatial[i] + declared[len(k) + i] for i in range(len(k))]
        else:
            lo, hi = begin, [begin[i] + spatial[i] for i in range(len(k))]
        mask[tuple(slice(lo[i], hi[i]) for i in range(len(k)))] = 1
        count = _tap_count(mask, starts, s, out)
        return [mb.real_div(x=total, y=np.maximum(count, 1).astype(dtype_of(x)),
                            name=ctx.name())]
    if include and ctx.attr("ceil_mode", 0):
        # The declared pads count in the average, ceil_mode's extension does not.
        _, _, pb, pe = _spatial(ctx, shape_of(x), k, ceil=False)
        if any(pb) or any(pe):
            x = mb.pad(x=x, pad=_interleave(pb, pe), mode="constant",
                       constant_val=np.float32(0), name=ctx.tmp())
        begin = [b - p for b, p in zip(begin, pb, strict=True)]
        end = [e - p for e, p in zip(end, pe, strict=True)]
        include = False
    return [mb.avg_pool(x=x, kernel_sizes=k, strides=s, pad_type="custom",
                        pad=_interleave(begin, end), exclude_padding_from_average=not include,
                        name=ctx.name())]


@onnx_op("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def global_pool(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    axes = list(range(2, len(shape_of(x))))
    op = ctx.node.op_type
    if op == "GlobalLpPool" and float(ctx.attr("p", 2)) != 2:
        ctx.fail("GlobalLpPool with p != 2 is not converted")
    f = {"GlobalAveragePool": mb.reduce_mean, "GlobalMaxPool": mb.reduce_max,
         "GlobalLpPool": mb.reduce_l2_norm}[op]
    return [f(x=x, axes=axes, keep_dims=True, name=ctx.name())]


@onnx_op("BatchNormalization")
def batch_norm(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    if ctx.attr("training_mode", 0):
        return _batch_norm_training(ctx, x)
    scale, bias, mean, var = (ctx.like(ctx.const(i), x) for i in (1, 2, 3, 4))
    return [mb.batch_norm(x=x, mean=mean, variance=var, gamma=scale, beta=bias,
                          epsilon=np.float32(ctx.attr("epsilon", 1e-5)), name=ctx.name())]


def _batch_norm_training(ctx: NodeContext, x: Any) -> Outputs:
    """training_mode=1 by ONNX's definition: normalize with the batch's own mean and
    (population) variance; running_mean / running_var = input · momentum + batch · (1 − m)."""
    rank = len(shape_of(x))
    axes = [0, *range(2, rank)]
    c = shape_of(x)[1]
    tail = (1,) * (rank - 2)
    dt = dtype_of(x)
    eps = np.array(ctx.attr("epsilon", 1e-5), dt)
    m = np.array(ctx.attr("momentum", 0.9), dt)
    scale, bias, mean_in, var_in = (np.asarray(ctx.like(ctx.const(i), x)) for i in (1, 2, 3, 4))
    mean = mb.reduce_mean(x=x, axes=axes, keep_dims=True, name=ctx.tmp())
    centered = mb.sub(x=x, y=mean, name=ctx.tmp())
    var = mb.reduce_mean(x=mb.mul(x=centered, y=centered, name=ctx.tmp()), axes=axes,
                         keep_dims=True, name=ctx.tmp())
    y = mb.mul(x=centered, y=mb.rsqrt(x=mb.add(x=var, y=eps, name=ctx.tmp()), name=ctx.tmp()),
               name=ctx.tmp())
    y = mb.add(x=mb.mul(x=y, y=scale.reshape((1, c, *tail)), name=ctx.tmp()),
               y=bias.reshape((1, c, *tail)), name=ctx.name(0))
    outs: list[Any] = [y]
    for k, (batch, given) in enumerate(((mean, mean_in), (var, var_in)), start=1):
        if k < len(ctx.node.output) and ctx.node.output[k]:
            flat = mb.reshape(x=batch, shape=[c], name=ctx.tmp())
            outs.append(mb.add(x=mb.mul(x=flat, y=np.array(1, dt) - m, name=ctx.tmp()),
                               y=(given * m).astype(dt), name=ctx.name(k)))
    return outs


@onnx_op("InstanceNormalization")
def instance_norm(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    return [mb.instance_norm(x=x, gamma=ctx.like(ctx.const(1), x),
                             beta=ctx.like(ctx.const(2), x),
                             epsilon=np.float32(ctx.attr("epsilon", 1e-5)), name=ctx.name())]


@onnx_op("LayerNormalization", since=17)
def layer_norm(ctx: NodeContext) -> Outputs:
    """layer_norm for Y; the Mean and InvStdDev outputs, when used, from their definitions."""
    x = ctx.var(0)
    rank = len(shape_of(x))
    axis = int(ctx.attr("axis", -1)) % rank
    axes = list(range(axis, rank))
    eps = np.float32(ctx.attr("epsilon", 1e-5))
    norm_shape = shape_of(x)[axis:]
    gamma = np.broadcast_to(ctx.like(ctx.const(1), x), norm_shape).copy() \
        if is_const(ctx.raw(1)) else None
    beta = np.broadcast_to(ctx.like(ctx.const(2), x), norm_shape).copy() \
        if ctx.has(2) and is_const(ctx.raw(2)) else None
    outs: list[Any] = []
    if gamma is not None and (beta is not None or not ctx.has(2)):
        outs.append(mb.layer_norm(x=x, axes=axes, gamma=gamma, beta=beta, epsilon=eps,
                                  name=ctx.name()))
    else:
        y = mb.layer_norm(x=x, axes=axes, epsilon=eps, name=ctx.tmp())
        y = mb.mul(x=y, y=ctx.as_var(ctx.like(ctx.raw(1), x)), name=ctx.tmp())
        if ctx.has(2):
            y = mb.add(x=y, y=ctx.as_var(ctx.like(ctx.raw(2), x)), name=ctx.tmp())
        outs.append(mb.identity(x=y, name=ctx.name()))
    wants = [i < len(ctx.node.output) and bool(ctx.node.output[i]) for i in (1, 2)]
    if any(wants):
        mean = mb.reduce_mean(x=x, axes=axes, keep_dims=True, name=ctx.name(1) if wants[0]
                              else ctx.tmp())
        outs.append(mean)
        if wants[1]:
            c = mb.sub(x=x, y=mean, name=ctx.tmp())
            v = mb.reduce_mean(x=mb.mul(x=c, y=c, name=ctx.tmp()), axes=axes, keep_dims=True,
                               name=ctx.tmp())
            outs.append(mb.rsqrt(x=v, epsilon=eps, name=ctx.name(2)))
    return outs


@onnx_op("GroupNormalization", since=18)
def group_norm(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    shape = shape_of(x)
    g = int(ctx.attr("num_groups"))
    c = shape[1]
    eps = np.float32(ctx.attr("epsilon", 1e-5))
    grouped = mb.reshape(x=x, shape=[shape[0], g, -1], name=ctx.tmp())
    y = mb.layer_norm(x=grouped, axes=[2], epsilon=eps, name=ctx.tmp())
    y = mb.reshape(x=y, shape=list(shape), name=ctx.tmp())
    scale, bias = ctx.const(1), ctx.const(2)
    assert scale is not None and bias is not None
    if ctx.opset < 21:  # scale / bias per group until opset 21, per channel after
        scale, bias = np.repeat(scale, c // g), np.repeat(bias, c // g)
    tail = (1,) * (len(shape) - 2)
    y = mb.mul(x=y, y=ctx.like(scale.reshape((1, c, *tail)), x), name=ctx.tmp())
    return [mb.add(x=y, y=ctx.like(bias.reshape((1, c, *tail)), x), name=ctx.name())]


@onnx_op("RMSNormalization", since=23)
def rms_norm(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    rank = len(shape_of(x))
    axes = list(range(int(ctx.attr("axis", -1)) % rank, rank))
    eps = np.array(ctx.attr("epsilon", 1e-5), dtype_of(x))
    ms = mb.reduce_mean(x=mb.mul(x=x, y=x, name=ctx.tmp()), axes=axes, keep_dims=True,
                        name=ctx.tmp())
    y = mb.mul(x=x, y=mb.rsqrt(x=mb.add(x=ms, y=eps, name=ctx.tmp()), name=ctx.tmp()),
               name=ctx.tmp())
    return [mb.mul(x=y, y=ctx.as_var(ctx.like(ctx.raw(1), x)), name=ctx.name())]


@onnx_op("LRN")
def lrn(ctx: NodeContext) -> Outputs:
    return [mb.local_response_norm(
        x=ctx.var(0), size=int(ctx.attr("size")), alpha=np.float32(ctx.attr("alpha", 1e-4)),
        beta=np.float32(ctx.attr("beta", 0.75)), k=np.float32(ctx.attr("bias", 1.0)),
        name=ctx.name())]


@onnx_op("LpNormalization")
def lp_norm(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    axis = int(ctx.attr("axis", -1))
    p = int(ctx.attr("p", 2))
    f = mb.reduce_l2_norm if p == 2 else mb.reduce_l1_norm
    n = f(x=x, axes=[axis], keep_dims=True, name=ctx.tmp())
    # A zero norm means an all-zero slice, which stays zero (ONNX's reference): x / max(n, tiny)
    n = mb.maximum(x=n, y=np.array(np.finfo(dtype_of(x)).tiny, dtype_of(x)), name=ctx.tmp())
    return [mb.real_div(x=x, y=n, name=ctx.name())]


@onnx_op("MeanVarianceNormalization")
def mvn(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    axes = list(ctx.attr("axes", [0, 2, 3]))
    mean = mb.reduce_mean(x=x, axes=axes, keep_dims=True, name=ctx.tmp())
    c = mb.sub(x=x, y=mean, name=ctx.tmp())
    var = mb.reduce_mean(x=mb.mul(x=c, y=c, name=ctx.tmp()), axes=axes, keep_dims=True,
                         name=ctx.tmp())
    sd = mb.add(x=mb.sqrt(x=var, name=ctx.tmp()), y=np.float32(1e-9), name=ctx.tmp())
    return [mb.real_div(x=c, y=sd, name=ctx.name())]


@onnx_op("Gemm")
def gemm(ctx: NodeContext) -> Outputs:
    a, b = ctx.var(0), ctx.raw(1)
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    y = mb.matmul(x=a, y=ctx.as_var(ctx.like(b, a)), transpose_x=bool(ctx.attr("transA", 0)),
                  transpose_y=bool(ctx.attr("transB", 0)), name=ctx.tmp())
    if alpha != 1.0:
        y = mb.mul(x=y, y=np.array(alpha, dtype_of(a)), name=ctx.tmp())
    if ctx.has(2) and beta != 0.0:
        c = ctx.raw(2)
        c = ctx.like(c, a) * np.asarray(beta, dtype_of(a)) if is_const(c) else \
            mb.mul(x=c, y=np.array(beta, dtype_of(a)), name=ctx.tmp())
        y = mb.add(x=y, y=c, name=ctx.tmp())
    return [mb.identity(x=y, name=ctx.name())]


@onnx_op("MatMul")
def matmul(ctx: NodeContext) -> Outputs:
    """numpy matmul semantics: a 1-D operand is a row (left) or column (right) vector whose
    unit axis is dropped from the result."""
    a, b = ctx.raw(0), ctx.raw(1)
    ref = b if is_const(a) else a
    if isinstance(b, TransposedConst) and b.source is not None and not is_const(a) and \
            len(shape_of(a)) > 1:
        # Transpose(E) of a constant: read E as stored (one copy when E is also a Gather's
        # table, a tied LM head), transposed by the matmul.
        return [mb.matmul(x=a, y=ctx.as_var(ctx.like(b.source, a)), transpose_y=True,
                          name=ctx.name())]
    va, vb = ctx.as_var(ctx.like(a, ref)), ctx.as_var(ctx.like(b, ref))
    ra, rb = len(shape_of(va)), len(shape_of(vb))
    if ra > 1 and rb > 1:
        return [mb.matmul(x=va, y=vb, name=ctx.name())]
    if ra == 1:
        va = mb.reshape(x=va, shape=[1, shape_of(va)[0]], name=ctx.tmp())
    if rb == 1:
        vb = mb.reshape(x=vb, shape=[shape_of(vb)[0], 1], name=ctx.tmp())
    y = mb.matmul(x=va, y=vb, name=ctx.tmp())
    drop = ([-1] if rb == 1 else []) + ([-2] if ra == 1 else [])
    out = list(shape_of(y))
    for axis in sorted((len(out) + a_ for a_ in drop), reverse=True):
        del out[axis]
    return [mb.reshape(x=y, shape=np.array(out, np.int32), name=ctx.name())]


@onnx_op("Softmax", "LogSoftmax", "Hardmax")
def softmax(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    shape = shape_of(x)
    rank = len(shape)
    op = ctx.node.op_type
    if ctx.opset >= 13:
        axis = int(ctx.attr("axis", -1)) % rank
        flat = None
    else:  # before opset 13: coerced to 2-D at `axis`, normalized over the trailing block
        axis = int(ctx.attr("axis", 1)) % rank
        flat = [int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))]
        x = mb.reshape(x=x, shape=flat, name=ctx.tmp())
        axis = 1
    if op == "Hardmax":
        idx = mb.reduce_argmax(x=x, axis=axis, keep_dims=False, name=ctx.tmp())
        n = shape_of(x)[axis]
        y = mb.one_hot(indices=idx, one_hot_vector_size=n, axis=axis,
                       on_value=np.array(1, dtype_of(x)), off_value=np.array(0, dtype_of(x)),
                       name=ctx.tmp())
    elif op == "Softmax":
        y = mb.softmax(x=x, axis=axis, name=ctx.tmp())
    else:  # x - logsumexp(x): the stable form of log(softmax(x))
        lse = mb.reduce_log_sum_exp(x=x, axes=[axis], keep_dims=True, name=ctx.tmp())
        y = mb.sub(x=x, y=lse, name=ctx.tmp())
    if flat is not None:
        y = mb.reshape(x=y, shape=list(shape), name=ctx.tmp())
    return [mb.identity(x=y, name=ctx.name())]


@onnx_op("Dropout")
def dropout(ctx: NodeContext) -> Outputs:
    if ctx.has(2) and is_const(ctx.raw(2)) and bool(np.asarray(ctx.raw(2)).reshape(-1)[0]):
        ctx.fail("Dropout in training mode is not converted (export in eval mode)")
    x = ctx.var(0)
    outs: list[Any] = [mb.identity(x=x, name=ctx.name())]
    if len(ctx.node.output) > 1 and ctx.node.output[1]:
        outs.append(np.ones(shape_of(x), np.bool_))
    return outs
