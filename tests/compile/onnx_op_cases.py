"""Small single-operator ONNX graphs, as exporters write them, per operator and opset.

Each case builds an ONNX model with onnx.helper and real random inputs; tests run it through
onnxruntime (the reference) and the ONNX → MIL conversion for Core ML
(tests/compile/test_onnx_mil.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper, numpy_helper


@dataclass(frozen=True)
class OpCase:
    id: str
    build: Callable[[], tuple[ModelProto, dict[str, np.ndarray]]]


def _model(nodes: list[Any], inputs: dict[str, np.ndarray], out_shape: list[int] | None,
           opset: int, inits: dict[str, np.ndarray] | None = None,
           out_type: int = TensorProto.FLOAT) -> tuple[ModelProto, dict[str, np.ndarray]]:
    types = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64}
    graph = helper.make_graph(
        nodes, "case",
        [helper.make_tensor_value_info(k, types[v.dtype], list(v.shape))
         for k, v in inputs.items()],
        [helper.make_tensor_value_info(nodes[-1].output[0], out_type, out_shape)],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    # Give the output the shape onnx infers (exporters write it too).
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    model.graph.output[0].CopyFrom(inferred.graph.output[0])
    return model, inputs


def _x(*shape: int, seed: int = 0, scale: float = 2.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _unary(op: str, opset: int, shape: tuple[int, ...] = (2, 3, 8), out_type: int =
           TensorProto.FLOAT, x: np.ndarray | None = None, **attrs: Any
           ) -> Callable[[], tuple[ModelProto, dict[str, np.ndarray]]]:
    def build() -> tuple[ModelProto, dict[str, np.ndarray]]:
        value = _x(*shape) if x is None else x
        return _model([helper.make_node(op, ["x"], ["y"], name=f"{op.lower()}_0", **attrs)],
                      {"x": value}, None, opset, out_type=out_type)
    return build


def _with_specials() -> np.ndarray:
    x = _x(2, 3, 8)
    x[0, 0, :3] = [np.nan, np.inf, -np.inf]
    return x


def _masking(opset: int) -> Callable[[], tuple[ModelProto, dict[str, np.ndarray]]]:
    """IsNaN/IsInf → Or → Where: how exported attention masks scrub NaN scores."""
    def build() -> tuple[ModelProto, dict[str, np.ndarray]]:
        nodes = [helper.make_node("IsNaN", ["x"], ["nan"]),
                 helper.make_node("IsInf", ["x"], ["inf"]),
                 helper.make_node("Or", ["nan", "inf"], ["bad"]),
                 helper.make_node("Where", ["bad", "zero", "x"], ["y"], name="scrub")]
        return _model(nodes, {"x": _with_specials()}, None, opset,
                      {"zero": np.zeros((), np.float32)})
    return build


def _layer_norm(opset: int) -> Callable[[], tuple[ModelProto, dict[str, np.ndarray]]]:
    def build() -> tuple[ModelProto, dict[str, np.ndarray]]:
        node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1,
                                epsilon=1e-12)
        return _model([node], {"x": _x(1, 16, 32)}, None, opset,
                      {"g": _x(32, seed=1), "b": _x(32, seed=2)})
    return build


def _expand(opset: int) -> Callable[[], tuple[ModelProto, dict[str, np.ndarray]]]:
    def build() -> tuple[ModelProto, dict[str, np.ndarray]]:
        node = helper.make_node("Expand", ["x", "shape"], ["y"])
        return _model([node], {"x": _x(1, 1, 1, 8)}, None, opset,
                      {"shape": np.array([1, 4, 8, 8], np.int64)})
    return build


def _batched_matmul(opset: int) -> Callable[[], tuple[ModelProto, dict[str, np.ndarray]]]:
    def build() -> tuple[ModelProto, dict[str, np.ndarray]]:
        node = helper.make_node("MatMul", ["a", "b"], ["y"])
        return _model([node], {"a": _x(1, 4, 16, 8), "b": _x(1, 4, 8, 16, seed=1)}, None, opset)
    return build


def _softmax(opset: int, axis: int) -> Callable[[], tuple[ModelProto, dict[str, np.ndarray]]]:
    return _unary("Softmax", opset, (1, 4, 16), axis=axis)


def _resize(opset: int, mode: str, ctm: str, scales: list[float] | None,
            sizes: list[int] | None, **attrs: Any
            ) -> Callable[[], tuple[ModelProto, dict[str, np.ndarray]]]:
    def build() -> tuple[ModelProto, dict[str, np.ndarray]]:
        inits: dict[str, np.ndarray] = {"roi": np.zeros(0, np.float32)}
        names = ["x", "roi"]
        if scales is not None:
            inits["scales"] = np.array(scales, np.float32)
            names.append("scales")
        else:
            inits["sizes"] = np.array(sizes, np.int64)
            inits["no_scales"] = np.zeros(0, np.float32)
            names += ["no_scales", "sizes"]
        node = helper.make_node("Resize", names, ["y"], mode=mode,
                                coordinate_transformation_mode=ctm, **attrs)
        return _model([node], {"x": _x(1, 3, 8, 8)}, None, opset, inits)
    return build


def _conv_transpose() -> tuple[ModelProto, dict[str, np.ndarray]]:
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2],
                            pads=[1, 1, 1, 1], output_padding=[1, 1], kernel_shape=[3, 3])
    return _model([node], {"x": _x(1, 4, 8, 8)}, None, 11,
                  {"w": _x(4, 3, 3, 3, seed=1, scale=0.3), "b": _x(3, seed=2)})


def _clip(opset: int, dynamic: bool) -> Callable[[], tuple[ModelProto, dict[str, np.ndarray]]]:
    def build() -> tuple[ModelProto, dict[str, np.ndarray]]:
        if not dynamic:
            node = helper.make_node("Clip", ["x", "lo", "hi"], ["y"])
            return _model([node], {"x": _x(2, 8)}, None, opset,
                          {"lo": np.array(-1.0, np.float32), "hi": np.array(0.5, np.float32)})
        # min computed in the graph (ReduceMin of a second input), max omitted.
        nodes = [helper.make_node("ReduceMin", ["m"], ["lo"], keepdims=0),
                 helper.make_node("Clip", ["x", "lo", ""], ["y"], name="clip_dynamic")]
        return _model(nodes, {"x": _x(2, 8), "m": _x(4, seed=3)}, None, opset)
    return build


def _batch_norm(opset: int) -> Callable[[], tuple[ModelProto, dict[str, np.ndarray]]]:
    def build() -> tuple[ModelProto, dict[str, np.ndarray]]:
        node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"],
                                epsilon=1e-5)
        inits = {"s": _x(4, seed=1), "b": _x(4, seed=2), "m": _x(4, seed=3),
                 "v": np.abs(_x(4, seed=4)) + 0.5}
        return _model([node], {"x": _x(1, 4, 6, 6)}, None, opset, inits)
    return build


def _pool(op: str, opset: int, **attrs: Any
          ) -> Callable[[], tuple[ModelProto, dict[str, np.ndarray]]]:
    return _unary(op, opset, (1, 3, 9, 9), **attrs)


def _trilu(upper: int, k: int | None) -> Callable[[], tuple[ModelProto, dict[str, np.ndarray]]]:
    def build() -> tuple[ModelProto, dict[str, np.ndarray]]:
        names = ["x"] + (["k"] if k is not None else [])
        inits = {"k": np.array(k, np.int64)} if k is not None else {}
        node = helper.make_node("Trilu", names, ["y"], upper=upper)
        return _model([node], {"x": _x(1, 6, 6)}, None, 14, inits)
    return build


def _reduce_mean(opset: int) -> Callable[[], tuple[ModelProto, dict[str, np.ndarray]]]:
    def build() -> tuple[ModelProto, dict[str, np.ndarray]]:
        node = helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=1)
        return _model([node], {"x": _x(1, 16, 32)}, None, opset,
                      {"axes": np.array([-1], np.int64)})
    return build


B = TensorProto.BOOL
CASES: list[OpCase] = [
    OpCase("Gelu-20", _unary("Gelu", 20)),
    OpCase("Gelu-20-tanh", _unary("Gelu", 20, approximate="tanh")),
    *[OpCase(f"Erf-{o}", _unary("Erf", o)) for o in (11, 13, 20)],
    *[OpCase(f"LayerNormalization-{o}", _layer_norm(o)) for o in (17, 18, 20)],
    *[OpCase(f"IsNaN-{o}", _unary("IsNaN", o, out_type=B, x=_with_specials()))
      for o in (11, 13, 20)],
    *[OpCase(f"IsInf-{o}", _unary("IsInf", o, out_type=B, x=_with_specials()))
      for o in (11, 20)],
    OpCase("IsInf-20-positive", _unary("IsInf", 20, out_type=B, x=_with_specials(),
                                       detect_negative=0)),
    *[OpCase(f"masking-Where-{o}", _masking(o)) for o in (11, 16, 20)],
    *[OpCase(f"Expand-{o}", _expand(o)) for o in (11, 13, 20)],
    *[OpCase(f"MatMul-batched-{o}", _batched_matmul(o)) for o in (11, 13, 20)],
    OpCase("Softmax-11", _softmax(11, 2)),
    *[OpCase(f"Softmax-{o}", _softmax(o, -1)) for o in (13, 20)],
    *[OpCase(f"Resize-{o}-nearest", _resize(o, "nearest", "asymmetric", [1, 1, 2, 2], None,
                                            nearest_mode="floor")) for o in (11, 13, 18, 19)],
    *[OpCase(f"Resize-{o}-linear-sizes", _resize(o, "linear", "half_pixel", None,
                                                 [1, 3, 12, 20])) for o in (11, 13, 18, 19)],
    OpCase("Resize-13-linear-pytorch_half_pixel",
           _resize(13, "linear", "pytorch_half_pixel", [1, 1, 2, 2], None)),
    OpCase("Resize-11-linear-align_corners",
           _resize(11, "linear", "align_corners", None, [1, 3, 16, 16])),
    OpCase("Resize-19-cubic", _resize(19, "cubic", "half_pixel", [1, 1, 2, 2], None)),
    OpCase("Resize-11-nearest-half_pixel-ceil",
           _resize(11, "nearest", "half_pixel", [1, 1, 2, 2], None,
                   nearest_mode="round_prefer_ceil")),
    *[OpCase(f"HardSigmoid-{o}", _unary("HardSigmoid", o, alpha=0.2, beta=0.5))
      for o in (11, 20)],
    *[OpCase(f"HardSwish-{o}", _unary("HardSwish", o)) for o in (14, 20)],
    OpCase("ConvTranspose-11", _conv_transpose),
    *[OpCase(f"Clip-{o}", _clip(o, False)) for o in (11, 13)],
    OpCase("Clip-13-max-only", lambda: _model(
        [helper.make_node("Clip", ["x", "", "hi"], ["y"])], {"x": _x(2, 8)}, None, 13,
        {"hi": np.array(0.5, np.float32)})),
    *[OpCase(f"Clip-{o}-dynamic-min", _clip(o, True)) for o in (11, 13, 18)],
    *[OpCase(f"BatchNormalization-{o}", _batch_norm(o)) for o in (11, 14, 15)],
    OpCase("AveragePool-11", _pool("AveragePool", 11, kernel_shape=[3, 3], strides=[2, 2])),
    OpCase("AveragePool-19", _pool("AveragePool", 19, kernel_shape=[3, 3], strides=[2, 2],
                                   pads=[1, 1, 1, 1], count_include_pad=1)),
    OpCase("MaxPool-12", _pool("MaxPool", 12, kernel_shape=[3, 3], strides=[2, 2])),
    *[OpCase(f"GlobalMaxPool-{o}", _pool("GlobalMaxPool", o)) for o in (11, 20)],
    OpCase("GlobalAveragePool-11", _pool("GlobalAveragePool", 11)),
    *[OpCase(f"Flatten-{o}", _unary("Flatten", o, (1, 3, 4, 4), axis=1)) for o in (11, 13)],
    OpCase("Flatten-13-axis-rank", _unary("Flatten", 13, (1, 12), axis=2)),
    OpCase("Flatten-13-axis-0", _unary("Flatten", 13, (2, 3, 4), axis=0)),
    OpCase("Trilu-14-upper", _trilu(1, None)),
    OpCase("Trilu-14-lower-k", _trilu(0, 1)),
    OpCase("Mish-18", _unary("Mish", 18)),
    *[OpCase(f"ReduceMean-{o}-axes-input", _reduce_mean(o)) for o in (18, 20)],
]
