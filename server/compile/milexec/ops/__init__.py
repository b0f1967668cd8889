"""Every module that registers MIL ops, imported here and only here (add a line for a new
module, e.g. `from server.compile.milexec import ops_onnxmil`)."""

from server.compile.milexec import ops_onnxmil  # noqa: F401  (ops the ONNX → MIL rules emit)
from server.compile.milexec.ops import (  # noqa: F401
    constexpr,
    control,
    conv,
    elementwise,
    gather,
    linear,
    recurrent,
    reduce,
    resize,
    tensor,
)
