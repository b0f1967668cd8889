"""BatchNormalization folded into the Conv that feeds it, before QDQ quantization for QNN.

paddle2onnx writes each Conv of PP-OCR as Conv (no bias) → BatchNormalization. onnxruntime's
QNN preprocessing folds them (its ORT_ENABLE_BASIC pass) but writes the folded graph only
when one of its QNN fusions (Gelu, LpNorm, …) also applied; otherwise the QDQ graph keeps
each BatchNormalization standalone, and the HTP computes that QDQ op differently from
onnxruntime's CPU: on PP-OCR's direction classifier one channel of the first depthwise
conv's BatchNormalization (small running variance, large offset) comes out near 0 instead
of 1.33, and the W8A16 artifact was 5–9 dB against its own QDQ graph's 34 dB. Only this
fold is done here, not the whole optimization pass: it would also turn MatMul + Add into
Gemm and rename the nodes that `keep_float_nodes` and the per-column MatMul weights name.

The fold is exact up to float rounding (in float64): W' = W · k per output channel and
b' = (b − mean) · k + β with k = γ / √(var + ε).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray


def _values(graph: Any) -> dict[str, Any]:
    """Constant tensors by name: initializers and Constant nodes' `value`."""
    out = {t.name: t for t in graph.initializer}
    for node in graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None) \
            if node.op_type == "Constant" else None
        if value is not None:
            out[node.output[0]] = value
    return out


def foldable(model: Any) -> list[tuple[Any, Any]]:
    """(Conv, BatchNormalization) node pairs `fold_batchnorms` folds: an inference-mode
    BatchNormalization of a Conv output nothing else reads, with constant weights and
    statistics."""
    graph = model.graph
    tensors = _values(graph)
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    outputs = {o.name for o in graph.output}
    pairs = []
    for bn in graph.node:
        conv = producer.get(bn.input[0]) if bn.op_type == "BatchNormalization" else None
        if conv is None or conv.op_type != "Conv" or len(bn.output) != 1 \
                or readers.get(bn.input[0]) != 1 or bn.input[0] in outputs:
            continue
        # A weight or statistic computed at run time is left as it is.
        if all(n in tensors for n in [*conv.input[1:], *bn.input[1:5]] if n):
            pairs.append((conv, bn))
    return pairs


def fold_batchnorms(model: Any) -> int:
    """Folds each `foldable` BatchNormalization into its Conv (in place; the Conv takes the
    BatchNormalization's output name); returns how many."""
    from onnx import numpy_helper

    graph = model.graph
    tensors = _values(graph)
    pairs = foldable(model)
    for conv, bn in pairs:
        names = [conv.input[1], *(conv.input[2:3] or [""]), *bn.input[1:5]]
        w, b, gamma, beta, mean, var = (_array(tensors[n]) if n else None for n in names)
        assert w is not None and gamma is not None and beta is not None  # for mypy
        assert mean is not None and var is not None
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        k = gamma / np.sqrt(var + eps)
        bias = (np.zeros_like(k) if b is None else b) - mean
        weight = (w * k.reshape(-1, *[1] * (w.ndim - 1))).astype(np.float32)
        base = bn.output[0]
        graph.initializer.extend([numpy_helper.from_array(weight, f"{base}_folded_weight"),
                                  numpy_helper.from_array((bias * k + beta).astype(np.float32),
                                                          f"{base}_folded_bias")])
        del conv.input[1:]
        conv.input.extend([f"{base}_folded_weight", f"{base}_folded_bias"])
        conv.output[0] = base
    for _, bn in pairs:
        graph.node.remove(bn)
    return len(pairs)


def _array(t: Any) -> NDArray[np.float64]:
    from onnx import numpy_helper

    return numpy_helper.to_array(t).astype(np.float64)
