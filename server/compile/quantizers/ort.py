"""onnxruntime's QNN QDQ flow (`get_qnn_qdq_config` + `quantize`, min-max calibration) as a
`Quantizer`: the default backend, in-process, always available where onnxruntime is."""

from __future__ import annotations

from pathlib import Path

from server.compile.compilers.qnn import quantize_qdq
from server.compile.quantizers.base import QdqScheme, Samples


class OrtQdqQuantizer:
    name = "ort"

    def unavailable(self) -> str:
        return ""

    def quantize(self, src: Path, out: Path, calibration: Samples,
                 scheme: QdqScheme) -> Path:
        from server.compile.quiet import quiet

        with quiet():
            return quantize_qdq(src, out, calibration, scheme.activation_bits,
                                per_channel=scheme.per_channel, weight_bits=scheme.weight_bits,
                                keep_float=scheme.keep_float, htp_arch=scheme.htp_arch)
