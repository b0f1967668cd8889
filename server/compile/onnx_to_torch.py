"""ONNX → torch for the Core ML path (coremltools reads torch, not ONNX), via onnx2torch.

Two local workarounds, both deliberate:

1. onnx2torch imports torchvision eagerly (only for NonMaxSuppression and RoiAlign). PyPI
   torchvision does not import beside the CPU torch build used here, so it is not installed.
   Before importing onnx2torch we register, for the duration of that import only, a stand-in
   `torchvision` whose ops raise a clear error. Those two operators are rejected by the
   operator gate before conversion anyway.
2. onnx2torch registers converters up to opset ~17 and lacks operators real exporters emit
   (Gelu, Trilu, Mish, Resize 18/19, …): `server/compile/onnx_converters.py` adds them.
   Reshape's `allowzero=1` (written by the exporter, refused by onnx2torch) is reset when the
   target shape is a constant with no zero, where it has no effect. Every node that still
   cannot be converted is named with its operator and the converter's reason.
"""

from __future__ import annotations

import sys
import threading
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server.compile.errors import CompilerUnavailableError, ConversionError

_LOCK = threading.Lock()
_MODULE: Any = None


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
        from server.compile.onnx_converters import register

        register()
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


def _inline_identity_initializers(model: Any) -> None:
    """The TorchScript exporter deduplicates equal weights into `Identity(initializer)`
    nodes; onnx2torch's Conv/Gemm converters need the weight itself as an initializer."""
    inits = {t.name: t for t in model.graph.initializer}
    outputs = {o.name for o in model.graph.output}
    keep = []
    for node in model.graph.node:
        if node.op_type == "Identity" and node.input[0] in inits and node.output[0] not in outputs:
            copy = model.graph.initializer.add()
            copy.CopyFrom(inits[node.input[0]])
            copy.name = node.output[0]
            continue
        keep.append(node)
    if len(keep) != len(model.graph.node):
        del model.graph.node[:]
        model.graph.node.extend(keep)


def normalize(model: Any) -> Any:
    """Semantics-preserving rewrites so onnx2torch accepts exporter output (in place)."""
    _inline_identity_initializers(model)
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


@dataclass(frozen=True)
class Unconvertible:
    """A node the ONNX → torch step cannot convert, and why (the converter's own words)."""

    op: str
    node: str
    reason: str

    def label(self) -> str:
        return f"{self.op} node {self.node!r}: {self.reason}"


def unconvertible_nodes(model: Any) -> list[Unconvertible]:
    """Every node of the top graph the converter registry cannot take: no converter for its
    operator at the model's opset, or a converter that refuses its attributes/inputs. It
    runs the very converters the compile runs, so the gate and the compile agree."""
    load_onnx2torch()
    from onnx2torch.node_converters.registry import get_converter
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.utils.safe_shape_inference import safe_shape_inference

    model = safe_shape_inference(model)
    inits = {t.name for t in model.graph.initializer}
    for vi in [i for i in model.graph.input if i.name in inits]:
        model.graph.input.remove(vi)
    opsets = {o.domain or "": o.version for o in model.opset_import}
    graph = OnnxGraph(model.graph)
    out: list[Unconvertible] = []
    for name, node in graph.nodes.items():
        domain = node.domain or ""
        opset = opsets.get(domain, 1)
        try:
            converter = get_converter(operation_type=node.operation_type, version=opset,
                                      domain=domain)
        except NotImplementedError:
            out.append(Unconvertible(node.operation_type, name,
                                     f"no converter at opset {opset}"))
            continue
        try:
            converter(node, graph)
        except (NotImplementedError, ConversionError) as e:
            out.append(Unconvertible(node.operation_type, name, str(e) or "not supported"))
        except Exception as e:  # a converter bug is still this node's problem
            out.append(Unconvertible(node.operation_type, name, f"{type(e).__name__}: {e}"))
    return out


def unsupported_operators(model: Any) -> list[str]:
    """Operator types among `unconvertible_nodes`, in graph order (no duplicates)."""
    return list(dict.fromkeys(u.op for u in unconvertible_nodes(model)))


def onnx_to_torch(path: Path) -> Any:
    """A torch.nn.Module equivalent of the ONNX graph, or ConversionError naming operators."""
    import onnx

    o2t = load_onnx2torch()
    model = normalize(onnx.load(str(path)))
    missing = unconvertible_nodes(model)
    if missing:
        shown = "; ".join(u.label() for u in missing[:8])
        more = f" (and {len(missing) - 8} more)" if len(missing) > 8 else ""
        raise ConversionError(
            f"ONNX → torch conversion (needed for Core ML) cannot convert {len(missing)} "
            f"node(s): {shown}{more}. Upload the model as a torch ExportedProgram "
            "(torch.export.save) instead of ONNX to compile it for Core ML.",
            list(dict.fromkeys(u.op for u in missing)),
        )
    try:
        return o2t.convert(model).eval()
    except ConversionError:
        raise
    except Exception as e:
        raise ConversionError(
            f"ONNX → torch conversion failed: {type(e).__name__}: {e}. Upload the model as a "
            "torch ExportedProgram (torch.export.save) to compile it for Core ML.") from e
