"""Recurrent MIL ops `rnn`, `gru` and `lstm`, stepped in float32 (one float32 matmul per
step and gate), the outputs rounded to the declared dtype by the executor.

The gate layouts follow the MIL op docs and coremltools' own numpy references
(mil/ops/tests/iOS14/test_recurrent.py): lstm weights in [input, forget, output, cell]
order, `bias` = input + hidden bias, peepholes [i, f, o], `clip` bounds the cell state;
gru weights in [reset, output (new), update] order with the reset gate applied to the hidden
state before its matmul, or after it (PyTorch's form) with iOS18's `reset_after` and
`input_bias`. A `reverse` direction emits its steps in processing order; `bidirectional`
lstm emits the backward half aligned with the input's time axis.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from server.compile.milexec.ops.linear import wide
from server.compile.milexec.registry import Array, OpCall, mil_op

_ACT: dict[str, Callable[[Array], Any]] = {
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0), "linear": lambda x: x,
    "scaled_tanh": np.tanh, "sigmoid_hard": lambda x: np.clip(0.2 * x + 0.5, 0, 1),
}


def _act(op: OpCall, key: str, default: str) -> Callable[[Array], Any]:
    name = str(op.scalar(key, default)).lower()
    if name not in _ACT or name == "scaled_tanh":
        raise op.unsupported(f"{key} {name!r}")
    return _ACT[name]


def _optional(op: OpCall, key: str, size: int) -> Array:
    return wide(op.arr(key)) if key in op else np.zeros(size, np.float32)


def _finish(op: OpCall, steps: list[Array], state: list[Array]) -> tuple[Array, ...]:
    seq = np.stack(steps) if op.scalar("output_sequence", False) else steps[-1][None]
    return (seq, *state)


@mil_op("rnn")
def rnn(op: OpCall) -> tuple[Array, ...]:
    x, h = wide(op.arr("x")), wide(op.arr("initial_h"))
    w_ih, w_hh = wide(op.arr("weight_ih")), wide(op.arr("weight_hh"))
    b = _optional(op, "bias", w_ih.shape[0])
    act = _act(op, "activation", "tanh")
    xs = x[::-1] if op.scalar("direction", "forward") == "reverse" else x
    steps = []
    for xt in xs:
        h = act(xt @ w_ih.T + h @ w_hh.T + b)
        steps.append(h)
    return _finish(op, steps, [h])


@mil_op("gru")
def gru(op: OpCall) -> tuple[Array, ...]:
    x, h = wide(op.arr("x")), wide(op.arr("initial_h"))
    w_ih, w_hh = wide(op.arr("weight_ih")), wide(op.arr("weight_hh"))
    hidden = w_hh.shape[1]
    b = _optional(op, "bias", 3 * hidden)
    b_in = _optional(op, "input_bias", 3 * hidden)
    after = bool(op.scalar("reset_after", False))
    rec, act = _act(op, "recurrent_activation", "sigmoid"), _act(op, "activation", "tanh")
    wr, wo, wz = np.split(w_ih, 3)
    rr, ro, rz = np.split(w_hh, 3)
    br, bo, bz = np.split(b, 3)
    ir, io, iz = np.split(b_in, 3)
    xs = x[::-1] if op.scalar("direction", "forward") == "reverse" else x
    steps = []
    for xt in xs:
        r = rec(xt @ wr.T + ir + h @ rr.T + br)
        z = rec(xt @ wz.T + iz + h @ rz.T + bz)
        if after:
            o = act(xt @ wo.T + io + r * (h @ ro.T + bo))
        else:
            o = act(xt @ wo.T + io + (r * h) @ ro.T + bo)
        h = (1 - z) * o + z * h
        steps.append(h)
    return _finish(op, steps, [h])


def _lstm_pass(xs: Array, h: Array, c: Array, w_ih: Array, w_hh: Array, b: Array, p: Array,
               acts: tuple[Any, Any, Any], clip: float | None) -> tuple[list[Array], Array,
                                                                       Array]:
    rec, cell, out = acts
    pi, pf, po = np.split(p, 3)
    steps = []
    for xt in xs:
        gi, gf, go, gz = np.split(xt @ w_ih.T + h @ w_hh.T + b, 4, axis=-1)
        i, f, z = rec(gi + c * pi), rec(gf + c * pf), cell(gz)
        c = f * c + i * z
        if clip is not None:
            c = np.clip(c, -clip, clip)
        h = rec(go + c * po) * out(c)
        steps.append(h)
    return steps, h, c


@mil_op("lstm")
def lstm(op: OpCall) -> tuple[Array, ...]:
    x = wide(op.arr("x"))
    h0, c0 = wide(op.arr("initial_h")), wide(op.arr("initial_c"))
    w_ih = wide(op.arr("weight_ih"))
    hidden = w_ih.shape[0] // 4
    acts = (_act(op, "recurrent_activation", "sigmoid"), _act(op, "cell_activation", "tanh"),
            _act(op, "activation", "tanh"))
    clip = op.scalar("clip")
    direction = op.scalar("direction", "forward")
    fwd = _lstm_pass(x[::-1] if direction == "reverse" else x, h0[:, :hidden],
                     c0[:, :hidden], w_ih, wide(op.arr("weight_hh")),
                     _optional(op, "bias", 4 * hidden), _optional(op, "peephole", 3 * hidden),
                     acts, clip)
    if direction != "bidirectional":
        return _finish(op, fwd[0], [fwd[1], fwd[2]])
    back = _lstm_pass(x[::-1], h0[:, hidden:], c0[:, hidden:], wide(op.arr("weight_ih_back")),
                      wide(op.arr("weight_hh_back")), _optional(op, "bias_back", 4 * hidden),
                      _optional(op, "peephole_back", 3 * hidden), acts, clip)
    if op.scalar("output_sequence", False):
        seq = np.concatenate([np.stack(fwd[0]), np.stack(back[0][::-1])], axis=-1)
    else:
        seq = np.concatenate([fwd[0][-1], back[0][-1]], axis=-1)[None]
    return (seq, np.concatenate([fwd[1], back[1]], axis=-1),
            np.concatenate([fwd[2], back[2]], axis=-1))
