"""Generate synthetic ONNX model pairs (base, new) for delta tests and the delta benchmark.

Each pair is a plausible model update at a chosen size, built from a seed so runs repeat:

- ``head_only``: the last (classifier) layer retrained, everything else byte-identical;
- ``full_finetune``: every float weight nudged by a tiny learning rate (all low bits move);
- ``int8_requant``: an int8 model re-quantized with slightly different scales (~10% of the
  weight bytes change by one step);
- ``insert_tensor``: a low-rank adapter inserted in the middle of the graph (everything after
  it shifts in the file);
- ``unrelated``: same architecture, independently initialized weights;
- ``fp16_to_int8``: an FP16 artifact and its INT8 successor (the same float weights quantized
  per column, as a precision change ships them: the tensors change name, type and size);
- ``int8_finetune``: two INT8 builds of one model, the second after a small fine-tune of the
  float weights (lr 1e-3 of the weights' spread), re-quantized with fresh scales.

The graphs are valid ONNX (a MatMul/Add/Relu chain, DequantizeLinear for int8 weights) and are
written as one file with raw_data initializers, as ``torch.onnx.export`` produces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SCENARIOS = ("head_only", "full_finetune", "int8_requant", "insert_tensor", "unrelated",
             "fp16_to_int8", "int8_finetune")
LAYERS = 12


@dataclass
class Weights:
    """Per-layer tensors in graph order; ``quantized`` layers carry int8 + scale."""

    float_layers: list[np.ndarray]
    biases: list[np.ndarray]
    int8_layers: list[tuple[np.ndarray, np.ndarray]]  # (int8 weights, float32 per-col scale)
    adapter: tuple[np.ndarray, np.ndarray] | None = None  # inserted after layer LAYERS // 2


def _dim_for(size_bytes: int, quantized: bool) -> int:
    per_element = 1 if quantized else 4
    # LAYERS square layers + a head of half a layer.
    return max(16, int(math.sqrt(size_bytes / (per_element * (LAYERS + 0.5)))) // 8 * 8)


def _init(rng: np.random.Generator, d: int) -> Weights:
    head = (d, d // 2)
    shapes = [(d, d)] * LAYERS + [head]
    floats = [(rng.standard_normal(s) / math.sqrt(s[0])).astype(np.float32) for s in shapes]
    biases = [(rng.standard_normal(s[1]) * 0.01).astype(np.float32) for s in shapes]
    return Weights(floats, biases, [])


def _quantized(weights: Weights, scale_factor: float) -> Weights:
    return Weights([], weights.biases, [_quantize(w, scale_factor) for w in weights.float_layers])


def _half(weights: Weights) -> Weights:
    return Weights([w.astype(np.float16) for w in weights.float_layers],
                   [b.astype(np.float16) for b in weights.biases], [])


def _quantize(w: np.ndarray, scale_factor: float) -> tuple[np.ndarray, np.ndarray]:
    scale = (np.abs(w).max(axis=0) / 127.0 * scale_factor).astype(np.float32)
    q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
    return q, scale


def _graph(weights: Weights) -> onnx.ModelProto:
    quantized = bool(weights.int8_layers)
    elem = (TensorProto.FLOAT16 if not quantized and weights.float_layers[0].dtype == np.float16
            else TensorProto.FLOAT)
    count = len(weights.int8_layers) if quantized else len(weights.float_layers)
    d = (weights.int8_layers[0][0] if quantized else weights.float_layers[0]).shape[0]
    inits: list[TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    current = "x"
    for i in range(count):
        if quantized:
            q, scale = weights.int8_layers[i]
            inits += [
                numpy_helper.from_array(q, f"layer{i}.weight_q"),
                numpy_helper.from_array(scale, f"layer{i}.scale"),
                numpy_helper.from_array(np.zeros_like(scale, dtype=np.int8), f"layer{i}.zp"),
            ]
            nodes.append(
                helper.make_node(
                    "DequantizeLinear",
                    [f"layer{i}.weight_q", f"layer{i}.scale", f"layer{i}.zp"],
                    [f"layer{i}.weight"],
                    axis=1,
                )
            )
        else:
            inits.append(numpy_helper.from_array(weights.float_layers[i], f"layer{i}.weight"))
        inits.append(numpy_helper.from_array(weights.biases[i], f"layer{i}.bias"))
        nodes += [
            helper.make_node("MatMul", [current, f"layer{i}.weight"], [f"h{i}"]),
            helper.make_node("Add", [f"h{i}", f"layer{i}.bias"], [f"a{i}"]),
        ]
        current = f"a{i}"
        if i < count - 1:
            nodes.append(helper.make_node("Relu", [current], [f"r{i}"]))
            current = f"r{i}"
        if weights.adapter is not None and i == count // 2:
            down, up = weights.adapter
            inits += [
                numpy_helper.from_array(down, "adapter.down"),
                numpy_helper.from_array(up, "adapter.up"),
            ]
            nodes += [
                helper.make_node("MatMul", [current, "adapter.down"], ["ad0"]),
                helper.make_node("MatMul", ["ad0", "adapter.up"], ["ad1"]),
                helper.make_node("Add", [current, "ad1"], ["adapted"]),
            ]
            current = "adapted"
    out_dim = d // 2
    graph = helper.make_graph(
        nodes,
        "synthetic",
        [helper.make_tensor_value_info("x", elem, [1, d])],
        [helper.make_tensor_value_info(current, elem, [1, out_dim])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _save(model: onnx.ModelProto, path: Path) -> None:
    path.write_bytes(model.SerializeToString())


def write_pair(scenario: str, size_bytes: int, directory: Path, seed: int = 0) -> tuple[Path, Path]:
    """Write ``base.onnx`` and ``new.onnx`` of about ``size_bytes`` each; return their paths."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; pick one of {', '.join(SCENARIOS)}")
    rng = np.random.default_rng(seed)
    quantized = scenario in ("int8_requant", "int8_finetune")
    d = _dim_for(size_bytes, quantized)
    base = _init(rng, d)
    if scenario == "head_only":
        head = base.float_layers[-1]
        new_head = (rng.standard_normal(head.shape) / math.sqrt(d)).astype(np.float32)
        new_bias = (rng.standard_normal(head.shape[1]) * 0.01).astype(np.float32)
        new = Weights([*base.float_layers[:-1], new_head], [*base.biases[:-1], new_bias], [])
    elif scenario == "full_finetune":
        lr = 1e-4
        new = Weights(
            [
                (w + lr * rng.standard_normal(w.shape).astype(np.float32) * w.std()).astype(
                    np.float32
                )
                for w in base.float_layers
            ],
            [
                (b + lr * rng.standard_normal(b.shape) * 0.01).astype(np.float32)
                for b in base.biases
            ],
            [],
        )
    elif scenario == "int8_requant":
        # The same float weights quantized with 0.4% larger scales: values near a rounding
        # boundary move one step (~10% of the bytes), as after a calibration change.
        floats, base = base, _quantized(base, 1.0)
        new = _quantized(floats, 1.004)
    elif scenario == "fp16_to_int8":
        # Sized like the INT8 file (d from 1 byte per weight); the FP16 base is twice as big.
        d = _dim_for(size_bytes, True)
        base = _init(rng, d)
        floats, base = base, _half(base)
        new = _quantized(floats, 1.0)
    elif scenario == "int8_finetune":
        lr = 1e-3
        tuned = Weights(
            [(w + lr * rng.standard_normal(w.shape).astype(np.float32) * w.std()).astype(
                np.float32) for w in base.float_layers],
            base.biases, [])
        base, new = _quantized(base, 1.0), _quantized(tuned, 1.0)
    elif scenario == "insert_tensor":
        rank = max(4, d // 16)
        new = Weights(
            base.float_layers,
            base.biases,
            [],
            adapter=(
                (rng.standard_normal((d, rank)) * 0.01).astype(np.float32),
                (rng.standard_normal((rank, d)) * 0.01).astype(np.float32),
            ),
        )
    else:  # unrelated
        new = _init(rng, d)
    directory.mkdir(parents=True, exist_ok=True)
    base_path, new_path = directory / "base.onnx", directory / "new.onnx"
    _save(_graph(base), base_path)
    _save(_graph(new), new_path)
    return base_path, new_path
