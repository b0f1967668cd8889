"""Per-platform compile pipeline with gates (issue 4).

Library layer, independent of the database: `Pipeline.build(BuildSpec, workdir)` returns one
`BuildOutcome` per platform / variant with its gate report and packed artifact. Compilers live
in `server.compile.compilers` (onnx, coreml, qnn, qnn-hub), gates in `server.compile.gates`,
deterministic packing in `server.compile.packing`. The job layer is `server.jobs`.
"""

from server.compile.compilers.base import Compiler
from server.compile.errors import (
    CalibrationError,
    CompileError,
    CompilerUnavailableError,
    ConversionError,
    InvalidSourceError,
    TransientCompileError,
)
from server.compile.pipeline import DEFAULT_PLATFORMS, BuildOutcome, BuildSpec, Pipeline
from server.compile.types import (
    CompiledArtifact,
    CompileRequest,
    InputSpec,
    Precision,
    SourceFormat,
    Target,
)

__all__ = [
    "DEFAULT_PLATFORMS",
    "BuildOutcome",
    "BuildSpec",
    "CalibrationError",
    "CompileError",
    "CompileRequest",
    "CompiledArtifact",
    "Compiler",
    "CompilerUnavailableError",
    "ConversionError",
    "InputSpec",
    "InvalidSourceError",
    "Pipeline",
    "Precision",
    "SourceFormat",
    "Target",
    "TransientCompileError",
]
