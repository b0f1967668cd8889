"""A dynamically quantized upload back to the FP32 graph its integer weights stand for.

`onnxruntime.quantization.quantize_dynamic` stores weights as int8 / uint8 and quantizes
activations at run time (`DynamicQuantizeLinear` → `ConvInteger` / `MatMulInteger` → `Cast` →
`Mul` by the two scales; LSTMs as com.microsoft `DynamicQuantizeLSTM`). PyPI packages ship
models that way to halve their wheels, often without the FP32 original. No device compiler
here takes those operators, and shape inference knows nothing of the contrib ones, so the
build rewrites them (docs/compile.md, "Dynamically quantized uploads"):

- `DynamicQuantizeLinear(x)`: its quantized output becomes `x` itself, its scale 1 and its
  zero point 0. Every scale product downstream (`x_scale * w_scale`) then reduces to the
  weight's scale, so the rest of the graph stays as exported.
- `ConvInteger` / `MatMulInteger` become `Conv` / `MatMul` on the float activation and the
  weight minus its zero point (unscaled: the `Mul` after them applies the weight scale).
- The bias that older exporters quantize at run time (`Div` by the scales → `Floor` → `Cast`
  to int32 → `Add` to the integer sum) keeps its `Div`, and loses the rounding and the cast.
- `DynamicQuantizeLSTM`, `DynamicQuantizeMatMul`, `MatMulIntegerToFloat`: the FP32 op with
  dequantized weights (the LSTM's are stored transposed, [dirs, in, 4·hidden]).

The result differs from the upload only by the upload's run-time rounding of activations to
8 bits, which the build measures and reports (`gates.dequantized`). Anything else (QAttention,
an integer input that neither a `DynamicQuantizeLinear` nor a constant feeds) is refused by
name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from server.compile.dequantize_static import (
    STATIC_QUANTIZATION_OPS,
    StaticRewrite,
    Unsupported,
    dequantized,
)
from server.compile.errors import InvalidSourceError

# What quantize_dynamic writes (and onnxruntime's fusions of it, in saved optimized graphs).
DYNAMIC_QUANTIZATION_OPS = {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger",
                            "DynamicQuantizeLSTM", "DynamicQuantizeMatMul", "QAttention",
                            "MatMulIntegerToFloat"}
REWRITTEN = (DYNAMIC_QUANTIZATION_OPS - {"QAttention"}) | STATIC_QUANTIZATION_OPS


@dataclass(frozen=True)
class Dequantized:
    """What the rewrite did: node counts per rewritten operator."""

    ops: dict[str, int]

    @property
    def nodes(self) -> int:
        return sum(self.ops.values())

    def note(self) -> str:
        kinds = ", ".join(f"{n} {op}" for op, n in sorted(self.ops.items()))
        return (f"{_kind(self.ops)} quantized upload ({kinds}) rewritten to FP32 with its "
                "integer weights dequantized; the upload's activation rounding is gone")


def _kind(ops: Any) -> str:
    return "dynamically" if set(ops) & DYNAMIC_QUANTIZATION_OPS else "statically"


def quantized_nodes(model: Any) -> list[Any]:
    """quantize_dynamic's and quantize_static's operators (QDQ and QOperator formats)."""
    return [n for n in model.graph.node
            if n.op_type in DYNAMIC_QUANTIZATION_OPS | STATIC_QUANTIZATION_OPS]


def dequantize(model: Any) -> Dequantized | None:
    """Rewrites `model` in place (see the module docstring); None when it has none of
    quantize_dynamic's operators."""
    found = quantized_nodes(model)
    if not found:
        return None
    refused = [n for n in found if n.op_type not in REWRITTEN]
    if refused:
        raise _refusal(found, f"{refused[0].op_type} {_name(refused[0])!r} has no FP32 "
                       "rewrite here")
    rewrite = _Rewrite(model)
    try:
        rewrite.run()
    except (_Unsupported, Unsupported) as e:
        raise _refusal(found, str(e)) from None
    ops: dict[str, int] = {}
    for n in found:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    return Dequantized(ops)


