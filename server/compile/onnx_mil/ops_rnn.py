"""Rules for ONNX's recurrent ops: LSTM → MIL `lstm` (gate order and bias layout rearranged);
GRU and RNN unrolled over the static sequence length with matmul and elementwise ops.

GRU is unrolled because MIL's `gru` puts the reset gate before the recurrent bias
(r ⊙ (W h) + b), which is ONNX's linear_before_reset=1 with a zero recurrent bias only; torch
and TensorFlow exports carry that bias, so mapping to `gru` would change the numbers.
Unrolling computes ONNX's equations as written, for either linear_before_reset.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from coremltools.converters.mil import Builder as mb

from server.compile.onnx_mil.context import NodeContext, dtype_of, shape_of
from server.compile.onnx_mil.registry import Outputs, onnx_op


def _layout(ctx: NodeContext, x: Any) -> Any:
    """X as [seq, batch, input] (layout=1 is batch-first)."""
    if ctx.attr("layout", 0):
        return mb.transpose(x=x, perm=[1, 0, 2], name=ctx.tmp())
    return x


def _check_lengths(ctx: NodeContext, seq: int) -> None:
    if ctx.has(4):
        lens = ctx.const(4)
        if np.any(np.asarray(lens) != seq):
            ctx.fail("sequence_lens shorter than the sequence is not converted; export "
                     "without per-sample lengths")


def _initial(ctx: NodeContext, i: int, dirs: int, batch: int, hidden: int, x: Any) -> Any:
    """An initial state as [dirs, batch, H] (zeros when absent; layout=1 gives it batch-first)."""
    if ctx.has(i):
        state = ctx.as_var(ctx.like(ctx.raw(i), x))
        if ctx.attr("layout", 0):
            state = mb.transpose(x=state, perm=[1, 0, 2], name=ctx.tmp())
        return state
    return ctx.as_var(np.zeros((dirs, batch, hidden), dtype_of(x)))


def _outputs(ctx: NodeContext, ys: Any, hs: list[Any], cs: list[Any] | None,
             batch_first: bool) -> Outputs:
    """Y [seq, dirs, batch, H] (or batch-first), Y_h / Y_c [dirs, batch, H] from lists."""
    outs: list[Any] = []
    y = ys
    if batch_first:
        y = mb.transpose(x=y, perm=[2, 0, 1, 3], name=ctx.tmp())
    outs.append(mb.identity(x=y, name=ctx.name(0)))
    for k, states in ((1, hs), (2, cs)):
        if states is None:
            continue
        st = states[0] if len(states) == 1 else mb.concat(values=states, axis=0, name=ctx.tmp())
        if batch_first:
            st = mb.transpose(x=st, perm=[1, 0, 2], name=ctx.tmp())
        outs.append(mb.identity(x=st, name=ctx.name(k)))
    return outs


_ACTS: dict[str, Callable[..., Any]] = {
    "sigmoid": lambda x, a, b, n: mb.sigmoid(x=x, name=n),
    "tanh": lambda x, a, b, n: mb.tanh(x=x, name=n),
    "relu": lambda x, a, b, n: mb.relu(x=x, name=n),
    "hardsigmoid": lambda x, a, b, n: mb.sigmoid_hard(x=x, alpha=a, beta=b, name=n),
    "leakyrelu": lambda x, a, b, n: mb.leaky_relu(x=x, alpha=a, name=n),
    "thresholdedrelu": lambda x, a, b, n: mb.thresholded_relu(x=x, alpha=a, name=n),
    "scaledtanh": lambda x, a, b, n: mb.scaled_tanh(x=x, alpha=a, beta=b, name=n),
    "affine": lambda x, a, b, n: mb.linear_activation(x=x, alpha=a, beta=b, name=n),
    "elu": lambda x, a, b, n: mb.elu(x=x, alpha=a, name=n),
    "softsign": lambda x, a, b, n: mb.softsign(x=x, name=n),
    "softplus": lambda x, a, b, n: mb.softplus(x=x, name=n),
}
_DEFAULT_AB = {"hardsigmoid": (0.2, 0.5), "leakyrelu": (0.01, 0.0), "thresholdedrelu": (1.0, 0),
               "scaledtanh": (1.0, 1.0), "affine": (1.0, 0.0), "elu": (1.0, 0.0)}


def _bind_act(f: Callable[..., Any], a: Any, b: Any) -> Callable[[Any, str], Any]:
    return lambda x, n: f(x, a, b, n)


def _activations(ctx: NodeContext, defaults: list[str], dirs: int
                 ) -> list[list[Callable[[Any, str], Any]]]:
    names = [str(a.decode() if isinstance(a, bytes) else a).lower()
             for a in ctx.attr("activations", defaults * dirs)]
    alphas = list(ctx.attr("activation_alpha", []))
    betas = list(ctx.attr("activation_beta", []))
    fns: list[Callable[[Any, str], Any]] = []
    ab_i = 0
    for nm in names:
        if nm not in _ACTS:
            ctx.fail(f"activation {nm!r} is not converted")
        a, b = _DEFAULT_AB.get(nm, (0.0, 0.0))
        if nm in _DEFAULT_AB:
            a = alphas[ab_i] if ab_i < len(alphas) else a
            b = betas[ab_i] if ab_i < len(betas) else b
            ab_i += 1
        fns.append(_bind_act(_ACTS[nm], np.float32(a), np.float32(b)))
    per = len(defaults)
    return [fns[d * per:(d + 1) * per] for d in range(dirs)]


def _unroll(ctx: NodeContext, cell: Callable[..., Any], gates: int) -> Outputs:
    """Shared unroller of GRU and RNN: per direction, X·Wᵀ + Wb for all steps in one matmul,
    then one `cell` call per step on (xw_t, h)."""
    x = _layout(ctx, ctx.var(0))
    seq, batch, _ = shape_of(x)
    _check_lengths(ctx, seq)
    w = ctx.like(ctx.const(1), x)
    r = ctx.like(ctx.const(2), x)
    dirs, hidden = w.shape[0], r.shape[2]
    b = ctx.like(ctx.const(3), x) if ctx.has(3) else np.zeros((dirs, 2 * gates * hidden),
                                                              dtype_of(x))
    h0 = _initial(ctx, 5, dirs, batch, hidden, x)
    direction = ctx.attr("direction", "forward")
    acts = _activations(ctx, ["Sigmoid", "Tanh"] if gates == 3 else ["Tanh"], dirs)
    clip = ctx.attr("clip")
    ys, hs = [], []
    for d in range(dirs):
        reverse = direction == "reverse" or d == 1
        xw = mb.add(x=mb.matmul(x=x, y=w[d].T.copy(), name=ctx.tmp()),
                    y=b[d][:gates * hidden].copy(), name=ctx.tmp())
        h = mb.reshape(x=mb.slice_by_index(x=h0, begin=[d, 0, 0], end=[d + 1, batch, hidden],
                                           name=ctx.tmp()), shape=[batch, hidden],
                       name=ctx.tmp())
        steps: list[Any] = [None] * seq
        for t in (range(seq - 1, -1, -1) if reverse else range(seq)):
            xt = mb.reshape(x=mb.slice_by_index(x=xw, begin=[t, 0, 0],
                                                end=[t + 1, batch, gates * hidden],
                                                name=ctx.tmp()),
                            shape=[batch, gates * hidden], name=ctx.tmp())
            h = cell(ctx, xt, h, r[d], b[d][gates * hidden:], hidden, acts[d], clip)
            steps[t] = mb.reshape(x=h, shape=[1, 1, batch, hidden], name=ctx.tmp())
        ys.append(mb.concat(values=steps, axis=0, name=ctx.tmp()) if seq > 1 else steps[0])
        hs.append(mb.reshape(x=h, shape=[1, batch, hidden], name=ctx.tmp()))
    y = ys[0] if dirs == 1 else mb.concat(values=ys, axis=1, name=ctx.tmp())
    return _outputs(ctx, y, hs, None, bool(ctx.attr("layout", 0)))


def _clip(ctx: NodeContext, v: Any, clip: Any) -> Any:
    if clip is None:
        return v
    return mb.clip(x=v, alpha=np.float32(-clip), beta=np.float32(clip), name=ctx.tmp())


def _gru_cell(ctx: NodeContext, xw: Any, h: Any, r: Any, rb: Any, hidden: int,
              acts: list[Callable[[Any, str], Any]], clip: Any) -> Any:
    f, g = acts
    xz, xr, xh = mb.split(x=xw, num_splits=3, axis=1, name=ctx.tmp())
    rz, rr, rh = r[:hidden], r[hidden:2 * hidden], r[2 * hidden:]
    bz, br, bh = rb[:hidden], rb[hidden:2 * hidden], rb[2 * hidden:]
    hz = mb.linear(x=h, weight=rz.copy(), bias=bz.copy(), name=ctx.tmp())
    hr = mb.linear(x=h, weight=rr.copy(), bias=br.copy(), name=ctx.tmp())
    z = f(_clip(ctx, mb.add(x=xz, y=hz, name=ctx.tmp()), clip), ctx.tmp())
    rt = f(_clip(ctx, mb.add(x=xr, y=hr, name=ctx.tmp()), clip), ctx.tmp())
    if ctx.attr("linear_before_reset", 0):
        hh = mb.mul(x=rt, y=mb.linear(x=h, weight=rh.copy(), bias=bh.copy(), name=ctx.tmp()),
                    name=ctx.tmp())
    else:
        hh = mb.linear(x=mb.mul(x=rt, y=h, name=ctx.tmp()), weight=rh.copy(), bias=bh.copy(),
                       name=ctx.tmp())
    n = g(_clip(ctx, mb.add(x=xh, y=hh, name=ctx.tmp()), clip), ctx.tmp())
    # (1 - z) * n + z * h  ==  n + z * (h - n)
    return mb.add(x=n, y=mb.mul(x=z, y=mb.sub(x=h, y=n, name=ctx.tmp()), name=ctx.tmp()),
                  name=ctx.tmp())


def _rnn_cell(ctx: NodeContext, xw: Any, h: Any, r: Any, rb: Any, hidden: int,
              acts: list[Callable[[Any, str], Any]], clip: Any) -> Any:
    hr = mb.linear(x=h, weight=r.copy(), bias=rb.copy(), name=ctx.tmp())
    return acts[0](_clip(ctx, mb.add(x=xw, y=hr, name=ctx.tmp()), clip), ctx.tmp())


@onnx_op("GRU")
def gru(ctx: NodeContext) -> Outputs:
    return _unroll(ctx, _gru_cell, 3)


@onnx_op("RNN")
def rnn(ctx: NodeContext) -> Outputs:
    return _unroll(ctx, _rnn_cell, 1)


def _iofc_to_ifoc(a: np.ndarray, hidden: int) -> np.ndarray:
    i, o, f, c = (a[k * hidden:(k + 1) * hidden] for k in range(4))
    return np.concatenate([i, f, o, c], axis=0)


@onnx_op("LSTM")
def lstm(ctx: NodeContext) -> Outputs:
    x = _layout(ctx, ctx.var(0))
    seq, batch, _ = shape_of(x)
    _check_lengths(ctx, seq)
    if ctx.attr("input_forget", 0):
        ctx.fail("LSTM with input_forget=1 (coupled gates) is not converted")
    w = ctx.like(ctx.const(1), x)
    r = ctx.like(ctx.const(2), x)
    dirs, hidden = w.shape[0], r.shape[2]
    b = ctx.like(ctx.const(3), x) if ctx.has(3) else np.zeros((dirs, 8 * hidden), dtype_of(x))
    names = [str(a.decode() if isinstance(a, bytes) else a).lower()
             for a in ctx.attr("activations", ["Sigmoid", "Tanh", "Tanh"] * dirs)]
    mil_acts = {"sigmoid": "sigmoid", "tanh": "tanh", "relu": "relu"}
    if any(n not in mil_acts for n in names) or (names[:3] != names[3:] and dirs == 2):
        ctx.fail(f"LSTM activations {names} are not converted (sigmoid / tanh / relu, the same "
                 "in both directions)")
    p = ctx.like(ctx.const(7), x) if ctx.has(7) else None

    def per_dir(d: int) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "weight_ih": _iofc_to_ifoc(w[d], hidden), "weight_hh": _iofc_to_ifoc(r[d], hidden),
            "bias": _iofc_to_ifoc(b[d][:4 * hidden] + b[d][4 * hidden:], hidden)}
        if p is not None:  # peepholes i, o, f → MIL's i, f, o
            pi, po, pf = p[d][:hidden], p[d][hidden:2 * hidden], p[d][2 * hidden:]
            kw["peephole"] = np.concatenate([pi, pf, po])
        return kw

    def state(i: int) -> Any:  # [dirs, batch, H] → [batch, dirs*H]
        s = _initial(ctx, i, dirs, batch, hidden, x)
        return mb.reshape(x=mb.transpose(x=s, perm=[1, 0, 2], name=ctx.tmp()),
                          shape=[batch, dirs * hidden], name=ctx.tmp())

    kw = per_dir(0)
    if dirs == 2:
        kw.update({f"{k}_back": v for k, v in per_dir(1).items()})
    clip = ctx.attr("clip")
    if clip is not None:
        kw["clip"] = np.float32(clip)
    direction = ctx.attr("direction", "forward")
    if direction == "reverse":
        # ONNX's reverse LSTM reads the sequence backwards and reports Y in input time order:
        # run forward over the reversed sequence and reverse Y back (no reliance on how a MIL
        # runtime orders a reverse lstm's outputs).
        x = mb.reverse(x=x, axes=[0], name=ctx.tmp())
    y, h, c = mb.lstm(x=x, initial_h=state(5), initial_c=state(6), output_sequence=True,
                      direction="bidirectional" if direction == "bidirectional" else "forward",
                      recurrent_activation=mil_acts[names[0]],
                      cell_activation=mil_acts[names[1]], activation=mil_acts[names[2]],
                      name=ctx.tmp(), **kw)
    if direction == "reverse":
        y = mb.reverse(x=y, axes=[0], name=ctx.tmp())
    y = mb.transpose(x=mb.reshape(x=y, shape=[seq, batch, dirs, hidden], name=ctx.tmp()),
                     perm=[0, 2, 1, 3], name=ctx.tmp())

    def split_state(s: Any) -> list[Any]:
        s = mb.transpose(x=mb.reshape(x=s, shape=[batch, dirs, hidden], name=ctx.tmp()),
                         perm=[1, 0, 2], name=ctx.tmp())
        return [s]
    return _outputs(ctx, y, split_state(h), split_state(c), bool(ctx.attr("layout", 0)))
