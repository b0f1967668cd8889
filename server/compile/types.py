"""Values passed into and out of compilers: requests, targets, artifacts and reports.

Plain dataclasses and enums; no I/O. A `CompileRequest` describes ONE shape variant of ONE
model version for ONE platform; the pipeline fans a version out into requests.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class SourceFormat(enum.StrEnum):
    ONNX = "onnx"
    EXPORTED_PROGRAM = "exported_program"  # torch.export.save(...) -> .pt2
    TORCHSCRIPT = "torchscript"  # torch.jit.save(...) -> .pt

    @classmethod
    def parse(cls, value: str) -> SourceFormat:
        aliases = {"pt2": cls.EXPORTED_PROGRAM, "torch": cls.EXPORTED_PROGRAM,
                   "ts": cls.TORCHSCRIPT, "jit": cls.TORCHSCRIPT}
        try:
            return aliases.get(value) or cls(value)
        except ValueError:
            known = ", ".join(m.value for m in cls)
            raise ValueError(f"unknown source format {value!r}; use one of: {known}") from None


class Precision(enum.StrEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"


@dataclass(frozen=True)
class InputSpec:
    """One model input with a fully static shape (dynamic shapes are rejected by the gate);
    `shape == ()` is a scalar (rank 0). `value`: a scalar the app always feeds (a sample
    rate); the build binds it as a constant, so what the graph decides from it folds, and the
    artifact no longer takes the input."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    value: float | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("input spec needs a name")
        if any((not isinstance(d, int)) or d <= 0 for d in self.shape):
            raise ValueError(
                f"input {self.name!r} has shape {self.shape!r}; every dimension must be a "
                "positive integer (declare one shape variant per size instead of a dynamic "
                "axis; () is a scalar)"
            )
        if self.value is not None and self.shape != ():
            raise ValueError(f"input {self.name!r} declares a constant value but has shape "
                             f"{self.shape!r}; a constant value is declared for a scalar "
                             "input (shape ()) only")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InputSpec:
        value = data.get("value")
        return cls(name=str(data["name"]), shape=tuple(int(d) for d in data["shape"]),
                   dtype=str(data.get("dtype", "float32")),
                   value=None if value is None else float(value))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "shape": list(self.shape),
                               "dtype": self.dtype}
        if self.value is not None:
            out["value"] = self.value
        return out


@dataclass(frozen=True)
class CompileRequest:
    """Everything a compiler needs for one platform and one shape variant."""

    source_path: Path
    source_format: SourceFormat
    inputs: tuple[InputSpec, ...]
    shape_variant: str = "default"
    settings: dict[str, Any] = field(default_factory=dict)
    # .npz keyed by input name; each array is (N, *shape) or exactly `shape` (N = 1).
    calibration_path: Path | None = None
    # FP32 ONNX of the source, made once by the pipeline and shared by compilers that need ONNX.
    onnx_path: Path | None = None
    # Real inputs (.npz like calibration) a compiler may use to check an intermediate step.
    reference_path: Path | None = None
    # A quantized ONNX upload as uploaded (`source_path` is then its FP32 rewrite): the onnx
    # platform ships it (quantized_upload.py).
    quantized_upload: Path | None = None
    # Inputs declared with a constant `value` (left out of `inputs`: the rewrite binds them).
    bound_inputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Target:
    """What an artifact was built for; copied into the manifest's `target` for filters."""

    platform: str
    variant: str
    format: str
    soc: str = ""
    arch: str = ""
    runtime: str = ""
    runtime_version: str = ""
    # The upload's input-shape variant this artifact was compiled for ("default", "720p", …);
    # informational in the manifest (not a selection constraint). Devices use it to pair an
    # accelerator artifact with the portable ONNX artifact of the same shapes as a fallback.
    shape_variant: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"platform": self.platform, "variant": self.variant, "format": self.format,
                "soc": self.soc, "arch": self.arch, "runtime": self.runtime,
                "runtime_version": self.runtime_version, "shape_variant": self.shape_variant}


@dataclass
class CompiledArtifact:
    """One compiler output: a file or a directory (packed later), plus what it targets."""

    path: Path
    target: Target
    precision: Precision
    compile_settings: dict[str, str | int | bool]
    notes: list[str] = field(default_factory=list)
    # Whether this artifact can be executed on this machine for the numeric gate, and why not.
    runnable_here: bool = True
    not_runnable_reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
