"""A statically quantized upload back to the FP32 graph its integer weights stand for.

`onnxruntime.quantization.quantize_static` writes two formats, and packages ship both:

- **QDQ**: float ops between `QuantizeLinear` → `DequantizeLinear` pairs, with weights stored
  as integers behind a `DequantizeLinear`. A `DequantizeLinear` of constants folds to the float
  weight it computes (onnx's reference implementation, so every type, axis and block size is
  read as the spec says); an activation's `QuantizeLinear` → `DequantizeLinear` pair is
  dropped (the float value passes through).
- **QOperator**: integer ops (`QLinearConv`, `QLinearMatMul`, com.microsoft `QLinearAdd`,
  `QLinearMul`, `QLinearSigmoid`, `QLinearLeakyRelu`, `QLinearAveragePool`,
  `QLinearGlobalAveragePool`, `QLinearConcat`, `QGemm`) on uint8 / int8 activations. Each
  becomes its float op on the activations' float values, with its constant operands
  dequantized (an int32 bias at scale `x_scale · w_scale`); ops that only move data
  (`Reshape`, `Transpose`, `MaxPool`, `Concat`, …) work on the float values unchanged.

Every quantized activation so becomes the float value it encodes, which is what a device
compiler quantizes again or runs at FP16; the difference from the upload is the upload's
rounding of activations, which the build reports (`gates.dequantized`). A quantized tensor
read by anything else (a graph input of integer type, an op with no rule) is refused by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

STATIC_QUANTIZATION_OPS = {
    "QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "QLinearAdd",
    "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearAveragePool",
    "QLinearGlobalAveragePool", "QLinearConcat", "QGemm"}
# Ops whose result on quantized values is the quantized result on the float values (they
# select or move elements, or are monotonic and piecewise the identity).
DATA_MOVEMENT = {"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "MaxPool", "Slice",
                 "Split", "Concat", "Identity", "Gather", "DepthToSpace", "SpaceToDepth",
                 "Tile", "Expand"}  # not Relu: on a zero point of 128 it is max(q, 128)
_RANGES = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127),
           np.dtype(np.uint16): (0, 65535), np.dtype(np.int16): (-32768, 32767)}
_FLOAT_OP = {"QLinearAdd": "Add", "QLinearMul": "Mul", "QLinearSigmoid": "Sigmoid",
             "QLinearLeakyRelu": "LeakyRelu", "QLinearAveragePool": "AveragePool",
             "QLinearGlobalAveragePool": "GlobalAveragePool"}


class Unsupported(Exception):
    pass


def static_nodes(model: Any) -> list[Any]:
    return [n for n in model.graph.node if n.op_type in STATIC_QUANTIZATION_OPS]


def dequantized_constant(node: Any, consts: dict[str, np.ndarray]) -> np.ndarray:
    """What a `DequantizeLinear` of constants computes, by onnx's reference implementation."""
    from onnx.reference.ops.op_dequantize_linear import DequantizeLinear_21

    inputs: list[Any] = [consts[i] for i in node.input if i]
    attrs = {a.name: a.i for a in node.attribute if a.name in ("axis", "block_size")}
    out = DequantizeLinear_21.eval(*inputs, **attrs)
    return np.asarray(out[0] if isinstance(out, (tuple, list)) else out, np.float32)


def dequantized(q: np.ndarray, scale: np.ndarray | None, zero: np.ndarray | None, *,
                axis: int = -1, block_size: int = 0, what: str = "") -> np.ndarray:
    """`(q − zero) · scale` in float32 by onnx's reference DequantizeLinear (one reading of
    the spec for every rule): per tensor (one scale), per channel along `axis` (1-D), or per
    block of `block_size` along `axis`. `scale` None is 1: the dynamic rewrite leaves the
    scale to the Mul after the integer sum. A zero point whose type is not the weight's, or
    a scale that does not fit the weight, is refused by name (`what`)."""
    from onnx.reference.ops.op_dequantize_linear import DequantizeLinear_21

    s = np.ones(np.shape(zero) if zero is not None else (), np.float32) if scale is None \
        else np.asarray(scale, np.float32)
    args: list[Any] = [q, s] if zero is None else [q, s, np.asarray(zero)]
    try:
        out = DequantizeLinear_21.eval(*args, axis=axis % max(q.ndim, 1),
                                       block_size=block_size)
    except (ValueError, IndexError, AssertionError) as e:
        raise Unsupported(f"{what}: its weight, scale and zero point do not fit one "
                          f"another ({e})") from None
    return np.asarray(out[0] if isinstance(out, (tuple, list)) else out, np.float32)


