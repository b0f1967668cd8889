"""The QDQ quantizer interface of the QNN compiler: a float ONNX and calibration samples in, a
QDQ ONNX (QuantizeLinear/DequantizeLinear pairs around float ops) out.

Every backend's output is the same kind of graph, so the HTP compile, the support probe and
the numeric gate downstream consume it unchanged whichever backend made it. A backend that
cannot run on this machine says so (`unavailable`) instead of failing half-way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from numpy.typing import NDArray

Samples = list[dict[str, NDArray[Any]]]


@dataclass(frozen=True)
class QdqScheme:
    """What to quantize to: weight and activation widths, per-channel weights, ONNX node
    names left in float (mixed precision), and the oldest HTP generation the graph must run
    on (a backend with per-generation rules, AIMET's HTP configs, follows that one)."""

    weight_bits: int = 8
    activation_bits: int = 16
    per_channel: bool = True
    keep_float: tuple[str, ...] = ()
    htp_arch: int = 75

    @property
    def label(self) -> str:
        return f"w{self.weight_bits}a{self.activation_bits}"


@runtime_checkable
class Quantizer(Protocol):
    name: str  # the `qnn.quantizer` setting that selects it

    def unavailable(self) -> str:
        """"" when the backend can run here, else why not and how to fix it."""
        ...

    def quantize(self, src: Path, out: Path, calibration: Samples,
                 scheme: QdqScheme) -> Path:
        """Writes the QDQ ONNX of `src` to `out` (its directory is the backend's scratch
        space) and returns it. Raises CompileError subclasses."""
        ...
