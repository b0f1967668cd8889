"""ONNX → torch for the Core ML path (coremltools reads torch, not ONNX), via onnx2torch.

Two local workarounds, both deliberate:

1. onnx2torch imports torchvision eagerly (only for NonMaxSuppression and RoiAlign). PyPI
   torchvision does not import beside the CPU torch build used here, so it is not installed.
   Before importing onnx2torch we register, for the duration of that import only, a stand-in
   `torchvision` whose ops raise a clear error. Those two operators are rejected by the
   operator gate before conversion anyway.
2. onnx2torch registers converters up to opset ~17, while torch's dynamo exporter writes opset
   18+. Where a newer opset only widened the accepted types we alias the newest converter;
   the opset-18 reductions (axes moved from attribute to a constant input) get a converter
   that reads the constant axes. Reshape's `allowzero=1` (written by the exporter, refused by
   onnx2torch) is reset when the target shape is a constant with no zero, where it has no
   effect. Everything else fails with the operator named.
"""

from __future__ import annotations

import sys
import threading
import types
from pathlib import Path
from typing import Any

from server.compile.errors import CompilerUnavailableError, ConversionError

_LOCK = threading.Lock()
_MODULE: Any = None

# (op, newer since_version, existing converter version): semantics unchanged for float graphs.
_ALIASES = [
    ("Cast", 19, 13), ("Cast", 21, 13), ("Constant", 19, 13), ("Constant", 21, 13),
    ("Identity", 19, 16), ("Identity", 21, 16), ("Reshape", 19, 14), ("Reshape", 21, 14),
    ("Shape", 19, 15), ("Shape", 21, 15), ("Equal", 19, 13), ("Flatten", 21, 13),
    ("Transpose", 21, 13), ("Unsqueeze", 21, 13), ("Pad", 18, 13), ("Pad", 19, 13),
    ("Pad", 21, 13), ("Split", 18, 13), ("ConstantOfShape", 20, 9), ("ConstantOfShape", 21, 9),
    ("Where", 16, 16), ("ReduceMax", 20, 13), ("ReduceMin", 20, 13),
]
_REDUCE_18 = ["ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax",
              "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSumSquare"]


def _stand_in_torchvision() -> dict[str, types.ModuleType]:
    def unavailable(*_: Any, **__: Any) -> Any:
        raise RuntimeError(
            "torchvision ops (NMS, RoIAlign) are not available in the compile worker; models "
            "using them are rejected by the operator gate"
        )

    tv = types.ModuleType("torchvision")
    ops = types.ModuleType("torchvision.ops")
    ops.__dict__.update(nms=unavailable, box_convert=unavailable, roi_align=unavailable)
    tv.__dict__.update(ops=ops, __modelfleet_stand_in__=True)
    return {"torchvision": tv, "torchvision.ops": ops}


def _register_extra_converters(o2t: Any) -> None:
    import torch
    from onnx2torch.node_converters.reduce import OnnxReduceStaticAxes
    from onnx2torch.node_converters.registry import (
        _CONVERTER_REGISTRY,
        OperationDescription,
        add_converter,
    )
    from onnx2torch.utils.common import OnnxMapping, OperationConverterResult, get_const_value

    for op, new, old in _ALIASES:
        existing = _CONVERTER_REGISTRY.get(OperationDescription("", op, old))
        if existing is not None and OperationDescription("", op, new) not in _CONVERTER_REGISTRY:
            add_converter(operation_type=op, version=new)(existing)

    def reduce_with_axes_input(node: Any, graph: Any) -> Any:
        axes = None
        if len(node.input_values) > 1 and node.input_values[1]:
            try:
                axes = torch.as_tensor(get_const_value(node.input_values[1], graph)).tolist()
            except KeyError:
                raise ConversionError(
                    f"{node.operation_type} with non-constant axes cannot be converted",
                    [node.operation_type]) from None
        if not axes and node.attributes.get("noop_with_empty_axes", 0):
            raise ConversionError(f"{node.operation_type} with noop_with_empty_axes=1",
                                  [node.operation_type])
        return OperationConverterResult(
            torch_module=OnnxReduceStaticAxes(operation_type=node.operation_type, axes=axes,
                                              keepdims=node.attributes.get("keepdims", 1)),
            onnx_mapping=OnnxMapping(inputs=(node.input_values[0],), outputs=node.output_values),
        )

    for op in _REDUCE_18:
        for version in (18, 20):
            if OperationDescription("", op, version) not in _CONVERTER_REGISTRY:
                add_converter(operation_type=op, version=version)(reduce_with_axes_input)


