"""Fixtures for the delta tests: small generated ONNX model pairs (bench.delta.models)."""

from __future__ import annotations

from pathlib import Path

import pytest

# bench/ is not an installed package: it is imported from the repository root, which pytest
# puts on sys.path because tests/ is a package.
from bench.delta.models import SCENARIOS, write_pair

PAIR_BYTES = 1_500_000


@pytest.fixture(scope="session")
def model_pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """scenario -> (base.onnx, new.onnx), each about 1.5 MB."""
    root = tmp_path_factory.mktemp("pairs")
    return {s: write_pair(s, PAIR_BYTES, root / s, seed=7) for s in SCENARIOS}
