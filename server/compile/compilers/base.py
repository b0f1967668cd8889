"""The `Compiler` protocol every platform implements, and the helpers compilers share.

A compiler turns one `CompileRequest` into one or more `CompiledArtifact`s (several when a
platform builds per hardware target, e.g. QNN per SoC) and can run its own artifacts for the
numeric gate when this machine can (`run`). It does no packing, storage or gating. The
platform registry is `registry.py`: this module imports no compiler.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from numpy.typing import NDArray

from server.compile.errors import InvalidSourceError
from server.compile.types import CompiledArtifact, CompileRequest

Feeds = list[dict[str, NDArray[Any]]]
Outputs = list[list[NDArray[Any]]]


@runtime_checkable
class Compiler(Protocol):
    platform: str

    def compile(self, request: CompileRequest, workdir: Path) -> list[CompiledArtifact]:
        """Builds artifacts into `workdir` (created, empty). Raises CompileError subclasses."""
        ...

    def run(self, artifact: CompiledArtifact, feeds: Feeds) -> Outputs:
        """Outputs of the artifact per sample; only called when `artifact.runnable_here`."""
        ...


def settings_for(request: CompileRequest, platform: str) -> dict[str, object]:
    """The platform's own block of the version's compile settings (may be empty)."""
    block = request.settings.get(platform, {})
    return dict(block) if isinstance(block, dict) else {}


def int_setting(opts: dict[str, object], name: str, default: int) -> int:
    """`opts[name]` as an int (settings arrive as strings or numbers)."""
    value = opts.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | str | float):
        raise InvalidSourceError(f"compile setting {name} must be a number, not {value!r}")
    try:
        return int(value)
    except ValueError:
        raise InvalidSourceError(f"compile setting {name} must be a number, not {value!r}") \
            from None


def ensure_onnx(request: CompileRequest, workdir: Path) -> Path:
    """The request's FP32 ONNX, exporting it here when the pipeline did not provide one."""
    if request.onnx_path is not None:
        return request.onnx_path
    from server.compile.source import export_onnx

    return export_onnx(request.source_path, request.source_format, request.inputs,
                       workdir / "source.onnx")
