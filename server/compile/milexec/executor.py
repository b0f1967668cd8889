"""Runs the MIL program of a saved `.mlpackage` in numpy: `MilExecutor(path).run(feeds)`.

The executor walks the function's block op by op, in program order, and looks each op up in
`registry.OPS`. Every result is cast to the dtype the program declares for it and its shape
is checked against the declared one, so a float16 program stays float16 between ops and a
mismatch names the op. An op without a function raises `UnsupportedMilOp` (never skipped).
Nested blocks (`cond`, `while_loop`) run through `BlockRunner.run_block`. Weights (`const`
and `constexpr_*` ops) are decoded once and reused across runs.

Precision: see docs/compile.md "The MIL reference executor" — elementwise ops compute in the
program's dtype (each result rounded to float16 in an FP16 program); ops that accumulate
(matmul, linear, conv, einsum, reductions, normalisations, softmax, pooling) accumulate in
float32 and round their output, as Core ML documents FP16 storage with higher-precision
accumulation.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import numpy as np

import server.compile.milexec.ops  # noqa: F401  (registers every op module)
from server.compile.milexec.program import TensorSpec, ValueReader, load_function, tensor_spec
from server.compile.milexec.registry import OPS, Array, MilExecError, OpCall, UnsupportedMilOp

Env = MutableMapping[str, Any]
_WEIGHT_OPS = ("const", "constexpr_")


class BlockRunner:
    """Executes MIL blocks against an environment of named values."""

    def __init__(self, reader: ValueReader) -> None:
        self._reader = reader
        self._weights: dict[str, Any] = {}  # const / constexpr outputs, decoded once
        self.trace: dict[str, Any] | None = None
        # Weight values used instead of what the program's const / constexpr ops hold, by
        # var name (a compressed weight put back to its float value: sensitivity.py).
        self.weight_overrides: Mapping[str, Any] = {}

    def run_block(self, block: Any, env: Env, inputs: list[Any] | None = None) -> list[Any]:
        """Runs `block` with its block inputs bound to `inputs` (in order); returns the
        values of the block's outputs. Names the block defines do not leak into `env`."""
        scope: Env = ChainMap({}, env)
        for named, value in zip(block.inputs, inputs or [], strict=True):
            scope[named.name] = value
        for op in block.operations:
            self._run_op(op, scope)
        return [self._lookup(scope, name, "block output") for name in block.outputs]

    def decode_weights(self, block: Any) -> dict[str, Any]:
        """The values of `block`'s const and constexpr ops (weights as the device
        materialises them), by name."""
        env: Env = {}
        for op in block.operations:
            if op.type.startswith(_WEIGHT_OPS):
                self._run_op(op, env)
        return dict(env)

    def _run_op(self, op: Any, env: Env) -> None:
        specs = [tensor_spec(o) for o in op.outputs]
        name = specs[0].name if specs else op.type
        weight = op.type.startswith(_WEIGHT_OPS)
        if weight and name in self.weight_overrides:
            env[name] = self.weight_overrides[name]
            return
        if weight and name in self._weights:
            for s in specs:
                env[s.name] = self._weights[s.name]
            return
        if op.type == "const":
            values: list[Any] = [self._reader.read(op.attributes["val"])]
        else:
            fn = OPS.get(op.type)
            if fn is None:
                raise UnsupportedMilOp(op.type, name)
            call = OpCall(type=op.type, name=name, inputs=self._inputs(op, env, name),
                          out_dtypes=[s.dtype for s in specs],
                          out_shapes=[_static(s) for s in specs], blocks=list(op.blocks),
                          runner=self, env=env, attributes=dict(op.attributes))
            try:
                res = fn(call)
            except MilExecError:
                raise
            except Exception as e:
                raise MilExecError(f"MIL op {op.type} ({name}) failed in the executor: "
                                   f"{type(e).__name__}: {e}") from e
            values = list(res) if isinstance(res, tuple) else [res]
        if len(values) != len(specs):
            raise MilExecError(f"MIL op {op.type} ({name}) gave {len(values)} outputs, the "
                               f"program declares {len(specs)}")
        for s, v in zip(specs, values, strict=True):
            v = _conform(op.type, s, v)
            env[s.name] = v
            if weight:
                self._weights[s.name] = v
            elif self.trace is not None:
                self.trace[s.name] = v

    def _inputs(self, op: Any, env: Env, name: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, arg in op.inputs.items():
            vals = [self._lookup(env, b.name, f"input {key!r} of {op.type} ({name})")
                    if b.WhichOneof("binding") == "name" else self._reader.read(b.value)
                    for b in arg.arguments]
            out[key] = vals[0] if len(vals) == 1 and not _is_tuple_input(op.type, key) \
                else vals
        # iOS16 constexpr ops hold their parameters as attributes, not inputs
        for key, value in op.attributes.items():
            if key != "name" and key not in out:
                out[key] = self._reader.read(value)
        return out

    @staticmethod
    def _lookup(env: Env, name: str, what: str) -> Any:
        try:
            return env[name]
        except KeyError:
            raise MilExecError(f"the MIL program uses {name!r} ({what}) before defining "
                               "it") from None


# Inputs MIL declares as tuples: a single element is still a list to the op function.
_TUPLE_INPUTS = {("concat", "values"), ("stack", "values"), ("identity_n", "x"),
                 ("while_loop", "loop_vars"), ("einsum", "values")}


def _is_tuple_input(op_type: str, key: str) -> bool:
    return (op_type, key) in _TUPLE_INPUTS


def _static(spec: TensorSpec) -> tuple[int, ...] | None:
    if spec.shape is None or any(d is None for d in spec.shape):
        return None
    return tuple(int(d) for d in spec.shape if d is not None)


def _conform(op_type: str, spec: TensorSpec, value: Any) -> Any:
    """`value` in the declared dtype, after checking its shape against the declared one."""
    if spec.shape is None or isinstance(value, str):
        return value
    arr = np.asarray(value)
    if spec.dtype != np.dtype(object) and arr.dtype != spec.dtype:
        arr = arr.astype(spec.dtype)
    shape = spec.shape
    if len(shape) != arr.ndim or any(d is not None and d != n for d, n in zip(
            shape, arr.shape, strict=True)):
        raise MilExecError(f"MIL op {op_type} ({spec.name}) computed shape {arr.shape}, the "
                           f"program declares {tuple('?' if d is None else d for d in shape)}")
    return arr


class MilExecutor:
    """A numpy executor of one MIL function of a saved `.mlpackage` (default: the package's
    default function, else `main`, at the block specialised for the function's opset)."""

    def __init__(self, package_path: str | Path, function: str | None = None) -> None:
        self.path = Path(package_path)
        self.spec, fn, self.function = load_function(self.path, function)
        self.opset: str = fn.opset
        self._block = fn.block_specializations[fn.opset]
        self.inputs = [tensor_spec(i) for i in fn.inputs]
        self.output_names: list[str] = list(self._block.outputs)
        self._runner = BlockRunner(ValueReader(self.path))

    def run(self, feeds: dict[str, Array], keep_intermediates: bool = False,
            weights: Mapping[str, Array] | None = None) -> dict[str, Array]:
        """The program's outputs by name for one sample. Feeds are cast to the dtype each
        input declares (an FP16 program's inputs become float16). With
        `keep_intermediates`, also every var a non-weight op computed, by name. `weights`
        replaces the values of the named const / constexpr vars for this run (a weight op
        with more than one output is replaced whole only through its first)."""
        env: dict[str, Any] = {}
        for spec in self.inputs:
            if spec.name not in feeds:
                raise MilExecError(f"feed {spec.name!r} missing; the MIL program takes "
                                   f"{[s.name for s in self.inputs]}")
            env[spec.name] = _conform("input", spec, np.asarray(feeds[spec.name]))
        self._runner.trace = {} if keep_intermediates else None
        self._runner.weight_overrides = weights or {}
        try:
            outs = self._runner.run_block(self._block, env)
        finally:
            trace, self._runner.trace = self._runner.trace, None
            self._runner.weight_overrides = {}
        result = dict(trace or {})
        if keep_intermediates:
            result.update(env)
        result.update(zip(self.output_names, outs, strict=True))
        return result

    @property
    def operations(self) -> list[Any]:
        """The function's ops (MIL proto `Operation`s) in program order."""
        return list(self._block.operations)

    def weights(self) -> dict[str, Array]:
        """The function's weights, decompressed (`constexpr_*`) as Core ML materialises
        them, by var name."""
        return self._runner.decode_weights(self._block)


def run_mlpackage(path: str | Path, feeds: dict[str, Array]) -> dict[str, Array]:
    """The outputs of the package's default MIL function for one sample."""
    ex = MilExecutor(path)
    out = ex.run(feeds)
    return {n: out[n] for n in ex.output_names}
