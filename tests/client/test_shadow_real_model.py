"""Shadow mode on a model from outside: PaddleOCR's text-direction classifier as
rapidocr-onnxruntime ships it (real weights, paddle2onnx, dynamic batch and width), run in the
shadow child process with the SDK's defaults. A re-packed copy of it (same weights) passes;
a copy whose first convolution was damaged diverges and fails — on inputs made like the
crops the app would classify (dark text strokes on a light background)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from client_sdk import ModelRuntime, shadow_process
from client_sdk.runtime import CANDIDATE
from client_sdk.shadow_stats import FAILED, PASSED, ShadowStore
from tests.client.onnx_models import stage_onnx
from tests.corpus.fetch import ppocr_model

pytestmark = pytest.mark.skipif(not shadow_process.supported(), reason="Linux shadow process")

SAMPLES = 12


def _crops(n: int) -> list[np.ndarray]:
    """Text-line-like crops, 3×48×192, normalized as PP-OCR's classifier expects."""
    rng = np.random.default_rng(5)
    out = []
    for _ in range(n):
        img = np.full((48, 192), 0.9, np.float32)
        for x in rng.integers(4, 180, size=12):  # strokes
            w, top, h = rng.integers(2, 6), rng.integers(8, 16), rng.integers(18, 30)
            img[top:top + h, x:x + w] = 0.1
        img += rng.normal(0, 0.03, img.shape).astype(np.float32)
        out.append(((np.repeat(img[None], 3, 0) - 0.5) / 0.5)[None].astype(np.float32))
    return out


def _variants() -> tuple[bytes, bytes, bytes]:
    """The shipped model, a re-packed copy (new doc string: another artifact, same weights),
    and a damaged copy (the first convolution's weights negated: paddle2onnx keeps them in a
    ``Constant`` node, not an initializer)."""
    path = ppocr_model("cls")
    shipped = path.read_bytes()
    same = onnx.load(path)
    same.doc_string = "re-packed for a shadow test"
    damaged = onnx.load(path)
    conv = next(n for n in damaged.graph.node if n.op_type == "Conv")
    const = next(n for n in damaged.graph.node if conv.input[1] in n.output)
    value = next(a for a in const.attribute if a.name == "value")
    value.t.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(value.t), value.t.name))
    return shipped, same.SerializeToString(), damaged.SerializeToString()


@pytest.mark.parametrize("which, verdict", [(1, PASSED), (2, FAILED)])
def test_the_shipped_ppocr_classifier_in_the_shadow_process(tmp_path, which, verdict):
    models = _variants()
    d = tmp_path / "device"
    active, cand = stage_onnx(d, "1.0", models[0]), stage_onnx(d, "2.0", models[which])
    ShadowStore(d).register(cand.sha256, "clf", "2.0", {
        "max_kl_micro": 1000, "max_latency_p99_us": 10**9, "min_samples": SAMPLES})
    # Every prediction a sample (the budget would take ~20× as many for this fast model).
    rt = ModelRuntime(d, shadow_isolation="process", shadow_budget=None)
    try:
        rt.swap(rt.prepare(active))
        rt.swap(rt.prepare(cand), CANDIDATE)
        for x in _crops(SAMPLES):
            p = rt.predict("clf", {"x": x})
            assert p.version == "1.0"  # the candidate never answers
            rt.flush_shadow()  # one at a time: none dropped, whatever the machine's load
        stats = ShadowStore(d).load(cand.sha256)
    finally:
        rt.close()
    assert stats is not None and stats.samples == SAMPLES, stats
    assert stats.verdict == verdict, stats
    if verdict == PASSED:
        assert stats.kl_max_micro <= 1, stats  # the same weights: the same distributions
    else:
        assert stats.kl_max_micro > 1000, stats
