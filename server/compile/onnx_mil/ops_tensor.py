"""Rules for shape and data-movement ops: Reshape, Transpose, Slice, Gather, Concat, Split,
Pad, Expand, TopK, CumSum, Einsum, …

Shape-valued arguments (Reshape's shape, Slice's starts, Pad's pads, …) must be constants by
the time a rule runs; with declared static input shapes the converter folds them (convert.py).
Reshape's 0 / -1 and Slice's clamping are resolved here to a fully static MIL call.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from coremltools.converters.mil import Builder as mb

from server.compile.onnx_mil.context import NodeContext, dtype_of, is_const, mil_dtype, shape_of
from server.compile.onnx_mil.registry import Outputs, onnx_op


@onnx_op("Shape")
def shape(ctx: NodeContext) -> Outputs:
    s = np.array(shape_of(ctx.raw(0)), np.int64)
    start, end = int(ctx.attr("start", 0)), ctx.attr("end")
    return [s[start:end] if end is not None else s[start:]]


@onnx_op("Size")
def size(ctx: NodeContext) -> Outputs:
    return [np.array(int(np.prod(shape_of(ctx.raw(0)))), np.int64)]


@onnx_op("EyeLike")
def eye_like(ctx: NodeContext) -> Outputs:
    n, m = shape_of(ctx.raw(0))
    dt = {1: np.float32, 10: np.float16, 6: np.int32, 7: np.int64, 9: np.bool_}.get(
        int(ctx.attr("dtype", 1)), np.float32)
    return [np.eye(n, m, int(ctx.attr("k", 0)), dtype=dt)]


@onnx_op("ConstantOfShape")
def constant_of_shape(ctx: NodeContext) -> Outputs:
    """Needs its shape at conversion time (static shapes make it so); then it is a constant."""
    shape = ctx.ints(0)
    value = ctx.attr("value")
    fill = np.zeros(1, np.float32) if value is None else _tensor(value)
    return [np.full(shape, fill.reshape(-1)[0], dtype=fill.dtype)]


@onnx_op("Range")
def range_(ctx: NodeContext) -> Outputs:
    """Needs start / limit / delta at conversion time; then it is a constant."""
    start, limit, delta = (np.asarray(ctx.const(i)) for i in range(3))
    return [np.arange(start.item(), limit.item(), delta.item()).astype(start.dtype)]


def _tensor(t: Any) -> np.ndarray:
    from onnx import numpy_helper

    return np.asarray(numpy_helper.to_array(t))


@onnx_op("Reshape")
def reshape(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    in_shape = shape_of(x)
    want = ctx.ints(1) if ctx.opset >= 5 else list(ctx.attr("shape"))
    assert want is not None
    if not ctx.attr("allowzero", 0):
        want = [in_shape[i] if d == 0 else d for i, d in enumerate(want)]
    if -1 in want:
        known = int(np.prod([d for d in want if d != -1]))
        want[want.index(-1)] = int(np.prod(in_shape)) // max(known, 1)
    return [mb.reshape(x=x, shape=np.array(want, np.int32), name=ctx.name())]


@onnx_op("Flatten")
def flatten(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    s = shape_of(x)
    axis = int(ctx.attr("axis", 1))
    axis = axis + len(s) if axis < 0 else axis
    return [mb.reshape(x=x, shape=[int(np.prod(s[:axis])), int(np.prod(s[axis:]))],
                       name=ctx.name())]


def _axes(ctx: NodeContext, since: int) -> list[int] | None:
    return ctx.ints(1) if ctx.opset >= since else ctx.attr("axes")


@onnx_op("Squeeze")
def squeeze(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    s = shape_of(x)
    axes = _axes(ctx, 13)
    axes = [i for i, d in enumerate(s) if d == 1] if not axes else [a % len(s) for a in axes]
    if len(axes) == len(s):
        return [mb.reshape(x=x, shape=np.zeros((0,), np.int32), name=ctx.name())]
    return [mb.squeeze(x=x, axes=axes, name=ctx.name())]


@onnx_op("Unsqueeze")
def unsqueeze(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    axes = _axes(ctx, 13) or []
    rank = len(shape_of(x)) + len(axes)
    out = list(shape_of(x))
    for a in sorted(a % rank for a in axes):
        out.insert(a, 1)
    return [mb.reshape(x=x, shape=np.array(out, np.int32), name=ctx.name())]


@onnx_op("Transpose")
def transpose(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    perm = ctx.attr("perm") or list(range(len(shape_of(x))))[::-1]
    return [mb.transpose(x=x, perm=list(perm), name=ctx.name())]


@onnx_op("Concat")
def concat(ctx: NodeContext) -> Outputs:
    vals = [ctx.raw(i) for i in range(ctx.n_inputs) if ctx.has(i)]
    vals = [v for v in vals if int(np.prod(shape_of(v))) > 0] or vals[:1]
    ref = next((v for v in vals if not is_const(v)), vals[0])
    vs = [ctx.as_var(ctx.like(v, ref)) for v in vals]
    axis = int(ctx.attr("axis"))
    if len(vs) == 1:
        return [mb.identity(x=vs[0], name=ctx.name())]
    return [mb.concat(values=vs, axis=axis, name=ctx.name())]


@onnx_op("Split")
def split(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    axis = int(ctx.attr("axis", 0)) % len(shape_of(x))
    dim = shape_of(x)[axis]
    n = len(ctx.node.output)
    sizes = ctx.ints(1) if ctx.opset >= 13 and ctx.has(1) else ctx.attr("split")
    if not sizes:
        parts = int(ctx.attr("num_outputs", n))
        chunk = -(-dim // parts)
        sizes = [chunk] * (dim // chunk) + ([dim % chunk] if dim % chunk else [])
    names = [ctx.name(k) for k in range(len(sizes))]
    if len(sizes) == 1:
        return [mb.identity(x=x, name=names[0])]
    outs = mb.split(x=x, split_sizes=np.array(sizes, np.int32), axis=axis, name=ctx.tmp())
    return [mb.identity(x=o, name=nm) for o, nm in zip(outs, names, strict=True)]


def _slice_params(ctx: NodeContext, s: tuple[int, ...]) -> tuple[list[int], list[int],
                                                                  list[int], list[bool]]:
    if ctx.opset >= 10:
        starts, ends = ctx.ints(1), ctx.ints(2)
        axes, steps = ctx.ints(3), ctx.ints(4)
    else:
        starts, ends, axes, steps = ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes"), None
    assert starts is not None and ends is not None
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    begin, end, stride = [0] * len(s), list(s), [1] * len(s)
    end_mask = [False] * len(s)
    for a, b, e, st in zip(axes, starts, ends, steps, strict=True):
        a %= len(s)
        b0, e0, st0 = slice(b, e, st).indices(s[a])
        begin[a], end[a], stride[a] = b0, e0, st0
        if st0 < 0 and e0 < 0:
            end_mask[a] = True  # runs through index 0
    return begin, end, stride, end_mask


@onnx_op("Slice")
def slice_(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    s = shape_of(x)
    begin, end, stride, end_mask = _slice_params(ctx, s)
    if any(len(range(b, -1 if m else e, st)) == 0
           for b, e, st, m in zip(begin, end, stride, end_mask, strict=True)):
        ctx.fail("the slice is empty; Core ML tensors cannot have a zero-sized dimension")
    return [mb.slice_by_index(x=x, begin=begin, end=end, stride=stride, end_mask=end_mask,
                              name=ctx.name())]


def _indices(ctx: NodeContext, i: int, dim: int) -> Any:
    """Index input `i` for an axis of size `dim`, negative indices wrapped as ONNX defines."""
    idx = ctx.raw(i)
    if is_const(idx):
        return (np.asarray(idx).astype(np.int64) % max(dim, 1)).astype(np.int32)
    v = ctx.as_var(idx)
    neg = mb.less(x=v, y=np.int32(0), name=ctx.tmp())
    return mb.select(cond=neg, a=mb.add(x=v, y=np.int32(dim), name=ctx.tmp()), b=v,
                     name=ctx.tmp())


def _as_int_if_bool(ctx: NodeContext, x: Any) -> tuple[Any, bool]:
    """MIL's gather ops take no bool tensors: bool data moves as int32 and is cast back."""
    if not is_const(x) and dtype_of(x) == np.bool_:
        return mb.cast(x=x, dtype="int32", name=ctx.tmp()), True
    return x, False


