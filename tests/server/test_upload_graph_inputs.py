"""Upload-time checks of declared inputs against the ONNX graph (server/services/
graph_inputs.py): scalars (rank 0), a rank or dtype the graph contradicts, and the 422 for an
upload without `inputs` that lists the graph's inputs and a template to declare them."""

from __future__ import annotations

import io
import json
from typing import Any

import onnx
import pytest
from fastapi.testclient import TestClient
from onnx import TensorProto, helper
from sqlalchemy.orm import Session, sessionmaker

from server.db.models import ModelVersion
from server.errors import UnsupportedFileError
from server.services.sourcefiles import (
    MAX_VALUE_INFO_BYTES,
    GraphInput,
    onnx_graph_inputs,
    read_onnx,
)
from tests.compile.vad_model import vad_onnx
from tests.server.test_registry_api import blob_keys, count, create_model, sqlite_only, upload

VAD_INPUTS = [{"name": "audio", "dtype": "float32", "shape": [1, 64]},
              {"name": "state", "dtype": "float32", "shape": [2, 1, 16]},
              {"name": "sr", "dtype": "int64", "shape": []}]


def _meta(inputs: list[dict[str, Any]] | None, platforms: tuple[str, ...] = ("onnx", "qnn")
          ) -> str:
    body: dict[str, Any] = {"version": "1.0.0", "platforms": list(platforms)}
    if inputs is not None:
        body["inputs"] = inputs
    return json.dumps(body)


@pytest.fixture(scope="module")
def vad_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return vad_onnx(tmp_path_factory.mktemp("vad") / "vad.onnx").read_bytes()


