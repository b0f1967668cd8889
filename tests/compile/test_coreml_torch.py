"""Core ML from torch uploads (coremltools' torch frontend), where our compiler adjusts the
program before coremltools sees it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from server.compile import CompileRequest, InputSpec, SourceFormat
from server.compile.compilers.coreml import CoreMLCompiler


def test_pt2_exported_with_a_channels_last_example_converts_and_computes(tmp_path: Path
                                                                         ) -> None:
    """coremltools refuses a placeholder whose example tensor is non-contiguous ("Core ML
    does not have general support for non-contiguous dim order", naming no node); the layout
    of the export example changes no value, so the compile makes it contiguous."""
    import torch

    class Permute(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x.permute(0, 2, 3, 1).contiguous()) * 2

    example = torch.randn(1, 3, 4, 5).to(memory_format=torch.channels_last)
    torch.export.save(torch.export.export(Permute(), (example,)), str(tmp_path / "m.pt2"))
    request = CompileRequest(tmp_path / "m.pt2", SourceFormat.EXPORTED_PROGRAM,
                             (InputSpec("x", (1, 3, 4, 5)),), settings={
                                 "coreml": {"precision": "fp32"}})
    compiler = CoreMLCompiler()
    (artifact,) = compiler.compile(request, tmp_path)
    x = np.random.default_rng(0).standard_normal((1, 3, 4, 5)).astype(np.float32)
    (got,) = compiler.run(artifact, [{"x": x}])[0]
    np.testing.assert_allclose(got, np.maximum(x.transpose(0, 2, 3, 1), 0) * 2, rtol=1e-6)
