"""AIMET (`aimet-onnx`, Qualcomm's PTQ) as a `Quantizer`, run in its own interpreter.

aimet-onnx pins its own torch and onnxruntime, which the server's environment does not share,
so it lives in a separate venv named by the deployment (`MODELFLEET_AIMET_PYTHON`, read by
server/settings.py and handed down; never by a version's settings, which are the uploader's).
`quantize` writes the calibration samples and a job file into the scratch directory and runs
`aimet_worker.py` (standard library + numpy + onnx + aimet_onnx only) with that interpreter,
in a near-empty environment and with a wall-clock limit. In a build this runs inside the
compile sandbox like every other step (the sandbox binds the AIMET venv read-only,
server/compile/sandbox.py), so the hostile model AIMET opens is as confined as ever.

AIMET quantizes the graph onnxruntime's flow would (server/compile/qdq_prep.py `prepare`:
BatchNormalizations folded into their Convs, shared constants unshared, opset lifted for
per-channel weights): the preparation is the HTP's need, not a backend's. Without it
AIMET left PP-OCR's standalone BatchNormalizations (paddle2onnx writes each Conv without
bias, then one) as QDQ ops the HTP does not claim, and its graph did not compile.

Techniques: `minmax` (PTQ, min-max calibration), `adaround` (adaptive rounding of weights) and
`seqmse` (sequential MSE weight-encoding search); each exports a QDQ ONNX
(`QuantizationSimModel.to_onnx_qdq`) that the QNN compile consumes unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from server.compile import qdq_prep
from server.compile.child_env import minimal_env
from server.compile.errors import ConversionError
from server.compile.quantizers.base import QdqScheme, Samples

WORKER = Path(__file__).with_name("aimet_worker.py")
TECHNIQUES = ("minmax", "adaround", "seqmse")
NOT_INSTALLED = ("AIMET is not installed on this worker: create a venv with `pip install "
                 "aimet-onnx` and set MODELFLEET_AIMET_PYTHON to its python (docs/compile.md, "
                 "\"QNN quantizers\"), or use the qnn quantizer ort")
STDERR_TAIL = 3000


class AimetQuantizer:
    def __init__(self, python: str, technique: str = "minmax", *,
                 timeout_s: float = 1800.0, adaround_iterations: int = 500) -> None:
        if technique not in TECHNIQUES:
            raise ValueError(f"AIMET technique must be one of {TECHNIQUES}, not {technique!r}")
        self.python = python
        self.technique = technique
        self.timeout_s = timeout_s
        # Per layer; AIMET recommends 10k, which takes hours on a CPU worker.
        self.adaround_iterations = adaround_iterations
        self.name = "aimet" if technique == "minmax" else f"aimet-{technique}"

    def unavailable(self) -> str:
        if not self.python:
            return NOT_INSTALLED
        if not os.access(self.python, os.X_OK):
            return (f"MODELFLEET_AIMET_PYTHON is {self.python!r}, which is not an executable "
                    "here (inside the compile sandbox only the venv it names is visible); "
                    + NOT_INSTALLED.split(": ", 1)[1])
        return ""

    def quantize(self, src: Path, out: Path, calibration: Samples,
                 scheme: QdqScheme) -> Path:
        scratch = out.parent / f"{out.stem}.aimet"  # AIMET writes its own files here too
        scratch.mkdir(parents=True, exist_ok=True)
        src = qdq_prep.prepare(src, scratch / "prepared.onnx", scheme.per_channel)
        calib, job, result = scratch / "calib.npz", scratch / "job.json", scratch / "result.json"
        names = list(calibration[0]) if calibration else []
        arrays: dict[str, Any] = {n: np.stack([s[n] for s in calibration]) for n in names}
        np.savez(calib, **arrays)
        job.write_text(json.dumps({
            "source": str(src), "out": str(out), "calibration": str(calib),
            "result": str(result), "technique": self.technique,
            "weight_bits": scheme.weight_bits, "activation_bits": scheme.activation_bits,
            "per_channel": scheme.per_channel, "keep_float": list(scheme.keep_float),
            "htp_arch": scheme.htp_arch, "adaround_iterations": self.adaround_iterations}))
        env = minimal_env(scratch, CUDA_VISIBLE_DEVICES="")  # not the server's PYTHONPATH
        started = time.monotonic()
        try:
            proc = subprocess.run([self.python, "-s", "-B", str(WORKER), str(job)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, env=env, timeout=self.timeout_s,
                                  check=False, cwd=scratch)
        except subprocess.TimeoutExpired as e:
            raise ConversionError(f"AIMET {self.technique} ran longer than "
                                  f"{self.timeout_s:.0f}s and was stopped") from e
        except OSError as e:
            raise ConversionError(f"AIMET could not start ({e}); {NOT_INSTALLED}") from e
        tail = proc.stderr.decode("utf-8", "replace")[-STDERR_TAIL:]
        doc = _result(result)
        if proc.returncode != 0 or doc.get("error") or not out.is_file():
            why = doc.get("error") or " | ".join(tail.strip().splitlines()[-6:])
            raise ConversionError(f"AIMET {self.technique} {scheme.label} failed after "
                                  f"{time.monotonic() - started:.0f}s: {str(why)[:800]}")
        return out


def _result(path: Path) -> dict[str, object]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}
