"""MIL ops the ONNX → MIL converter (server/compile/onnx_mil) emits that the executor's own
op modules do not cover, each written from the MIL op's documented definition."""

from __future__ import annotations

import numpy as np

from server.compile.milexec.registry import Array, OpCall, mil_op


@mil_op("reverse_sequence")
def reverse_sequence(op: OpCall) -> Array:
    """Reverses the first `lengths[b]` steps along `seq_axis` of every batch entry `b`."""
    x = np.array(op.arr("x"))
    lengths = op.arr("lengths").reshape(-1)
    seq = int(op.scalar("seq_axis", 0)) % x.ndim
    batch = int(op.scalar("batch_axis", 0)) % x.ndim
    out = x.copy()
    for b, n in enumerate(lengths):
        n = int(n)
        src = [slice(None)] * x.ndim
        src[batch] = slice(b, b + 1)
        src[seq] = slice(0, n)
        out[tuple(src)] = np.flip(x[tuple(src)], axis=seq)
    return out
