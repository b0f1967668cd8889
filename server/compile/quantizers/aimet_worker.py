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
# The exported QDQ graph may be at most this much worse against FP32 than AIMET's own
# simulation (capped: two near-exact results may differ more). Seen: SeqMSE's encodings of a
# MobileNetV3 simulated at 44 dB, exported at 7 dB (aimet-onnx 2.42). The two run different
# kernels (fake-quant vs onnxruntime's QDQ), so a few dB apart is normal at W8A8.
EXPORT_MARGIN_DB = 10.0
EXPORT_CAP_DB = 60.0
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
                               providers=["CPUExecutionProvider"])
    _keep_float(sim, model, job.get("keep_float") or [])
    technique = job["technique"]
    if technique == "adaround":
        apply_adaround(sim, samples, num_iterations=int(job["adaround_iterations"]))
    elif technique == "seqmse":
        apply_seq_mse(sim, samples, num_candidates=SEQ_MSE_CANDIDATES)
    sim.compute_encodings(samples)
    checked = samples[:EXPORT_CHECK_SAMPLES]
    simulated = [sim.session.run(None, feed) for feed in checked]
    qdq = sim.to_onnx_qdq()
    onnx.save(qdq, job["out"])
    sim_db, export_db = export_check(_run(job["source"], checked), simulated,
                                     _run(job["out"], checked))
    if export_db < min(sim_db, EXPORT_CAP_DB) - EXPORT_MARGIN_DB:
        raise ValueError(f"AIMET's QDQ export does not reproduce its own simulation: against "
                         f"FP32 the simulation has SNR {sim_db:.1f} dB, the exported graph "
                         f"{export_db:.1f} dB; use another quantizer")
    return {"seconds": time.monotonic() - started, "config": config, "samples": len(samples),
            "param_type": param, "activation_type": act, "sim_snr_db": sim_db,
            "export_snr_db": export_db}


def _run(path: str, samples: list[dict[str, Any]]) -> list[list[Any]]:
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return [sess.run(None, feed) for feed in samples]


def worst_snr_db(expected: list[list[Any]], got: list[list[Any]]) -> float:
    """Worst SNR (dB) over samples and outputs; 200 for an exact match."""
    import numpy as np

    worst = 200.0
    for exp_outs, got_outs in zip(expected, got, strict=True):
        for e, g in zip(exp_outs, got_outs, strict=True):
            e64, g64 = np.asarray(e, np.float64), np.asarray(g, np.float64)
            noise = float(np.sum((e64 - g64) ** 2))
            if noise > 0:
                signal = max(float(np.sum(e64 ** 2)), 1e-30)
                worst = min(worst, float(10 * np.log10(signal / noise)))
    return worst


def export_check(fp32: list[list[Any]], simulated: list[list[Any]],
                 exported: list[list[Any]]) -> tuple[float, float]:
    """(SNR of AIMET's simulation, SNR of the exported QDQ graph), both against FP32."""
    return worst_snr_db(fp32, simulated), worst_snr_db(fp32, exported)


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