def load_onnx2torch() -> Any:
    """Imports onnx2torch once per process (with the torchvision stand-in if needed)."""
    global _MODULE
    with _LOCK:
        if _MODULE is not None:
            return _MODULE
        added: dict[str, types.ModuleType] = {}
        try:
            import torchvision  # noqa: F401
        except Exception:
            added = _stand_in_torchvision()
            for name, mod in added.items():
                sys.modules.setdefault(name, mod)
        try:
            import onnx2torch
        except ImportError as e:
            raise CompilerUnavailableError(
                f"onnx2torch is not installed ({e}); install it with "
                "`pip install --no-deps onnx2torch` to compile ONNX uploads for Core ML"
            ) from e
        finally:
            # Only onnx2torch keeps references; nobody else should see the stand-in.
            for name, mod in added.items():
                if sys.modules.get(name) is mod:
                    del sys.modules[name]
        _register_extra_converters(onnx2torch)
        _MODULE = onnx2torch
        return _MODULE


def _constants(model: Any) -> dict[str, Any]:
    from onnx import numpy_helper

    out = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    out[node.output[0]] = numpy_helper.to_array(attr.t)
    return out


def normalize(model: Any) -> Any:
    """Semantics-preserving rewrites so onnx2torch accepts exporter output (in place)."""
    consts = None
    for node in model.graph.node:
        if node.op_type != "Reshape":
            continue
        for attr in node.attribute:
            if attr.name == "allowzero" and attr.i == 1:
                consts = consts if consts is not None else _constants(model)
                shape = consts.get(node.input[1])
                if shape is not None and 0 not in shape.tolist():
                    attr.i = 0  # with no 0 in the shape, allowzero changes nothing
    return model


def unsupported_operators(model: Any) -> list[str]:
    """Operators of `model` (top graph) that onnx2torch has no converter for, in graph order."""
    load_onnx2torch()
    from onnx2torch.node_converters.registry import get_converter

    opsets = {o.domain or "": o.version for o in model.opset_import}
    missing: list[str] = []
    for node in model.graph.node:
        domain = node.domain or ""
        try:
            get_converter(operation_type=node.op_type, version=opsets.get(domain, 1),
                          domain=domain)
        except NotImplementedError:
            label = f"{node.op_type} (opset {opsets.get(domain, 1)})"
            if label not in missing:
                missing.append(label)
    return missing


def onnx_to_torch(path: Path) -> Any:
    """A torch.nn.Module equivalent of the ONNX graph, or ConversionError naming operators."""
    import onnx

    o2t = load_onnx2torch()
    model = normalize(onnx.load(str(path)))
    missing = unsupported_operators(model)
    if missing:
        raise ConversionError(
            f"ONNX → torch conversion (needed for Core ML) has no converter for: "
            f"{', '.join(missing)}. Upload the model as a torch ExportedProgram "
            "(torch.export.save) instead of ONNX to compile it for Core ML.",
            [m.split(" ")[0] for m in missing],
        )
    try:
        return o2t.convert(model).eval()
    except ConversionError:
        raise
    except Exception as e:
        raise ConversionError(
            f"ONNX → torch conversion failed: {type(e).__name__}: {e}. Upload the model as a "
            "torch ExportedProgram (torch.export.save) to compile it for Core ML.") from e
