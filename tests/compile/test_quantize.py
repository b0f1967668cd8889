"""Each quantization variant, on small real models through the real compilers:

- Core ML (coremltools.optimize): INT8 per channel, INT8 / INT4 per block, palettization: the
  package holds the constexpr op of its scheme, executes through the MIL executor close to
  the FP32 source, is smaller than the FP16 package, and is labelled INT8; block-wise / INT4
  on a pre-iOS18 target and a block size that divides no weight are refused with the fix;
  `keep_ops` leaves the named op's weight uncompressed.
- QNN (onnxruntime QDQ for the HTP): W8A8, W8A16 and INT4-weight (W4A16) QDQ graphs carry
  the weight and activation types of their scheme, compile to an HTP context binary and
  run; W4A16 for an HTP generation before v73 is refused; `keep_float_nodes` leaves the
  named node out of the quantization.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from server.compile import CompileRequest, InputSpec, SourceFormat
from server.compile.compilers.coreml import CoreMLCompiler
from server.compile.compilers.qnn import QnnCompiler
from server.compile.errors import InvalidSourceError
from server.compile.gates.metrics import snr_db
from server.compile.milexec import MilExecutor
from server.compile.source import load_samples, run_onnx_cpu
from tests.compile.compile_models import ModelFiles
from tests.compile.quant_models import mlp


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> ModelFiles:
    return mlp(tmp_path_factory.mktemp("quant"), "mlp", (64, 64, 32))


def _coreml(net: ModelFiles, out: Path, **opts: object):  # type: ignore[no-untyped-def]
    out.mkdir(parents=True, exist_ok=True)
    req = CompileRequest(net.onnx, SourceFormat.ONNX, net.inputs, onnx_path=net.onnx,
                         settings={"coreml": {"weight_threshold": 0, **opts}})
    (art,) = CoreMLCompiler().compile(req, out)
    return art


def _weights_bytes(package: Path) -> int:
    return (package / "Data/com.apple.CoreML/weights/weight.bin").stat().st_size


@pytest.mark.parametrize(("scheme", "op", "min_snr"), [
    ("int8", "constexpr_affine_dequantize", 38.0),  # iOS17: the iOS16 op
    ("int8-block32", "constexpr_blockwise_shift_scale", 40.0),
    ("int4-block32", "constexpr_blockwise_shift_scale", 12.0),
    ("palettize6", "constexpr_lut_to_dense", 20.0),
])
def test_core_ml_quantization_variant_compiles_runs_and_shrinks(net, tmp_path, scheme, op,
                                                                min_snr):
    target = "iOS18" if "block" in scheme else "iOS17"
    plain = _coreml(net, tmp_path / "plain", minimum_deployment_target=target)
    art = _coreml(net, tmp_path / scheme, weight_compression=scheme,
                  minimum_deployment_target=target)
    ex = MilExecutor(art.path)
    ops = {o.type for o in ex.operations}
    assert op in ops, ops
    assert art.precision.value == "int8" and art.target.variant == f"fp16-{scheme}"
    assert art.compile_settings["weight_compression"] == scheme
    assert any("2 weight tensor(s) compressed" in n for n in art.notes), art.notes
    assert _weights_bytes(art.path) < _weights_bytes(plain.path)
    feeds = load_samples(net.reference, net.inputs)
    (got,) = CoreMLCompiler().run(art, feeds[:1])[0]
    expected = run_onnx_cpu(net.onnx, feeds[:1])[0][0]
    # The executor ran the compressed weights: close to FP32 by what the scheme keeps,
    # and not bit-equal to the uncompressed package.
    assert snr_db(expected, got) > min_snr
    (dense,) = CoreMLCompiler().run(plain, feeds[:1])[0]
    assert not np.array_equal(dense, got)


def test_int4_blocks_on_a_pre_ios18_target_are_refused_with_the_fix(net, tmp_path):
    with pytest.raises(InvalidSourceError, match="minimum_deployment_target=iOS18"):
        _coreml(net, tmp_path, weight_compression="int4-block32",
                minimum_deployment_target="iOS17")


def test_a_block_size_that_divides_no_weight_is_refused_not_shipped_uncompressed(net, tmp_path):
    with pytest.raises(InvalidSourceError, match=r"compressed no weight.*block size 48"):
        _coreml(net, tmp_path, weight_compression="int4-block48",
                minimum_deployment_target="iOS18")


def test_weights_a_block_does_not_fit_get_int8_per_channel_not_fp16(tmp_path):
    # 48 input channels: block 32 does not divide the first layer's, does the second's (64).
    odd = mlp(tmp_path, "odd", (48, 64, 32))
    art = _coreml(odd, tmp_path / "int4", weight_compression="int4-block32",
                  minimum_deployment_target="iOS18")
    linears = [o for o in MilExecutor(art.path).operations if o.type == "linear"]
    assert len(linears) == 2
    # Both weights are compressed (before: the first stayed FP16, the package outweighing
    # its own INT8 build), and the package is smaller than the INT8 per-channel one.
    assert any("2 weight tensor(s) compressed" in n for n in art.notes), art.notes
    int8 = _coreml(odd, tmp_path / "int8", weight_compression="int8",
                   minimum_deployment_target="iOS18")
    assert _weights_bytes(art.path) < _weights_bytes(int8.path)
    feeds = load_samples(odd.reference, odd.inputs)
    (got,) = CoreMLCompiler().run(art, feeds[:1])[0]
    assert snr_db(run_onnx_cpu(odd.onnx, feeds[:1])[0][0], got) > 12.0


def test_unknown_compression_names_the_schemes(net, tmp_path):
    with pytest.raises(InvalidSourceError, match="int4-block<N>"):
        _coreml(net, tmp_path, weight_compression="int3")


def test_core_ml_keep_ops_leaves_that_layer_uncompressed(net, tmp_path):
    full = _coreml(net, tmp_path / "full", weight_compression="int8")
    linears = [o for o in MilExecutor(full.path).operations if o.type == "linear"]
    first = linears[0].attributes["name"].immediateValue.tensor.strings.values[0]
    kept = _coreml(net, tmp_path / "kept", weight_compression="int8", keep_ops=[first])
    count = sum(o.type.startswith("constexpr_") for o in MilExecutor(kept.path).operations)
    assert count == 1  # of the two linear weights, only the other one
    assert kept.compile_settings["keep_ops"] == first and kept.target.variant.endswith("keep1")


def test_keeping_one_reader_of_a_shared_weight_keeps_it_for_all(tmp_path):
    """A tied LM head's table is one const read by the gather and the matmul: keeping the
    matmul (what the precision search's mixed pass asks) used to fail the compile with
    coremltools' "compression config conflict"."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    emb = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Gather", ["emb", "ids"], ["h"], axis=0),
         helper.make_node("Transpose", ["emb"], ["emb_t"], perm=[1, 0]),
         helper.make_node("MatMul", ["h", "emb_t"], ["logits"]),
         helper.make_node("MatMul", ["logits", "head"], ["y"])], "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 16])],
        [numpy_helper.from_array(emb, "emb"),
         numpy_helper.from_array(emb[:, :16].copy(), "head")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "tied.onnx"))
    tied = ModelFiles("tied", (InputSpec("ids", (1, 3), "int64"),), tmp_path / "tied.onnx",
                      tmp_path / "tied.onnx", tmp_path / "tied.onnx", tmp_path / "tied.onnx")
    full = _coreml(tied, tmp_path / "full", weight_compression="int8")
    ops = MilExecutor(full.path).operations
    assert sum(o.type.startswith("constexpr_") for o in ops) == 2  # the table and the head
    matmul = next(o for o in ops if o.type in ("matmul", "linear"))  # the tied one
    name = matmul.attributes["name"].immediateValue.tensor.strings.values[0]
    kept = _coreml(tied, tmp_path / "kept", weight_compression="int8", keep_ops=[name])
    # The table stays FP16 for the gather too; only the head's weight is compressed.
    assert sum(o.type.startswith("constexpr_") for o in MilExecutor(kept.path).operations) == 1
    assert kept.compile_settings["keep_ops"] == name


