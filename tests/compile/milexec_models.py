"""Tiny Core ML packages for the MIL executor tests: torch modules through the same path
the coreml compiler takes (torch.export → core ATen → ct.convert) and `mb.program` MIL
builder programs, saved as `.mlpackage`s; plus the tolerance the comparisons use."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from server.compile.milexec import MilExecutor

FP16_RTOL = 1e-2  # float16 storage through a few ops, relative to the output's magnitude
FP32_RTOL = 2e-5


@contextlib.contextmanager
def quiet() -> Any:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def _precision(precision: str) -> Any:
    import coremltools as ct

    return ct.precision.FLOAT16 if precision == "fp16" else ct.precision.FLOAT32


def torch_packages(module: Any, args: Sequence[np.ndarray], out: Path,
                   precisions: Sequence[str] = ("fp32", "fp16"), target: str = "iOS17"
                   ) -> dict[str, Path]:
    """`module` converted as the coreml compiler converts a torch upload, once per precision
    (one export shared): `out`/<precision>.mlpackage by precision."""
    import coremltools as ct
    import torch

    from server.compile.compilers.coreml import _fill_pool_defaults

    tensors = tuple(torch.from_numpy(a) for a in args)
    paths = {}
    with quiet():
        ep = _fill_pool_defaults(torch.export.export(module.eval(), tensors).run_decompositions())
        for precision in precisions:
            ml = ct.convert(ep, convert_to="mlprogram", compute_precision=_precision(precision),
                            minimum_deployment_target=getattr(ct.target, target),
                            inputs=[ct.TensorType(name=f"x{i}", shape=a.shape)
                                    for i, a in enumerate(args)])
            paths[precision] = out / f"{precision}.mlpackage"
            ml.save(str(paths[precision]))
    return paths


def mil_package(build: Callable[..., Any], specs: Sequence[tuple[tuple[int, ...], Any]],
                out: Path, precision: str = "fp32", target: str = "iOS17") -> Path:
    """A MIL builder function over placeholders of `specs` ((shape, mil dtype) pairs)."""
    import coremltools as ct
    from coremltools.converters.mil.mil import Builder as mb

    tgt = getattr(ct.target, target)
    prog = mb.program(input_specs=[mb.TensorSpec(shape=s, dtype=d) for s, d in specs],
                      opset_version=tgt)(build)
    with quiet():
        ml = ct.convert(prog, convert_to="mlprogram", compute_precision=_precision(precision),
                        minimum_deployment_target=tgt)
    ml.save(str(out))
    return out


def op_types(path: Path) -> set[str]:
    """Every op type in the package's main function (nested blocks included)."""
    import coremltools as ct

    fn = ct.utils.load_spec(str(path)).mlProgram.functions["main"]
    found: set[str] = set()

    def walk(block: Any) -> None:
        for op in block.operations:
            found.add(op.type)
            for b in op.blocks:
                walk(b)
    walk(fn.block_specializations[fn.opset])
    return found


def run(path: Path, *args: np.ndarray) -> list[np.ndarray]:
    """The package's outputs, in order, for positional inputs."""
    ex = MilExecutor(path)
    out = ex.run({s.name: a for s, a in zip(ex.inputs, args, strict=True)})
    return [np.asarray(out[n]) for n in ex.output_names]


def assert_close(got: np.ndarray, expected: np.ndarray, precision: str, what: str = "") -> None:
    """Agreement within the precision's tolerance, scaled by the output's magnitude."""
    got64, exp64 = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    assert got64.shape == exp64.shape, (what, got64.shape, exp64.shape)
    scale = max(1.0, float(np.abs(exp64).max(initial=0.0)))
    rtol = FP16_RTOL if precision == "fp16" else FP32_RTOL
    err = float(np.abs(got64 - exp64).max(initial=0.0))
    assert err <= rtol * scale, (
        f"{what}: max |diff| {err:.3g} > {rtol} × {scale:.3g}")
