"""The MIL executor on `mb.program` MIL builder programs (the ops a direct ONNX → MIL converter
emits), against references that do not come from the executor: PyTorch, numpy, and the
worked examples in the MIL op docs. Also: an op the executor lacks is named, never skipped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from coremltools.converters.mil.mil import Builder as mb
from coremltools.converters.mil.mil import types
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional as F

from server.compile.milexec import OPS, MilExecutor, UnsupportedMilOp, mil_op
from server.compile.milexec.ops.resize import grid
from tests.compile.milexec_models import assert_close, mil_package, op_types, run

FP = types.fp32
I32 = types.int32
X = (2, 3, 5)
IMG = (1, 3, 6, 7)
R = np.random.default_rng(7)


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def _ints(shape: tuple[int, ...], lo: int, hi: int) -> np.ndarray:
    return R.integers(lo, hi, shape).astype(np.int32)


W = R.standard_normal((3,)).astype(np.float32)
IDX = np.array([[1, 2], [0, 0], [1, 1]], np.int32)
# id, build, input specs, reference on the numpy inputs, MIL ops the package must hold
Case = tuple[str, Callable[..., Any], list[tuple[tuple[int, ...], Any]],
             Callable[..., list[Any]], set[str]]
CASES: list[Case] = [
    ("gelu-modes", lambda x: [mb.gelu(x=x, mode=m) for m in
                              ("EXACT", "TANH_APPROXIMATION", "SIGMOID_APPROXIMATION")],
     [(X, FP)], lambda x: [F.gelu(_t(x)).numpy(), F.gelu(_t(x), approximate="tanh").numpy(),
                           x / (1 + np.exp(-1.702 * x))], {"gelu"}),
    ("prelu", lambda x: mb.prelu(x=x, alpha=W), [(IMG, FP)],
     lambda x: [F.prelu(_t(x), _t(W)).numpy()], {"prelu"}),
    ("epsilon-ops", lambda x: [mb.inverse(x=x, epsilon=0.5), mb.rsqrt(x=mb.abs(x=x),
                                                                      epsilon=0.25),
                               mb.log(x=mb.abs(x=x), epsilon=0.125), mb.clip(x=x, alpha=-0.3,
                                                                             beta=0.6)],
     [(X, FP)], lambda x: [1 / (x + 0.5), 1 / np.sqrt(np.abs(x) + 0.25),
                           np.log(np.abs(x) + 0.125), np.clip(x, -0.3, 0.6)],
     {"inverse", "rsqrt", "log", "clip"}),
    ("int-arithmetic", lambda a, b: [mb.floor_div(x=a, y=b), mb.mod(x=a, y=b),
                                     mb.select(cond=mb.greater(x=a, y=b), a=a, b=b)],
     [(X, I32), (X, I32)], lambda a, b: [a // b, a % b, np.where(a > b, a, b)],
     {"floor_div", "mod", "select"}),
    ("logical", lambda a, b: [mb.cast(x=mb.logical_xor(x=mb.less(x=a, y=0.0),
                                                       y=mb.greater_equal(x=b, y=0.2)),
                                      dtype="int32"),
                              mb.cast(x=mb.logical_not(x=mb.logical_or(
                                  x=mb.equal(x=a, y=b), y=mb.less_equal(x=a, y=b))),
                                      dtype="int32")],
     [(X, FP), (X, FP)], lambda a, b: [((a < 0) ^ (b >= 0.2)).astype(np.int32),
                                       (~((a == b) | (a <= b))).astype(np.int32)], set()),
    ("topk-argsort", lambda x: [*mb.topk(x=x, k=2, axis=1, ascending=True),
                                mb.argsort(x=x, axis=-1)],
     [(X, FP)], lambda x: [*(t.numpy() for t in torch.topk(_t(x), 2, 1, largest=False)),
                           np.argsort(-x, axis=-1, kind="stable")], {"topk", "argsort"}),
    ("cumsum", lambda x: [mb.cumsum(x=x, axis=2, exclusive=True),
                          mb.cumsum(x=x, axis=0, reverse=True)],
     [(X, FP)], lambda x: [np.cumsum(x, 2) - x, np.flip(np.cumsum(np.flip(x, 0), 0), 0)],
     {"cumsum"}),
    ("gathers", lambda x: [mb.gather_nd(x=x, indices=IDX),
                           mb.gather(x=x, indices=np.array([2, 0, -1], np.int32), axis=2),
                           mb.gather_along_axis(x=x, indices=np.array(
                               [[[1, 0, 2, 2, 1]]], np.int32).repeat(2, 0), axis=1)],
     [(X, FP)], lambda x: [x[IDX[:, 0], IDX[:, 1]], x[:, :, [2, 0, -1]],
                           np.take_along_axis(x, np.array([[[1, 0, 2, 2, 1]]]).repeat(2, 0),
                                              1)], {"gather_nd", "gather", "gather_along_axis"}),
    ("scatters", lambda x, u: [mb.scatter(data=x, indices=np.array([1, 1], np.int32),
                                          updates=mb.slice_by_size(x=u, begin=[0, 0, 0],
                                                                   size=[2, 2, 5]),
                                          axis=1, mode="add"),
                               mb.scatter_nd(data=x, indices=np.array([[0, 2], [1, 0]],
                                                                      np.int32),
                                             updates=mb.squeeze(x=mb.slice_by_size(
                                                 x=u, begin=[0, 0, 0], size=[1, 2, 5]),
                                                 axes=[0]), mode="update"),
                               mb.scatter_along_axis(data=x, indices=np.zeros(
                                   (2, 1, 5), np.int32), updates=mb.slice_by_size(
                                   x=u, begin=[0, 0, 0], size=[2, 1, 5]), axis=1,
                                   mode="max")],
     [(X, FP), (X, FP)], lambda x, u: [
         torch.index_add(_t(x), 1, torch.tensor([1, 1]), _t(u[:, :2])).numpy(),
         _nd_update(x, u[0, :2]),
         np.concatenate([np.maximum(x[:, :1], u[:, :1]), x[:, 1:]], 1)],
     {"scatter", "scatter_nd", "scatter_along_axis"}),
    ("tensor-builders", lambda x: [mb.tile(x=x, reps=[1, 2, 1]),
                                   mb.band_part(x=x, lower=1, upper=0),
                                   mb.one_hot(indices=mb.cast(x=mb.abs(x=mb.mul(x=x, y=2.0)),
                                                              dtype="int32"),
                                              one_hot_vector_size=4, axis=-1),
                                   mb.range_1d(start=1, end=9, step=3),
                                   mb.fill(shape=[2, 2], value=1.5)],
     [(X, FP)], lambda x: [np.tile(x, (1, 2, 1)), np.tril(np.triu(x, -1), 0),
                           F.one_hot(_t(np.trunc(np.abs(2 * x)).astype(np.int64)).clamp(
                               max=3), 4).numpy().astype(np.float32)
                           * (np.trunc(np.abs(2 * x)) < 4)[..., None],
                           np.arange(1, 9, 3), np.full((2, 2), 1.5)], {"tile", "band_part"}),
    ("norms", lambda x: [mb.l2_norm(x=x, epsilon=1e-6),
                         mb.local_response_norm(x=x, size=3, alpha=0.1, beta=0.75, k=1.0),
                         mb.instance_norm(x=x, gamma=W, beta=W, epsilon=1e-5),
                         mb.batch_norm(x=x, mean=W, variance=np.abs(W), gamma=W, beta=W)],
     [(IMG, FP)], lambda x: [x / np.sqrt((x * x).sum() + 1e-6),
                             F.local_response_norm(_t(x), 3, 0.1, 0.75, 1.0).numpy(),
                             F.instance_norm(_t(x), weight=_t(W), bias=_t(W)).numpy(),
                             F.batch_norm(_t(x), _t(W), _t(np.abs(W)), _t(W), _t(W)).numpy()],
     {"l2_norm", "local_response_norm", "instance_norm", "batch_norm"}),
    ("pads", lambda x: [mb.pad(x=x, pad=[1, 2, 2, 1], mode="reflect"),
                        mb.pad(x=x, pad=[0, 3, 1, 0], mode="replicate"),
                        mb.pad(x=x, pad=[1, 1, 0, 0, 2, 1], mode="constant", constant_val=0.5)],
     [(IMG, FP)], lambda x: [F.pad(_t(x), (2, 1, 1, 2), mode="reflect").numpy(),
                             F.pad(_t(x), (1, 0, 0, 3), mode="replicate").numpy(),
                             F.pad(_t(x), (2, 1, 0, 0, 1, 1), value=0.5).numpy()], {"pad"}),
    ("upsample-bilinear", lambda x: [
        mb.upsample_bilinear(x=x, scale_factor_height=2, scale_factor_width=3,
                             align_corners=False, half_pixel_centers=True),
        mb.upsample_bilinear(x=x, scale_factor_height=2, scale_factor_width=2,
                             align_corners=True),
        mb.resize_nearest_neighbor(x=x, target_size_height=12, target_size_width=14)],
     [(IMG, FP)], lambda x: [
         F.interpolate(_t(x), scale_factor=(2, 3), mode="bilinear").numpy(),
         F.interpolate(_t(x), scale_factor=2, mode="bilinear", align_corners=True).numpy(),
         F.interpolate(_t(x), size=(12, 14), mode="nearest").numpy()],
     {"upsample_bilinear", "resize_nearest_neighbor"}),
    ("reductions", lambda x: [mb.reduce_prod(x=x, axes=[1]), mb.reduce_l1_norm(x=x, axes=[2]),
                              mb.reduce_log_sum(x=mb.abs(x=x), axes=[0, 2]),
                              mb.reduce_sum_square(x=x, axes=[-1], keep_dims=True),
                              mb.reduce_argmin(x=x, axis=1)],
     [(X, FP)], lambda x: [x.prod(1), np.abs(x).sum(2), np.log(np.abs(x).sum((0, 2))),
                           (x * x).sum(-1, keepdims=True), x.argmin(1)], {"reduce_prod"}),
    ("rnn", lambda x, h: mb.rnn(x=x, initial_h=h, weight_ih=_RNN["w_ih"], weight_hh=_RNN[
        "w_hh"], bias=_RNN["b"], output_sequence=True),
     [((4, 2, 3), FP), ((2, 5), FP)], lambda x, h: _torch_rnn(x, h), {"rnn"}),
]

_RNN = {"w_ih": R.standard_normal((5, 3)).astype(np.float32) * 0.5,
        "w_hh": R.standard_normal((5, 5)).astype(np.float32) * 0.5,
        "b": R.standard_normal(5).astype(np.float32) * 0.1}


def _torch_rnn(x: np.ndarray, h: np.ndarray) -> list[np.ndarray]:
    m = torch.nn.RNN(3, 5)
    with torch.no_grad():
        m.weight_ih_l0.copy_(_t(_RNN["w_ih"]))
        m.weight_hh_l0.copy_(_t(_RNN["w_hh"]))
        m.bias_ih_l0.copy_(_t(_RNN["b"]))
        m.bias_hh_l0.zero_()
        out, hn = m(_t(x), _t(h)[None])
    return [out.numpy(), hn[0].numpy()]


def _nd_update(x: np.ndarray, u: np.ndarray) -> np.ndarray:
    out = x.copy()
    out[0, 2], out[1, 0] = u[0], u[1]
    return out


def _feeds(specs: list[tuple[tuple[int, ...], Any]]) -> list[np.ndarray]:
    return [_ints(s, 1, 6) * np.where(R.random(s) < 0.5, -1, 1).astype(np.int32) if d is I32
            else R.standard_normal(s).astype(np.float16).astype(np.float32) for s, d in specs]


@pytest.mark.parametrize(("name", "build", "specs", "ref", "ops"), CASES,
                         ids=[c[0] for c in CASES])
def test_executor_matches_reference(name, build, specs, ref, ops, tmp_path):  # type: ignore[no-untyped-def]
    args = _feeds(specs)
    expected = ref(*args)
    precisions = ("fp32", "fp16") if all(d is FP for _, d in specs) else ("fp32",)
    for precision in precisions:
        path = mil_package(build, specs, tmp_path / f"{precision}.mlpackage", precision)
        assert ops <= op_types(path), op_types(path)
        got = run(path, *args)
        assert len(got) == len(expected)
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            e = np.asarray(e)
            what = f"{name} {precision} output {i}"
            if g.dtype.kind in "iub":
                np.testing.assert_array_equal(g, e, err_msg=what)
            else:
                assert_close(g, e, precision, what)


_H, _I = 4, 3


def _torch_recurrent(kind: str, bidirectional: bool = False) -> Any:
    torch.manual_seed(3)
    return {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[kind](
        _I, _H, bidirectional=bidirectional).eval()


def _ifzo_to_ifoz(w: np.ndarray) -> np.ndarray:
    i, f, z, o = np.split(w, 4)
    return np.concatenate([i, f, o, z])


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_lstm_matches_torch(direction, tmp_path):  # type: ignore[no-untyped-def]
    m = _torch_recurrent("lstm", direction == "bidirectional")
    sd = {k: v.detach().numpy() for k, v in m.state_dict().items()}
    d = 2 if direction == "bidirectional" else 1
    x = R.standard_normal((5, 2, _I)).astype(np.float32)
    h0, c0 = (R.standard_normal((d, 2, _H)).astype(np.float32) for _ in range(2))

    def weights(sfx: str) -> dict[str, np.ndarray]:
        return {"ih": _ifzo_to_ifoz(sd[f"weight_ih_l0{sfx}"]),
                "hh": _ifzo_to_ifoz(sd[f"weight_hh_l0{sfx}"]),
                "b": _ifzo_to_ifoz(sd[f"bias_ih_l0{sfx}"] + sd[f"bias_hh_l0{sfx}"])}
    fw, bw = weights(""), weights("_reverse") if d == 2 else {}

    def build(x, h, c):  # type: ignore[no-untyped-def]
        extra = {"weight_ih_back": bw["ih"], "weight_hh_back": bw["hh"],
                 "bias_back": bw["b"]} if d == 2 else {}
        return mb.lstm(x=x, initial_h=h, initial_c=c, weight_ih=fw["ih"], weight_hh=fw["hh"],
                       bias=fw["b"], direction=direction, output_sequence=True, **extra)

    flat = [np.concatenate(list(s), -1) for s in (h0, c0)]  # MIL: [b, D*H]
    path = mil_package(build, [(x.shape, FP), (flat[0].shape, FP), (flat[1].shape, FP)],
                       tmp_path / "lstm.mlpackage")
    assert "lstm" in op_types(path)
    out, h, c = run(path, x, *flat)
    with torch.no_grad():
        eo, (eh, ec) = m(_t(x), (_t(h0), _t(c0)))
    assert_close(out, eo.numpy(), "fp32", "sequence")
    assert_close(h, np.concatenate(list(eh.numpy()), -1), "fp32", "h")
    assert_close(c, np.concatenate(list(ec.numpy()), -1), "fp32", "c")


def test_gru_reset_after_matches_torch(tmp_path):  # type: ignore[no-untyped-def]
    m = _torch_recurrent("gru")
    sd = {k: v.detach().numpy() for k, v in m.state_dict().items()}

    def rzn_to_ron(w: np.ndarray) -> np.ndarray:  # torch [r, z, n] → MIL [r, o(n), z]
        r, z, n = np.split(w, 3)
        return np.concatenate([r, n, z])
    x = R.standard_normal((5, 2, _I)).astype(np.float32)
    h0 = R.standard_normal((1, 2, _H)).astype(np.float32)
    path = mil_package(lambda x, h: mb.gru(
        x=x, initial_h=h, weight_ih=rzn_to_ron(sd["weight_ih_l0"]),
        weight_hh=rzn_to_ron(sd["weight_hh_l0"]), input_bias=rzn_to_ron(sd["bias_ih_l0"]),
        bias=rzn_to_ron(sd["bias_hh_l0"]), reset_after=True, output_sequence=True),
        [(x.shape, FP), ((2, _H), FP)], tmp_path / "gru.mlpackage", target="iOS18")
    out, h = run(path, x, h0[0])
    with torch.no_grad():
        eo, eh = m(_t(x), _t(h0))
    assert_close(out, eo.numpy(), "fp32", "sequence")
    assert_close(h, eh[0].numpy(), "fp32", "h")


@pytest.mark.parametrize(("mode", "n_out", "expected"), [
    # the worked examples of MIL's resize_bilinear docs (Xin = 2)
    ("UNALIGN_CORNERS", 5, [0., 0.1, 0.5, 0.9, 1.]),
    ("STRICT_ALIGN_CORNERS", 5, [0., 0.25, 0.5, 0.75, 1.]),
    ("DEFAULT", 5, [0., 0.4, 0.8, 1., 1.]),
    ("OFFSET_CORNERS", 5, [0.1, 0.3, 0.5, 0.7, 0.9]),
    ("UNALIGN_CORNERS", 6, [0., 0., 0.33, 0.67, 1., 1.]),
    ("DEFAULT", 6, [0., 0.33, 0.67, 1., 1., 1.]),
    ("OFFSET_CORNERS", 6, [0.08, 0.25, 0.42, 0.58, 0.75, 0.92]),
])
def test_resize_bilinear_samples_where_the_mil_docs_say(mode, n_out, expected, tmp_path):  # type: ignore[no-untyped-def]
    np.testing.assert_allclose(grid(mode, 2, n_out), expected, atol=0.005)
    # interpolating the ramp [0, 1] returns the sample coordinates themselves
    path = mil_package(lambda x: mb.resize_bilinear(x=x, target_size_height=1,
                                                    target_size_width=n_out,
                                                    sampling_mode=mode),
                       [((1, 1, 1, 2), FP)], tmp_path / "r.mlpackage")
    (got,) = run(path, np.array([[[[0.0, 1.0]]]], np.float32))
    np.testing.assert_allclose(got.ravel(), expected, atol=0.005)


def test_cond_and_while_loop_run_their_blocks(tmp_path):  # type: ignore[no-untyped-def]
    def build(x, p):  # type: ignore[no-untyped-def]
        y = mb.cond(pred=mb.greater(x=mb.reduce_sum(x=p), y=0.0),
                    _true_fn=lambda: mb.add(x=x, y=1.0), _false_fn=lambda: mb.mul(x=x, y=3.0))
        _, z = mb.while_loop(_cond=lambda i, a: mb.less(x=i, y=np.int32(3)),
                             _body=lambda i, a: (mb.add(x=i, y=np.int32(1)),
                                                 mb.mul(x=a, y=2.0)),
                             loop_vars=(mb.const(val=np.int32(0)), y))
        return z
    path = mil_package(build, [((2,), FP), ((1,), FP)], tmp_path / "cf.mlpackage")
    assert {"cond", "while_loop"} <= op_types(path)
    x = np.array([1.0, 2.0], np.float32)
    np.testing.assert_array_equal(run(path, x, np.ones(1, np.float32))[0], (x + 1) * 8)
    np.testing.assert_array_equal(run(path, x, -np.ones(1, np.float32))[0], x * 3 * 8)


@settings(max_examples=12, deadline=None)
@given(groups=st.sampled_from([1, 2]), k=st.integers(1, 3), stride=st.integers(1, 2),
       dilation=st.integers(1, 2), pad_type=st.sampled_from(["valid", "same", "custom"]),
       pads=st.lists(st.integers(0, 2), min_size=4, max_size=4))
def test_conv_attribute_space_matches_torch(groups, k, stride, dilation, pad_type, pads,
                                            tmp_path_factory):  # type: ignore[no-untyped-def]
    x = R.standard_normal((1, 4, 8, 7)).astype(np.float32)
    w = R.standard_normal((6, 4 // groups, k, k + 1)).astype(np.float32)
    kwargs: dict[str, Any] = {"pad_type": pad_type, "strides": [stride, stride],
                              "dilations": [dilation, dilation], "groups": groups}
    if pad_type == "custom":
        kwargs["pad"] = pads
    path = mil_package(lambda x: mb.conv(x=x, weight=w, **kwargs), [(x.shape, FP)],
                       tmp_path_factory.mktemp("conv") / "c.mlpackage")
    (got,) = run(path, x)
    if pad_type == "same":  # TF SAME: output ceil(in / stride), the odd pad at the end
        eff = [(k - 1) * dilation + 1, k * dilation + 1]
        total = [max(0, (-(-n // stride) - 1) * stride + e - n) for n, e in zip(
            x.shape[2:], eff, strict=True)]
        pads = [total[0] // 2, total[0] - total[0] // 2, total[1] // 2, total[1] - total[1] // 2]
    elif pad_type == "valid":
        pads = [0, 0, 0, 0]
    xp = F.pad(_t(x), (pads[2], pads[3], pads[0], pads[1]))
    expected = F.conv2d(xp, _t(w), stride=stride, dilation=dilation, groups=groups).numpy()
    assert_close(got, expected, "fp32", f"conv {kwargs}")


def test_an_op_without_a_function_is_named_not_skipped(tmp_path):  # type: ignore[no-untyped-def]
    assert "non_maximum_suppression" not in OPS
    path = mil_package(lambda b, s: mb.non_maximum_suppression(
        boxes=b, scores=s, iou_threshold=0.5, score_threshold=0.1, max_boxes=3),
        [((1, 6, 4), FP), ((1, 6, 2), FP)], tmp_path / "nms.mlpackage", target="iOS15")
    with pytest.raises(UnsupportedMilOp) as err:
        MilExecutor(path).run({"b": R.random((1, 6, 4)).astype(np.float32),
                               "s": R.random((1, 6, 2)).astype(np.float32)})
    assert err.value.op_type == "non_maximum_suppression"
    assert err.value.var_name and err.value.var_name in str(err.value)
    assert "non_maximum_suppression" in str(err.value)


def test_an_op_registers_once_and_runs_from_its_module(tmp_path):  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="registered twice"):
        mil_op("relu")(lambda op: op.arr("x"))
    assert OPS["relu"].__module__ == "server.compile.milexec.ops.elementwise"
