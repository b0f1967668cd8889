"""The registry of compile platforms: platform name → compiler factory.

Apart from `base.py` (the `Compiler` protocol and helpers every compiler imports), so the
compilers import the protocol and the registry imports the compilers, never both ways.
"""

from __future__ import annotations

from collections.abc import Callable

from server.compile.compilers.base import Compiler


def default_compilers(aimet_python: str = "") -> dict[str, Callable[[], Compiler]]:
    """Factories by platform name; imported here, at the first call, so a process that never
    builds (the API, a publish worker) never loads a toolchain. `aimet_python`: the
    deployment's AIMET interpreter for the qnn quantizers (empty: AIMET not installed)."""
    from server.compile.compilers.coreml import CoreMLCompiler
    from server.compile.compilers.onnx import OnnxCompiler
    from server.compile.compilers.qnn import QnnCompiler
    from server.compile.compilers.qnn_hub import QnnHubCompiler
    from server.compile.quantizers.registry import default_quantizers

    return {
        "onnx": OnnxCompiler,
        "coreml": CoreMLCompiler,
        "qnn": lambda: QnnCompiler(default_quantizers(aimet_python)),
        "qnn-hub": QnnHubCompiler.from_environment,
    }
