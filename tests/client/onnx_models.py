"""Tiny ONNX models built with the onnx helper API (no torch), whose outputs name their bundle.

``scaled_model(k)``: y = x * k and tag = [k], so a prediction proves which whole bundle ran:
``y == x * tag`` holds only if both outputs came from the same model.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from client_sdk.install import Bundle, BundleStore, Member


def scaled_model(
    k: float, *, padding: int = 0, tweak: int = 0, use_padding: bool = False, width: int = 4
) -> bytes:
    """A model computing y = x*k (x: float32[1,4]) plus the constant output tag=[k].

    ``padding`` adds an unused initializer of that many float32s (seeded, identical across
    calls) to make the file bigger for patch tests; ``tweak`` changes its first values, so two
    models differing only in ``k``/``tweak`` make a small bsdiff4 patch. ``use_padding`` adds
    an output ``padsum`` so optimizers keep the padding (realistic compile cost). ``width``:
    the input's second dimension (a model the app's [1, 4] inputs do not fit fails to run).
    """
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])
    tag = helper.make_tensor_value_info("tag", TensorProto.FLOAT, [1])
    inits = [numpy_helper.from_array(np.array([k], dtype=np.float32), "k")]
    if padding:
        pad = np.random.default_rng(1234).standard_normal(padding).astype(np.float32)
        pad[:tweak] += 1.0
        inits.append(numpy_helper.from_array(pad, "pad"))
    nodes = [
        helper.make_node("Mul", ["x", "k"], ["y"]),
        helper.make_node("Identity", ["k"], ["tag"]),
    ]
    outputs = [y, tag]
    if use_padding:
        nodes.append(helper.make_node("ReduceSum", ["pad"], ["padsum"], keepdims=0))
        outputs.append(helper.make_tensor_value_info("padsum", TensorProto.FLOAT, []))
    graph = helper.make_graph(nodes, "scaled", [x], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def check_whole(outputs: dict[str, np.ndarray], x: np.ndarray) -> float:
    """Assert both outputs come from one model; return its k."""
    k = float(outputs["tag"][0])
    np.testing.assert_allclose(outputs["y"], x * np.float32(k), rtol=0, atol=0)
    return k


def stage_onnx(data_dir: Path, version: str, data: bytes, model: str = "clf") -> Bundle:
    """``data`` staged in ``data_dir`` as a one-member ONNX bundle of ``model`` (a test's
    shortcut past the updater)."""
    src = data_dir / f"src-{version}"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_bytes(data)
    member = Member("primary", "onnx", "linux", "", "primary.onnx",
                    hashlib.sha256(data).hexdigest(), len(data))
    return BundleStore(data_dir).stage(model, version, [(member, src)])