class _Unsupported(Exception):
    pass


def _name(node: Any) -> str:
    return str(node.name or node.output[0])


def _refusal(found: Sequence[Any], why: str) -> InvalidSourceError:
    kinds = sorted({n.op_type for n in found})
    named = ", ".join(f"{n.op_type} {_name(n)!r}" for n in found[:4])
    return InvalidSourceError(
        f"the upload is {_kind(kinds)} quantized ({len(found)} node(s) of {', '.join(kinds)}: "
        f"{named}{' …' if len(found) > 4 else ''}) and cannot be turned back into FP32: "
        f"{why}. Upload the FP32 model it was quantized from; the builds quantize it "
        "themselves (qnn: precision int8 / w8a16 with calibration inputs; coreml: "
        "weight_compression int8)")


class _Rewrite:
    def __init__(self, model: Any) -> None:
        from onnx import numpy_helper

        self.model = model
        self.graph = model.graph
        self.consts = {t.name: numpy_helper.to_array(t) for t in self.graph.initializer}
        for n in self.graph.node:
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                self.consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        self.dql_outputs: set[str] = set()  # the float-for-integer tensors after the rewrite
        self.new_inits: list[Any] = []
        self.integer_sums: set[str] = set()  # outputs of rewritten ConvInteger / MatMulInteger
        self.static = StaticRewrite(self.consts, self.dql_outputs, self._const, _name)

    def run(self) -> None:
        from onnx import TensorProto, helper

        out: list[Any] = []
        for node in self.graph.node:
            out.extend(self._node(node, helper))
        out = self._drop_bias_rounding(out)
        del self.graph.node[:]
        self.graph.node.extend(_live(out, {o.name for o in self.graph.output}))
        used = {i for n in self.graph.node for i in n.input} | {o.name for o in self.graph.output}
        keep = [t for t in self.graph.initializer if t.name in used]
        del self.graph.initializer[:]
        self.graph.initializer.extend(keep + [t for t in self.new_inits if t.name in used])
        # Inferred types of rewritten tensors (int32 sums, uint8 activations) are now wrong.
        del self.graph.value_info[:]
        for o in self.graph.output:
            if o.name in self.dql_outputs or o.name in self.integer_sums:
                kind = TensorProto.DataType.Name(o.type.tensor_type.elem_type)
                raise _Unsupported(f"graph output {o.name!r} is a quantized tensor ({kind}) "
                                   "that the app reads as such; the rewrite would make it "
                                   "float")
        if not any(n.domain == "com.microsoft" for n in self.graph.node):
            del_domains = [o for o in self.model.opset_import if o.domain == "com.microsoft"]
            for o in del_domains:
                self.model.opset_import.remove(o)

    def _const(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        self.new_inits.append(numpy_helper.from_array(value, name))
        self.consts[name] = value
        return name

    def _weight(self, node: Any, name: str, zero_point: str | None) -> str:
        """A constant integer operand minus its zero point, as float."""
        if name not in self.consts:
            raise _Unsupported(f"{node.op_type} {_name(node)!r} reads integer tensor {name!r}, "
                               "which is neither a DynamicQuantizeLinear output nor a constant")
        return self._const(f"{name}__dequantized",
                           self._dequantized(node, name, zero_point or "", scale=""))

    def _dequantized(self, node: Any, name: str, zero_point: str, scale: str) -> np.ndarray:
        """A constant integer weight, `(w − zero_point) · scale` (no scale: 1); per channel
        along a Conv weight's output channels, a MatMul weight's columns."""
        if zero_point and zero_point not in self.consts:
            raise _Unsupported(f"{node.op_type} {_name(node)!r} has a computed weight zero point")
        return dequantized(self.consts[name], self.consts[scale] if scale else None,
                           self.consts[zero_point] if zero_point else None,
                           axis=0 if node.op_type == "ConvInteger" else -1,
                           what=f"{node.op_type} {_name(node)!r}")

    def _operand(self, node: Any, name: str, zero_point: str | None) -> str:
        return name if name in self.dql_outputs else self._weight(node, name, zero_point)

    def _node(self, node: Any, helper: Any) -> list[Any]:
        op, ins = node.op_type, list(node.input) + [""] * 12
        if op == "DynamicQuantizeLinear":
            q, s, z = node.output
            self.dql_outputs.add(q)
            return [helper.make_node("Identity", [node.input[0]], [q], name=f"{_name(node)}_x"),
                    _constant(helper, s, np.array(1.0, np.float32)),
                    _constant(helper, z, np.array(0, np.uint8))]
        if op in ("ConvInteger", "MatMulInteger"):
            a = self._operand(node, ins[0], ins[2])
            b = self._operand(node, ins[1], ins[3])
            self.integer_sums.add(node.output[0])
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            return [helper.make_node(op.replace("Integer", ""), [a, b], list(node.output),
                                     name=node.name, **attrs)]
        if op == "DynamicQuantizeLSTM":
            return [self._lstm(node, ins, helper)]
        if op not in DYNAMIC_QUANTIZATION_OPS:
            return self.static.node(node, helper) or [node]
        if op == "DynamicQuantizeMatMul":  # A, B, b_scale, b_zero_point, bias
            b = self._scaled(node, ins[1], ins[3], ins[2])
            return self._matmul_bias(node, ins[0], b, ins[4], helper)
        if op == "MatMulIntegerToFloat":  # A, B, a_scale, b_scale, a_zp, b_zp, bias
            a = self._operand(node, ins[0], ins[4])
            b = self._scaled(node, ins[1], ins[5], ins[3]) \
                if ins[1] not in self.dql_outputs else ins[1]
            nodes = self._matmul_bias(node, a, b, "", helper, out=f"{node.output[0]}__mm")
            scaled = f"{node.output[0]}__mm"
            if ins[1] in self.dql_outputs:
                nodes.append(helper.make_node("Mul", [scaled, ins[3]], [f"{scaled}_b"]))
                scaled = f"{scaled}_b"
            last = [helper.make_node("Mul", [scaled, ins[2]], [
                node.output[0] if not ins[6] else f"{scaled}_a"])]
            if ins[6]:
                last.append(helper.make_node("Add", [f"{scaled}_a", ins[6]], [node.output[0]]))
            return nodes + last
        return [node]

    def _scaled(self, node: Any, name: str, zero_point: str, scale: str) -> str:
        """A constant integer weight dequantized: (w - zero_point) · scale."""
        if name not in self.consts or (scale and scale not in self.consts):
            raise _Unsupported(f"{node.op_type} {_name(node)!r} has a computed weight or scale")
        return self._const(f"{name}__dequantized",
                           self._dequantized(node, name, zero_point, scale))

    def _matmul_bias(self, node: Any, a: str, b: str, bias: str, helper: Any,
                     out: str | None = None) -> list[Any]:
        target = out or node.output[0]
        if not bias:
            return [helper.make_node("MatMul", [a, b], [target], name=node.name)]
        return [helper.make_node("MatMul", [a, b], [f"{target}__nobias"], name=node.name),
                helper.make_node("Add", [f"{target}__nobias", bias], [target])]

    def _lstm(self, node: Any, ins: list[str], helper: Any) -> Any:
        # X, W, R, B, sequence_lens, initial_h, initial_c, P, W_scale, W_zp, R_scale, R_zp;
        # W and R are [dirs, in / hidden, 4·hidden]: ONNX's LSTM wants [dirs, 4·hidden, …].
        def weight(w: str, scale: str, zp: str) -> str:
            if any(n and n not in self.consts for n in (w, scale, zp)):
                raise _Unsupported(f"DynamicQuantizeLSTM {_name(node)!r} has computed weights")
            q, s = self.consts[w], self.consts[scale]
            z = self.consts[zp] if zp else None
            what = f"DynamicQuantizeLSTM {_name(node)!r}"
            if s.ndim <= 1:  # per direction ([dirs])
                value = dequantized(q, s, z, axis=0, what=what)
            else:  # per direction and gate column ([dirs, 4·hidden]): one block per column
                value = dequantized(q, s[:, None, :], None if z is None else z[:, None, :],
                                    axis=1, block_size=q.shape[1], what=what)
            return self._const(f"{w}__dequantized",
                               np.ascontiguousarray(value.transpose(0, 2, 1)))

        w = weight(ins[1], ins[8], ins[9])
        r = weight(ins[2], ins[10], ins[11])
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        inputs = [ins[0], w, r, *ins[3:8]]
        while inputs and not inputs[-1]:
            inputs.pop()
        return helper.make_node("LSTM", inputs, list(node.output), name=node.name, **attrs)

    def _drop_bias_rounding(self, nodes: list[Any]) -> list[Any]:
        """`Add(integer sum, Reshape?(Cast int32(Floor(bias / scales))))`: the bias now adds
        to a float sum, so its rounding and cast to int32 become Identity, as does the
        `Cast` to float of a sum."""
        from onnx import TensorProto, helper

        producer = {o: n for n in nodes for o in n.output}
        rounding: set[int] = set()
        sums = set(self.integer_sums)  # float now: their Cast to float is an Identity
        for add in nodes:
            if add.op_type != "Add" or not self.integer_sums & set(add.input):
                continue
            sums.update(add.output)
            (other,) = [i for i in add.input if i not in self.integer_sums] or [""]
            n = producer.get(other)
            if n is not None and n.op_type == "Reshape":
                n = producer.get(n.input[0])
            if n is None or n.op_type != "Cast" or helper.get_attribute_value(
                    n.attribute[0]) != TensorProto.INT32:
                continue
            rounding.add(id(n))
            floor = producer.get(n.input[0])
            if floor is not None and floor.op_type in ("Floor", "Round"):
                rounding.add(id(floor))
        rounding.update(id(n) for n in nodes if n.op_type == "Cast" and n.input[0] in sums
                        and helper.get_attribute_value(n.attribute[0]) == TensorProto.FLOAT)
        return [helper.make_node("Identity", [n.input[0]], list(n.output), name=n.name)
                if id(n) in rounding else n for n in nodes]


def _constant(helper: Any, name: str, value: np.ndarray) -> Any:
    from onnx import numpy_helper

    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))


