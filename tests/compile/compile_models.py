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
