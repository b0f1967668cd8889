"""Small ONNX multilayer perceptrons for the quantization tests, written with onnx.helper (no
export: milliseconds to build), with reference and calibration inputs from separate draws.

`outlier_layer` (one index or several) gives that layer's weights a few huge values in every
output row, so one scale per channel (or per block) has to span them and the layer's
ordinary weights lose most of their bits when quantized: a layer that is measurably the
most sensitive one.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from server.compile import InputSpec
from tests.compile.compile_models import ModelFiles, onnx_model


def mlp(tmp: Path, name: str, widths: tuple[int, ...] = (64, 64, 64, 32), seed: int = 0,
        outlier_layer: int | tuple[int, ...] | None = None, outlier: float = 60.0,
        tokens: int | None = None, gelu: bool = False) -> ModelFiles:
    """`tokens`: the input is (1, tokens, width), as a transformer's MLP sees it; `gelu`:
    the activation is an exported Gelu (x·½·(1 + erf(x/√2))) instead of Relu. With both,
    onnxruntime's QNN preprocessing fuses each MatMul + Add into a Gemm (its Gelu fusion
    makes it keep the ORT-optimized graph)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x = "x"
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        w = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
        if i == outlier_layer or (isinstance(outlier_layer, tuple) and i in outlier_layer):
            rows = rng.integers(0, a, size=b)
            w[rows, np.arange(b)] *= outlier  # one outlier per output channel
        inits += [numpy_helper.from_array(w, f"w{i}"),
                  numpy_helper.from_array((0.1 * rng.standard_normal(b)).astype(np.float32),
                                          f"b{i}")]
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"fc{i}"),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"bias{i}")]
        x = f"a{i}"
        if i < len(widths) - 2 and gelu:
            if i == 0:
                inits += [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
                          (("sqrt2", np.sqrt(2)), ("one", 1.0), ("half", 0.5))]
            nodes += [helper.make_node("Div", [x, "sqrt2"], [f"d{i}"]),
                      helper.make_node("Erf", [f"d{i}"], [f"e{i}"]),
                      helper.make_node("Add", [f"e{i}", "one"], [f"p{i}"]),
                      helper.make_node("Mul", [x, f"p{i}"], [f"g{i}"]),
                      helper.make_node("Mul", [f"g{i}", "half"], [f"r{i}"])]
            x = f"r{i}"
        elif i < len(widths) - 2:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"], name=f"relu{i}"))
            x = f"r{i}"
    nodes[-1].output[0] = "y"
    lead = (1,) if tokens is None else (1, tokens)
    spec = InputSpec("x", (*lead, widths[0]))
    path = onnx_model(tmp / f"{name}.onnx", nodes,
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                     [*lead, widths[0]])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                     [*lead, widths[-1]])],
                      inits)
    ref, cal = tmp / f"{name}.ref.npz", tmp / f"{name}.cal.npz"
    feeds = rng.standard_normal((4, *spec.shape)).astype(np.float32)
    np.savez(ref, x=feeds)
    # The calibration set covers the reference inputs' range (as a representative set does),
    # so QDQ activation ranges do not clip them.
    np.savez(cal, x=np.concatenate(
        [feeds, rng.standard_normal((28, *spec.shape)).astype(np.float32)]))
    return ModelFiles(name, (spec,), path, path, ref, cal)


