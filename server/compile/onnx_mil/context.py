"""What a rule sees of one ONNX node: its inputs (numpy constants or MIL vars), attributes,
the model's opset, op names, and the dtype policy shared by all rules.

Values: a tensor whose value is known at conversion time stays a numpy array (initializers,
Constant nodes, folded shape arithmetic); everything else is a MIL `Var`. MIL computes in
fp32 / fp16 / int32 / bool, so an int64 constant becomes int32 when it enters the program
(values beyond int32 are refused, never wrapped) and float64 becomes fp32.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types
from coremltools.converters.mil.mil.var import Var
from numpy.typing import NDArray
from onnx import NodeProto, helper

from server.compile.errors import ConversionError

Value = Any  # NDArray | Var
_INT32 = np.iinfo(np.int32)
_NAME = re.compile(r"[^A-Za-z0-9_]")


# The words coremltools' NameSanitizer (mil/passes/defs/preprocess.py) renames to
# `<word>_workaround` in a converted program: a MIL name avoids them itself, so a package
# input is called what `mil_name` says (Silero's `state` input was `state_workaround`).
_RESERVED = frozenset({"any", "bool", "program", "func", "tensor", "list", "dict", "tuple",
                       "true", "false", "string", "bf16", "fp16", "fp32", "fp64", "int8",
                       "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                       "state"})


def mil_name(onnx_name: str) -> str:
    """A MIL identifier for an ONNX tensor name (letters, digits, underscores), one that
    coremltools keeps as it is (no reserved word, no leading underscore)."""
    name = _NAME.sub("_", onnx_name) or "t"
    if name[0].isdigit():
        name = f"t_{name}"
    if name in _RESERVED:
        name += "_workaround"
    return f"var{name}" if name.startswith("_") else name


def to_mil_array(a: NDArray[Any], what: str = "constant") -> NDArray[Any]:
    """`a` in a dtype MIL can hold: int64 → int32 (range-checked), float64 → float32."""
    a = np.asarray(a)
    if a.dtype in (np.float64,):
        return a.astype(np.float32)
    if a.dtype.kind in "iu" and a.dtype != np.int32:
        if a.size and (a.min() < _INT32.min or a.max() > _INT32.max):
            clipped = np.clip(a, _INT32.min, _INT32.max)
            if a.dtype.kind == "i" and np.all((a == clipped) | (np.abs(a) >= 2**62)):
                out: NDArray[Any] = clipped.astype(np.int32)
                return out  # INT64_MAX / MIN sentinels (Slice ends)
            raise ConversionError(f"{what} holds integers beyond int32, which Core ML "
                                  "computes in; the graph cannot be represented")
        return a.astype(np.int32)
    if a.dtype in (np.float32, np.float16, np.bool_, np.int32):
        return a
    raise ConversionError(f"{what} has dtype {a.dtype}, which Core ML cannot compute in")


class TransposedConst(np.ndarray):
    """A folded 2-D Transpose of a constant, remembering that constant (`source`).

    A tied LM head reads the token embedding twice: Gather(E) and MatMul(x, Transpose(E)).
    Folding the Transpose gives the MatMul a second, transposed copy of E, which Core ML
    then stores beside the first (gpt2: half the weights twice). The MatMul rule reads
    `source` with `transpose_y` instead, so both consumers hold the same values and
    coremltools' const deduplication keeps one copy. Anything computed from it is a plain
    array again (`source` is not inherited).
    """

    source: NDArray[Any] | None = None

    def __array_finalize__(self, obj: Any) -> None:
        self.source = None


def transposed_const(value: NDArray[Any], source: NDArray[Any]) -> TransposedConst:
    out = np.asarray(value).view(TransposedConst)
    out.source = source
    return out


def is_const(v: Value) -> bool:
    return isinstance(v, np.ndarray)


def dtype_of(v: Value) -> Any:
    """The numpy dtype a value computes in (a var's MIL dtype mapped to numpy)."""
    if isinstance(v, np.ndarray):
        return to_mil_array(v).dtype
    return np.dtype(types.nptype_from_builtin(v.dtype))


def shape_of(v: Value) -> tuple[int, ...]:
    shape = v.shape
    if any(not isinstance(d, (int, np.integer)) for d in shape):
        raise ConversionError(f"tensor {getattr(v, 'name', '?')} has a dynamic shape {shape}; "
                              "declare static input shapes")
    return tuple(int(d) for d in shape)


class NodeContext:
    """One node being converted. `names` is the converter's set of MIL names in use."""

    def __init__(self, node: NodeProto, inputs: list[Value | None], opset: int,
                 names: set[str]) -> None:
        self.node = node
        self.inputs = inputs
        self.opset = opset
        self._names = names
        self.attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        self._count = 0

    # ---- inputs ---------------------------------------------------------------------------
    @property
    def n_inputs(self) -> int:
        return len(self.inputs)

    def has(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] is not None

    def raw(self, i: int) -> Value:
        if not self.has(i):
            self.fail(f"input {i} is required")
        return self.inputs[i]

    def var(self, i: int, dtype: Any = None) -> Var:
        """Input `i` as a MIL var (a constant becomes a `const` op), optionally cast."""
        return self.as_var(self.raw(i), dtype)

    def const(self, i: int, default: Any = None) -> NDArray[Any] | None:
        """Input `i`'s value, which this rule needs at conversion time."""
        if not self.has(i):
            return None if default is None else np.asarray(default)
        v = self.inputs[i]
        if not isinstance(v, np.ndarray):
            why = (f"input {i} ({self.node.input[i]}) must be a constant (an initializer or "
                   "computed from shapes) for Core ML, but it depends on the model's inputs")
            raise NeedsConstant(f"Core ML (ONNX → MIL): node {self.describe()}: {why}",
                                self.node.input[i], [self.node.op_type],
                                [{"op": self.node.op_type, "node": self.node.name, "why": why}])
        return v

    def ints(self, i: int) -> list[int] | None:
        c = self.const(i)
        return None if c is None else [int(x) for x in np.asarray(c).reshape(-1)]

    def attr(self, name: str, default: Any = None) -> Any:
        v = self.attrs.get(name, default)
        return v.decode() if isinstance(v, bytes) else v

    # ---- building -------------------------------------------------------------------------
    def name(self, k: int = 0, suffix: str = "") -> str:
        """A unique MIL op name for output `k` (with a suffix for helper ops)."""
        out = self.node.output[k] if k < len(self.node.output) and self.node.output[k] else \
            (self.node.name or self.node.op_type)
        base = mil_name(out + (f"__{suffix}" if suffix else ""))
        name, n = base, 1
        while name in self._names:
            name, n = f"{base}_{n}", n + 1
        self._names.add(name)
        return name

    def tmp(self) -> str:
        self._count += 1
        return self.name(0, f"t{self._count}")

    def as_var(self, v: Value, dtype: Any = None) -> Var:
        if isinstance(v, np.ndarray):
            arr = to_mil_array(v, f"input of node {self.describe()}")
            if dtype is not None:
                arr = arr.astype(dtype)
            return mb.const(val=arr, name=self.tmp())
        if dtype is not None and dtype_of(v) != np.dtype(dtype):
            return mb.cast(x=v, dtype=_MIL_DTYPE[np.dtype(dtype)], name=self.tmp())
        return v

    def like(self, v: Value, ref: Value) -> Value:
        """`v` in `ref`'s dtype: numpy constants are cast in numpy, vars with a cast op."""
        dt = dtype_of(ref)
        if isinstance(v, np.ndarray):
            return to_mil_array(v).astype(dt)
        return self.as_var(v, dt)

    def describe(self) -> str:
        n = self.node
        return f"{n.name or '(unnamed)'} ({n.op_type}, opset {self.opset})"

    def fail(self, why: str) -> Any:
        raise ConversionError(
            f"Core ML (ONNX → MIL): node {self.describe()}: {why}",
            [self.node.op_type],
            [{"op": self.node.op_type, "node": self.node.name, "why": why}])


class NeedsConstant(ConversionError):
    """A rule needs an input's value at conversion time; `tensor` names that input."""

    def __init__(self, message: str, tensor: str, operators: list[str],
                 nodes: list[dict[str, str]]) -> None:
        super().__init__(message, operators, nodes)
        self.tensor = tensor


class RankLimit(ConversionError):
    """A tensor of rank > 5: beyond what Core ML represents."""


_MIL_DTYPE = {np.dtype(np.float32): "fp32", np.dtype(np.float16): "fp16",
              np.dtype(np.int32): "int32", np.dtype(np.bool_): "bool"}


def mil_dtype(dt: Any) -> str:
    return _MIL_DTYPE[np.dtype(dt)]
