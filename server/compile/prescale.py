"""Sums scaled after the reduction are scaled before it, so FP16 can hold them.

A mean written as a sum and a scale — `ReduceSum(x) * (1/N)` or `ReduceSum(x) / N`, as
jax2tf / tf2onnx export LayerNorm and torch exports masked means — overflows in FP16 when the
sum passes 65,504 although the mean is small: Magika's second LayerNorm sums 512 squares to
1.8e5, so every FP16 build (the HTP's, Core ML's) computed inf and then 0 from there on.
`ReduceSum(x * (1/N))` is the same value (exactly so when the scale is a power of two, as
1/512 is; within FP32 rounding otherwise) and each term, like the mean, stays in range.

`prescale_sums(model)` rewrites, in place, each ReduceSum whose output feeds only one Mul by
a constant scalar c with 0 < |c| < 1 (or one Div by a constant scalar d with |d| > 1) and is
no graph output; it returns the ReduceSum nodes' names. Other graphs are left untouched.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _scalars(model: Any) -> dict[str, tuple[float, int]]:
    """(value, rank) of each float constant with one element (initializers and Constant
    nodes), by name."""
    from onnx import TensorProto, numpy_helper

    out: dict[str, tuple[float, int]] = {}
    tensors = [(t.name, t) for t in model.graph.initializer]
    tensors += [(n.output[0], a.t) for n in model.graph.node if n.op_type == "Constant"
                for a in n.attribute if a.name == "value"]
    for name, t in tensors:
        if t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE):
            values = numpy_helper.to_array(t)
            if values.size == 1 and np.isfinite(values).all():
                out[name] = (float(values.reshape(-1)[0]), values.ndim)
    return out


def candidates(model: Any) -> list[tuple[int, int, str]]:
    """(ReduceSum node index, its scaling Mul / Div node's index, the constant's name) for
    each sum that qualifies (see the module docstring)."""
    import onnx

    scalars = _scalars(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph.value_info
    except Exception:
        inferred = []
    ranks = {vi.name: len(vi.type.tensor_type.shape.dim) for vi in inferred
             if vi.type.tensor_type.HasField("shape")}
    nodes = list(model.graph.node)
    consumers: dict[str, list[int]] = {}
    for j, node in enumerate(nodes):
        for name in node.input:
            consumers.setdefault(name, []).append(j)
    outputs = {o.name for o in model.graph.output}
    found = []
    for i, node in enumerate(nodes):
        if node.op_type != "ReduceSum" or node.domain not in ("", "ai.onnx"):
            continue
        total = node.output[0]
        users = consumers.get(total, [])
        if total in outputs or len(users) != 1:
            continue
        scale = nodes[users[0]]
        other = [x for x in scale.input if x != total]
        if len(scale.input) != 2 or len(other) != 1 or other[0] not in scalars:
            continue
        value, rank = scalars[other[0]]
        # A scale of higher rank than the sum broadcasts the sum up: not a plain scale.
        if rank > ranks.get(total, 0):
            continue
        if (scale.op_type == "Mul" and 0 < abs(value) < 1) or (
                scale.op_type == "Div" and scale.input[0] == total and abs(value) > 1):
            found.append((i, users[0], other[0]))
    return found


def prescale_sums(model: Any) -> list[str]:
    """Moves the constant scale of each qualifying sum before the ReduceSum, in place;
    returns the rewritten ReduceSum nodes' names."""
    from onnx import helper

    nodes = list(model.graph.node)
    replace: dict[int, list[Any]] = {}  # node index -> the nodes that stand for it
    done = []
    for i, j, constant in candidates(model):
        node, scale = nodes[i], nodes[j]
        name = node.name or f"ReduceSum{i}"
        scaled = f"{name}/prescaled"
        first = helper.make_node(scale.op_type, [node.input[0], constant], [scaled],
                                 name=f"{name}/prescale")
        summed = helper.make_node("ReduceSum", [scaled, *node.input[1:]], list(scale.output),
                                  name=name)
        summed.attribute.extend(node.attribute)
        # At the scale's place: its constant may be a Constant node after the ReduceSum.
        replace[i] = []
        replace[j] = [first, summed]
        done.append(name)
    if done:
        rebuilt = [n for k, node in enumerate(nodes) for n in replace.get(k, [node])]
        del model.graph.node[:]
        model.graph.node.extend(rebuilt)
    return done
