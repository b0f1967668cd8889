"""A numpy reference executor for the MIL program inside a saved `.mlpackage` — the exact
program and weights a Core ML device gets — so Core ML builds get a numeric gate on Linux.

    from server.compile.milexec import MilExecutor, run_mlpackage, UnsupportedMilOp
    outs = MilExecutor("model.mlpackage").run({"x": x}, keep_intermediates=False)

Errors: MilExecError (the program cannot be run as written), UnsupportedMilOp (an op
without a function here; names the op type and its output var). Ops register with
`registry.mil_op`; the modules holding them are listed in `ops/__init__.py`.
"""

from server.compile.milexec.executor import MilExecutor, run_mlpackage
from server.compile.milexec.registry import OPS, MilExecError, OpCall, UnsupportedMilOp, mil_op

__all__ = ["OPS", "MilExecError", "MilExecutor", "OpCall", "UnsupportedMilOp", "mil_op",
           "run_mlpackage"]