def _dynamic_bytes() -> bytes:
    """x float32[batch, 3, ?, ?] (one named, two unnamed dims), t int64[1], sr int64 scalar."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, None, "?"]),
         helper.make_tensor_value_info("t", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, None, "?"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def test_a_scalar_declared_as_an_empty_shape_is_accepted(
        client: TestClient, publish_headers, vad_bytes: bytes) -> None:
    # Before: 201 here too, then every build failed with "input 'sr' has shape ()".
    create_model(client, publish_headers)
    r = upload(client, publish_headers, vad_bytes, _meta(VAD_INPUTS))
    assert r.status_code == 201, r.text
    assert r.json()["inputs"][2] == {"name": "sr", "dtype": "int64",
                                     "shapes": {"default": []}}


@sqlite_only
@pytest.mark.parametrize(("change", "field", "words"), [
    ({"shape": [1]}, "metadata.inputs[2].shape",
     ["sr", "rank 1 but the ONNX input has rank 0 (a scalar)"]),
    ({"dtype": "float32"}, "metadata.inputs[2].dtype",
     ["dtype float32 is declared, but the ONNX input 'sr' is int64"]),
])
def test_a_rank_or_dtype_the_graph_contradicts_is_422_naming_the_input(
        client: TestClient, publish_headers, vad_bytes: bytes, change: dict[str, Any],
        field: str, words: list[str], session_factory: sessionmaker[Session]) -> None:
    # Before: `[1]` for the scalar was accepted, then failed at build time on the rank.
    create_model(client, publish_headers)
    inputs = [*VAD_INPUTS[:2], {**VAD_INPUTS[2], **change}]
    r = upload(client, publish_headers, vad_bytes, _meta(inputs))
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field
    assert all(w in r.json()["detail"] for w in words), r.json()
    assert blob_keys(client) == [] and count(session_factory, ModelVersion) == 0


@sqlite_only
def test_a_shape_declared_for_a_tensor_input_given_as_scalar_is_422(
        client: TestClient, publish_headers, vad_bytes: bytes) -> None:
    create_model(client, publish_headers)
    inputs = [{**VAD_INPUTS[0], "shape": []}, *VAD_INPUTS[1:]]
    r = upload(client, publish_headers, vad_bytes, _meta(inputs))
    assert r.status_code == 422 and r.json()["field"] == "metadata.inputs[0].shape"
    assert "declare 2 dims, e.g. [1, 64]" in r.json()["fix"]


@sqlite_only
def test_upload_without_inputs_lists_each_input_dynamic_dims_and_a_template(
        client: TestClient, publish_headers) -> None:
    # Before: "metadata.inputs: Field required", naming nothing of the model.
    create_model(client, publish_headers)
    r = upload(client, publish_headers, _dynamic_bytes(), _meta(None))
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["field"] == "metadata.inputs"
    assert body["errors"] == [
        {"name": "x", "dtype": "float32", "dims": ["batch", 3, "", ""],
         "dynamic_dims": [0, 2, 3]},
        {"name": "t", "dtype": "int64", "dims": [1], "dynamic_dims": []},
        {"name": "sr", "dtype": "int64", "dims": [], "dynamic_dims": []}]
    assert "x (float32, ['batch', 3, '?', '?'], dynamic dims [0, 2, 3])" in body["detail"]
    assert "sr (int64, a scalar, static)" in body["detail"]
    assert ('"inputs": [{"name": "x", "dtype": "float32", "shape": [<batch>, 3, <x.2>, '
            '<x.3>]}, {"name": "t", "dtype": "int64", "shape": [1]}, {"name": "sr", '
            '"dtype": "int64", "shape": []}]') in body["fix"]
    assert ("--input x:float32:<batch>x3x<x.2>x<x.3> --input t:int64:1 "
            "--input sr:int64:scalar") in body["fix"]


@sqlite_only
def test_upload_without_inputs_of_a_static_graph_offers_its_sizes_without_placeholders(
        client: TestClient, publish_headers) -> None:
    # Before: "…replacing each <placeholder> with the size…" for a template that has none
    # (openWakeWord's keyword heads, x.1 float32[1, 16, 96]).
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 96])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    create_model(client, publish_headers)
    fix = upload(client, publish_headers, model.SerializeToString(), _meta(None)).json()["fix"]
    assert "<" not in fix and "placeholder" not in fix
    assert ('add "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 16, 96]}] to '
            "metadata, the sizes the graph fixes (it has no dynamic dims); with the CLI: "
            "--input x:float32:1x16x96") == fix


@sqlite_only
def test_the_template_once_filled_in_is_accepted(client: TestClient, publish_headers) -> None:
    """The template is the real format: with its placeholders replaced it uploads."""
    create_model(client, publish_headers)
    fix = upload(client, publish_headers, _dynamic_bytes(), _meta(None)).json()["fix"]
    template = fix.split('"inputs": ', 1)[1].split(" to metadata", 1)[0]
    filled = template.replace("<batch>", "1").replace("<x.2>", "32").replace("<x.3>", "48")
    r = upload(client, publish_headers, _dynamic_bytes(), _meta(json.loads(filled)))
    assert r.status_code == 201, r.text


def _with_input(raw_value_info: bytes) -> io.BytesIO:
    """A real model whose graph gets one more `input` field holding `raw_value_info`."""
    model = onnx.ModelProto.FromString(_dynamic_bytes())
    graph = model.graph.SerializeToString()
    field = bytes([(11 << 3) | 2]) + _varint(len(raw_value_info)) + raw_value_info
    graph += field
    model.ClearField("graph")
    return io.BytesIO(model.SerializeToString() + bytes([(7 << 3) | 2]) + _varint(len(graph))
                      + graph)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def test_graph_inputs_are_read_with_the_onnx_protobuf_library() -> None:
    got = onnx_graph_inputs(read_onnx(io.BytesIO(_dynamic_bytes())))
    assert got == [GraphInput("x", "float32", ["batch", 3, "", ""]),
                   GraphInput("t", "int64", [1]), GraphInput("sr", "int64", [])]


def test_oversized_graph_input_cannot_balloon_memory_and_is_415() -> None:
    huge = helper.make_tensor_value_info("big", TensorProto.FLOAT, [1])
    huge.doc_string = "a" * (MAX_VALUE_INFO_BYTES + 1)
    with pytest.raises(UnsupportedFileError, match="larger than 65536 bytes"):
        onnx_graph_inputs(read_onnx(_with_input(huge.SerializeToString())))


def test_malformed_graph_input_bytes_are_415_not_a_crash() -> None:
    # name field, then a length-delimited type field claiming more bytes than it holds: the
    # model is parsed whole by protobuf, so the whole file is refused.
    bad = b"\x0a\x03abc" + b"\x12\x7f\x0a"
    with pytest.raises(UnsupportedFileError, match="not a valid ONNX model"):
        read_onnx(_with_input(bad))


def test_deeply_nested_input_type_is_refused_not_a_recursion_crash() -> None:
    # TypeProto.sequence_type.elem_type … nested 5000 deep: a parser bomb.
    inner = b""
    for _ in range(5000):
        inner = b"\x22" + _varint(len(b"\x0a" + _varint(len(inner)) + inner)) + \
            b"\x0a" + _varint(len(inner)) + inner
    bad = b"\x0a\x01z" + b"\x12" + _varint(len(inner)) + inner
    assert len(bad) < MAX_VALUE_INFO_BYTES  # reaches the parser, not the size cap
    with pytest.raises(UnsupportedFileError, match="not a valid ONNX model"):
        read_onnx(_with_input(bad))


def _group(number: int) -> bytes:
    """An unknown protobuf group field (wire types 3 … 4) holding one varint: protobuf
    skips it; a hand-written field walker stopped at it."""
    return _varint((number << 3) | 3) + b"\x08\x01" + _varint((number << 3) | 4)


def test_graph_input_and_initializer_behind_an_unknown_group_field_are_read() -> None:
    """The graph's fields after an unknown group are the graph's fields for every ONNX loader:
    an input there is listed, an initializer there is not taken for an input."""
    model = onnx.ModelProto.FromString(_dynamic_bytes())
    weight = helper.make_tensor("w", TensorProto.FLOAT, [1], [0.5])
    late_input = helper.make_tensor_value_info("late", TensorProto.FLOAT, [2])
    weight_input = helper.make_tensor_value_info("w", TensorProto.FLOAT, [1])
    graph = (model.graph.SerializeToString() + _group(900)
             + bytes([(11 << 3) | 2]) + _varint(late_input.ByteSize())
             + late_input.SerializeToString()
             + bytes([(11 << 3) | 2]) + _varint(weight_input.ByteSize())
             + weight_input.SerializeToString()
             + bytes([(5 << 3) | 2]) + _varint(weight.ByteSize()) + weight.SerializeToString())
    model.ClearField("graph")
    raw = model.SerializeToString() + bytes([(7 << 3) | 2]) + _varint(len(graph)) + graph
    names = [i.name for i in onnx_graph_inputs(read_onnx(io.BytesIO(raw)))]
    assert names == ["x", "t", "sr", "late"]
