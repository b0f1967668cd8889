"""Fixtures for the delta tests: small generated ONNX model pairs (bench.delta.models)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# bench/ is not an installed package; the pair generator is shared with the benchmark.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from bench.delta.models import SCENARIOS, write_pair  # noqa: E402

PAIR_BYTES = 1_500_000


@pytest.fixture(scope="session")
def model_pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """scenario -> (base.onnx, new.onnx), each about 1.5 MB."""
    root = tmp_path_factory.mktemp("pairs")
    return {s: write_pair(s, PAIR_BYTES, root / s, seed=7) for s in SCENARIOS}
