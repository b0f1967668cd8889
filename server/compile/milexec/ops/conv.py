"""Convolutions (`conv`, `conv_transpose`, 1-D to 3-D, groups, dilations, MIL's pad types)
and pooling (`max_pool`, `avg_pool`, `l2_pool`, ceil mode, padding excluded or counted).

A convolution is a sum over kernel offsets of one batched float32 matrix product per offset
(strided views of the padded input, no im2col copy of the whole window), rounded once to the
declared dtype by the executor."""

from __future__ import annotations

import itertools
import math

import numpy as np

from server.compile.milexec.ops.linear import wide
from server.compile.milexec.registry import Array, OpCall, mil_op


def _spatial(op: OpCall, kernel: list[int], dims: list[int]) -> tuple[
        list[int], list[int], list[tuple[int, int]]]:
    """strides, dilations and per-dim (before, after) padding of a conv or pool."""
    n = len(kernel)
    strides = op.ints("strides", [1] * n) or [1] * n
    dilations = op.ints("dilations", [1] * n) or [1] * n
    pad_type = op.scalar("pad_type", "valid")
    if pad_type == "custom":
        p = op.ints("pad", [0] * 2 * n) or [0] * 2 * n
        return strides, dilations, [(p[2 * i], p[2 * i + 1]) for i in range(n)]
    if pad_type == "valid":
        return strides, dilations, [(0, 0)] * n
    if pad_type not in ("same", "same_lower"):
        raise op.unsupported(f"pad_type {pad_type!r}")
    pads = []
    for i, k, s, d in zip(dims, kernel, strides, dilations, strict=True):
        total = max(0, s * math.ceil(i / s) - i + (k - 1) * d + 1 - s)
        before = total // 2 if pad_type == "same" else total - total // 2
        pads.append((before, total - before))
    return strides, dilations, pads


def _window(xp: Array, offset: tuple[int, ...], strides: list[int], dilations: list[int],
            out: list[int]) -> Array:
    """The input elements kernel offset `offset` meets at every output position."""
    idx = tuple(slice(o * d, o * d + s * (n - 1) + 1, s)
                for o, d, s, n in zip(offset, dilations, strides, out, strict=True))
    return xp[(slice(None), slice(None), *idx)]


def _at(offset: tuple[int, ...]) -> tuple[slice | int, ...]:
    """The index of one kernel offset of a [C, C', *K] weight."""
    return (slice(None), slice(None), *offset)


@mil_op("conv")
def conv(op: OpCall) -> Array:
    x, w = wide(op.arr("x")), wide(op.arr("weight"))  # w: [C_out, C_in/groups, *K]
    groups = int(op.scalar("groups", 1))
    kernel = list(w.shape[2:])
    strides, dil, pads = _spatial(op, kernel, list(x.shape[2:]))
    xp = np.pad(x, [(0, 0), (0, 0), *pads])
    out = [(xp.shape[2 + i] - (k - 1) * dil[i] - 1) // strides[i] + 1
           for i, k in enumerate(kernel)]
    n = x.shape[0]
    c_out, cg = w.shape[:2]
    og = c_out // groups
    positions = int(np.prod(out))
    acc = np.zeros((n, groups, og, positions), np.float32)
    for offset in itertools.product(*(range(k) for k in kernel)):
        xs = _window(xp, offset, strides, dil, out).reshape(n, groups, cg, positions)
        wk = w[_at(offset)].reshape(groups, og, cg)
        if cg == 1:  # depthwise-like: a broadcast product, not G tiny matmuls
            acc += wk[None, :, :, 0, None] * xs
        else:
            acc += np.matmul(wk[None], xs)
    res = acc.reshape(n, c_out, *out)
    if "bias" in op:
        res += wide(op.arr("bias")).reshape(1, -1, *([1] * len(kernel)))
    return res


