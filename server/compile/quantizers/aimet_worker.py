"""Runs in the AIMET venv, not the server's: `python aimet_worker.py job.json`.

Imports only the standard library, numpy, onnx and aimet_onnx (that venv has no server
packages). The job names the float ONNX, the calibration .npz (one array per input, first axis
the sample), the output path and the scheme; the worker builds AIMET's QuantizationSimModel
with the HTP config of the target generation, optionally optimizes the weight encodings
(AdaRound or sequential MSE), calibrates the activations on the samples, and writes the QDQ
ONNX (`to_onnx_qdq`) and a result document. Any failure is written to the result as `error`
and the exit status is 1.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

# HTP generations AIMET ships a quantsim config for (aimet_onnx/common/quantsim_config).
HTP_CONFIGS = (66, 68, 69, 73, 75, 79, 81, 85)
SEQ_MSE_CANDIDATES = 20
# The exported QDQ graph must agree with AIMET's own simulation this well (seen: SeqMSE's
# encodings exported at 7 dB against a 44 dB simulation, aimet-onnx 2.42 on a MobileNetV3).
MIN_EXPORT_SNR_DB = 30.0
EXPORT_CHECK_SAMPLES = 4


def htp_config(arch: int) -> str:
    """The newest AIMET HTP config not newer than `arch` (the oldest one below that)."""
    fits = [a for a in HTP_CONFIGS if a <= arch]
    return f"htp_v{max(fits) if fits else HTP_CONFIGS[0]}"


def _samples(path: str) -> list[dict[str, Any]]:
    import numpy as np

    with np.load(path, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    count = min((len(a) for a in arrays.values()), default=0)
    return [{name: a[i] for name, a in arrays.items()} for i in range(count)]


def _keep_float(sim: Any, model: Any, names: list[str]) -> None:
    """Leaves the named nodes in float: their weight and output quantizers are disabled."""
    wanted = set(names)
    for node in model.graph.node:
        if node.name in wanted:
            for tensor in [*node.input, *node.output]:
                quantizer = sim.qc_quantize_op_dict.get(tensor)
                if quantizer is not None:
                    quantizer.enabled = False


def quantize(job: dict[str, Any]) -> dict[str, Any]:
    import onnx
    from aimet_onnx import QuantizationSimModel, apply_adaround, apply_seq_mse

    started = time.monotonic()
    model = onnx.load(job["source"])
    samples = _samples(job["calibration"])
    if not samples:
        raise ValueError("no calibration samples")
    param = "int4" if job["weight_bits"] == 4 else "int8"
    act = "int16" if job["activation_bits"] == 16 else "int8"
    config = htp_config(int(job.get("htp_arch", 75)))
    sim = QuantizationSimModel(model, param_type=param, activation_type=act,
                               quant_scheme="min_max", config_file=config,
                               providers=["CPUExecutionProvider"],
                               path=str(Path(job["result"]).parent))
    _keep_float(sim, model, job.get("keep_float") or [])
    technique = job["technique"]
    if technique == "adaround":
        apply_adaround(sim, samples, num_iterations=int(job["adaround_iterations"]))
    elif technique == "seqmse":
        apply_seq_mse(sim, samples, num_candidates=SEQ_MSE_CANDIDATES)
    sim.compute_encodings(samples)
    simulated = [sim.session.run(None, s) for s in samples[:EXPORT_CHECK_SAMPLES]]
    qdq = sim.to_onnx_qdq()
    onnx.save(qdq, job["out"])
    agreement = _export_agreement(job["out"], samples[:EXPORT_CHECK_SAMPLES], simulated)
    if agreement < MIN_EXPORT_SNR_DB:
        raise ValueError(f"AIMET's QDQ export does not reproduce its own simulation: SNR "
                         f"{agreement:.1f} dB between the QuantizationSimModel and the exported "
                         f"graph (want >= {MIN_EXPORT_SNR_DB:.0f} dB); use another quantizer")
    return {"seconds": time.monotonic() - started, "config": config, "samples": len(samples),
            "param_type": param, "activation_type": act, "export_snr_db": agreement}


def _export_agreement(path: str, samples: list[dict[str, Any]],
                      simulated: list[list[Any]]) -> float:
    """Worst SNR (dB) of the exported QDQ graph on onnxruntime's CPU provider against the
    sim's own outputs on the same samples."""
    import numpy as np
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    worst = float("inf")
    for feed, expected in zip(samples, simulated, strict=True):
        for e, g in zip(expected, sess.run(None, feed), strict=True):
            e64, g64 = np.asarray(e, np.float64), np.asarray(g, np.float64)
            noise = float(np.sum((e64 - g64) ** 2))
            if noise > 0:
                worst = min(worst, 10 * np.log10(max(float(np.sum(e64 ** 2)), 1e-30) / noise))
    return worst


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[1]).read_text())
    try:
        doc = quantize(job)
        status = 0
    except Exception as e:  # the model is an upload: anything may fail; report it
        traceback.print_exc()
        doc, status = {"error": f"{type(e).__name__}: {e}"}, 1
    Path(job["result"]).write_text(json.dumps(doc))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