def shared_bias_convs(tmp: Path, name: str, opset: int = 13, identity: bool = True,
                      channels: int = 8) -> ModelFiles:
    """conv0 → relu → conv1, both Convs reading one bias initializer, through an Identity
    each when `identity` (as the TorchScript exporter writes a bias several Convs share)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    c = channels
    inits = [numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) / 9).astype(
        np.float32), f"w{i}") for i in range(2)]
    inits.append(numpy_helper.from_array((0.1 * rng.standard_normal(c)).astype(np.float32),
                                         "b"))
    bias = ["b0", "b1"] if identity else ["b", "b"]
    nodes = [helper.make_node("Identity", ["b"], [b], name=f"id{i}")
             for i, b in enumerate(bias) if identity]
    nodes += [helper.make_node("Conv", ["x", "w0", bias[0]], ["c0"], name="conv0",
                               pads=[1, 1, 1, 1]),
              helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
              helper.make_node("Conv", ["r0", "w1", bias[1]], ["y"], name="conv1",
                               pads=[1, 1, 1, 1])]
    shape = (1, c, 8, 8)
    path = onnx_model(tmp / f"{name}.onnx", nodes,
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
                      inits, opset=opset)
    ref, cal = tmp / f"{name}.ref.npz", tmp / f"{name}.cal.npz"
    np.savez(ref, x=rng.standard_normal((2, *shape)).astype(np.float32))
    np.savez(cal, x=rng.standard_normal((8, *shape)).astype(np.float32))
    return ModelFiles(name, (InputSpec("x", shape),), path, path, ref, cal)


def masked_attention(tmp: Path, name: str, seq: int = 8, dim: int = 16, causal: bool = False
                     ) -> ModelFiles:
    """One attention head with an additive mask as exporters write it: scores = (x·Wq)(x·Wk)ᵀ
    + Where(mask, 0, -inf), softmax, times x·Wv; `mask` is an int64 attention mask (1 = keep).
    `causal`: the mask is instead a constant (1, seq, seq) tensor of float32's lowest value
    above the diagonal, as the dynamo exporter writes GPT-2's (and no mask input)."""
    from onnx import TensorProto, helper, numpy_helper

    if causal:
        return _causal_attention(tmp, name, seq, dim)

    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array((rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(
        np.float32), w) for w in ("wq", "wk", "wv")]
    inits += [numpy_helper.from_array(np.array([0.0], np.float32), "zero"),
              numpy_helper.from_array(np.array([-np.inf], np.float32), "ninf"),
              numpy_helper.from_array(np.array([1], np.int64), "axis1")]
    nodes = [helper.make_node("MatMul", ["x", w], [w + "_out"], name=w + "_proj")
             for w in ("wq", "wk", "wv")]
    nodes += [helper.make_node("Transpose", ["wk_out"], ["kt"], name="kt", perm=[0, 2, 1]),
              helper.make_node("MatMul", ["wq_out", "kt"], ["scores"], name="qk"),
              helper.make_node("Cast", ["mask"], ["keep"], name="keep", to=TensorProto.BOOL),
              helper.make_node("Unsqueeze", ["keep", "axis1"], ["keep3"], name="keep3"),
              helper.make_node("Where", ["keep3", "zero", "ninf"], ["bias"], name="mask_bias"),
              helper.make_node("Add", ["scores", "bias"], ["masked"], name="mask_add"),
              helper.make_node("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["probs", "wv_out"], ["y"], name="attend")]
    path = onnx_model(tmp / f"{name}.onnx", nodes,
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, dim]),
                       helper.make_tensor_value_info("mask", TensorProto.INT64, [1, seq])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, dim])],
                      inits)
    masks = np.ones((16, 1, seq), np.int64)
    masks[:, :, seq - 3:] = 0  # the last three positions are padding
    x = rng.standard_normal((16, 1, seq, dim)).astype(np.float32)
    ref, cal = tmp / f"{name}.ref.npz", tmp / f"{name}.cal.npz"
    np.savez(ref, x=x[:2], mask=masks[:2])
    np.savez(cal, x=x, mask=masks)  # covers the reference inputs' range
    return ModelFiles(name, (InputSpec("x", (1, seq, dim)),
                             InputSpec("mask", (1, seq), "int64")), path, path, ref, cal)


def _causal_attention(tmp: Path, name: str, seq: int, dim: int) -> ModelFiles:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array((rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(
        np.float32), w) for w in ("wq", "wk", "wv")]
    lowest = np.triu(np.full((seq, seq), np.finfo(np.float32).min, np.float32), 1)
    inits.append(numpy_helper.from_array(lowest[None], "causal"))
    nodes = [helper.make_node("MatMul", ["x", w], [w + "_out"], name=w + "_proj")
             for w in ("wq", "wk", "wv")]
    nodes += [helper.make_node("Transpose", ["wk_out"], ["kt"], name="kt", perm=[0, 2, 1]),
              helper.make_node("MatMul", ["wq_out", "kt"], ["scores"], name="qk"),
              helper.make_node("Add", ["scores", "causal"], ["masked"], name="mask_add"),
              helper.make_node("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["probs", "wv_out"], ["y"], name="attend")]
    path = onnx_model(tmp / f"{name}.onnx", nodes,
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, dim])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, dim])],
                      inits)
    x = rng.standard_normal((16, 1, seq, dim)).astype(np.float32)
    ref, cal = tmp / f"{name}.ref.npz", tmp / f"{name}.cal.npz"
    np.savez(ref, x=x[:2])
    np.savez(cal, x=x)
    return ModelFiles(name, (InputSpec("x", (1, seq, dim)),), path, path, ref, cal)


