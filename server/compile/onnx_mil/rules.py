"""The modules holding the ONNX → MIL rules, imported in one place: each registers its rules
with `registry.onnx_op` on import. Anything that looks rules up (the graph walk, the package's
`claimed_ops`) imports this module first, so the registry itself never imports a rule module
(they import it)."""

from server.compile.onnx_mil import (  # noqa: F401
    ops_math,
    ops_nn,
    ops_resize,
    ops_rnn,
    ops_tensor,
)
