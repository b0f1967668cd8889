"""Small real test files for the server tests: ONNX models and .npz archives."""

from __future__ import annotations


def make_onnx_bytes(scale: float = 2.0, extra_inputs: tuple[str, ...] = (),
                    dims: tuple[int | str, ...] = (1, 3, 8, 8)) -> bytes:
    """A tiny real ONNX model: y = x * scale, x float32[1, 3, 8, 8] (plus unused float32[1]
    inputs named in `extra_inputs`); `dims` may name symbolic dims (a dynamic upload)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(dims))
    k = numpy_helper.from_array(np.array(scale, dtype=np.float32), name="k")
    extra = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in extra_inputs]
    graph = helper.make_graph([helper.make_node("Mul", ["x", "k"], ["y"])], "g", [x, *extra],
                              [y], [k])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def npz_bytes(**arrays: object) -> bytes:
    import io

    import numpy as np

    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()
