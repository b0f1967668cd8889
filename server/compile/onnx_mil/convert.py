"""ONNX graph → MIL program, node by node, with constant folding and `If` inlining.

`convert_model(model, inputs, target)` walks the graph in order:
- a node whose inputs are all known at conversion time (initializers, Constant nodes, shapes
  of static tensors) is evaluated with ONNX's own reference implementation, so shape
  arithmetic (Shape → Gather → Concat → Reshape) folds to constants with exact ONNX semantics
  and the program gets static shapes;
- an `If` whose condition folded to a constant is replaced by the branch it takes; any other
  `If` is refused, naming the node;
- every other node goes to its registered rule (registry.py), which emits MIL ops; a node
  without a rule for the model's opset is a `ConversionError` naming node, op type and opset,
  with what the uploader can do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import Function, Program, types
from onnx import GraphProto, ModelProto, NodeProto, numpy_helper

from server.compile.errors import ConversionError
from server.compile.onnx_mil import rules as _rules  # noqa: F401  (registers every rule)
from server.compile.onnx_mil.context import (
    NodeContext,
    RankLimit,
    Value,
    mil_name,
    to_mil_array,
    transposed_const,
)
from server.compile.onnx_mil.registry import opset_range, rule_for

# Ops never folded even with constant inputs: random draws must stay random.
_NO_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
            "Bernoulli", "Multinomial", "If", "Loop", "Scan"}
# Folded constants larger than this many elements stay a rule's job (a weight transform is
# still folded: this guards against materializing e.g. a ConstantOfShape of a huge tensor).
_FOLD_LIMIT = 1 << 26
MAX_RANK = 5
_ELEM: dict[int, Any] = {onnx.TensorProto.FLOAT: types.fp32, onnx.TensorProto.FLOAT16: types.fp16,
         onnx.TensorProto.INT64: types.int32, onnx.TensorProto.INT32: types.int32,
         onnx.TensorProto.BOOL: types.bool}

ADVICE = ("To compile this model for Core ML, re-export it so that the node uses operators "
          "the Core ML converter supports (docs/compile.md lists them, with opsets), or "
          "exclude the coreml platform for this model (the other platforms are unaffected)")


def model_opset(model: ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 1


def unsupported_nodes(model: ModelProto) -> list[dict[str, str]]:
    """Nodes (top level and in subgraphs) no rule claims at the model's opset — the Core ML
    support gate's findings, from the very registry the conversion uses."""
    opset = model_opset(model)
    found: list[dict[str, str]] = []

    def walk(graph: GraphProto) -> None:
        for node in graph.node:
            why = _no_rule_reason(node, opset)
            if why:
                found.append({"op": node.op_type, "node": node.name, "why": why})
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
    walk(model.graph)
    return found


def _no_rule_reason(node: NodeProto, opset: int) -> str:
    if node.domain not in ("", "ai.onnx"):
        return f"operator domain {node.domain!r} is not converted (only the ONNX default domain)"
    if node.op_type in ("If", "Constant") or rule_for(node.op_type, opset) is not None:
        return ""
    span = opset_range(node.op_type)
    if span is None:
        return f"no Core ML conversion rule for {node.op_type}"
    return (f"the Core ML rule for {node.op_type} covers opsets {span[0]}–{span[1]}, "
            f"not {opset}")


