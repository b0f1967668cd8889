"""A hand-built ONNX graph with the structure of the voice-activity model in issue 19: a
scalar int64 sample-rate input `sr`, `If` nodes whose condition is decided by the input's
shape, an LSTM carrying a state input, and a rank-0 speech probability out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
SAMPLES, FRAME, HIDDEN = 64, 8, 16


def _branch(name: str, shape: list[int], out: str) -> onnx.GraphProto:
    """A branch that frames `audio` as (1, steps, FRAME) with its own constant shape."""
    shape_c = helper.make_node("Constant", [], [f"{name}_shape"],
                               value=numpy_helper.from_array(np.array(shape, np.int64)))
    reshape = helper.make_node("Reshape", ["audio", f"{name}_shape"], [out], name=f"{name}_r")
    return helper.make_graph([shape_c, reshape], name, [],
                             [helper.make_tensor_value_info(out, F, None)])


def vad_onnx(path: Path, seed: int = 0, opset: int = 17, sr_if: bool = False) -> Path:
    """audio float32[1, 64], state float32[2, 1, 16], sr int64 scalar →
    prob float32 scalar, state_out float32[2, 1, 16]. `sr_if` adds an `If` on the value of
    `sr` (16 kHz features as they are, else doubled): no shape decides that one."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((1, 4 * HIDDEN, FRAME)) * 0.4).astype(np.float32)
    r = (rng.standard_normal((1, 4 * HIDDEN, HIDDEN)) * 0.4).astype(np.float32)
    bias = (rng.standard_normal((1, 8 * HIDDEN)) * 0.1).astype(np.float32)
    head = (rng.standard_normal((HIDDEN, 1)) * 0.5).astype(np.float32)
    inits = {"W": w, "R": r, "B": bias, "head": head,
             "one": np.array(1, np.int64), "n_expected": np.array(SAMPLES, np.int64),
             "rank_expected": np.array(2, np.int64), "sr_ref": np.array(16000.0, np.float32),
             "h_idx": np.array([0], np.int64), "c_idx": np.array([1], np.int64)}
    nodes = [
        # if audio.shape[1] == 64: frame it as 8 × 8, else as frames of 8 of any count
        helper.make_node("Shape", ["audio"], ["audio_shape"], name="shape"),
        helper.make_node("Gather", ["audio_shape", "one"], ["n"], axis=0, name="n_samples"),
        helper.make_node("Equal", ["n", "n_expected"], ["is_64"], name="is_64"),
        helper.make_node("If", ["is_64"], ["frames"], name="frame_if",
                         then_branch=_branch("fixed", [1, SAMPLES // FRAME, FRAME], "fr_a"),
                         else_branch=_branch("any", [1, -1, FRAME], "fr_b")),
        # if audio.dim() == 2 (a second shape-decided If, on the rank): pass, else keep
        helper.make_node("Size", ["audio_shape"], ["rank"], name="rank"),
        helper.make_node("Equal", ["rank", "rank_expected"], ["is_2d"], name="is_2d"),
        helper.make_node("If", ["is_2d"], ["frames2"], name="rank_if",
                         then_branch=helper.make_graph(
                             [helper.make_node("Identity", ["frames"], ["f_t"])], "t", [],
                             [helper.make_tensor_value_info("f_t", F, None)]),
                         else_branch=helper.make_graph(
                             [helper.make_node("Neg", ["frames"], ["f_e"])], "e", [],
                             [helper.make_tensor_value_info("f_e", F, None)])),
        # the scalar sample rate scales the features: sr / 16000
        helper.make_node("Cast", ["sr"], ["sr_f"], to=F, name="sr_cast"),
        helper.make_node("Div", ["sr_f", "sr_ref"], ["sr_scale"], name="sr_scale"),
        helper.make_node("Mul", ["frames2", "sr_scale"], ["feats"], name="scale"),
        *_sr_if(sr_if),
        helper.make_node("Transpose", ["feats_sr"], ["seq"], perm=[1, 0, 2], name="to_seq"),
        helper.make_node("Gather", ["state", "h_idx"], ["h0"], axis=0, name="h0"),
        helper.make_node("Gather", ["state", "c_idx"], ["c0"], axis=0, name="c0"),
        helper.make_node("LSTM", ["seq", "W", "R", "B", "", "h0", "c0"], ["y", "hn", "cn"],
                         hidden_size=HIDDEN, name="lstm"),
        helper.make_node("Concat", ["hn", "cn"], ["state_out"], axis=0, name="state_out"),
        helper.make_node("Squeeze", ["hn"], ["h_last"], name="h_last"),  # [1, 16]
        helper.make_node("MatMul", ["h_last", "head"], ["logit"], name="head"),
        helper.make_node("Sigmoid", ["logit"], ["p"], name="sigmoid"),
        helper.make_node("ReduceMean", ["p"], ["prob"], keepdims=0, name="prob"),
    ]
    graph = helper.make_graph(
        nodes, "vad",
        [helper.make_tensor_value_info("audio", F, [1, SAMPLES]),
         helper.make_tensor_value_info("state", F, [2, 1, HIDDEN]),
         helper.make_tensor_value_info("sr", I64, [])],
        [helper.make_tensor_value_info("prob", F, []),
         helper.make_tensor_value_info("state_out", F, [2, 1, HIDDEN])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def _sr_if(on: bool) -> list[onnx.NodeProto]:
    if not on:
        return [helper.make_node("Identity", ["feats"], ["feats_sr"], name="sr_pass")]
    c16k = numpy_helper.from_array(np.array(16000, np.int64))
    return [
        helper.make_node("Constant", [], ["c16k"], value=c16k),
        helper.make_node("Equal", ["sr", "c16k"], ["is_16k"], name="is_16k"),
        helper.make_node("If", ["is_16k"], ["feats_sr"], name="sr_if",
                         then_branch=helper.make_graph(
                             [helper.make_node("Identity", ["feats"], ["s_t"])], "t16", [],
                             [helper.make_tensor_value_info("s_t", F, None)]),
                         else_branch=helper.make_graph(
                             [helper.make_node("Add", ["feats", "feats"], ["s_e"])], "t8",
                             [], [helper.make_tensor_value_info("s_e", F, None)]))]


def vad_feeds(n: int, seed: int = 1) -> dict[str, np.ndarray]:
    """`n` samples of (audio, state, sr), stacked (N, *shape) as the reference .npz wants."""
    rng = np.random.default_rng(seed)
    return {"audio": rng.standard_normal((n, 1, SAMPLES)).astype(np.float32),
            "state": (rng.standard_normal((n, 2, 1, HIDDEN)) * 0.5).astype(np.float32),
            "sr": np.full((n,), 16000, np.int64)}