class StaticRewrite:
    """One pass over the nodes; `floats` names the tensors that now hold the float value of
    a quantized activation (shared with the dynamic rewrite's stand-ins)."""

    def __init__(self, consts: dict[str, np.ndarray], floats: set[str],
                 const: Callable[[str, np.ndarray], str], name: Callable[[Any], str]) -> None:
        self.consts, self.floats, self._const, self._name = consts, floats, const, name

    def node(self, node: Any, helper: Any) -> list[Any] | None:
        """The float nodes for `node`, or None when the node is no concern of this pass."""
        op, ins = node.op_type, list(node.input) + [""] * 10
        if op == "DequantizeLinear":
            if all(not i or i in self.consts for i in node.input):
                value = dequantized_constant(node, self.consts)
                self.consts[node.output[0]] = value
                return [_constant(helper, node.output[0], value)]
            if ins[0] in self.floats:
                return [helper.make_node("Identity", [ins[0]], list(node.output),
                                         name=node.name)]
            raise Unsupported(f"DequantizeLinear {self._name(node)!r} reads {ins[0]!r}, which "
                              "is neither constant nor a quantized activation of the graph")
        if op == "QuantizeLinear":  # x, y_scale, y_zero_point: x within the type's range
            self.floats.add(node.output[0])
            return self._saturate(helper, node, ins[0], node.output[0], ins[1], ins[2])
        if op == "QLinearConv":  # x, xs, xz, w, ws, wz, ys, yz, B
            w = self._dequant(node, ins[3], ins[4], ins[5], axis=0)
            args = [self._float(node, ins[0]), w]
            if ins[8]:
                args.append(self._bias(node, ins[8], ins[1], ins[4]))
            return self._out(helper, "Conv", args, node, _attrs(helper, node), ins[6], ins[7])
        if op == "QLinearMatMul":  # a, as, az, b, bs, bz, ys, yz
            a = self._operand(node, ins[0], ins[1], ins[2], axis=-1)
            b = self._operand(node, ins[3], ins[4], ins[5], axis=-1)
            return self._out(helper, "MatMul", [a, b], node, {}, ins[6], ins[7])
        if op == "QGemm":  # A, as, az, B, bs, bz, C, ys, yz
            attrs = _attrs(helper, node)
            args = [self._float(node, ins[0]),
                    self._dequant(node, ins[3], ins[4], ins[5],
                                  axis=0 if attrs.get("transB", 0) else 1)]
            if ins[6]:
                args.append(self._bias(node, ins[6], ins[1], ins[4]))
            # without y_scale QGemm's output is float already; either way it is the float value
            return self._out(helper, "Gemm", args, node, attrs, ins[7], ins[8])
        if op in ("QLinearAdd", "QLinearMul"):  # A, As, Az, B, Bs, Bz, Cs, Cz
            a = self._operand(node, ins[0], ins[1], ins[2], axis=None)
            b = self._operand(node, ins[3], ins[4], ins[5], axis=None)
            return self._out(helper, _FLOAT_OP[op], [a, b], node, {}, ins[6], ins[7])
        if op in _FLOAT_OP:  # X, Xs, Xz, Ys, Yz
            attrs = {k: v for k, v in _attrs(helper, node).items() if k != "channels_last"}
            if _attrs(helper, node).get("channels_last"):
                raise Unsupported(f"{op} {self._name(node)!r} is channels-last")
            return self._out(helper, _FLOAT_OP[op], [self._float(node, ins[0])], node, attrs,
                             ins[3], ins[4])
        if op == "QLinearConcat":  # Ys, Yz, then (X, Xs, Xz) per input
            xs = [self._operand(node, node.input[k], node.input[k + 1], node.input[k + 2],
                                axis=None) for k in range(2, len(node.input), 3)]
            return self._out(helper, "Concat", xs, node, _attrs(helper, node), ins[0], ins[1])
        read = [i for i in node.input if i in self.floats]
        if not read:
            return None
        if op in DATA_MOVEMENT and (op != "Concat" or all(
                i in self.floats for i in node.input)):
            self.floats.update(node.output)
            return [node]
        raise Unsupported(f"{op} {self._name(node)!r} reads the quantized tensor {read[0]!r} "
                          "and has no FP32 rule here")

    def _float(self, node: Any, name: str) -> str:
        if name not in self.floats:
            raise Unsupported(f"{node.op_type} {self._name(node)!r} reads {name!r}, which is "
                              "not a quantized activation of the graph (an integer input?)")
        return name

    def _operand(self, node: Any, name: str, scale: str, zero: str, axis: int | None) -> str:
        if name in self.floats:
            return name
        return self._dequant(node, name, scale, zero, axis=axis)

    def _dequant(self, node: Any, name: str, scale: str, zero: str, axis: int | None) -> str:
        if any(n and n not in self.consts for n in (name, scale, zero)):
            raise Unsupported(f"{node.op_type} {self._name(node)!r} has a computed weight, "
                              "scale or zero point")
        value = dequantized(self.consts[name], self.consts[scale],
                            self.consts[zero] if zero else None,
                            axis=-1 if axis is None else axis,
                            what=f"{node.op_type} {self._name(node)!r}")
        return self._const(f"{name}__dequantized", value)

    def _bias(self, node: Any, bias: str, x_scale: str, w_scale: str) -> str:
        if any(n not in self.consts for n in (bias, x_scale, w_scale)):
            raise Unsupported(f"{node.op_type} {self._name(node)!r} has a computed bias scale")
        scale = self.consts[x_scale].astype(np.float32) * self.consts[w_scale].astype(
            np.float32).reshape(-1)
        return self._const(f"{bias}__dequantized",
                           (self.consts[bias].astype(np.float32) * scale).astype(np.float32))

    def _out(self, helper: Any, op: str, args: list[str], node: Any, attrs: dict[str, Any],
             scale: str, zero: str) -> list[Any]:
        """The float op, saturated to the quantized output's range when it has one (QGemm
        without y_scale returns float)."""
        out = node.output[0]
        if not scale:
            return [helper.make_node(op, args, [out], name=node.name, **attrs)]
        self.floats.add(out)
        return [helper.make_node(op, args, [f"{out}__float"], name=node.name, **attrs),
                *self._saturate(helper, node, f"{out}__float", out, scale, zero)]

    def _saturate(self, helper: Any, node: Any, x: str, out: str, scale: str, zero: str
                  ) -> list[Any]:
        """`out` = x clipped to what the quantized type holds at this scale and zero point:
        `(qmin − zp) · s … (qmax − zp) · s`. Exporters fuse a ReLU (or ReLU6) into that range
        (a zero point at qmin), so dropping it would drop the activation function."""
        if any(n and n not in self.consts for n in (scale, zero)):
            raise Unsupported(f"{node.op_type} {self._name(node)!r} has a computed scale or "
                              "zero point")
        s = self.consts[scale].astype(np.float64)
        z = self.consts[zero] if zero else np.zeros((), np.uint8)
        if z.dtype not in _RANGES or s.size != 1 or z.size != 1:
            raise Unsupported(f"{node.op_type} {self._name(node)!r} quantizes to "
                              f"{z.dtype} {'per axis' if s.size > 1 else ''}, which the "
                              "rewrite does not take")
        lo, hi = ((q - float(z.reshape(-1)[0])) * float(s.reshape(-1)[0])
                  for q in _RANGES[z.dtype])
        return [helper.make_node("Clip", [x, self._const(f"{out}__min", np.array(lo, np.float32)),
                                          self._const(f"{out}__max", np.array(hi, np.float32))],
                                 [out], name=f"{node.name or out}__range")]


def _attrs(helper: Any, node: Any) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _constant(helper: Any, name: str, value: np.ndarray) -> Any:
    from onnx import numpy_helper

    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))
