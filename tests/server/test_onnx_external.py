"""Inlining an ONNX model's external-data file (server/services/onnx_external.py) on the
layouts exporters write: torch dynamo's `model.onnx.data`, onnx.save with attribute and
subgraph tensors, sparse initializers; and the clear refusals when the pair does not fit.
The attacks over HTTP are in tests/security/test_onnx_external_data.py."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import convert_model_to_external_data

from server.errors import InvalidInputError, PayloadTooLargeError, UnsupportedFileError
from server.services.onnx_external import inline_external_data
from server.services.sourcefiles import is_external, onnx_tensors


def _pair(model: onnx.ModelProto, tmp_path: Path, location: str = "model.onnx.data",
          convert_attribute: bool = True) -> tuple[onnx.ModelProto, bytes]:
    """(the .onnx as saved, the data file's bytes): onnx's own writer."""
    convert_model_to_external_data(model, location=location, size_threshold=0,
                                   convert_attribute=convert_attribute)
    onnx.save_model(model, str(tmp_path / "model.onnx"))
    saved = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    return saved, (tmp_path / location).read_bytes()


def _inlined(model: onnx.ModelProto, data: bytes, max_bytes: int = 2**30) -> onnx.ModelProto:
    inline_external_data(model, io.BytesIO(data), max_bytes=max_bytes)
    return onnx.ModelProto.FromString(model.SerializeToString())


def _arrays(model: onnx.ModelProto) -> list[np.ndarray]:
    return [numpy_helper.to_array(t) for _, t in onnx_tensors(model)]


def test_a_torch_dynamo_export_with_external_data_runs_like_the_module(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                 torch.nn.Linear(8 * 6 * 6, 4)).eval()
    x = torch.randn(1, 3, 8, 8)
    torch.onnx.export(module, (x,), str(tmp_path / "model.onnx"), dynamo=True,
                      external_data=True, input_names=["x"])
    graph = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    assert any(is_external(t) for _, t in onnx_tensors(graph))  # the layout under test
    model = _inlined(graph, (tmp_path / "model.onnx.data").read_bytes())
    assert not any(is_external(t) for _, t in onnx_tensors(model))
    got = _run(model, {"x": x.numpy()})
    np.testing.assert_allclose(got, module(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def _with_subgraph_and_sparse() -> onnx.ModelProto:
    """An If whose branches hold Constant tensors, a sparse initializer and a dense one."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 4)).astype(np.float32)
    a, b = (rng.standard_normal((1, 4)).astype(np.float32) for _ in range(2))

    def branch(name: str, value: np.ndarray) -> onnx.GraphProto:
        const = helper.make_node("Constant", [], [f"{name}_c"],
                                 value=numpy_helper.from_array(value, f"{name}_v"))
        return helper.make_graph([const], name, [], [helper.make_tensor_value_info(
            f"{name}_c", TensorProto.FLOAT, [1, 4])])

    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.5, -2.0], np.float32), "s"),
        numpy_helper.from_array(np.array([1, 6], np.int64), "s_indices"), [2, 4])
    nodes = [helper.make_node("If", ["cond"], ["bias"], then_branch=branch("then", a),
                              else_branch=branch("else", b)),
             helper.make_node("MatMul", ["x", "w"], ["xw"]),
             helper.make_node("Add", ["xw", "bias"], ["y0"]),
             helper.make_node("MatMul", ["s", "w"], ["sw"]),
             helper.make_node("ReduceSum", ["sw"], ["sr"], keepdims=1),
             helper.make_node("Add", ["y0", "sr"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                     helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(w, "w")], sparse_initializer=[sparse])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_subgraph_attribute_and_sparse_tensors_are_inlined_bit_for_bit(tmp_path: Path) -> None:
    original = _with_subgraph_and_sparse()
    wanted = _arrays(original)
    saved, data = _pair(onnx.ModelProto.FromString(original.SerializeToString()), tmp_path)
    # onnx's writer leaves sparse tensors inline; point them at the file too, as another
    # writer may, so every position a tensor can take is read from the data file.
    sparse = saved.graph.sparse_initializer[0]
    for tensor in (sparse.values, sparse.indices):
        onnx.external_data_helper.set_external_data(tensor, "model.onnx.data", offset=len(data),
                                                    length=len(tensor.raw_data))
        data += tensor.raw_data
        tensor.ClearField("raw_data")
    assert sum(is_external(t) for _, t in onnx_tensors(saved)) == 5  # w, 2 Constants, sparse
    model = _inlined(saved, data)
    for got, want in zip(_arrays(model), wanted, strict=True):
        np.testing.assert_array_equal(got, want)
    feeds = {"x": np.arange(4, dtype=np.float32)[None], "cond": np.array(False)}
    assert _run(model, feeds).tolist() == _run(original, feeds).tolist()


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, feeds)
    return np.asarray(out)


def test_a_model_with_no_external_tensors_is_told_to_upload_the_onnx_alone() -> None:
    with pytest.raises(InvalidInputError, match="keeps all its tensors inline") as e:
        inline_external_data(_with_subgraph_and_sparse(), io.BytesIO(b"x"), max_bytes=2**20)
    assert e.value.fix == "upload the .onnx alone"


def test_tensors_spread_over_two_files_are_refused_with_the_one_file_fix(tmp_path: Path) -> None:
    saved, data = _pair(_with_subgraph_and_sparse(), tmp_path)
    tensor = saved.graph.initializer[0]
    for entry in tensor.external_data:
        if entry.key == "location":
            entry.value = "other.bin"
    with pytest.raises(UnsupportedFileError, match="from 2 external-data files") as e:
        inline_external_data(saved, io.BytesIO(data), max_bytes=2**20)
    assert "all_tensors_to_one_file=True" in (e.value.fix or "")


def test_a_merged_model_past_the_cap_is_413_naming_the_setting(tmp_path: Path) -> None:
    saved, data = _pair(_with_subgraph_and_sparse(), tmp_path)
    with pytest.raises(PayloadTooLargeError) as e:
        inline_external_data(saved, io.BytesIO(data), max_bytes=saved.ByteSize() + 8)
    assert "MODELFLEET_MAX_MODEL_BYTES" in (e.value.fix or "")


def test_a_merged_model_past_protobufs_2_gib_is_refused_with_the_pt2_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from server.services import onnx_external
    saved, data = _pair(_with_subgraph_and_sparse(), tmp_path)
    monkeypatch.setattr(onnx_external, "MAX_ONNX_BYTES", saved.ByteSize() + 8)
    with pytest.raises(UnsupportedFileError, match="protobuf's limit") as e:
        inline_external_data(saved, io.BytesIO(data), max_bytes=2**30)
    assert ".pt2" in (e.value.fix or "")


def test_a_string_tensor_pointing_at_external_data_is_refused(tmp_path: Path) -> None:
    saved, data = _pair(_with_subgraph_and_sparse(), tmp_path)
    saved.graph.initializer[0].data_type = TensorProto.STRING
    with pytest.raises(UnsupportedFileError, match="string tensor"):
        inline_external_data(saved, io.BytesIO(data), max_bytes=2**20)
