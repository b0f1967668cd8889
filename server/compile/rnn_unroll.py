"""LSTM and GRU unrolled over their static sequence length into MatMul, Add, Mul, Sigmoid,
Tanh (and Relu / HardSigmoid when the node names them), Where and Concat — ops every backend
runs. The QNN HTP takes a plain LSTM or GRU as its own op; it refuses sequence_lens, clip
and other activations, and those nodes are unrolled here instead
(`server/compile/qnn_prep.py` calls `unroll_lstm` / `unroll_gru` for the nodes it rejects).

Covered, as the ONNX spec defines them (opset 7–22): forward, reverse and bidirectional;
with or without initial_h / initial_c; sequence_lens (steps past a batch entry's length keep
its state and write zeros to Y); peepholes P; clip; input_forget; GRU linear_before_reset;
layout 1 (batch-first, opset 14). W, R, B and P must be constants (initializers, as every
exporter writes them); the input projection of all steps is one MatMul per gate, the
recurrence one MatMul per gate and step. A node outside this raises ValueError and is left
as it is (the caller then names it).

`seq_first(model)` is the exact rewrite every platform gets (from `server/compile/shapes.py`):
a batch-first node becomes its layout-0 form between Transposes, since onnxruntime's CPU
kernels have no layout-1 form either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


class Builder(Protocol):
    """What `server/compile/qnn_prep.py`'s builder provides."""

    def const(self, value: Any, dtype: Any = ...) -> str: ...

    def op(self, op_type: str, inputs: list[str], out: str | None = None,
           **attrs: Any) -> str: ...


_ACTIVATIONS = {"Sigmoid", "Tanh", "Relu", "HardSigmoid"}


@dataclass
class _Rnn:
    """One RNN node's static facts: sizes, constant weights, optional inputs."""

    node: Any
    T: int
    B: int
    H: int
    dirs: int
    reverse_only: bool
    layout: int
    W: Any  # [dirs, gates*H, I]
    R: Any  # [dirs, gates*H, H]
    bias: Any  # [dirs, 2*gates*H]
    acts: list[tuple[str, float, float]]  # (op, alpha, beta) per direction × activation
    clip: float | None
    x: str  # [T, B, I]
    lens: str  # [B, 1] int32, '' without sequence_lens
    init: dict[int, str]  # input index (5 h, 6 c) -> [dirs, B, H] tensor