def _back_to_bool(ctx: NodeContext, y: Any, was_bool: bool) -> Any:
    return mb.cast(x=y, dtype="bool", name=ctx.name()) if was_bool else y


@onnx_op("Gather")
def gather(ctx: NodeContext) -> Outputs:
    x, was_bool = _as_int_if_bool(ctx, ctx.raw(0))
    if was_bool:
        return [_back_to_bool(ctx, _gather(ctx, x, ctx.tmp()), True)]
    return [_gather(ctx, x, ctx.name())]


def _gather(ctx: NodeContext, x: Any, out_name: str) -> Any:
    axis = int(ctx.attr("axis", 0)) % len(shape_of(x))
    idx = _indices(ctx, 1, shape_of(x)[axis])
    if is_const(idx) and idx.ndim == 0 and not is_const(x):
        # A scalar index: a slice, then drop the axis (what the Gather means).
        i = int(idx)
        s = shape_of(x)
        sl = mb.slice_by_index(x=x, begin=[i if a == axis else 0 for a in range(len(s))],
                               end=[i + 1 if a == axis else d for a, d in enumerate(s)],
                               name=ctx.tmp())
        if len(s) == 1:
            return mb.reshape(x=sl, shape=np.zeros((0,), np.int32), name=out_name)
        return mb.squeeze(x=sl, axes=[axis], name=out_name)
    return mb.gather(x=ctx.as_var(x), indices=idx, axis=axis, name=out_name)


