"""An `If` on tensor values as dataflow: both branches inlined, `Where` picks the result.

Exporters write a data-dependent `If` where the model's Python code branched on a value:
openWakeWord's keyword heads run a second "verifier" network only when the first score
passes a threshold (`if p1 >= 0.5: return verifier(x)`), a model may skip a refinement
stage for easy inputs. No compiler here takes control flow, but such an `If` is a select
when its branches are plain dataflow: computing both and keeping one with
`Where(cond, then, else)` gives the same outputs (ONNX operators have no side effects), at
the cost of always running both branches.

`select_ifs(model)` does that in place for every top-level `If` whose branches
- hold no nested subgraph (a `Loop`, `Scan` or inner `If` would need the same treatment
  recursively; it is refused with that reason),
- give outputs of the same dtype and the same static shape in both branches (after
  inlining, by shape inference; `Where` would otherwise broadcast one branch's result to a
  shape that branch never had).
Every other `If` is left as it was, with the reason, for the caller's refusal message.
Names inside a branch are prefixed with the `If` node's name and the branch (`…/then/…`),
so the two branches' locals and the outer graph's names never collide; outer names a
branch reads are kept.
"""

from __future__ import annotations

from typing import Any

BRANCHES = ("then_branch", "else_branch")


def select_ifs(model: Any) -> tuple[list[str], dict[str, str]]:
    """Replaces each top-level `If` that qualifies (above) with its inlined branches and one
    `Where` per output, in place; returns (the replaced nodes' names, {name: why not} for
    the `If` nodes kept)."""
    import onnx

    selected: list[str] = []
    kept: dict[str, str] = {}
    for index in range(len(model.graph.node) - 1, -1, -1):  # from the end: indexes stay valid
        node = model.graph.node[index]
        if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
            continue
        name = node.name or f"If{index}"
        nested = _nested(node)
        if nested:
            kept[name] = f"a branch holds control flow of its own ({nested})"
            continue
        trial = onnx.ModelProto()
        trial.CopyFrom(model)
        pairs = _inline(trial, index, name)
        why = _mismatch(trial, pairs)
        if why:
            kept[name] = why
            continue
        model.CopyFrom(trial)
        selected.append(name)
    return selected[::-1], kept


def _nested(node: Any) -> str:
    for a in node.attribute:
        if a.type == a.GRAPH:
            for inner in a.g.node:
                if any(x.type in (x.GRAPH, x.GRAPHS) for x in inner.attribute):
                    return f"{inner.op_type} node {inner.name or inner.output[0]!r}"
    return ""


def _inline(model: Any, index: int, name: str) -> list[tuple[str, str, str]]:
    """Replaces node `index` (an `If`) with both branches and the `Where`s; returns
    (then output, else output, If output) for each output."""
    from onnx import TensorProto, helper, numpy_helper

    node = model.graph.node[index]
    graphs = {a.name: a.g for a in node.attribute if a.type == a.GRAPH}
    new: list[Any] = []
    results: dict[str, list[str]] = {}
    for branch in BRANCHES:
        g = graphs[branch]
        prefix = f"{name}/{branch.split('_')[0]}/"
        local = {t.name for t in g.initializer} | {o for n in g.node for o in n.output if o}
        rename = {x: prefix + x for x in local}
        for t in g.initializer:
            moved = numpy_helper.from_array(numpy_helper.to_array(t), rename[t.name])
            model.graph.initializer.append(moved)
        for j, inner in enumerate(g.node):
            copy = helper.make_node(inner.op_type, [rename.get(i, i) for i in inner.input],
                                    [rename.get(o, o) for o in inner.output],
                                    name=prefix + (inner.name or f"{inner.op_type}_{j}"),
                                    domain=inner.domain or None)
            copy.attribute.extend(inner.attribute)
            new.append(copy)
        results[branch] = [rename.get(o.name, o.name) for o in g.output]
    cond = f"{name}/cond_scalar"
    shape = f"{name}/scalar_shape"
    model.graph.initializer.append(helper.make_tensor(shape, TensorProto.INT64, [0], []))
    new.append(helper.make_node("Reshape", [node.input[0], shape], [cond],
                                name=f"{name}/cond_reshape"))
    pairs = []
    for k, out in enumerate(node.output):
        then_out, else_out = results["then_branch"][k], results["else_branch"][k]
        new.append(helper.make_node("Where", [cond, then_out, else_out], [out],
                                    name=f"{name}/select_{k}"))
        pairs.append((then_out, else_out, out))
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes[:index] + new + nodes[index + 1:])
    return pairs


def _mismatch(model: Any, pairs: list[tuple[str, str, str]]) -> str:
    """Why the inlined branches cannot be selected by `Where`, or ""."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception as e:
        return f"shape inference fails on its inlined branches ({type(e).__name__}: {e})"
    known = {vi.name: vi.type.tensor_type for vi in
             [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]}
    for t in inferred.graph.initializer:
        known.setdefault(t.name, onnx.helper.make_tensor_type_proto(t.data_type, t.dims)
                         .tensor_type)
    for then_out, else_out, out in pairs:
        a, b = known.get(then_out), known.get(else_out)
        dims = [_static(x) for x in (a, b)]
        if a is None or b is None or None in dims:
            return f"output {out!r} has no static shape in both branches"
        if a.elem_type != b.elem_type or dims[0] != dims[1]:
            return (f"output {out!r} differs between the branches "
                    f"({_describe(a, dims[0])} vs {_describe(b, dims[1])})")
    return ""


def _static(t: Any) -> list[int] | None:
    if not t.HasField("shape") or not all(d.HasField("dim_value") for d in t.shape.dim):
        return None
    return [d.dim_value for d in t.shape.dim]


def _describe(t: Any, dims: list[int] | None) -> str:
    from onnx import helper

    return f"{helper.tensor_dtype_to_np_dtype(t.elem_type)}{dims}"
