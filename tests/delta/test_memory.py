"""mfdelta1 creates and applies in bounded memory: peak allocations stay flat as files grow.

NumPy registers its buffers with tracemalloc, so the traced peak covers the arrays the coder
holds per op (zstd's own buffers are not traced; they are bounded by the format's caps).
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from client_sdk.patching import apply_patch
from server.delta.mfdelta1 import create_mfdelta1

MB = 1024 * 1024


def traced_peak(action: Callable[[], None]) -> int:
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def write_pair(directory: Path, size: int) -> tuple[Path, Path]:
    rng = np.random.default_rng(size)
    old = rng.standard_normal(size // 4).astype("<f4")
    new = (old * (1 + 1e-4 * rng.standard_normal(old.shape))).astype("<f4")
    new[: size // 64] = 0  # some bytes change a lot, most a little
    base, target = directory / f"base{size}", directory / f"new{size}"
    base.write_bytes(old.tobytes())
    target.write_bytes(new.tobytes())
    return base, target


@pytest.mark.slow
def test_mfdelta1_peak_memory_does_not_grow_with_the_file(tmp_path: Path) -> None:
    peaks = {}
    for size in (8 * MB, 64 * MB):
        base, new = write_pair(tmp_path, size)
        patch, out = tmp_path / f"patch{size}", tmp_path / f"out{size}"
        create_peak = traced_peak(lambda: create_mfdelta1(base, new, patch))
        apply_peak = traced_peak(
            lambda: apply_patch("mfdelta1", base, patch, out, max_output=size)
        )
        assert out.read_bytes() == new.read_bytes()
        peaks[size] = (create_peak, apply_peak)
        for path in (base, new, patch, out):
            path.unlink()
    small, large = peaks[8 * MB], peaks[64 * MB]
    # 8x the data, (nearly) the same working set: at most one more op's worth.
    assert large[0] < small[0] + 8 * MB, peaks
    assert large[1] < small[1] + 8 * MB, peaks
    assert large[0] < 48 * MB and large[1] < 48 * MB, peaks
