"""The MIL executor against PyTorch, op by op, on packages built the way the coreml compiler
builds a torch upload (torch.export → core ATen → coremltools' torch frontend), in FP32 and
FP16. Each case also asserts that the MIL op it is about is in the package, so a frontend
change that stops emitting it cannot leave the op untested unnoticed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tests.compile.milexec_models import assert_close, op_types, run, torch_packages


class Fn(nn.Module):
    def __init__(self, fn: Callable[..., Any], *layers: nn.Module) -> None:
        super().__init__()
        self.fn = fn
        self.layers = nn.ModuleList(layers)

    def forward(self, *xs: torch.Tensor) -> Any:
        return self.fn(self.layers, *xs)


def _f(fn: Callable[..., Any]) -> Callable[[], nn.Module]:
    return lambda: Fn(lambda _layers, *xs: fn(*xs))


def _m(fn: Callable[..., Any], *make: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    return lambda: Fn(fn, *(m() for m in make))


def _layer(make: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    return make


IMG = (1, 4, 9, 11)
SEQ = (2, 5, 8)
# id, module factory, input shapes, MIL ops the package must hold
CASES: list[tuple[str, Callable[[], nn.Module], list[tuple[int, ...]], set[str]]] = [
    ("conv-same", _layer(lambda: nn.Conv2d(4, 6, 3, padding=1)), [IMG],
     {"conv"}),
    ("conv-stride-dilation", _layer(lambda: nn.Conv2d(
        4, 6, 3, stride=2, dilation=2, padding=(2, 1))), [IMG], {"conv"}),
    ("conv-grouped", _layer(lambda: nn.Conv2d(4, 8, (3, 1), groups=2,
                                                               padding=(1, 0))), [IMG], {"conv"}),
    ("conv-depthwise", _layer(lambda: nn.Conv2d(4, 4, 3, groups=4,
                                                                 stride=2)), [IMG], {"conv"}),
    ("conv1d", _layer(lambda: nn.Conv1d(5, 3, 4, padding=2)), [SEQ],
     {"conv"}),
    ("conv-transpose", _layer(lambda: nn.ConvTranspose2d(
        4, 6, 3, stride=2, padding=1, output_padding=1)), [IMG], {"conv_transpose"}),
    ("conv-transpose-grouped", _layer(lambda: nn.ConvTranspose2d(
        4, 4, 2, stride=2, groups=2)), [IMG], {"conv_transpose"}),
    ("max-pool-ceil", _f(lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True)), [IMG],
     {"max_pool"}),
    ("max-pool-pad", _f(lambda x: F.max_pool2d(x, 3, 2, padding=1)), [IMG], {"max_pool"}),
    ("avg-pool-include-pad", _f(lambda x: F.avg_pool2d(x, 3, 2, padding=1)), [IMG],
     {"avg_pool"}),
    ("avg-pool-exclude-pad-ceil", _f(lambda x: F.avg_pool2d(
        x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False)), [IMG], {"avg_pool"}),
    ("batch-norm", _layer(lambda: nn.BatchNorm2d(4).eval()), [IMG], set()),
    ("instance-norm", _layer(lambda: nn.InstanceNorm2d(4, affine=True)),
     [IMG], set()),
    ("layer-norm", _layer(lambda: nn.LayerNorm(8)), [SEQ], {"layer_norm"}),
    ("group-norm", _layer(lambda: nn.GroupNorm(2, 4)), [IMG], set()),
    ("linear-gelu", _m(lambda mods, x: F.gelu(mods[0](x)), lambda: nn.Linear(8, 6)), [SEQ],
     {"linear", "gelu"}),
    ("activations", _f(lambda x: torch.cat([F.silu(x), F.elu(x), F.leaky_relu(x, 0.1),
                                            F.softplus(x), torch.sigmoid(x), torch.tanh(x),
                                            F.hardsigmoid(x)], -1)), [SEQ],
     {"elu", "leaky_relu", "sigmoid", "tanh"}),
    ("softmax", _f(lambda x: torch.cat([torch.softmax(x, 1), torch.log_softmax(x, -1)], -1)),
     [SEQ], {"softmax"}),
    # the frontend writes reflect / replicate padding as gathers on constant indices
    ("pad-reflect", _f(lambda x: F.pad(x, (2, 1, 1, 2), mode="reflect")), [IMG], {"gather"}),
    ("pad-replicate", _f(lambda x: F.pad(x, (1, 3, 2, 0), mode="replicate")), [IMG],
     {"gather"}),
    ("pad-constant", _f(lambda x: F.pad(x, (1, 2, 0, 1), value=0.5)), [IMG], {"pad"}),
    ("upsample-bilinear", _f(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear")),
     [IMG], {"upsample_bilinear"}),
    ("upsample-bilinear-align", _f(lambda x: F.interpolate(
        x, size=(13, 7), mode="bilinear", align_corners=True)), [IMG], set()),
    ("upsample-nearest", _f(lambda x: F.interpolate(x, scale_factor=2, mode="nearest")),
     [IMG], {"upsample_nearest_neighbor"}),
    ("attention", _f(lambda q, k: torch.softmax(q @ k.transpose(-1, -2) / 3, -1) @ k),
     [SEQ, SEQ], {"matmul", "softmax"}),
    ("einsum", _f(lambda a, b: torch.einsum("bik,bjk->bij", a, b)), [SEQ, SEQ], set()),
    ("reductions", _f(lambda x: torch.cat([x.sum(1), x.mean(-1, keepdim=True).squeeze(-1)
                                           .repeat(1, 1), x.amax(1), x.amin(1),
                                           torch.logsumexp(x, 1), x.norm(dim=1)], -1)), [SEQ],
     {"reduce_sum", "reduce_max", "reduce_min"}),
    ("argmax-topk", _f(lambda x: (x.argmax(-1), *torch.topk(x, 3, dim=-1))), [SEQ],
     {"reduce_argmax", "topk"}),
    ("unary-math", _f(lambda x: torch.cat([torch.exp(x / 4), torch.log(x.abs() + 1),
                                           torch.sqrt(x.abs()), torch.rsqrt(x.abs() + 1),
                                           torch.sin(x), torch.cos(x), torch.floor(x * 3),
                                           torch.ceil(x * 3), torch.round(x * 3),
                                           torch.sign(x), torch.erf(x), 1 / (x.abs() + 1),
                                           x.clamp(-0.5, 0.3), x * x, x.pow(3)], -1)), [SEQ],
     {"exp", "log", "sqrt", "rsqrt", "sin", "cos", "floor", "ceil", "round", "sign", "erf"}),
    ("binary", _f(lambda a, b: torch.cat([a + b, a - b, a * b, a / (b.abs() + 1),
                                          torch.maximum(a, b), torch.minimum(a, b),
                                          torch.where(a > b, a, b),
                                          (a < b).float(), (a == a).float()], -1)),
     [SEQ, SEQ], {"add", "sub", "mul", "real_div", "maximum", "minimum", "select"}),
    ("layout", _f(lambda x: torch.cat([x.permute(0, 2, 1).reshape(2, 5, 8),
                                       x.flip(1), x[:, 1:4].repeat(1, 2, 1)[:, :5],
                                       torch.stack(x.chunk(2, -1), 2).flatten(2)], -1)),
     [SEQ], {"transpose", "reshape", "concat"}),
    ("slicing", _f(lambda x: torch.cat([x[:, ::2, 1:7:3], x[:, -3:, :2]], 1).unsqueeze(0)
                   .squeeze(0)), [SEQ], {"slice_by_index"}),
    ("gather-cumsum", _f(lambda x: torch.cat([torch.gather(x, 2, torch.argsort(x, -1)),
                                              torch.cumsum(x, 1), x[:, [4, 0, 2]].sum(
                                                  1, keepdim=True).expand(2, 5, 8)], -1)),
     [SEQ], {"cumsum"}),
    ("embedding", _m(lambda mods, x: mods[0]((x.abs() * 10).long().clamp(max=19)),
                     lambda: nn.Embedding(20, 6)), [SEQ], {"gather"}),
    # core ATen unrolls recurrent layers; mb.lstm itself is in test_milexec_mil_ops.py
    ("lstm", _m(lambda mods, x: mods[0](x)[0], lambda: nn.LSTM(8, 6, batch_first=True)), [SEQ],
     set()),
    ("gru", _m(lambda mods, x: mods[0](x)[0], lambda: nn.GRU(8, 6, batch_first=True)), [SEQ],
     set()),
]


@pytest.mark.parametrize(("name", "make", "shapes", "ops"), CASES, ids=[c[0] for c in CASES])
def test_executor_matches_torch(name, make, shapes, ops, tmp_path):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    module = make().eval()
    # float16-exact inputs: the FP16 package rounds its inputs, so compare on the same values
    args = [np.random.default_rng(1).standard_normal(s).astype(np.float16).astype(np.float32)
            for s in shapes]
    with torch.no_grad():
        expected = module(*(torch.from_numpy(a) for a in args))
    expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    for precision, path in torch_packages(module, args, tmp_path).items():
        assert ops <= op_types(path), op_types(path)
        got = run(path, *args)
        assert len(got) == len(expected)
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            what = f"{name} {precision} output {i}"
            e = e.numpy()
            if e.dtype.kind in "iu":
                np.testing.assert_array_equal(g, e, err_msg=what)
            else:
                assert g.dtype == (np.float16 if precision == "fp16" else np.float32), what
                assert_close(g, e, precision, what)
