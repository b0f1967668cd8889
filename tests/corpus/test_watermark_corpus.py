"""Corpus models that pass their gate pass it in every one of 64 watermark cohorts (issue 23):
the worker's pipeline, once without and once with `watermark: {cohorts: 64}`, on small
corpus models (the whole corpus: bench/compile/bench_watermark.py, docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from server import watermark as wm
from server.compile import weights
from server.compile.cohorts import WatermarkSpec
from server.compile.pipeline import BuildSpec, Pipeline
from server.compile.settings_map import pipeline_settings
from tests.corpus.models import corpus

pytestmark = pytest.mark.slow
KEY = b"corpus watermark key"


@pytest.mark.parametrize("name", ["mobilenetv3-dynamo"])
def test_every_one_of_64_cohorts_passes_the_gate_the_corpus_model_passes(name, tmp_path):
    (model,) = corpus([name])

    def build(watermark: WatermarkSpec | None, where: Path):  # type: ignore[no-untyped-def]
        spec = BuildSpec(source_path=model.path, source_format=model.fmt,
                         variants={"default": model.inputs}, platforms=("onnx",),
                         settings=pipeline_settings("onnx", model.platforms["onnx"]),
                         reference_path=model.reference, watermark=watermark)
        (out,) = Pipeline().build(spec, where)
        return out

    base = build(None, tmp_path / "base")
    assert base.state == "ready" and base.gates["numeric"]["status"] == "passed"
    marked = build(WatermarkSpec(64, KEY), tmp_path / "marked")
    assert marked.state == "ready", marked.error
    assert marked.gates["watermark"]["status"] == "passed"
    assert marked.gates["watermark"]["lowest_output_psnr_db"] > 60
    assert len(marked.cohorts) == 64 and len({c.sha256 for c in marked.cohorts}) == 64
    original = [(t.name, t.values) for t in weights.read(marked.artifact.path) if t.markable]
    for c in (0, 41, 63):
        got = wm.identify_tensors(weights.by_name(weights.read(marked.cohorts[c].path)),
                                  original, KEY, 64)
        assert got.cohort == c and got.false_positive <= 1e-9, (c, got)
