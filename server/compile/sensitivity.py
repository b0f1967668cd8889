"""Which layers lose the most when quantized, measured on a reference sample (mixed precision).

A layer's loss is the noise it adds: the relative noise power of its output against the
unquantized graph's (10^(-SNR/10)), minus the worst of its inputs'. Errors pile up down a
network, so ranking by output SNR alone would always blame the last layers, and ranking by
SNR dB dropped would always blame the first (exact inputs: an "infinite" drop); noise power
adds up layer over layer, so its increase finds the layers that quantize badly (an
outlier-heavy projection, a first conv on raw pixels).

- QNN: the QDQ graph against the FP32 source, both on onnxruntime's CPU provider, tensor by
  tensor (`layers.all_layers`); the candidates are the nodes with a weight (an initializer
  of rank 2 or more: Conv, MatMul, Gemm, …), left out of the QDQ via `nodes_to_exclude`.
- Core ML: the compressed package against the same program with uncompressed weights, both
  through the MIL reference executor with intermediates kept; the candidates are the ops
  that consume a compressed weight (`op_name_configs`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from server.compile.gates.layers import all_layers, layer_metrics
from server.compile.qdq_prep import readers

# SNRs are clamped to ±this before conversion to noise power.
_EXACT_DB = 140.0


@dataclass(frozen=True)
class LayerLoss:
    name: str  # the name the compiler's exclusion setting takes (ONNX node / MIL op name)
    op: str
    snr_db: float  # of the layer's output
    added_noise: float  # relative noise power this layer added (output's minus inputs')

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.name, "op": self.op, "snr_db": round(self.snr_db, 2),
                "added_noise": float(f"{self.added_noise:.4g}")}


def _noise(snr_db: float) -> float:
    """Relative noise power of a tensor with this SNR (0 for an exact one)."""
    if math.isinf(snr_db) and snr_db > 0:
        return 0.0
    return 10 ** (-max(min(snr_db, _EXACT_DB), -_EXACT_DB) / 10)


def _loss(name: str, op: str, snr_out: float, snr_in: list[float]) -> LayerLoss:
    worst_in = max((_noise(x) for x in snr_in), default=0.0)
    return LayerLoss(name, op, snr_out, max(_noise(snr_out) - worst_in, 0.0))


def _rank(losses: list[LayerLoss]) -> list[LayerLoss]:
    return sorted(losses, key=lambda x: -x.added_noise)


def onnx_losses(source: Path, quantized: Path, feeds: dict[str, Any]) -> list[LayerLoss]:
    """Nodes of the FP32 `source`, most loss added first, against the QDQ graph `quantized`."""
    import onnx

    metrics = {m.tensor: m for m in all_layers(source, quantized, feeds)}
    model = onnx.load(str(source))
    weights = {t.name for t in model.graph.initializer if len(t.dims) >= 2}
    reading = readers(model)

    def measured(node: Any) -> list[Any]:
        """The node's outputs as the quantized graph has them; for a node a fusion swallowed
        (a MatMul whose Add the QNN preprocessing fused into one Gemm: its output is gone),
        those of its one reader."""
        outs = [metrics[t] for t in node.output if t in metrics]
        if outs or len(node.output) != 1 or len(reading.get(node.output[0], [])) != 1:
            return outs
        return [metrics[t] for t in reading[node.output[0]][0].output if t in metrics]

    out = []
    for i, node in enumerate(model.graph.node):
        outs = measured(node)
        if not outs or not any(t in weights for t in node.input):
            continue
        out.append(_loss(node.name or f"{node.op_type}_{i}", node.op_type,
                         min(m.snr_db for m in outs),
                         [metrics[t].snr_db for t in node.input if t in metrics]))
    return _rank(out)


def _op_name(op: Any, fallback: str) -> str:
    attr = op.attributes.get("name")
    values = attr.immediateValue.tensor.strings.values if attr is not None else []
    return str(values[0]) if values else fallback


def coreml_losses(plain: Path, compressed: Path, feeds: dict[str, Any]) -> list[LayerLoss]:
    """Ops of the `compressed` package that read a compressed weight, most loss added first,
    against the `plain` package (same program, uncompressed weights)."""
    from server.compile.milexec import MilExecutor

    ref_ex, cand_ex = MilExecutor(plain), MilExecutor(compressed)
    ref = ref_ex.run(feeds, keep_intermediates=True)
    cand = cand_ex.run(feeds, keep_intermediates=True)
    ops = cand_ex.operations
    compressed_vars = {o.name for op in ops if op.type.startswith("constexpr_")
                       for o in op.outputs}
    snr: dict[str, float] = {}
    out = []
    for op in ops:
        if op.type == "const" or op.type.startswith("constexpr_") or not op.outputs:
            continue
        var = op.outputs[0].name
        if var not in ref or var not in cand or np.asarray(ref[var]).dtype.kind not in "fc":
            continue
        m = layer_metrics(np.asarray(ref[var]), np.asarray(cand[var]), var, op.type, var)
        snr[var] = m.snr_db
        args = [a.name for arg in op.inputs.values() for a in arg.arguments
                if a.WhichOneof("binding") == "name"]
        if not any(a in compressed_vars for a in args):
            continue
        out.append(_loss(_op_name(op, var), op.type, snr[var], [snr[a] for a in args
                                                                  if a in snr]))
    return _rank(out)
