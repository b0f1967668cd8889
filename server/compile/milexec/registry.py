"""The op table of the MIL reference executor: `OPS` maps a MIL op type to one small numpy
function, registered with `@mil_op("type", ...)` (the layout of coremltools' own frontends).

An op function takes an `OpCall` (the op's resolved inputs, its output dtypes and shapes,
its nested blocks) and returns one array, or a tuple of arrays for an op with several
outputs. The executor casts each result to the dtype the program declares for that output,
so a function may compute in float32 and leave the rounding to the executor; elementwise
functions compute in the input dtype (float16 in an FP16 program).

Which modules register ops is listed in one place, `server/compile/milexec/ops/__init__.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

Array = NDArray[Any]
Value = Any  # np.ndarray, or a list of arrays for a tuple input (concat's `values`)
Result = Array | tuple[Array, ...]
OpFunction = Callable[["OpCall"], Result]

OPS: dict[str, OpFunction] = {}


class BlockRunner(Protocol):
    """What a control-flow op (cond, while_loop) needs of the executor: run a nested block
    (executor.BlockRunner implements it; declared here so the registry imports no executor)."""

    def run_block(self, block: Any, env: Any, inputs: list[Any] | None = None) -> list[Any]: ...


class MilExecError(Exception):
    """Base of the executor's errors; `str(err)` names the op and what to do."""


class UnsupportedMilOp(MilExecError):
    """The program holds an op the executor has no function for (never silently skipped)."""

    def __init__(self, op_type: str, var_name: str, why: str = "") -> None:
        detail = f": {why}" if why else ""
        super().__init__(
            f"the MIL reference executor cannot run op {op_type!r} (output {var_name!r})"
            f"{detail}; add it to server/compile/milexec/ops/ or run the package on macOS")
        self.op_type = op_type
        self.var_name = var_name


def mil_op(*names: str) -> Callable[[OpFunction], OpFunction]:
    """Registers the decorated function for each MIL op type in `names`."""
    if not names:
        raise ValueError("mil_op needs at least one MIL op type")

    def register(fn: OpFunction) -> OpFunction:
        for name in names:
            if name in OPS:
                raise ValueError(f"MIL op {name!r} is registered twice "
                                 f"({OPS[name].__module__} and {fn.__module__})")
            OPS[name] = fn
        return fn
    return register


@dataclass
class OpCall:
    """One op as an op function sees it: inputs by parameter name, already evaluated."""

    type: str
    name: str  # the first output's var name (how errors name the op)
    inputs: dict[str, Value]
    out_dtypes: list[np.dtype[Any]]
    out_shapes: list[tuple[int, ...] | None]  # None where the program leaves a dim symbolic
    blocks: Sequence[Any] = ()  # the op's nested MIL blocks (cond, while_loop)
    runner: BlockRunner | None = None
    env: Any = None  # the enclosing scope, for nested blocks
    attributes: dict[str, Any] = field(default_factory=dict)

    def __contains__(self, key: str) -> bool:
        return key in self.inputs

    def arr(self, key: str) -> Array:
        """Input `key` as an array; a missing required input is the program's fault."""
        if key not in self.inputs:
            raise MilExecError(f"op {self.type} ({self.name}) lacks its input {key!r}")
        return np.asarray(self.inputs[key])

    def get(self, key: str, default: Any = None) -> Any:
        """Input `key` as an array, or `default` when the program omits it (MIL defaults)."""
        return np.asarray(self.inputs[key]) if key in self.inputs else default

    def scalar(self, key: str, default: Any = None) -> Any:
        """Input `key` as a Python scalar (int, float, bool or str)."""
        if key not in self.inputs:
            return default
        v = self.inputs[key]
        return v if isinstance(v, str) else np.asarray(v).item()

    def ints(self, key: str, default: Sequence[int] | None = None) -> list[int] | None:
        """Input `key` as a list of ints (axes, strides, shapes)."""
        if key not in self.inputs:
            return None if default is None else list(default)
        return [int(v) for v in np.asarray(self.inputs[key]).reshape(-1)]

    def unsupported(self, why: str) -> UnsupportedMilOp:
        return UnsupportedMilOp(self.type, self.name, why)

    @property
    def dtype(self) -> np.dtype[Any]:
        """The first output's dtype."""
        return self.out_dtypes[0]
