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

from server.compile.onnx_mil.context import NodeContext, dtype_of, is_const, shape_of
from server.compile.onnx_mil.registry import Outputs, onnx_op


def _spatial(ctx: NodeContext, x_shape: tuple[int, ...], kernel: list[int]
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
    if ctx.attr("ceil_mode", 0):
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
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        want = list(out_shape)[-n:] if out_shape is not None else [
            ins[i] * strides[i] for i in range(n)]
        for i in range(n):
            total = full[i] + out_pad[i] - want[i]
            small = total // 2
            begin[i], end[i] = (total - small, small) if auto == "SAME_LOWER" else (
                small, total - small)
    elif auto == "VALID":
        begin, end = [0] * n, [0] * n
    y = mb.conv_transpose(x=x, weight=w, strides=strides, dilations=dil, pad_type="valid",
                          groups=int(ctx.attr("group", 1)), name=ctx.tmp())
    size = [full[i] + out_pad[i] - begin[i] - end[i] for i in range(n)]
    rank = n + 2
    stop = [min(begin[i] + size[i], full[i]) for i in range(n)]
    if any(b > 0 for b in begin) or stop != full:
        y = mb.slice_by_index(x=y, begin=[0, 0, *begin], end=[0, 0, *stop],
                              begin_mask=[True, True] + [False] * n,
                              end_mask=[True, True] + [False] * n, name=ctx.tmp())
    extra = [begin[i] + size[i] - stop[i] for i in range(n)]
    if any(e > 0 for e in extra):
        y = mb.pad(x=y, pad=_interleave([0] * n, extra), mode="constant",
                   constant_val=np.float32(0), name=ctx.tmp())
    if ctx.has(2):
        b = np.asarray(ctx.like(ctx.const(2), x)).reshape((1, -1) + (1,) * n)
        y = mb.add(x=y, y=b, name=ctx.tmp())
    del rank
    return [mb.identity(x=y, name=ctx.name())]


def _dilated_max(ctx: NodeContext, x: Any, k: list[int], s: list[int], d: list[int],
                 begin: list[int], end: list[int]) -> Any:
    """MaxPool with dilations, by its definition: the max over the kernel taps, each tap a
    strided slice of the (−inf padded) input."""
    n = len(k)
    xs = shape_of(x)
    if any(begin) or any(end):
        x = mb.pad(x=x, pad=_interleave(begin, end), mode="constant",
                   constant_val=np.float32(-np.inf), name=ctx.tmp())
    padded = [xs[2 + i] + begin[i] + end[i] for i in range(n)]
    out = [(padded[i] - ((k[i] - 1) * d[i] + 1)) // s[i] + 1 for i in range(n)]
    result = None
    for tap in np.ndindex(*k):
        b = [tap[i] * d[i] for i in range(n)]
        e = [b[i] + (out[i] - 1) * s[i] + 1 for i in range(n)]
        sl = mb.slice_by_index(x=x, begin=[0, 0, *b], end=[0, 0, *e], stride=[1, 1, *s],
                               begin_mask=[True, True] + [False] * n,
                               end_mask=[True, True] + [False] * n, name=ctx.tmp())
        result = sl if result is None else mb.maximum(x=result, y=sl, name=ctx.tmp())
    return result


@onnx_op("MaxPool", "AveragePool", "LpPool")
def pool(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    if len(ctx.node.output) > 1 and ctx.node.output[1]:
        ctx.fail("the Indices output of MaxPool has no Core ML equivalent; export the model "
                 "without return_indices")
    k = list(ctx.attr("kernel_shape"))
    s, d, begin, end = _spatial(ctx, shape_of(x), k)
    op = ctx.node.op_type
    if op == "MaxPool":
        if any(v != 1 for v in d):
            return [mb.identity(x=_dilated_max(ctx, x, k, s, d, begin, end), name=ctx.name())]
        return [mb.max_pool(x=x, kernel_sizes=k, strides=s, pad_type="custom",
                            pad=_interleave(begin, end), name=ctx.name())]
    if any(v != 1 for v in d):
        ctx.fail("AveragePool with dilations is not converted")
    if op == "LpPool":
        p = float(ctx.attr("p", 2))
        if p != 2:
            ctx.fail(f"LpPool with p={p}: Core ML's l2_pool covers p=2 only")
        return [mb.l2_pool(x=x, kernel_sizes=k, strides=s, pad_type="custom",
                           pad=_interleave(begin, end), name=ctx.name())]
    include = bool(ctx.attr("count_include_pad", 0))
    if include and ctx.attr("ceil_mode", 0):
        # The declared pads count in the average, ceil_mode's extension does not.
        declared = list(ctx.attr("pads", [0] * 2 * len(k)))
        pb, pe = declared[:len(k)], declared[len(k):]
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
        ctx.fail("BatchNormalization in training mode is not converted (export in eval mode)")
    scale, bias, mean, var = (ctx.like(ctx.raw(i), x) for i in (1, 2, 3, 4))
    return [mb.batch_norm(x=x, mean=mean, variance=var, gamma=scale, beta=bias,
                          epsilon=np.float32(ctx.attr("epsilon", 1e-5)), name=ctx.name())]


@onnx_op("InstanceNormalization")
def instance_norm(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    return [mb.instance_norm(x=x, gamma=ctx.like(ctx.raw(1), x), beta=ctx.like(ctx.raw(2), x),
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
    a, b = ctx.raw(0), ctx.raw(1)
    ref = b if is_const(a) else a
    return [mb.matmul(x=ctx.as_var(ctx.like(a, ref)), y=ctx.as_var(ctx.like(b, ref)),
                      name=ctx.name())]


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
