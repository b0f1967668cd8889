"""Compressed weights (`constexpr_*` ops as coremltools.optimize writes them) through the MIL
executor: the weights it materialises equal an independent dequantisation of the original
float weights (int8 per channel, int4 per block, magnitude pruning), palettized weights keep
at most 2^nbits values close to the originals, and the outputs match PyTorch run with the
materialised weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from server.compile.milexec import MilExecutor
from tests.compile.milexec_models import assert_close, op_types, quiet, run

W = np.random.default_rng(5).standard_normal((16, 32)).astype(np.float32)


def _package(config: Any, target: str, out: Path, compress: str) -> Path:
    import coremltools as ct
    from coremltools.converters.mil.mil import Builder as mb
    from coremltools.optimize import coreml as cto

    tgt = getattr(ct.target, target)
    prog = mb.program(input_specs=[mb.TensorSpec(shape=(3, 32))], opset_version=tgt)(
        lambda x: mb.linear(x=x, weight=W))
    with quiet():
        ml = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=tgt,
                        compute_precision=ct.precision.FLOAT32)
        op_config = cto.OptimizationConfig(global_config=config(cto))
        ml = {"quantize": cto.linear_quantize_weights, "palettize": cto.palettize_weights,
              "prune": cto.prune_weights}[compress](ml, config=op_config)
    ml.save(str(out))
    return out


def _dense(path: Path) -> np.ndarray:
    (w,) = [v for v in MilExecutor(path).weights().values()
            if getattr(v, "shape", None) == W.shape]
    return np.asarray(w, np.float32)


def _int8_per_channel(w: np.ndarray) -> np.ndarray:
    scale = np.abs(w).max(axis=1, keepdims=True) / 127
    return np.clip(np.round(w / scale), -127, 127) * scale


def _int4_per_block(w: np.ndarray, block: int) -> np.ndarray:
    blocks = w.reshape(w.shape[0], -1, block)
    scale = np.abs(blocks).max(axis=2, keepdims=True) / 7
    return (np.clip(np.round(blocks / scale), -8, 7) * scale).reshape(w.shape)


def _pruned(w: np.ndarray, sparsity: float) -> np.ndarray:
    cut = np.sort(np.abs(w).ravel())[int(sparsity * w.size) - 1]
    return np.where(np.abs(w) > cut, w, 0)


CASES = [
    ("int8-per-channel-ios16", "iOS16", "quantize", lambda c: c.OpLinearQuantizerConfig(
        mode="linear_symmetric", dtype="int8", weight_threshold=0),
     "constexpr_affine_dequantize", _int8_per_channel),
    ("int8-per-channel-ios18", "iOS18", "quantize", lambda c: c.OpLinearQuantizerConfig(
        mode="linear_symmetric", dtype="int8", granularity="per_channel", weight_threshold=0),
     "constexpr_blockwise_shift_scale", _int8_per_channel),
    ("int4-per-block-ios18", "iOS18", "quantize", lambda c: c.OpLinearQuantizerConfig(
        mode="linear_symmetric", dtype="int4", granularity="per_block", block_size=8,
        weight_threshold=0), "constexpr_blockwise_shift_scale",
     lambda w: _int4_per_block(w, 8)),
    ("pruned-ios16", "iOS16", "prune", lambda c: c.OpMagnitudePrunerConfig(
        target_sparsity=0.5, weight_threshold=0), "constexpr_sparse_to_dense",
     lambda w: _pruned(w, 0.5)),
    ("pruned-ios18", "iOS18", "prune", lambda c: c.OpMagnitudePrunerConfig(
        target_sparsity=0.5, weight_threshold=0), "constexpr_sparse_to_dense",
     lambda w: _pruned(w, 0.5)),
]


def _matches_torch(path: Path, dense: np.ndarray) -> None:
    x = np.random.default_rng(6).standard_normal((3, 32)).astype(np.float32)
    (got,) = run(path, x)
    with torch.no_grad():
        expected = torch.nn.functional.linear(torch.from_numpy(x), torch.from_numpy(dense))
    assert_close(got, expected.numpy(), "fp32", "linear on materialised weights")


@pytest.mark.parametrize(("name", "target", "compress", "config", "op", "reference"), CASES,
                         ids=[c[0] for c in CASES])
def test_compressed_weights_materialise_as_the_dequantised_originals(
        name, target, compress, config, op, reference, tmp_path):  # type: ignore[no-untyped-def]
    path = _package(config, target, tmp_path / f"{name}.mlpackage", compress)
    assert op in op_types(path), op_types(path)
    dense = _dense(path)
    expected = reference(W)
    np.testing.assert_allclose(dense, expected, rtol=1e-5, atol=1e-6 * np.abs(W).max())
    _matches_torch(path, dense)


@pytest.mark.parametrize(("target", "nbits", "granularity"), [
    ("iOS16", 4, "per_tensor"), ("iOS18", 4, "per_grouped_channel"), ("iOS18", 6, "per_tensor")])
def test_palettized_weights_are_a_small_table_close_to_the_originals(
        target, nbits, granularity, tmp_path):  # type: ignore[no-untyped-def]
    extra = {"group_size": 4} if granularity == "per_grouped_channel" else {}
    path = _package(lambda c: c.OpPalettizerConfig(
        mode="uniform", nbits=nbits, granularity=granularity, weight_threshold=0, **extra),
        target, tmp_path / "p.mlpackage", "palettize")
    assert "constexpr_lut_to_dense" in op_types(path)
    dense = _dense(path)
    groups = [dense[i:i + 4] for i in range(0, 16, 4)] if extra else [dense]
    for g, orig in zip(groups, [W[i:i + 4] for i in range(0, 16, 4)] if extra else [W],
                       strict=True):
        assert len(np.unique(g)) <= 2 ** nbits
        step = (orig.max() - orig.min()) / (2 ** nbits - 1)
        assert np.abs(g - orig).max() <= step  # every weight within one palette step
    _matches_torch(path, dense)