def embedding_lookup(tmp: Path, name: str, vocab: int = 64, dim: int = 16, seq: int = 8
                     ) -> ModelFiles:
    """ids → Gather(table) → MatMul(w): an embedding table and one projection."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((vocab, dim)).astype(np.float32),
                                     "table"),
             numpy_helper.from_array((rng.standard_normal((dim, dim)) / 4).astype(np.float32),
                                     "w")]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"], name="embed"),
             helper.make_node("MatMul", ["emb", "w"], ["y"], name="proj")]
    path = onnx_model(tmp / f"{name}.onnx", nodes,
                      [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, seq])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, dim])],
                      inits)
    ids = rng.integers(0, vocab, size=(8, 1, seq)).astype(np.int64)
    ref, cal = tmp / f"{name}.ref.npz", tmp / f"{name}.cal.npz"
    np.savez(ref, ids=ids[:2])
    np.savez(cal, ids=ids)
    return ModelFiles(name, (InputSpec("ids", (1, seq), "int64"),), path, path, ref, cal)


def positional_embedding(tmp: Path, name: str, vocab: int = 64, dim: int = 32, seq: int = 16
                         ) -> ModelFiles:
    """ids → Gather(table) + Gather(positions table, constant positions) → MatMul(w), no bias:
    a BERT-style embedding sum. The positions are a constant, so the converter folds the
    second Gather into a `[1, seq, dim]` const that an `add` reads — an activation, not a
    weight. Position 0's row is 30× the others (as a trained model's first position often
    is), so one scale for the whole folded table leaves the other rows a few levels."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    positions = (rng.standard_normal((seq, dim)) / 4).astype(np.float32)
    positions[0] *= 30.0
    inits = [numpy_helper.from_array(rng.standard_normal((vocab, dim)).astype(np.float32),
                                     "table"),
             numpy_helper.from_array(positions, "positions"),
             numpy_helper.from_array(np.arange(seq, dtype=np.int64)[None], "position_ids"),
             numpy_helper.from_array((rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(
                 np.float32), "w")]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["tok"], name="embed"),
             helper.make_node("Gather", ["positions", "position_ids"], ["pos"],
                              name="embed_positions"),
             helper.make_node("Add", ["tok", "pos"], ["emb"], name="embed_sum"),
             helper.make_node("MatMul", ["emb", "w"], ["y"], name="proj")]
    path = onnx_model(tmp / f"{name}.onnx", nodes,
                      [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, seq])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, dim])],
                      inits)
    ids = rng.integers(0, vocab, size=(8, 1, seq)).astype(np.int64)
    ref, cal = tmp / f"{name}.ref.npz", tmp / f"{name}.cal.npz"
    np.savez(ref, ids=ids[:2])
    np.savez(cal, ids=ids)
    return ModelFiles(name, (InputSpec("ids", (1, seq), "int64"),), path, path, ref, cal)


def conv_batchnorm(tmp: Path, name: str) -> ModelFiles:
    """Relu → depthwise Conv without bias → standalone BatchNormalization → Relu, the block
    paddle2onnx writes (PP-OCR's direction classifier, its first depthwise conv: the
    BatchNormalization scale and offset are that layer's, rounded; the conv's output is
    small and its running statistics with it). Unfolded, the HTP runs the QDQ
    BatchNormalization differently from onnxruntime's CPU: channel 2 (small variance, large
    offset) comes out near 0, as in the classifier."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    c, shape = 8, (1, 8, 24, 48)
    bn = {"scale": [0.52, 1.02, 0.58, 0.74, 0.60, 0.55, 0.54, 0.96],
          "offset": [-0.01, 0.59, 1.27, 0.64, 1.21, 1.09, 0.98, -0.25],
          "mean": [m / 50 for m in (0.034, 0.148, -0.003, 0.442, 0.362, 0.617, 0.271,
                                    -0.579)],
          "var": [v / 2500 for v in (0.074, 0.048, 0.022, 0.650, 0.250, 0.218, 0.119,
                                     1.226)]}
    dw = (rng.standard_normal((c, 1, 3, 3)) / 150).astype(np.float32)
    inits = [numpy_helper.from_array(dw, "dw")]
    inits += [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in bn.items()]
    nodes = [helper.make_node("Relu", ["x"], ["r0"], name="relu0"),
             helper.make_node("Conv", ["r0", "dw"], ["dwc"], name="depthwise", group=c,
                              kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["dwc", "scale", "offset", "mean", "var"],
                              ["bn"], name="bn", epsilon=1e-5),
             helper.make_node("Relu", ["bn"], ["y"], name="relu1")]
    path = onnx_model(tmp / f"{name}.onnx", nodes,
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
                      inits)
    x = rng.standard_normal((8, *shape)).astype(np.float32)
    ref, cal = tmp / f"{name}.ref.npz", tmp / f"{name}.cal.npz"
    np.savez(ref, x=x[:2])
    np.savez(cal, x=x)
    return ModelFiles(name, (InputSpec("x", shape),), path, path, ref, cal)
