"""Matrix products: matmul, linear, einsum. Inputs are widened to float32 and the products
accumulate in float32 (BLAS); the executor rounds the result to the declared dtype (float16
in an FP16 program) — FP16 storage with higher-precision accumulation."""

from __future__ import annotations

import numpy as np

from server.compile.milexec.registry import Array, OpCall, mil_op


def wide(x: Array) -> Array:
    """Floats as float32 (the accumulation type); integers unchanged."""
    return x.astype(np.float32) if x.dtype.kind == "f" and x.dtype != np.float64 else x


@mil_op("matmul")
def matmul(op: OpCall) -> Array:
    x, y = wide(op.arr("x")), wide(op.arr("y"))
    if op.scalar("transpose_x", False) and x.ndim > 1:
        x = np.swapaxes(x, -1, -2)
    if op.scalar("transpose_y", False) and y.ndim > 1:
        y = np.swapaxes(y, -1, -2)
    return np.asarray(np.matmul(x, y))


@mil_op("linear")
def linear(op: OpCall) -> Array:
    x, w = wide(op.arr("x")), wide(op.arr("weight"))  # weight: [D_out, D_in]
    out = np.matmul(x, w.T)
    if "bias" in op:
        out = out + wide(op.arr("bias"))
    return np.asarray(out)


@mil_op("einsum")
def einsum(op: OpCall) -> Array:
    values = [wide(np.asarray(v)) for v in op.inputs["values"]]
    return np.asarray(np.einsum(str(op.scalar("equation")), *values, optimize=True))


@mil_op("scaled_dot_product_attention")
def scaled_dot_product_attention(op: OpCall) -> Array:
    q, k, v = wide(op.arr("query")), wide(op.arr("key")), wide(op.arr("value"))
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) / np.sqrt(np.float32(q.shape[-1]))
    if "attn_mask" in op:
        mask = op.arr("attn_mask")
        scores = np.where(mask, scores, -np.inf) if mask.dtype == bool else scores + wide(mask)
    scores = np.exp(scores - np.max(scores, axis=-1, keepdims=True))
    return np.asarray(np.matmul(scores / np.sum(scores, axis=-1, keepdims=True), v))
