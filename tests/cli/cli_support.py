"""Helpers of the CLI tests: running `modelfleet` as a subprocess, a free port, and tiny real
model files (built at test time, never committed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODELFLEET = [sys.executable, "-m", "modelfleet"]


def run_cli(*args: str, env: dict[str, str], stdin: str | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MODELFLEET, *args], cwd=REPO, env=env, input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def write_scale_model(path: Path, scale: float = 2.0) -> Path:
    """y = x * scale with x float32[1, 3, 8, 8], as an ONNX file."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])
    k = numpy_helper.from_array(np.array(scale, dtype=np.float32), name="k")
    graph = helper.make_graph([helper.make_node("Mul", ["x", "k"], ["y"])], "g", [x], [y], [k])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


def write_reference(path: Path) -> Path:
    import numpy as np

    np.savez(path, x=np.random.default_rng(0).random((2, 1, 3, 8, 8), dtype=np.float32))
    return path


def write_unloadable_model(path: Path) -> Path:
    """A well-formed ONNX file whose one operator no runtime knows: it uploads, and its build
    fails when the numeric gate tries to run it."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])
    graph = helper.make_graph([helper.make_node("Frobnicate", ["x"], ["y"],
                                                domain="com.example")], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    path.write_bytes(model.SerializeToString())
    return path


WEIGHTED_INPUT = "x:float32:1x192"


def write_weighted_model(path: Path, edit: int = 0) -> Path:
    """y = x @ W with x float32[1, 192] and W a fixed random float32[192, 256] (~196 kB);
    `edit` > 0 changes that many weights, so two versions differ as a fine-tune does and a
    delta patch between them is a small fraction of the artifact."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(7).standard_normal((192, 256)).astype(np.float32)
    w.flat[:edit] += 1.0
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 192])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y],
                              [numpy_helper.from_array(w, name="w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path
