"""Rewrites of ONNX nodes the QNN HTP rejects into equivalent nodes it runs.

Applied only to the nodes the HTP probe (`htp_support.probe`) left on the CPU, so a graph the
HTP takes whole is compiled unchanged:

- GatherND with constant indices (exported attention masks, bool): Reshape + Gather of
  precomputed linear indices, bool data through int32;
- Erf: Abramowitz–Stegun 7.1.26 polynomial (|error| < 1.5e-7), from Abs, Mul, Add, Div, Exp,
  Sign — all HTP ops;
- Gelu: 0.5·x·(1 + erf(x/√2)) with that Erf (or the tanh form for approximate="tanh");
- Trilu with static shapes: Where with a constant triangular mask;
- Clip whose bounds are computed (not constants): Max / Min;
- LSTM / GRU the HTP refuses (sequence_lens, clip, other activations): unrolled per step
  (`server/compile/rnn_unroll.py`).
- Einsum that is a (batched, grouped) matrix product: Transpose / Reshape / MatMul
  (`server/compile/qnn_einsum.py`); other equations are named with what they do instead.

`rewrite(model, names)` returns the rewritten model and what was done, per node; a node that
has a rewrite but whose form it does not cover is left as is, with the reason in `refused`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from server.compile import qnn_einsum
from server.compile.rnn_unroll import unroll_gru, unroll_lstm

# Abramowitz & Stegun 7.1.26
_P = 0.3275911
_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


class _Builder:
    def __init__(self, model: Any, prefix: str) -> None:
        self.model, self.prefix = model, prefix
        self.nodes: list[Any] = []
        self.n = 0

    def name(self, what: str) -> str:
        self.n += 1
        return f"{self.prefix}/{what}_{self.n}"

    def const(self, value: Any, dtype: Any = np.float32) -> str:
        from onnx import numpy_helper

        name = self.name("c")
        self.model.graph.initializer.append(numpy_helper.from_array(
            np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs: Any) -> str:
        from onnx import helper

        y = out or self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [y], name=self.name(op_type),
                                           **attrs))
        return y


def _erf(b: _Builder, x: str, out: str | None = None) -> str:
    ax = b.op("Abs", [x])
    t = b.op("Div", [b.const(1.0), b.op("Add", [b.const(1.0), b.op("Mul", [ax, b.const(_P)])])])
    poly = b.op("Mul", [t, b.const(_A[4])])
    for a in reversed(_A[:4]):
        poly = b.op("Mul", [b.op("Add", [poly, b.const(a)]), t])
    e = b.op("Exp", [b.op("Neg", [b.op("Mul", [ax, ax])])])
    y = b.op("Sub", [b.const(1.0), b.op("Mul", [poly, e])])
    return b.op("Mul", [b.op("Sign", [x]), y], out)


def _erf_node(b: _Builder, node: Any, shapes: dict[str, Any]) -> str:
    _erf(b, node.input[0], node.output[0])
    return "Erf as a polynomial (Abramowitz–Stegun 7.1.26)"


def _gelu_node(b: _Builder, node: Any, shapes: dict[str, Any]) -> str:
    x = node.input[0]
    approximate = next((a.s.decode() for a in node.attribute if a.name == "approximate"),
                       "none")
    if approximate == "tanh":
        inner = b.op("Mul", [b.op("Add", [x, b.op("Mul", [b.const(0.044715), b.op(
            "Mul", [x, b.op("Mul", [x, x])])])]), b.const(np.sqrt(2 / np.pi))])
        one_plus = b.op("Add", [b.const(1.0), b.op("Tanh", [inner])])
    else:
        one_plus = b.op("Add", [b.const(1.0), _erf(b, b.op("Mul", [x, b.const(
            1 / np.sqrt(2))]))])
    b.op("Mul", [b.op("Mul", [x, b.const(0.5)]), one_plus], node.output[0])
    return "Gelu as 0.5·x·(1 + erf(x/√2)) with a polynomial Erf" if approximate != "tanh" \
        else "Gelu (tanh) from Tanh, Mul, Add"


def _gathernd_node(b: _Builder, node: Any, shapes: dict[str, Any]) -> str:
    """GatherND with constant indices (batch_dims 0) is a Gather on the flattened leading
    axes with precomputed linear indices; bool data goes through int32."""
    from onnx import TensorProto, numpy_helper

    consts = {t.name: t for t in b.model.graph.initializer}
    shape = shapes.get(node.input[0])
    if node.input[1] not in consts or not shape or any(
            a.name == "batch_dims" and a.i for a in node.attribute):
        raise ValueError("GatherND needs constant indices, a static data shape, batch_dims 0")
    idx = numpy_helper.to_array(consts[node.input[1]]).astype(np.int64)
    k = idx.shape[-1]
    lead = shape[:k]
    idx = np.where(idx < 0, idx + np.asarray(lead), idx)
    linear = np.ravel_multi_index(tuple(np.moveaxis(idx, -1, 0)), lead).astype(np.int64)
    dtype = shapes.get("__dtype__" + node.input[0])
    data = node.input[0]
    is_bool = dtype is not None and np.dtype(dtype) == np.bool_
    if is_bool:
        data = b.op("Cast", [data], to=TensorProto.INT32)
    flat = b.op("Reshape", [data, b.const([int(np.prod(lead)), *shape[k:]], np.int64)])
    g = b.op("Gather", [flat, b.const(linear, np.int64)], None if is_bool else node.output[0],
             axis=0)
    if is_bool:
        b.op("Cast", [g], node.output[0], to=TensorProto.BOOL)
    return "GatherND with constant indices as Reshape + Gather" + \
        (" through int32 (bool data)" if is_bool else "")


def _trilu_node(b: _Builder, node: Any, shapes: dict[str, Any]) -> str:
    shape = shapes.get(node.input[0])
    if not shape:
        raise ValueError("Trilu needs a static input shape to build its mask")
    k = 0
    if len(node.input) > 1 and node.input[1]:
        consts = {t.name: t for t in b.model.graph.initializer}
        if node.input[1] not in consts:
            raise ValueError("Trilu with a computed k")
        from onnx import numpy_helper

        k = int(numpy_helper.to_array(consts[node.input[1]]).reshape(-1)[0])
    upper = next((a.i for a in node.attribute if a.name == "upper"), 1)
    rows, cols = shape[-2], shape[-1]
    mask = np.triu(np.ones((rows, cols), bool), k) if upper else \
        np.tril(np.ones((rows, cols), bool), k)
    zero = b.const(np.zeros((), dtype=shapes.get("__dtype__" + node.input[0], np.float32)))
    b.op("Where", [b.const(mask, bool), node.input[0], zero], node.output[0])
    return "Trilu as Where with a constant triangular mask"


def _clip_node(b: _Builder, node: Any, shapes: dict[str, Any]) -> str:
    """Clip with computed bounds (a log-mel front end's `max(x, x.max() - 80)`): the HTP's
    Clip takes constant bounds only; Max then Min is the same function (ONNX's Clip gives
    `max` where min > max, and so does Min(Max(x, min), max))."""
    bounds = [*node.input[1:3], "", ""][:2]
    if not any(bounds):
        raise ValueError("Clip without bound inputs (none, or opset < 11 attributes): "
                         "nothing to rewrite")
    y = node.input[0]
    for op, bound, last in (("Max", bounds[0], not bounds[1]), ("Min", bounds[1], True)):
        if bound:
            y = b.op(op, [y, bound], node.output[0] if last else None)
    return "Clip with computed bounds as Max / Min"


REWRITES: dict[str, Callable[[_Builder, Any, dict[str, Any]], str]] = {
    "Clip": _clip_node, "Erf": _erf_node, "Gelu": _gelu_node, "GatherND": _gathernd_node,
    "Trilu": _trilu_node,
    # LSTM / GRU forms the HTP refuses (sequence_lens, clip, other activations): unrolled.
    "LSTM": unroll_lstm, "GRU": unroll_gru,
    "Einsum": qnn_einsum.build,
}


def _static_shapes(model: Any) -> dict[str, Any]:
    import onnx
    from onnx import helper

    inferred = onnx.shape_inference.infer_shapes(model)
    out: dict[str, Any] = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        tt = vi.type.tensor_type
        dims = [d.dim_value for d in tt.shape.dim]
        if dims and all(d > 0 for d in dims):
            out[vi.name] = dims
        if tt.elem_type:
            out["__dtype__" + vi.name] = helper.tensor_dtype_to_np_dtype(tt.elem_type)
    for t in model.graph.initializer:  # weights: static by nature
        if t.dims and all(d > 0 for d in t.dims):
            out.setdefault(t.name, list(t.dims))
        out.setdefault("__dtype__" + t.name, helper.tensor_dtype_to_np_dtype(t.data_type))
    return out


def rewrite(model: Any, names: set[str], refused: dict[str, str] | None = None
            ) -> tuple[Any, dict[str, str]]:
    """Rewrites the named nodes that have a decomposition (in place); returns the model and
    {node name: what was done} (nodes without a decomposition are left as they are; why a
    node's form has none goes to `refused`)."""
    shapes = _static_shapes(model)
    done: dict[str, str] = {}
    new_nodes = []
    for node in model.graph.node:
        fn = REWRITES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if fn is None or node.name not in names:
            new_nodes.append(node)
            continue
        b = _Builder(model, node.name or node.op_type)
        try:
            done[node.name] = fn(b, node, shapes)
        except ValueError as e:
            if refused is not None:
                refused[node.name] = str(e)
            new_nodes.append(node)
            continue
        new_nodes.extend(b.nodes)
    del model.graph.node[:]
    model.graph.node.extend(new_nodes)
    return model, done


# Inputs where an out-of-int32-range value means "to the end" and is clamped by the op.
_CLAMPED_INT64 = {("Slice", 1), ("Slice", 2)}
_I32 = np.iinfo(np.int32)


def int64_out_of_int32_range(model: Any) -> list[tuple[str, str, str]]:
    """(constant, consuming node, op) for every int64 constant with a value outside int32:
    the HTP computes 64-bit integers in 32 bits (as Qualcomm's converters truncate them), so
    such a constant would silently change meaning. Slice starts/ends are exempt (clamped)."""
    from onnx import TensorProto, numpy_helper

    bad = {t.name for t in model.graph.initializer if t.data_type == TensorProto.INT64
           and _outside_int32(numpy_helper.to_array(t))}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value" and a.t.data_type == TensorProto.INT64 \
                        and _outside_int32(numpy_helper.to_array(a.t)):
                    bad.add(node.output[0])
    found = []
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name in bad and (node.op_type, i) not in _CLAMPED_INT64:
                found.append((name, node.name or node.op_type, node.op_type))
    return found


def _outside_int32(values: Any) -> bool:
    return bool(values.size) and bool((values.min() < _I32.min) or (values.max() > _I32.max))
