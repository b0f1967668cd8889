"""ONNX operators onnx2torch lacks, registered into its converter registry (Core ML route).

Real exporters (torch dynamo and TorchScript exporters at opsets 11–20, paddle2onnx) emit
operators and opset versions onnx2torch 1.5 has no converter for. Each converter here emits
only torch ops that `torch.export` traces and coremltools' torch frontend converts
(e.g. IsNaN becomes `x != x`, because coremltools has no `isinf` and its `isnan` is recent).

- aliases: a newer opset that only widened the accepted types reuses the older converter;
- opset-18 reductions (axes moved from an attribute to a constant input);
- Gelu (20), IsNaN/IsInf (all versions), Trilu, Mish, GlobalMaxPool, AveragePool 19
  (dilations 1 only), Resize 11–19 (constant scales/sizes; nearest, linear, cubic),
  Clip with non-constant min/max, Flatten at any axis.

A converter that cannot express a node raises NotImplementedError with the reason; the
operator gate (`server/compile/gates/support.py`) calls the same converters, so it names the
same nodes the compile would fail on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

Converter = Callable[[Any, Any], Any]

# (op, newer since_version, existing converter version): semantics unchanged for our graphs.
ALIASES: list[tuple[str, int, int]] = [
    ("Cast", 19, 13), ("Cast", 21, 13), ("Constant", 19, 13), ("Constant", 21, 13),
    ("Identity", 19, 16), ("Identity", 21, 16), ("Reshape", 19, 14), ("Reshape", 21, 14),
    ("Shape", 19, 15), ("Shape", 21, 15), ("Equal", 19, 13), ("Flatten", 21, 13),
    ("Transpose", 21, 13), ("Unsqueeze", 21, 13), ("Pad", 18, 13), ("Pad", 19, 13),
    ("Pad", 21, 13), ("Split", 18, 13), ("ConstantOfShape", 20, 9), ("ConstantOfShape", 21, 9),
    ("Where", 16, 16), ("ReduceMax", 20, 13), ("ReduceMin", 20, 13),
    ("GreaterOrEqual", 16, 12), ("LessOrEqual", 16, 12), ("ScatterND", 18, 16),
]
REDUCE_18 = ["ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax",
             "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSumSquare"]
RESIZE_VERSIONS = (11, 13, 18, 19)


def _result(module: nn.Module, inputs: tuple[str, ...], node: Any) -> Any:
    from onnx2torch.utils.common import OnnxMapping, OperationConverterResult

    return OperationConverterResult(torch_module=module, onnx_mapping=OnnxMapping(
        inputs=inputs, outputs=node.output_values))


def _const(name: str, graph: Any) -> torch.Tensor | None:
    """The constant value of an input (initializer or Constant node), None when computed."""
    from onnx2torch.utils.common import get_const_value

    if not name:
        return None
    try:
        return torch.as_tensor(get_const_value(name, graph))
    except KeyError:
        return None


class Gelu(nn.Module):
    def __init__(self, approximate: str) -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(x, approximate=self.approximate)


class IsNaN(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ne(x, x)


class IsInf(nn.Module):
    def __init__(self, positive: bool, negative: bool) -> None:
        super().__init__()
        self.positive, self.negative = positive, negative

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.eq(x, float("inf"))
        neg = torch.eq(x, float("-inf"))
        if self.positive and self.negative:
            return torch.logical_or(pos, neg)
        return pos if self.positive else (neg if self.negative else torch.zeros_like(pos))


class Trilu(nn.Module):
    def __init__(self, upper: bool, k: int) -> None:
        super().__init__()
        self.upper, self.k = upper, k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.triu(x, self.k) if self.upper else torch.tril(x, self.k)


class Mish(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.tanh(nn.functional.softplus(x))


class GlobalMaxPool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.amax(x, dim=tuple(range(2, x.dim())), keepdim=True)


class Clamp(nn.Module):
    """Clip with min and/or max computed in the graph (onnx2torch only takes constants)."""

    def forward(self, x: torch.Tensor, low: torch.Tensor | None = None,
                high: torch.Tensor | None = None) -> torch.Tensor:
        if low is not None:
            x = torch.maximum(x, low.to(x.dtype))
        if high is not None:
            x = torch.minimum(x, high.to(x.dtype))
        return x


class Flatten(nn.Module):
    """ONNX Flatten: (prod(shape[:axis]), prod(shape[axis:])), for every axis in [-r, r]
    (onnx2torch's fails when axis equals the rank)."""

    def __init__(self, axis: int) -> None:
        super().__init__()
        self.axis = axis

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        axis = self.axis + x.dim() if self.axis < 0 else self.axis
        lead = 1
        for d in x.shape[:axis]:
            lead *= int(d)
        return x.reshape(lead, -1)


class Expand(nn.Module):
    """Expand to a constant shape (onnx2torch builds torch.Size from a tensor, which
    torch.export cannot trace)."""

    def __init__(self, shape: list[int]) -> None:
        super().__init__()
        self.shape = shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch.broadcast_shapes has no annotations (torch 2.13)
        shape = torch.broadcast_shapes(tuple(x.shape), tuple(self.shape))  # type: ignore[no-untyped-call]
        return torch.broadcast_to(x, shape)


class Resize(nn.Module):
    """ONNX Resize with constant scales or sizes for the spatial axes (batch, channel kept)."""

    def __init__(self, mode: str, align_corners: bool | None, antialias: bool,
                 scales: list[float] | None, sizes: list[int] | None,
                 lead: list[int] | None = None) -> None:
        super().__init__()
        self.mode, self.align_corners, self.antialias = mode, align_corners, antialias
        self.scales, self.sizes, self.lead = scales, sizes, lead

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.lead is not None and list(x.shape[:2]) != self.lead:
            raise RuntimeError(f"Resize sizes {self.lead} change the batch or channel axis "
                               f"of an input shaped {list(x.shape)}")
        return nn.functional.interpolate(
            x, size=self.sizes, scale_factor=self.scales, mode=self.mode,
            align_corners=self.align_corners, antialias=self.antialias,
            recompute_scale_factor=False if self.scales is not None else None)


def _gelu(node: Any, graph: Any) -> Any:
    approximate = node.attributes.get("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise NotImplementedError(f"Gelu approximate={approximate!r}")
    return _result(Gelu(approximate), (node.input_values[0],), node)


def _isnan(node: Any, graph: Any) -> Any:
    return _result(IsNaN(), (node.input_values[0],), node)


def _isinf(node: Any, graph: Any) -> Any:
    a = node.attributes
    module = IsInf(bool(a.get("detect_positive", 1)), bool(a.get("detect_negative", 1)))
    return _result(module, (node.input_values[0],), node)


def _trilu(node: Any, graph: Any) -> Any:
    k = 0
    if len(node.input_values) > 1 and node.input_values[1]:
        value = _const(node.input_values[1], graph)
        if value is None:
            raise NotImplementedError("Trilu with a computed k (the diagonal offset)")
        k = int(value.reshape(-1)[0])
    return _result(Trilu(bool(node.attributes.get("upper", 1)), k), (node.input_values[0],),
                   node)


def _mish(node: Any, graph: Any) -> Any:
    return _result(Mish(), (node.input_values[0],), node)


def _global_max_pool(node: Any, graph: Any) -> Any:
    return _result(GlobalMaxPool(), (node.input_values[0],), node)


class ConstClamp(nn.Module):
    def __init__(self, low: float | None, high: float | None) -> None:
        super().__init__()
        self.low, self.high = low, high

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, self.low, self.high)


def _clip(node: Any, graph: Any) -> Any:
    """Clip 11+: min/max optional inputs, each constant, computed or omitted ('')."""
    names = [*node.input_values[1:3], "", ""][:2]
    values = [_const(n, graph) if n else None for n in names]
    if all(not n or v is not None for n, v in zip(names, values, strict=True)):
        low, high = (None if v is None else float(v) for v in values)
        if low is None and high is None:
            return _result(nn.Identity(), (node.input_values[0],), node)
        return _result(ConstClamp(low, high), (node.input_values[0],), node)
    inputs = (node.input_values[0], *node.input_values[1:3])
    return _result(Clamp(), inputs, node)


def _flatten(node: Any, graph: Any) -> Any:
    return _result(Flatten(int(node.attributes.get("axis", 1))), (node.input_values[0],), node)


def _expand(fallback: Converter) -> Converter:
    def convert(node: Any, graph: Any) -> Any:
        shape = _const(node.input_values[1], graph)
        if shape is None:
            return fallback(node, graph)
        return _result(Expand([int(d) for d in shape.tolist()]), (node.input_values[0],), node)
    return convert


def _average_pool_19(fallback: Converter) -> Converter:
    def convert(node: Any, graph: Any) -> Any:
        if any(d != 1 for d in node.attributes.get("dilations", [1])):
            raise NotImplementedError("AveragePool with dilations > 1 (torch has no dilated "
                                      "average pooling)")
        return fallback(node, graph)
    return convert


_RESIZE_MODES = {("nearest", 1): "nearest", ("nearest", 2): "nearest",
                 ("nearest", 3): "nearest", ("linear", 1): "linear", ("linear", 2): "bilinear",
                 ("linear", 3): "trilinear", ("cubic", 2): "bicubic"}


def _resize_mode(a: dict[str, Any], spatial: int) -> tuple[str, bool | None]:
    mode = a.get("mode", "nearest")
    ctm = a.get("coordinate_transformation_mode", "half_pixel")
    torch_mode = _RESIZE_MODES.get((mode, spatial))
    if torch_mode is None:
        raise NotImplementedError(f"Resize mode {mode!r} on {spatial} spatial axes")
    if mode == "nearest":
        nearest = a.get("nearest_mode", "round_prefer_floor")
        if ctm == "asymmetric" and nearest == "floor":
            return torch_mode, None
        if ctm in ("half_pixel", "pytorch_half_pixel") and nearest == "round_prefer_ceil":
            return "nearest-exact", None
        raise NotImplementedError(
            f"Resize nearest with coordinate_transformation_mode={ctm!r} and "
            f"nearest_mode={nearest!r} (torch has asymmetric+floor and half_pixel+"
            "round_prefer_ceil)")
    if mode == "cubic" and (a.get("cubic_coeff_a", -0.75) != -0.75
                            or a.get("exclude_outside", 0)):
        raise NotImplementedError("Resize cubic with cubic_coeff_a != -0.75 or exclude_outside")
    if ctm in ("half_pixel", "pytorch_half_pixel"):
        return torch_mode, False
    if ctm == "align_corners":
        return torch_mode, True
    raise NotImplementedError(f"Resize {mode} with coordinate_transformation_mode={ctm!r}")


def _resize(node: Any, graph: Any) -> Any:
    a = dict(node.attributes)
    names = [*node.input_values, "", "", ""][:4]
    if names[1] and (roi := _const(names[1], graph)) is not None and roi.numel() \
            and a.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        raise NotImplementedError("Resize with tf_crop_and_resize (a region of interest)")
    scales = _const(names[2], graph)
    sizes = _const(names[3], graph)
    if (names[2] and scales is None) or (names[3] and sizes is None):
        raise NotImplementedError("Resize with computed scales/sizes (fix the input shapes so "
                                  "they fold to constants)")
    if a.get("keep_aspect_ratio_policy", "stretch") != "stretch" and sizes is not None:
        raise NotImplementedError("Resize keep_aspect_ratio_policy other than stretch")
    lead = None
    scale_list = scales.tolist() if scales is not None and scales.numel() else None
    size_list = [int(s) for s in sizes.tolist()] if sizes is not None and sizes.numel() \
        else None
    axes = a.get("axes")
    values = scale_list if scale_list is not None else size_list
    if values is None:
        raise NotImplementedError("Resize without scales or sizes")
    if axes is not None:
        if sorted(axes) != list(range(min(axes), min(axes) + len(axes))) or min(axes) < 2:
            raise NotImplementedError(f"Resize over axes {axes} (only spatial axes)")
        rank = len(axes) + 2
    else:
        rank = len(values)
        if rank < 3 or (scale_list is not None and values[:2] != [1.0, 1.0]):
            raise NotImplementedError("Resize of the batch or channel axis")
        lead = None if scale_list is not None else [int(v) for v in values[:2]]
        values = values[2:]
    mode, align = _resize_mode(a, rank - 2)
    antialias = bool(a.get("antialias", 0))
    if antialias and mode not in ("bilinear", "bicubic"):
        raise NotImplementedError(f"Resize antialias with mode {a.get('mode')!r}")
    module = Resize(mode, align, antialias,
                    [float(v) for v in values] if scale_list is not None else None,
                    [int(v) for v in values] if scale_list is None else None, lead)
    return _result(module, (node.input_values[0],), node)


def _reduce_with_axes_input(node: Any, graph: Any) -> Any:
    from onnx2torch.node_converters.reduce import OnnxReduceStaticAxes

    axes = None
    if len(node.input_values) > 1 and node.input_values[1]:
        value = _const(node.input_values[1], graph)
        if value is None:
            raise NotImplementedError(f"{node.operation_type} with computed axes")
        axes = value.tolist()
    if not axes and node.attributes.get("noop_with_empty_axes", 0):
        raise NotImplementedError(f"{node.operation_type} with noop_with_empty_axes=1")
    module = OnnxReduceStaticAxes(operation_type=node.operation_type, axes=axes,
                                  keepdims=node.attributes.get("keepdims", 1))
    return _result(module, (node.input_values[0],), node)


def register() -> None:
    """Adds the converters above to onnx2torch's registry (call once, after importing it)."""
    from onnx2torch.node_converters.registry import _CONVERTER_REGISTRY, OperationDescription

    def put(op: str, version: int, fn: Converter, replace: bool = False) -> None:
        key = OperationDescription("", op, version)
        if replace or key not in _CONVERTER_REGISTRY:
            _CONVERTER_REGISTRY[key] = fn

    def existing(op: str, version: int) -> Converter:
        # onnx2torch's registry is an untyped dict
        return _CONVERTER_REGISTRY[OperationDescription("", op, version)]  # type: ignore[no-any-return]

    for op, new, old in ALIASES:
        if OperationDescription("", op, old) in _CONVERTER_REGISTRY:
            put(op, new, existing(op, old))
    for op in REDUCE_18:
        for version in (18, 20):
            put(op, version, _reduce_with_axes_input)
    put("Gelu", 20, _gelu)
    for version in (9, 13, 20):
        put("IsNaN", version, _isnan, replace=True)
    for version in (10, 20):
        put("IsInf", version, _isinf, replace=True)
    put("Trilu", 14, _trilu)
    put("Mish", 18, _mish)
    put("GlobalMaxPool", 1, _global_max_pool)
    put("AveragePool", 19, _average_pool_19(existing("AveragePool", 11)))
    for version in (11, 12, 13):
        put("Clip", version, _clip, replace=True)
    for version in (1, 9, 11, 13, 21):
        put("Flatten", version, _flatten, replace=True)
    for version in (8, 13):
        put("Expand", version, _expand(existing("Expand", version)), replace=True)
    for version in RESIZE_VERSIONS:
        put("Resize", version, _resize, replace=True)
