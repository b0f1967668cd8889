"""Control flow: `cond` runs the block its predicate picks, `while_loop` runs its condition
block and body block (both bound to the loop vars) until the condition is false. Names a
block defines stay inside it."""

from __future__ import annotations

import numpy as np

from server.compile.milexec.registry import Array, MilExecError, OpCall, mil_op

MAX_ITERATIONS = 1_000_000


@mil_op("cond")
def cond(op: OpCall) -> Array | tuple[Array, ...]:
    if op.runner is None or len(op.blocks) != 2:
        raise op.unsupported("cond needs a true and a false block")
    block = op.blocks[0] if bool(op.arr("pred").item()) else op.blocks[1]
    outs = op.runner.run_block(block, op.env)
    return outs[0] if len(outs) == 1 else tuple(outs)


@mil_op("while_loop")
def while_loop(op: OpCall) -> Array | tuple[Array, ...]:
    if op.runner is None or len(op.blocks) != 2:
        raise op.unsupported("while_loop needs a condition and a body block")
    check, body = op.blocks
    values = [np.asarray(v) for v in op.inputs["loop_vars"]]
    for _ in range(MAX_ITERATIONS):
        if not bool(np.asarray(op.runner.run_block(check, op.env, values)[0]).item()):
            return values[0] if len(values) == 1 else tuple(values)
        values = [np.asarray(v) for v in op.runner.run_block(body, op.env, values)]
    raise MilExecError(f"while_loop {op.name} ran {MAX_ITERATIONS} iterations without its "
                       "condition turning false")


@mil_op("identity_n")
def identity_n(op: OpCall) -> tuple[Array, ...]:
    return tuple(np.asarray(v) for v in op.inputs["x"])