@onnx_op("GatherElements")
def gather_elements(ctx: NodeContext) -> Outputs:
    x, was_bool = _as_int_if_bool(ctx, ctx.var(0))
    axis = int(ctx.attr("axis", 0)) % len(shape_of(x))
    idx = _indices(ctx, 1, shape_of(x)[axis])
    y = mb.gather_along_axis(x=x, indices=idx, axis=axis,
                             name=ctx.tmp() if was_bool else ctx.name())
    return [_back_to_bool(ctx, y, was_bool)]


@onnx_op("GatherND")
def gather_nd(ctx: NodeContext) -> Outputs:
    x, was_bool = _as_int_if_bool(ctx, ctx.var(0))
    batch = int(ctx.attr("batch_dims", 0))
    y = mb.gather_nd(x=x, indices=ctx.var(1, np.int32), batch_dims=batch,
                     name=ctx.tmp() if was_bool else ctx.name())
    return [_back_to_bool(ctx, y, was_bool)]


@onnx_op("ScatterND")
def scatter_nd(ctx: NodeContext) -> Outputs:
    mode = {"none": "update", "add": "add", "mul": "mul", "max": "max", "min": "min"}[
        ctx.attr("reduction", "none")]
    x = ctx.var(0)
    return [mb.scatter_nd(data=x, indices=ctx.var(1, np.int32),
                          updates=ctx.as_var(ctx.like(ctx.raw(2), x)), mode=mode,
                          name=ctx.name())]


@onnx_op("ScatterElements")
def scatter_elements(ctx: NodeContext) -> Outputs:
    mode = {"none": "update", "add": "add", "mul": "mul", "max": "max", "min": "min"}[
        ctx.attr("reduction", "none")]
    x = ctx.var(0)
    axis = int(ctx.attr("axis", 0)) % len(shape_of(x))
    return [mb.scatter_along_axis(data=x, indices=_indices(ctx, 1, shape_of(x)[axis]),
                                  updates=ctx.as_var(ctx.like(ctx.raw(2), x)), axis=axis,
                                  mode=mode, name=ctx.name())]