def _qnn(net: ModelFiles, out: Path, precision: str, arch: str = "75", **opts: object
         ):  # type: ignore[no-untyped-def]
    out.mkdir(parents=True, exist_ok=True)
    req = CompileRequest(net.onnx, SourceFormat.ONNX, net.inputs, onnx_path=net.onnx,
                         calibration_path=net.calibration,
                         settings={"qnn": {"precision": precision, **opts, "targets": [
                             {"name": "T", "soc_model": "57", "htp_arch": arch}]}})
    (art,) = QnnCompiler().compile(req, out)
    return art


def _dq_types(qdq: Path) -> dict[str, int]:
    """Integer type of each DequantizeLinear (its zero point's), by the tensor it reads."""
    import onnx

    model = onnx.load(str(qdq))
    types = {t.name: t.data_type for t in model.graph.initializer}
    return {n.input[0]: types[n.input[2]] for n in model.graph.node
            if n.op_type == "DequantizeLinear" and len(n.input) > 2}


@pytest.mark.parametrize(("precision", "weight", "activation"), [
    ("w8a8", "UINT8", "UINT8"), ("w8a16", "UINT8", "UINT16"), ("w4a16", "INT4", "UINT16")])
def test_qnn_qdq_variant_has_its_types_compiles_and_runs(net, tmp_path, precision, weight,
                                                         activation):
    from onnx import TensorProto

    art = _qnn(net, tmp_path, precision)
    assert art.precision.value == "int8" and art.target.variant == f"{precision}-t"
    types = _dq_types(Path(art.extra["qdq_model"]))
    weights = {t for name, t in types.items() if name.startswith("w")}
    acts = {t for name, t in types.items() if not name.startswith(("w", "b"))}
    assert weights == {getattr(TensorProto, weight)}, types
    assert getattr(TensorProto, activation) in acts, types
    feeds = load_samples(net.reference, net.inputs)[:1]
    (got,) = QnnCompiler().run(art, feeds)[0]
    expected = run_onnx_cpu(net.onnx, feeds)[0][0]
    assert snr_db(expected, got) > 8.0  # runs the quantized graph on the (emulated) HTP


def test_int4_weights_for_an_htp_before_v73_are_refused_with_the_fix(net, tmp_path):
    with pytest.raises(InvalidSourceError, match=r"w4a16 needs HTP v73.*w8a16"):
        _qnn(net, tmp_path, "w4a16", arch="69")


def test_qnn_keep_float_nodes_leaves_that_node_unquantized(net, tmp_path):
    art = _qnn(net, tmp_path, "w8a16", keep_float_nodes="fc0")
    types = _dq_types(Path(art.extra["qdq_model"]))
    assert "w1" in types.keys() or any(k.startswith("w1") for k in types)
    assert not any(k.startswith("w0") for k in types), types  # fc0's weight stays float
    assert art.compile_settings["keep_float_nodes"] == "fc0"
