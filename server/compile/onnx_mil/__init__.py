"""ONNX → Core ML MIL, without going through torch.

- `program_from_onnx(path, inputs, target)`: the MIL program (coremltools' pymil) for an ONNX
  file at the declared static input shapes, ready for `ct.convert(program, ...)`.
- `unsupported_nodes(model)`: nodes no rule claims at the model's opset (the support gate).
- `claimed_ops()`: the ONNX op types the converter has rules for.

The per-op rules live in `ops_*.py`, registered with `registry.onnx_op`; the graph walk,
constant folding and `If` inlining in `convert.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from server.compile.onnx_mil.convert import convert_model, model_opset, unsupported_nodes
from server.compile.onnx_mil.registry import claimed_ops, onnx_op, rule_for
from server.compile.types import InputSpec

__all__ = ["claimed_ops", "convert_model", "model_opset", "onnx_op", "program_from_onnx",
           "rule_for", "unsupported_nodes"]


def program_from_onnx(path: Path, inputs: Sequence[InputSpec], target: Any) -> Any:
    import onnx

    model = onnx.load(str(path))
    return convert_model(model, {s.name: s.shape for s in inputs}, target)