def _attr(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _const(b: Builder, name: str) -> Any:
    """The value of an initializer (or None)."""
    from onnx import numpy_helper

    model = getattr(b, "model", None)
    if model is None or not name:
        return None
    for t in model.graph.initializer:
        if t.name == name:
            return numpy_helper.to_array(t)
    return None


def _input(node: Any, i: int) -> str:
    return node.input[i] if len(node.input) > i else ""


def _prepare(b: Builder, node: Any, shapes: dict[str, Any], gates: int,
             default_acts: list[str]) -> _Rnn:
    x_shape = shapes.get(node.input[0])
    if not x_shape or len(x_shape) != 3:
        raise ValueError(f"{node.op_type} needs a static 3-D input X to unroll")
    W, R = _const(b, node.input[1]), _const(b, node.input[2])
    if W is None or R is None:
        raise ValueError(f"{node.op_type} with computed W or R")
    H = int(_attr(node, "hidden_size", R.shape[-1]))
    dirs = W.shape[0]
    bias_name = _input(node, 3)
    bias = _const(b, bias_name) if bias_name else np.zeros((dirs, 2 * gates * H), W.dtype)
    if bias is None:
        raise ValueError(f"{node.op_type} with a computed B")
    direction = _attr(node, "direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else str(direction)
    layout = int(_attr(node, "layout", 0))
    names = [a.decode() if isinstance(a, bytes) else str(a)
             for a in _attr(node, "activations", [])] or default_acts * dirs
    alphas = list(_attr(node, "activation_alpha", []))
    betas = list(_attr(node, "activation_beta", []))
    acts: list[tuple[str, float, float]] = []
    for i, name in enumerate(names):
        if name not in _ACTIVATIONS:
            raise ValueError(f"{node.op_type} activation {name} has no unrolled form")
        acts.append((name, float(alphas[i]) if i < len(alphas) else 0.2,
                     float(betas[i]) if i < len(betas) else 0.5))
    clip = _attr(node, "clip", None)
    x = node.input[0]
    T, B = (x_shape[1], x_shape[0]) if layout else (x_shape[0], x_shape[1])
    if layout:
        x = b.op("Transpose", [x], perm=[1, 0, 2])
    lens = ""
    if _input(node, 4):
        lens = b.op("Reshape", [b.op("Cast", [node.input[4]], to=6),
                                b.const([B, 1], np.int64)])
    init = {}
    for i in (5, 6):
        if _input(node, i):
            init[i] = b.op("Transpose", [node.input[i]], perm=[1, 0, 2]) if layout \
                else node.input[i]
    return _Rnn(node, T, B, H, dirs, direction == "reverse", layout, W, R, bias, acts,
                None if clip is None else float(clip), x, lens, init)


def _act(b: Builder, spec: tuple[str, float, float], x: str, clip: float | None) -> str:
    if clip is not None:
        x = b.op("Max", [b.op("Min", [x, b.const(clip)]), b.const(-clip)])
    name, alpha, beta = spec
    if name == "HardSigmoid":
        return b.op(name, [x], alpha=alpha, beta=beta)
    return b.op(name, [x])


class _Direction:
    """The per-gate projections of one direction: X·Wᵀ + biases for all steps at once,
    and the recurrent weights Rᵀ per gate."""

    def __init__(self, b: Builder, rnn: _Rnn, d: int, gates: int) -> None:
        H = rnn.H
        self.b, self.rnn, self.d = b, rnn, d
        self.x_proj: list[str] = []
        self.r_t: list[str] = []
        self.r_bias: list[Any] = []
        for g in range(gates):
            w_t = rnn.W[d, g * H:(g + 1) * H].T
            wb = rnn.bias[d, g * H:(g + 1) * H]
            rb = rnn.bias[d, (gates + g) * H:(gates + g + 1) * H]
            self.r_bias.append(rb)
            self.x_proj.append(b.op("Add", [b.op("MatMul", [rnn.x, b.const(w_t, w_t.dtype)]),
                                            b.const(wb, wb.dtype)]))
            self.r_t.append(b.const(rnn.R[d, g * H:(g + 1) * H].T.copy(), rnn.R.dtype))

    def step_x(self, g: int, t: int) -> str:
        """gate g's input projection at step t: [B, H]."""
        return self.b.op("Gather", [self.x_proj[g], self.b.const(t, np.int64)], axis=0)

    def rec(self, g: int, h: str, with_bias: bool = True) -> str:
        y = self.b.op("MatMul", [h, self.r_t[g]])
        return self.b.op("Add", [y, self.b.const(self.r_bias[g])]) if with_bias else y

    def initial(self, index: int) -> str:
        b, rnn = self.b, self.rnn
        if index in rnn.init:
            return b.op("Gather", [rnn.init[index], b.const(self.d, np.int64)], axis=0)
        return b.const(np.zeros((rnn.B, rnn.H), rnn.W.dtype), rnn.W.dtype)

    def order(self) -> list[int]:
        reverse = self.rnn.reverse_only or self.d == 1
        return list(range(self.rnn.T))[::-1] if reverse else list(range(self.rnn.T))

    def keep(self, t: int, new: str, old: str) -> str:
        """`new` where step t is within the entry's sequence length, else `old`."""
        if not self.rnn.lens:
            return new
        mask = self.b.op("Less", [self.b.const(t, np.int32), self.rnn.lens])
        return self.b.op("Where", [mask, new, old])


def _emit(b: Builder, rnn: _Rnn, ys: list[dict[int, str]], finals: list[list[str]]) -> None:
    """Writes Y, Y_h (and Y_c) in the node's layout from per-direction step outputs."""
    node, H, B, dirs = rnn.node, rnn.H, rnn.B, rnn.dirs
    zero = b.const(np.zeros((B, H), rnn.W.dtype), rnn.W.dtype)
    y_name = _input_out(node, 0)
    if y_name:
        steps = []
        for t in range(rnn.T):
            per_dir = [b.op("Reshape", [rnn_out if not rnn.lens else b.op(
                "Where", [b.op("Less", [b.const(t, np.int32), rnn.lens]), rnn_out, zero]),
                b.const([1, 1, B, H], np.int64)]) for rnn_out in (ys[d][t] for d in range(dirs))]
            steps.append(per_dir[0] if dirs == 1 else b.op("Concat", per_dir, axis=1))
        y = b.op("Concat", steps, axis=0) if rnn.T > 1 else steps[0]
        if rnn.layout:
            b.op("Transpose", [y], y_name, perm=[2, 0, 1, 3])
        else:
            b.op("Identity", [y], y_name)
    for k, states in enumerate(finals, start=1):
        name = _input_out(node, k)
        if not name:
            continue
        parts = [b.op("Reshape", [s, b.const([1, B, H], np.int64)]) for s in states]
        joined = parts[0] if dirs == 1 else b.op("Concat", parts, axis=0)
        if rnn.layout:
            b.op("Transpose", [joined], name, perm=[1, 0, 2])
        else:
            b.op("Identity", [joined], name)


def _input_out(node: Any, i: int) -> str:
    return node.output[i] if len(node.output) > i else ""


def unroll_lstm(b: Builder, node: Any, shapes: dict[str, Any]) -> str:
    """An LSTM node as per-step ops (gate order i, o, f, c; see the module docstring)."""
    rnn = _prepare(b, node, shapes, 4, ["Sigmoid", "Tanh", "Tanh"])
    P = _const(b, _input(node, 7)) if _input(node, 7) else None
    if _input(node, 7) and P is None:
        raise ValueError("LSTM with computed peepholes")
    coupled = bool(_attr(node, "input_forget", 0))
    ys: list[dict[int, str]] = []
    h_finals, c_finals = [], []
    for d in range(rnn.dirs):
        dr = _Direction(b, rnn, d, 4)
        f_act, g_act, h_act = rnn.acts[3 * d:3 * d + 3]
        h, c = dr.initial(5), dr.initial(6)
        out: dict[int, str] = {}
        for t in dr.order():
            def pre(g: int, cell: str | None = None, peep: int = -1, t: int = t,
                    h: str = h, dr: _Direction = dr) -> str:
                z = b.op("Add", [dr.step_x(g, t), dr.rec(g, h)])
                if P is not None and cell is not None:
                    z = b.op("Add", [z, b.op("Mul", [cell, b.const(
                        P[dr.d, peep * rnn.H:(peep + 1) * rnn.H], P.dtype)])])
                return z
            i_g = _act(b, f_act, pre(0, c, 0), rnn.clip)
            f_g = b.op("Sub", [b.const(1.0, rnn.W.dtype), i_g]) if coupled else \
                _act(b, f_act, pre(2, c, 2), rnn.clip)
            c_hat = _act(b, g_act, pre(3), rnn.clip)
            c_new = b.op("Add", [b.op("Mul", [f_g, c]), b.op("Mul", [i_g, c_hat])])
            o_g = _act(b, f_act, pre(1, c_new, 1), rnn.clip)
            h_new = b.op("Mul", [o_g, _act(b, h_act, c_new, None)])
            h, c = dr.keep(t, h_new, h), dr.keep(t, c_new, c)
            out[t] = h_new
        ys.append(out)
        h_finals.append(h)
        c_finals.append(c)
    _emit(b, rnn, ys, [h_finals, c_finals])
    return _note("LSTM", rnn)


def unroll_gru(b: Builder, node: Any, shapes: dict[str, Any]) -> str:
    """A GRU node as per-step ops (gate order z, r, h; see the module docstring)."""
    rnn = _prepare(b, node, shapes, 3, ["Sigmoid", "Tanh"])
    lbr = bool(_attr(node, "linear_before_reset", 0))
    ys: list[dict[int, str]] = []
    finals = []
    one = b.const(1.0, rnn.W.dtype)
    for d in range(rnn.dirs):
        dr = _Direction(b, rnn, d, 3)
        f_act, g_act = rnn.acts[2 * d:2 * d + 2]
        h = dr.initial(5)
        out: dict[int, str] = {}
        for t in dr.order():
            z = _act(b, f_act, b.op("Add", [dr.step_x(0, t), dr.rec(0, h)]), rnn.clip)
            r = _act(b, f_act, b.op("Add", [dr.step_x(1, t), dr.rec(1, h)]), rnn.clip)
            if lbr:
                rec = b.op("Mul", [r, dr.rec(2, h)])
            else:
                rec = dr.rec(2, b.op("Mul", [r, h]))
            h_hat = _act(b, g_act, b.op("Add", [dr.step_x(2, t), rec]), rnn.clip)
            h_new = b.op("Add", [b.op("Mul", [b.op("Sub", [one, z]), h_hat]),
                                 b.op("Mul", [z, h])])
            h = dr.keep(t, h_new, h)
            out[t] = h_new
        ys.append(out)
        finals.append(h)
    _emit(b, rnn, ys, [finals])
    return _note("GRU", rnn)


def _note(op: str, rnn: _Rnn) -> str:
    how = "bidirectional" if rnn.dirs == 2 else ("reverse" if rnn.reverse_only else "forward")
    extras = [w for w, on in (("sequence_lens", bool(rnn.lens)), ("clip", rnn.clip is not None),
                              ("batch-first", bool(rnn.layout))) if on]
    return (f"{op} unrolled over {rnn.T} steps ({how}, hidden {rnn.H}"
            + "".join(f", {e}" for e in extras) + ") into MatMul/Add/Mul and its activations")


def batch_first_rnns(model: Any) -> list[Any]:
    """LSTM / GRU / RNN nodes with layout=1 (batch-first, opset 14)."""
    return [n for n in model.graph.node if n.op_type in ("LSTM", "GRU", "RNN")
            and n.domain in ("", "ai.onnx") and int(_attr(n, "layout", 0)) == 1]


def seq_first(model: Any) -> list[str]:
    """Rewrites every batch-first RNN node (in place) as its layout-0 form between
    Transposes: X and the initial states in, Y and the final states out. Exact (only
    data movement); onnxruntime's CPU kernels and the HTP have no layout-1 form. Returns
    the names of the nodes rewritten."""
    from onnx import helper

    done: list[str] = []
    nodes: list[Any] = []
    wanted = {id(n) for n in batch_first_rnns(model)}
    for node in model.graph.node:
        if id(node) not in wanted:
            nodes.append(node)
            continue
        name = node.name or f"{node.op_type}_{len(done)}"
        new = helper.make_node(node.op_type, list(node.input), list(node.output),
                               name=node.name, domain=node.domain)
        new.attribute.extend(a for a in node.attribute if a.name != "layout")
        for i in (0, 5, 6):
            if len(node.input) > i and node.input[i]:
                moved = f"{name}/seq_first_in{i}"
                nodes.append(helper.make_node("Transpose", [node.input[i]], [moved],
                                              name=f"{name}/to_seq_first{i}", perm=[1, 0, 2]))
                new.input[i] = moved
        after = []
        for i, out in enumerate(node.output):
            if not out:
                continue
            inner = f"{name}/seq_first_out{i}"
            new.output[i] = inner
            after.append(helper.make_node("Transpose", [inner], [out],
                                          name=f"{name}/to_batch_first{i}",
                                          perm=[2, 0, 1, 3] if i == 0 else [1, 0, 2]))
        nodes.extend([new, *after])
        done.append(name)
    if done:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return done
