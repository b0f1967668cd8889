"""Tiny real models for the compile and job tests (a conv classifier, a transformer block)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from server.compile import InputSpec, SourceFormat


@dataclass(frozen=True)
class ModelFiles:
    name: str
    inputs: tuple[InputSpec, ...]
    pt2: Path
    onnx: Path
    reference: Path  # .npz of reference inputs
    calibration: Path  # .npz of calibration inputs (a different draw)

    def path(self, fmt: SourceFormat) -> Path:
        return self.onnx if fmt is SourceFormat.ONNX else self.pt2


def torch_models():  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    class ConvNet(nn.Module):
        """A small classifier: conv-bn-relu ×2, global pool, linear head (10 classes)."""

        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU())
            self.head = nn.Linear(16, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.body(x).mean(dim=(2, 3)))

    class Block(nn.Module):
        """One pre-norm transformer encoder block (attention + GELU MLP), 16 tokens × 32."""

        def __init__(self, d: int = 32, heads: int = 4) -> None:
            super().__init__()
            self.heads, self.d = heads, d
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).reshape(b, t, 3, self.heads, d // self.heads) \
                .permute(2, 0, 3, 1, 4)
            att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.ln2(x))

    return ConvNet, Block


def build_model(tmp: Path, name: str, module, spec: InputSpec, seed: int) -> ModelFiles:  # type: ignore[no-untyped-def]
    import torch

    from server.compile.source import export_onnx

    torch.manual_seed(seed)
    model = module().eval()
    if name == "convnet":  # give BatchNorm non-trivial statistics
        with torch.no_grad():
            model.body[1].running_mean.uniform_(-0.2, 0.2)
            model.body[1].running_var.uniform_(0.5, 1.5)
    x = torch.randn(*spec.shape)
    pt2 = tmp / f"{name}.pt2"
    torch.export.save(torch.export.export(model, (x,)), str(pt2))
    onnx_path = export_onnx(pt2, SourceFormat.EXPORTED_PROGRAM, (spec,), tmp / f"{name}.onnx")
    rng = np.random.default_rng(seed)
    ref, cal = tmp / f"{name}.ref.npz", tmp / f"{name}.cal.npz"
    np.savez(ref, **{spec.name: rng.standard_normal((4, *spec.shape)).astype(np.float32)})
    np.savez(cal, **{spec.name: rng.standard_normal((16, *spec.shape)).astype(np.float32)})
    return ModelFiles(name, (spec,), pt2, onnx_path, ref, cal)


def onnx_model(path: Path, nodes, inputs, outputs, initializers=(), opset: int = 18) -> Path:  # type: ignore[no-untyped-def]
    import onnx
    from onnx import helper

    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


P2O_DIMS = ("p2o.DynamicDimension.0", 3, "p2o.DynamicDimension.1", "p2o.DynamicDimension.2")


def dynamic_upsampler_onnx(path: Path) -> Path:
    """A paddle2onnx-style opset-12 graph: dynamic batch/height/width named like p2o's dims,
    and shape arithmetic (Shape → Slice/Gather → Mul → Concat) feeding a Resize and a Reshape.

    conv 3→4 → relu → resize to 2×(H, W) (sizes from its own Shape) → reshape [N, 4, -1].
    """
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
        numpy_helper.from_array(np.array([0], np.int64), "start"),
        numpy_helper.from_array(np.array([2], np.int64), "mid"),
        numpy_helper.from_array(np.array([4], np.int64), "end"),
        numpy_helper.from_array(np.array([2], np.int64), "two"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
        numpy_helper.from_array(np.array([4], np.int64), "four"),
        numpy_helper.from_array(np.array([], np.float32), "empty"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Shape", ["r"], ["s"], name="shape"),
        helper.make_node("Slice", ["s", "start", "mid"], ["nc"], name="slice_nc"),
        helper.make_node("Slice", ["s", "mid", "end"], ["hw"], name="slice_hw"),
        helper.make_node("Mul", ["hw", "two"], ["hw2"], name="double_hw"),
        helper.make_node("Concat", ["nc", "hw2"], ["sizes"], axis=0, name="sizes"),
        # Nearest upsampling as paddle2onnx writes it (asymmetric + floor).
        helper.make_node("Resize", ["r", "empty", "empty", "sizes"], ["up"], mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor",
                         name="upsample"),
        helper.make_node("Slice", ["s", "start", "mid"], ["n"], name="slice_n",
                         ),
        helper.make_node("Gather", ["n", "start"], ["n0"], axis=0, name="batch"),
        helper.make_node("Concat", ["n0", "four", "minus1"], ["flat_shape"], axis=0,
                         name="flat_shape"),
        helper.make_node("Reshape", ["up", "flat_shape"], ["y"], name="flatten"),
    ]
    return onnx_model(
        path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(P2O_DIMS))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["p2o.DynamicDimension.0", 4,
                                                                 "p2o.DynamicDimension.3"])],
        inits, opset=12)


def value_dependent_topk_onnx(path: Path) -> Path:
    """TopK whose k is a runtime input: no declared shape can make its output static."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=-1,
                              name="topk_by_k")]
    return onnx_model(
        path, nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16]),
         helper.make_tensor_value_info("k", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("values", TensorProto.FLOAT, ["batch", "k"]),
         helper.make_tensor_value_info("indices", TensorProto.INT64, ["batch", "k"])],
        opset=12)
