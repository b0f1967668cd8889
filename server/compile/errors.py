"""The compile package's errors: one base, one subclass per failure a caller can act on.

    CompileError
    ├── InvalidSourceError      the uploaded model or its inputs cannot be read as declared
    ├── ConversionError         a converter cannot translate the graph (names the operator)
    ├── CalibrationError        calibration / reference data does not match the input specs
    ├── CompilerUnavailableError the tool for a platform is missing or cannot run here
    └── TransientCompileError   worth retrying later (remote service busy, network down)

Gate failures are not exceptions: a failed gate is a normal outcome recorded in the report.
"""

from __future__ import annotations


class CompileError(Exception):
    """Base of every compile failure; `str(err)` says what went wrong and how to fix it."""


class InvalidSourceError(CompileError):
    """The source model file, its format or its input specs are unusable."""


class ConversionError(CompileError):
    """A converter could not translate the graph; `operators` names the culprits and
    `nodes` (when known) each offending node: {"op", "node", "why"}."""

    def __init__(self, message: str, operators: list[str] | None = None,
                 nodes: list[dict[str, str]] | None = None) -> None:
        super().__init__(message)
        self.operators = operators or []
        self.nodes = nodes or []


class CalibrationError(CompileError):
    """Calibration or reference inputs are missing names or have the wrong shape."""


class CompilerUnavailableError(CompileError):
    """The compiler's tool (or credentials for it) is not available on this machine."""


class TransientCompileError(CompileError):
    """A failure worth retrying with backoff (rate limits, timeouts, network)."""