@mil_op("conv_transpose")
def conv_transpose(op: OpCall) -> Array:
    x, w = wide(op.arr("x")), wide(op.arr("weight"))  # w: [C_in, C_out/groups, *K]
    groups = int(op.scalar("groups", 1))
    kernel = list(w.shape[2:])
    nsp = len(kernel)
    strides = op.ints("strides", [1] * nsp) or [1] * nsp
    dil = op.ints("dilations", [1] * nsp) or [1] * nsp
    dims = list(x.shape[2:])
    full = [(i - 1) * s + (k - 1) * d + 1 for i, s, k, d in zip(dims, strides, kernel, dil,
                                                               strict=True)]
    n, c_in = x.shape[:2]
    og = w.shape[1]
    cg = c_in // groups
    acc = np.zeros((n, groups, og, *full), np.float32)
    xs = x.reshape(n, groups, cg, -1)
    for offset in itertools.product(*(range(k) for k in kernel)):
        wk = w[_at(offset)].reshape(groups, cg, og)
        contrib = np.matmul(np.swapaxes(wk, 1, 2)[None], xs).reshape(n, groups, og, *dims)
        idx = tuple(slice(o * d, o * d + s * (i - 1) + 1, s)
                    for o, d, s, i in zip(offset, dil, strides, dims, strict=True))
        acc[(slice(None), slice(None), slice(None), *idx)] += contrib
    res = acc.reshape(n, groups * og, *full)
    out_dims = _transpose_out(op, full, dims, strides, nsp)
    crop = tuple(slice(b, b + o) for b, o in out_dims)
    res = res[(slice(None), slice(None), *crop)]
    if "bias" in op:
        res = res + wide(op.arr("bias")).reshape(1, -1, *([1] * nsp))
    return res


def _transpose_out(op: OpCall, full: list[int], dims: list[int], strides: list[int],
                   nsp: int) -> list[tuple[int, int]]:
    """(crop start, output size) per spatial dim of a conv_transpose."""
    pad_type = op.scalar("pad_type", "valid")
    given = op.ints("output_shape")
    if pad_type == "custom":
        p = op.ints("pad", [0] * 2 * nsp) or [0] * 2 * nsp
        sizes = [f - p[2 * i] - p[2 * i + 1] for i, f in enumerate(full)]
        starts = [p[2 * i] for i in range(nsp)]
    elif pad_type == "same":
        sizes = [i * s for i, s in zip(dims, strides, strict=True)]
        starts = [(f - o) // 2 for f, o in zip(full, sizes, strict=True)]
    else:
        sizes, starts = list(full), [0] * nsp
    if given:
        sizes = given[2:]
    return list(zip(starts, sizes, strict=True))


def _pool_geometry(op: OpCall, x: Array) -> tuple[list[int], list[int], list[tuple[int, int]],
                                                  list[int]]:
    kernel = op.ints("kernel_sizes") or []
    strides, _, pads = _spatial(op, kernel, list(x.shape[2:]))
    ceil = bool(op.scalar("ceil_mode", False))
    out = []
    for i, (k, s, (b, e)) in enumerate(zip(kernel, strides, pads, strict=True)):
        size, total = x.shape[2 + i], b + e
        if not ceil:
            out.append((size + total - k) // s + 1)
            continue
        o = (size + total - k + s - 1) // s + 1
        if (o - 1) * s >= size + total / 2 and total > 0:
            o -= 1
        out.append(o)
    return kernel, strides, pads, out


@mil_op("max_pool", "avg_pool", "l2_pool")
def pool(op: OpCall) -> Array:
    x = wide(op.arr("x"))
    kernel, strides, pads, out = _pool_geometry(op, x)
    # ceil mode may need windows past the padded input: pad the end further, as "absent"
    extra = [max(0, (o - 1) * s + k - (x.shape[2 + i] + b + e))
             for i, (o, s, k, (b, e)) in enumerate(zip(out, strides, kernel, pads, strict=True))]
    widths = [(0, 0), (0, 0), *((b, e + x_) for (b, e), x_ in zip(pads, extra, strict=True))]
    if op.type == "max_pool":
        xp = np.pad(x, widths, constant_values=-np.inf)
    else:
        xp = np.pad(np.square(x) if op.type == "l2_pool" else x, widths)
    ones = [1] * len(kernel)
    acc: Array | None = None
    for offset in itertools.product(*(range(k) for k in kernel)):
        win = _window(xp, offset, strides, ones, out)
        acc = win.copy() if acc is None else (
            np.maximum(acc, win) if op.type == "max_pool" else acc + win)
    assert acc is not None
    if op.type == "max_pool":
        return acc
    if op.type == "l2_pool":
        return np.sqrt(acc)
    exclude = bool(op.scalar("exclude_padding_from_average", False))
    # the divisor per output position: the window's part inside the input (exclude) or
    # inside the padded input (include), never the ceil-mode overhang
    mask = np.ones([1, 1, *x.shape[2:]], np.float32)
    if exclude:
        mask = np.pad(mask, widths)
    else:
        mask = np.pad(np.pad(mask, [(0, 0), (0, 0), *pads], constant_values=1),
                      [(0, 0), (0, 0), *((0, x_) for x_ in extra)])
    count: Array = sum(_window(mask, o, strides, ones, out)
                       for o in itertools.product(*(range(k) for k in kernel)))  # type: ignore
    return acc / np.maximum(count, 1)