def _live(nodes: list[Any], outputs: set[str]) -> list[Any]:
    """The nodes some graph output depends on, in order."""
    needed = set(outputs)
    keep: list[Any] = []
    for n in reversed(nodes):
        if any(o in needed for o in n.output):
            keep.append(n)
            needed.update(i for i in n.input if i)
            needed.update(subgraph_reads(n))
    return keep[::-1]


def subgraph_reads(node: Any) -> set[str]:
    """Names an If / Loop / Scan body reads (outer-scope tensors among them)."""
    from onnx import AttributeProto

    reads: set[str] = set()
    for a in node.attribute:
        graphs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)
        for g in graphs:
            for n in g.node:
                reads.update(n.input)
                reads.update(subgraph_reads(n))
    return reads


def dequantize_file(path: Path, out: Path) -> Dequantized | None:
    """Writes the FP32 rewrite of the ONNX upload `path` to `out`; None (and nothing written)
    when the upload is not dynamically quantized."""
    import onnx

    try:
        model = onnx.load(str(path))
    except Exception as e:
        raise InvalidSourceError(f"cannot read {path.name} as ONNX: {e}") from e
    report = dequantize(model)
    if report is None:
        return None
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise _refusal(quantized_nodes(onnx.load(str(path))),
                       f"the rewritten graph is not valid ONNX ({e})") from None
    onnx.save(model, str(out))
    return report
