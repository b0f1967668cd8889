"""Runs in a venv with neural-compressor 2.x, not the server's:
`python smoothquant_worker.py SRC.onnx SAMPLES.npz ALPHA OUT.onnx`.

Applies Intel Neural Compressor's SmoothQuant (`ORTSmoothQuant`, the transform onnxruntime's
`quantize_static(extra_options={"SmoothQuant": True})` calls) to SRC with the samples (one
array per input, first axis the sample) as its calibration data: each Conv / Gemm / MatMul
input channel j is divided by s_j = max|X_j|^α / max|W_j|^(1-α) and its weights multiplied by
it, the division folded into the producing op where it can be. The output computes the same
function in float; only its weights are easier to round. neural-compressor 3.x dropped the
ONNX adaptor, and 2.x pulls pandas, scikit-learn and opencv, so it stays out of the server's
environment, like AIMET (docs/compile.md).
"""

from __future__ import annotations

import sys


def main() -> None:
    import numpy as np
    import onnx
    from neural_compressor.adaptor.ox_utils.smooth_quant import ORTSmoothQuant

    src, samples, alpha, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    feeds = dict(np.load(samples))
    count = next(iter(feeds.values())).shape[0]

    def loader():  # type: ignore[no-untyped-def]
        for i in range(count):
            yield {k: v[i] for k, v in feeds.items()}, None

    smoothed = ORTSmoothQuant(onnx.load(src), loader(), False).transform(
        alpha, True, op_types=["MatMul", "Gemm", "Conv", "FusedConv"], scales_per_op=True)
    onnx.save(smoothed.model, out)


if __name__ == "__main__":
    main()
