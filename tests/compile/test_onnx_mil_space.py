"""The attribute spaces of the trickier ONNX → MIL rules, drawn with hypothesis, each example
converted, built into an .mlpackage, run by the MIL reference executor and compared with
onnxruntime (helpers in tests/compile/test_onnx_mil.py). Examples are bounded: each costs
one `ct.convert` (~0.3 s).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from onnx import helper

from server.compile.onnx_mil.conformance import execute_onnx
from tests.compile.test_onnx_mil import assert_matches_onnxruntime, graph, rand

pytestmark = pytest.mark.slow  # ~100 conversions: about a minute on a quiet machine

# No shrinking: a failing example is reported as drawn (shrinking would re-convert dozens).
SETTINGS = settings(max_examples=12, deadline=None, derandomize=True,
                    phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def conv_case(draw):  # type: ignore[no-untyped-def]
    rank = draw(st.sampled_from([1, 2]))
    k = [draw(st.integers(1, 3)) for _ in range(rank)]
    strides = [draw(st.integers(1, 2)) for _ in range(rank)]
    auto = draw(st.sampled_from(["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    # onnxruntime refuses dilations with SAME_* padding
    dil = [draw(st.integers(1, 2)) if not auto.startswith("SAME") else 1 for _ in range(rank)]
    group = draw(st.sampled_from([1, 2]))
    attrs = {"kernel_shape": k, "strides": strides, "dilations": dil, "group": group}
    if auto == "NOTSET":
        attrs["pads"] = [draw(st.integers(0, 2)) for _ in range(2 * rank)]
    else:
        attrs["auto_pad"] = auto
    return rank, k, group, attrs, draw(st.booleans())


@SETTINGS
@given(conv_case())
def test_conv_padding_strides_dilations_groups(case) -> None:  # type: ignore[no-untyped-def]
    rank, k, group, attrs, bias = case
    x = rand(1, 4, *([9] * rank))
    inits = {"w": rand(6, 4 // group, *k, seed=1)}
    names = ["x", "w"]
    if bias:
        inits["b"] = rand(6, seed=2)
        names.append("b")
    model = graph([helper.make_node("Conv", names, ["y"], **attrs)], {"x": x}, inits, opset=11)
    assert_matches_onnxruntime(model, {"x": x}, rtol=1e-4, atol=1e-4)


@st.composite
def pool_case(draw):  # type: ignore[no-untyped-def]
    op = draw(st.sampled_from(["MaxPool", "AveragePool"]))
    k = [draw(st.integers(2, 3)) for _ in range(2)]
    attrs = {"kernel_shape": k, "strides": [draw(st.integers(1, 3)) for _ in range(2)]}
    auto = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    if auto == "NOTSET":
        attrs["pads"] = [draw(st.integers(0, k[i % 2] - 1)) for i in range(4)]
        attrs["ceil_mode"] = draw(st.sampled_from([0, 1]))
    else:
        attrs["auto_pad"] = auto
    if op == "AveragePool":
        attrs["count_include_pad"] = draw(st.sampled_from([0, 1]))
    elif auto == "NOTSET" and draw(st.booleans()):
        attrs["dilations"] = [2, 2]
    return op, attrs, draw(st.sampled_from([7, 8, 10]))


@SETTINGS
@given(pool_case())
def test_pool_padding_ceil_mode_and_auto_pad(case) -> None:  # type: ignore[no-untyped-def]
    op, attrs, size = case
    x = rand(1, 2, size, size + 1)
    model = graph([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x}, opset=19)
    assert_matches_onnxruntime(model, {"x": x})


@st.composite
def resize_case(draw):  # type: ignore[no-untyped-def]
    mode = draw(st.sampled_from(["nearest", "linear", "cubic"]))
    ctm = draw(st.sampled_from(["half_pixel", "pytorch_half_pixel", "align_corners",
                                "asymmetric"]))
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
    if mode == "nearest":
        attrs["nearest_mode"] = draw(st.sampled_from(["round_prefer_floor", "round_prefer_ceil",
                                                      "floor", "ceil"]))
    by_sizes = draw(st.booleans())
    if by_sizes:
        target = [1, 2, draw(st.integers(3, 17)), draw(st.integers(3, 17))]
    else:
        target = [1.0, 1.0, draw(st.sampled_from([0.5, 1.5, 2.0, 3.0])),
                  draw(st.sampled_from([0.75, 2.0, 2.5]))]
    return attrs, by_sizes, target


@SETTINGS
@given(resize_case())
def test_resize_modes_and_coordinate_transforms(case) -> None:  # type: ignore[no-untyped-def]
    attrs, by_sizes, target = case
    x = rand(1, 2, 6, 8)
    if by_sizes:
        inits = {"sizes": np.array(target, np.int64)}
        names = ["x", "", "", "sizes"]
    else:
        inits = {"scales": np.array(target, np.float32)}
        names = ["x", "", "scales"]
    model = graph([helper.make_node("Resize", names, ["y"], **attrs)], {"x": x}, inits,
                  opset=19)
    assert_matches_onnxruntime(model, {"x": x})


@SETTINGS
@given(st.sampled_from(["constant", "reflect", "edge", "wrap"]), st.integers(1, 4),
       st.lists(st.integers(0, 3), min_size=6, max_size=6), st.booleans())
def test_pad_modes_over_axes(mode: str, rank_hint: int, pads: list[int],
                             negative: bool) -> None:
    rank = 3
    x = rand(2, 5, 6)
    if mode == "reflect":  # reflect pads at most dim − 1 per side
        pads = [min(p, x.shape[i % rank] - 1) for i, p in enumerate(pads)]
    if negative and mode == "constant":
        pads[0] = -1
    model = graph([helper.make_node("Pad", ["x", "pads", "v"], ["y"], mode=mode)], {"x": x},
                  {"pads": np.array(pads[:2 * rank], np.int64),
                   "v": np.array(rank_hint * 0.5, np.float32)}, opset=19)
    assert_matches_onnxruntime(model, {"x": x})


@SETTINGS
@given(st.booleans(), st.booleans(), st.sampled_from([1.0, 0.5]), st.sampled_from([1.0, 2.0, 0.0]),
       st.sampled_from(["none", "row", "full", "scalar"]))
def test_gemm_transposes_alpha_beta_and_c_broadcast(ta: bool, tb: bool, alpha: float,
                                                    beta: float, c: str) -> None:
    a = rand(4, 3) if ta else rand(3, 4)
    b = rand(5, 4, seed=1) if tb else rand(4, 5, seed=1)
    inits = {"b": b}
    names = ["a", "b"]
    if c != "none":
        inits["c"] = {"row": rand(5, seed=2), "full": rand(3, 5, seed=2),
                      "scalar": rand(1, seed=2)}[c]
        names.append("c")
    node = helper.make_node("Gemm", names, ["y"], transA=int(ta), transB=int(tb), alpha=alpha,
                            beta=beta)
    assert_matches_onnxruntime(graph([node], {"a": a}, inits, opset=13), {"a": a})


@SETTINGS
@given(st.lists(st.tuples(st.integers(-9, 9), st.integers(-12, 12),
                          st.sampled_from([-3, -2, -1, 1, 2, 3])), min_size=1, max_size=3))
def test_slice_with_negative_steps_and_clamped_bounds(specs) -> None:  # type: ignore[no-untyped-def]
    x = rand(7, 8, 9)
    axes = list(range(len(specs)))
    starts, ends, steps = zip(*specs, strict=True)
    dims = x.shape
    if any(len(range(*slice(s, e, st_).indices(dims[a]))) == 0
           for a, (s, e, st_) in zip(axes, specs, strict=True)):
        return  # an empty slice: Core ML has no zero-sized tensors (refused, tested below)
    inits = {"s": np.array(starts, np.int64), "e": np.array(ends, np.int64),
             "a": np.array(axes, np.int64), "st": np.array(steps, np.int64)}
    model = graph([helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])], {"x": x},
                  inits, opset=13)
    assert_matches_onnxruntime(model, {"x": x})


@SETTINGS
@given(st.integers(-3, 2), st.sampled_from(["scalar", "vector", "matrix"]), st.booleans())
def test_gather_axis_and_negative_indices(axis: int, kind: str, as_input: bool) -> None:
    x = rand(4, 5, 6)
    dim = x.shape[axis]
    rng = np.random.default_rng(axis + 3)
    shape = {"scalar": (), "vector": (3,), "matrix": (2, 2)}[kind]
    idx = rng.integers(-dim, dim, shape).astype(np.int64)
    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)
    if as_input:
        model = graph([node], {"x": x, "i": idx}, opset=13)
        assert_matches_onnxruntime(model, {"x": x, "i": idx})
    else:
        model = graph([node], {"x": x}, {"i": idx}, opset=13)
        assert_matches_onnxruntime(model, {"x": x})


@st.composite
def rnn_case(draw):  # type: ignore[no-untyped-def]
    op = draw(st.sampled_from(["LSTM", "GRU"]))
    direction = draw(st.sampled_from(["forward", "reverse", "bidirectional"]))
    return (op, direction, draw(st.booleans()), draw(st.booleans()), draw(st.sampled_from([0, 1])),
            draw(st.sampled_from([0, 1])))


@settings(max_examples=16, deadline=None, derandomize=True,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.too_slow])
@given(rnn_case())
def test_lstm_gru_directions_states_and_layouts(case) -> None:  # type: ignore[no-untyped-def]
    """onnxruntime runs layout=0 only; batch-first (layout=1) is checked against ONNX's
    reference implementation instead."""
    op, direction, with_bias, with_h0, lbr, layout = case
    dirs = 2 if direction == "bidirectional" else 1
    seq, batch, inp, hid = 5, 2, 3, 4
    gates = 4 if op == "LSTM" else 3
    x = rand(batch, seq, inp) if layout else rand(seq, batch, inp)
    inits = {"w": rand(dirs, gates * hid, inp, seed=1) * 0.5,
             "r": rand(dirs, gates * hid, hid, seed=2) * 0.5}
    names = ["x", "w", "r", "b" if with_bias else "", "", "h0" if with_h0 else ""]
    if with_bias:
        inits["b"] = rand(dirs, 2 * gates * hid, seed=3) * 0.5
    state = (batch, dirs, hid) if layout else (dirs, batch, hid)
    if with_h0:
        inits["h0"] = rand(*state, seed=4)
    attrs = {"hidden_size": hid, "direction": direction, "layout": layout}
    if op == "GRU":
        attrs["linear_before_reset"] = lbr
    outs = ["y", "yh"] + (["yc"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outs, **attrs)
    model = graph([node], {"x": x}, inits, opset=14, n_out=len(outs))
    if not layout:
        assert_matches_onnxruntime(model, {"x": x}, rtol=1e-4, atol=1e-5)
        return
    from onnx.reference import ReferenceEvaluator

    want = ReferenceEvaluator(model).run(None, {"x": x})
    for w, g in zip(want, execute_onnx(model, {"x": x}), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
