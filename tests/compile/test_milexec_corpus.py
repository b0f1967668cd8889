"""Acceptance: the MIL executor agrees with onnxruntime on corpus models' graphs as the
coreml compiler converts them (ONNX → MIL → coremltools; .pt2 via the torch frontend): FP32 packages
at FP32 thresholds (cosine ≥ 0.99999, SNR ≥ 80 dB — the executor's op semantics), FP16
packages within FP16 tolerance (cosine ≥ 0.9999). Slow: each model is converted twice.
The per-model figures for the whole corpus are in docs/compile.md."""

from __future__ import annotations

import time

import pytest

from server.compile import CompileRequest
from server.compile.compilers.coreml import CoreMLCompiler
from server.compile.gates import numeric
from server.compile.shapes import specialize_file
from server.compile.source import load_samples, run_onnx_cpu
from tests.corpus.models import corpus

pytestmark = pytest.mark.slow

# One of each family the Core ML path converts, small enough for the suite (the MiniLM and
# PP-OCR cells run in tests/corpus and tests/compile/test_ocr_upload.py through the API).
MODELS = ["vit-tiny-dynamo", "gpt2-tiny-dynamo", "resnet-torchscript", "detector-torchscript",
          "unet-dynamo"]
MIN = {"fp32": (0.99999, 80.0), "fp16": (0.9999, 40.0)}


@pytest.mark.parametrize("name", MODELS)
def test_executor_agrees_with_onnxruntime_on_corpus_model(name, tmp_path):  # type: ignore[no-untyped-def]
    (model,) = corpus([name])
    onnx_path = tmp_path / "static.onnx"
    if model.fmt.value == "onnx":
        specialize_file(model.path, model.inputs, onnx_path)
    feeds = load_samples(model.reference, model.inputs)[:1]
    expected = None
    for precision in ("fp32", "fp16"):
        (tmp_path / precision).mkdir()
        req = CompileRequest(onnx_path if model.fmt.value == "onnx" else model.path, model.fmt,
                             model.inputs, onnx_path=onnx_path if onnx_path.exists() else None,
                             settings={"coreml": {"precision": precision}})
        (art,) = CoreMLCompiler().compile(req, tmp_path / precision)
        if expected is None:
            from server.compile.source import reference_outputs

            expected = run_onnx_cpu(onnx_path, feeds) if onnx_path.exists() else \
                reference_outputs(model.path, model.fmt, model.inputs, feeds)
        started = time.monotonic()
        got = CoreMLCompiler().run(art, feeds)
        seconds = time.monotonic() - started
        for m in numeric.compare(expected, got):
            print(f"{name} {precision}: cosine {m.cosine:.7f} SNR {m.snr_db:.1f} dB "
                  f"max-abs {m.max_abs_diff:.2e} ({seconds:.2f}s)")
            cos, snr = MIN[precision]
            assert m.cosine >= cos and m.snr_db >= snr, (name, precision, m)