@onnx_op("Expand")
def expand(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    want = ctx.ints(1)
    assert want is not None
    s = shape_of(x)
    out = np.broadcast_shapes(s, tuple(want))
    padded = (1,) * (len(out) - len(s)) + s
    y = x if len(padded) == len(s) else mb.reshape(x=x, shape=list(padded), name=ctx.tmp())
    reps = [o // p for o, p in zip(out, padded, strict=True)]
    if all(r == 1 for r in reps):
        return [mb.identity(x=y, name=ctx.name())]
    return [mb.tile(x=y, reps=reps, name=ctx.name())]


@onnx_op("Tile")
def tile(ctx: NodeContext) -> Outputs:
    return [mb.tile(x=ctx.var(0), reps=ctx.ints(1), name=ctx.name())]


@onnx_op("Pad")
def pad(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    rank = len(shape_of(x))
    if ctx.opset >= 11:
        pads = ctx.ints(1)
        value = ctx.const(2) if ctx.has(2) else np.array(0)
        axes = ctx.ints(3) if ctx.has(3) else None
    else:
        pads, value, axes = list(ctx.attr("pads")), np.array(ctx.attr("value", 0.0)), None
    assert pads is not None
    axes = [a % rank for a in axes] if axes is not None else list(range(rank))
    begin, end = [0] * rank, [0] * rank
    for k, a in enumerate(axes):
        begin[a], end[a] = pads[k], pads[k + len(axes)]
    mode = ctx.attr("mode", "constant")
    if any(p < 0 for p in begin + end):  # negative pads crop
        s = shape_of(x)
        x = mb.slice_by_index(x=x, begin=[max(-b, 0) for b in begin],
                              end=[d - max(-e, 0) for d, e in zip(s, end, strict=True)],
                              name=ctx.tmp())
        begin, end = [max(b, 0) for b in begin], [max(e, 0) for e in end]
    if mode == "wrap":  # source index (i - begin) mod dim along each padded axis
        for a in range(rank):
            if begin[a] or end[a]:
                d = shape_of(x)[a]
                idx = (np.arange(-begin[a], d + end[a]) % d).astype(np.int32)
                x = mb.gather(x=x, indices=idx, axis=a, name=ctx.tmp())
        return [mb.identity(x=x, name=ctx.name())]
    first = next((a for a in range(rank) if begin[a] or end[a]), rank)
    if first == rank:
        return [mb.identity(x=x, name=ctx.name())]
    flat = np.array([p for a in range(first, rank) for p in (begin[a], end[a])], np.int32)
    if mode != "constant" and dtype_of(x).kind != "f":  # MIL pads non-float data by value only
        f = mb.cast(x=x, dtype="fp32", name=ctx.tmp())
        y = mb.pad(x=f, pad=flat, mode={"reflect": "reflect", "edge": "replicate"}[mode],
                   name=ctx.tmp())
        return [mb.cast(x=y, dtype=mil_dtype(dtype_of(x)), name=ctx.name())]
    mil_mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}[mode]
    cval = np.asarray(value).reshape(-1)[0] if np.asarray(value).size else 0
    return [mb.pad(x=x, pad=flat, mode=mil_mode, constant_val=np.array(cval, dtype_of(x)),
                   name=ctx.name())]


@onnx_op("DepthToSpace")
def depth_to_space(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    b = int(ctx.attr("blocksize"))
    if ctx.attr("mode", "DCR") == "CRD":
        return [mb.pixel_shuffle(x=x, upscale_factor=b, name=ctx.name())]
    return [mb.depth_to_space(x=x, block_size=b, name=ctx.name())]


@onnx_op("SpaceToDepth")
def space_to_depth(ctx: NodeContext) -> Outputs:
    x, b = ctx.var(0), int(ctx.attr("blocksize"))
    if ctx.attr("mode", "DCR") == "CRD":
        return [mb.pixel_unshuffle(x=x, downscale_factor=np.uint32(b), name=ctx.name())]
    return [mb.space_to_depth(x=x, block_size=b, name=ctx.name())]


@onnx_op("TopK")
def topk(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    # ctx.ints returns None for an unbound input; TopK-10's k is a bound constant input here.
    k = ctx.ints(1)[0] if ctx.opset >= 10 else int(ctx.attr("k"))  # type: ignore[index]
    axis = int(ctx.attr("axis", -1))
    largest = bool(ctx.attr("largest", 1))
    vals, idx = mb.topk(x=x, k=k, axis=axis, ascending=not largest, name=ctx.tmp())
    return [mb.identity(x=vals, name=ctx.name(0)), mb.identity(x=idx, name=ctx.name(1))]


@onnx_op("CumSum")
def cumsum(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    axis = ctx.ints(1)
    assert axis is not None
    return [mb.cumsum(x=x, axis=int(axis[0]), exclusive=bool(ctx.attr("exclusive", 0)),
                      reverse=bool(ctx.attr("reverse", 0)), name=ctx.name())]


@onnx_op("OneHot")
def one_hot(ctx: NodeContext) -> Outputs:
    depth = int(np.asarray(ctx.const(1)).reshape(-1)[0])
    values = np.asarray(ctx.const(2))
    dt = values.dtype if values.dtype.kind == "f" else np.int32
    idx = _indices(ctx, 0, depth)
    return [mb.one_hot(indices=ctx.as_var(idx, np.int32), one_hot_vector_size=depth,
                       axis=int(ctx.attr("axis", -1)), on_value=values[1].astype(dt),
                       off_value=values[0].astype(dt), name=ctx.name())]


@onnx_op("Trilu")
def trilu(ctx: NodeContext) -> Outputs:
    x = ctx.var(0)
    s = shape_of(x)
    k = int(np.asarray(ctx.const(1, 0)).reshape(-1)[0])
    n, m = s[-2], s[-1]
    rows, cols = np.arange(n)[:, None], np.arange(m)[None, :]
    keep = (cols - rows >= k) if ctx.attr("upper", 1) else (cols - rows <= k)
    return [mb.select(cond=keep, a=x, b=np.zeros((1,) * len(s), dtype_of(x)), name=ctx.name())]


@onnx_op("ReverseSequence")
def reverse_sequence(ctx: NodeContext) -> Outputs:
    return [mb.reverse_sequence(x=ctx.var(0), lengths=ctx.var(1, np.int32),
                                seq_axis=int(ctx.attr("time_axis", 0)),
                                batch_axis=int(ctx.attr("batch_axis", 1)), name=ctx.name())]


@onnx_op("Einsum")
def einsum(ctx: NodeContext) -> Outputs:
    from server.compile.onnx_mil.einsum import lower_einsum

    return [lower_einsum(ctx, str(ctx.attr("equation")),
                         [ctx.var(i) for i in range(ctx.n_inputs)])]