class _Converter:
    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.values: dict[str, Value] = {}
        self.names: set[str] = set()

    def graph(self, graph: GraphProto) -> None:
        for init in graph.initializer:
            self.values[init.name] = numpy_helper.to_array(init)
        for node in graph.node:
            self.node(node)

    def node(self, node: NodeProto) -> None:
        inputs = [self.values[n] if n else None for n in node.input]
        missing = [n for n, v in zip(node.input, inputs, strict=True) if n and v is None]
        if missing:
            raise ConversionError(f"node {node.name} reads {missing}, produced by no node")
        if node.op_type == "If":
            self._inline_if(node, inputs)
            return
        why = _no_rule_reason(node, self.opset)
        all_const = all(v is None or isinstance(v, np.ndarray) for v in inputs)
        if all_const and node.op_type not in _NO_FOLD and (
                why or sum(v.size for v in inputs if v is not None) <= _FOLD_LIMIT):
            outs = self._fold(node, inputs)
            if outs is not None:
                if node.op_type == "Transpose":  # a Constant node has no input to read
                    src = inputs[0]
                    perm = [list(a.ints) for a in node.attribute if a.name == "perm"]
                    if isinstance(src, np.ndarray) and src.ndim == 2 and \
                            (perm or [[1, 0]])[0] == [1, 0]:
                        outs = [transposed_const(outs[0], src)]
                self._store(node, outs)
                return
        if why:
            raise ConversionError(
                f"Core ML (ONNX → MIL): node {node.name or '(unnamed)'} ({node.op_type}, "
                f"opset {self.opset}): {why}. {ADVICE}.", [node.op_type],
                [{"op": node.op_type, "node": node.name, "why": why}])
        rule = rule_for(node.op_type, self.opset)
        assert rule is not None
        ctx = NodeContext(node, inputs, self.opset, self.names)
        try:
            produced = rule.fn(ctx)
        except ConversionError:
            raise
        except Exception as e:  # a MIL type/shape check refusing what the rule built
            ctx.fail(f"{type(e).__name__}: {str(e)[:300]}")
        self._store(node, produced)

    def _store(self, node: NodeProto, outs: Sequence[Any]) -> None:
        for name, v in zip(node.output, outs, strict=False):
            if not name:
                continue
            if not isinstance(v, np.ndarray) and v is not None and len(v.shape) > MAX_RANK:
                why = (f"output {name!r} has rank {len(v.shape)}; Core ML tensors have at "
                       f"most rank {MAX_RANK}")
                raise RankLimit(f"Core ML (ONNX → MIL): node {node.name or '(unnamed)'} "
                                f"({node.op_type}, opset {self.opset}): {why}. {ADVICE}.",
                                [node.op_type], [{"op": node.op_type, "node": node.name,
                                                  "why": why}])
            self.values[name] = v

    def _fold(self, node: NodeProto, inputs: list[Any]) -> list[Any] | None:
        from onnx.reference import ReferenceEvaluator

        feeds = {n: v for n, v in zip(node.input, inputs, strict=True) if n}
        try:
            outs = ReferenceEvaluator(node, opsets={"": self.opset}).run(None, feeds)
        except Exception:
            return None  # let the rule (or the missing-rule error) speak
        return [np.asarray(o) for o in outs]

    def _inline_if(self, node: NodeProto, inputs: list[Any]) -> None:
        cond = inputs[0]
        if not isinstance(cond, np.ndarray):
            why = ("its condition depends on the model's input values, and Core ML programs "
                   "here are built for one static path; only an If whose condition is fixed "
                   "by the declared shapes and constant inputs is folded")
            raise ConversionError(
                f"Core ML (ONNX → MIL): node {node.name or '(unnamed)'} (If, opset "
                f"{self.opset}): {why}. Re-export the model with the branch resolved (e.g. "
                "trace for the deployed input sizes), or exclude the coreml platform.",
                ["If"], [{"op": "If", "node": node.name, "why": why}])
        attrs = {a.name: a.g for a in node.attribute}
        branch = attrs["then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"]
        self.graph(branch)
        self._store(node, [self.values[o.name] for o in branch.output])


def _placeholder(value_info: onnx.ValueInfoProto, shape: Sequence[int]) -> Any:
    elem = value_info.type.tensor_type.elem_type
    if int(elem) not in _ELEM:
        raise ConversionError(
            f"graph input {value_info.name!r} has ONNX element type "
            f"{onnx.TensorProto.DataType.Name(elem)}; Core ML inputs are float32, float16, "
            "int32/int64 (as int32) or bool")
    return mb.placeholder(shape=tuple(shape), dtype=_ELEM[elem], allow_rank0_input=True)


def convert_model(model: ModelProto, shapes: dict[str, Sequence[int]], target: Any) -> Program:
    """The MIL program for `model` with the given static input shapes (by input name)."""
    graph = model.graph
    inits = {i.name for i in graph.initializer}
    conv = _Converter(model_opset(model))
    placeholders: dict[str, Any] = {}
    graph_inputs = [vi for vi in graph.input if vi.name not in inits]
    for vi in graph_inputs:
        if vi.name not in shapes:
            dims = vi.type.tensor_type.shape.dim
            if any(not d.HasField("dim_value") for d in dims):
                raise ConversionError(f"input {vi.name!r} has no declared static shape")
            shapes = {**shapes, vi.name: [d.dim_value for d in dims]}
        name = mil_name(vi.name)
        conv.names.add(name)
        placeholders[name] = _placeholder(vi, shapes[vi.name])
    with Function(placeholders, opset_version=target) as func:
        for vi in graph_inputs:
            conv.values[vi.name] = func.inputs[mil_name(vi.name)]
        conv.graph(graph)
        func.set_outputs([_output(conv, o.name) for o in graph.output])
    prog = Program()
    prog.add_function("main", func)
    return prog


def _output(conv: _Converter, name: str) -> Any:
    v = conv.values[name]
    want = mil_name(name)
    if isinstance(v, np.ndarray):
        v = mb.const(val=to_mil_array(v, f"output {name!r}"), name=f"{want}__const")
    if v.name == want and v.op is not None:
        return v
    if want in conv.names:
        want = f"{want}__out"
    conv.names.add(want)
    return mb.identity(x=v, name=want)
