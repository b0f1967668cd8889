"""The repository stays small: no tracked file is large, so models and caches stay out of git.

A submission larger than the hosting limit is refused whole, so a model file, a venv or a
screenshot committed by accident costs every change made with it. Large inputs are built or
fetched (and cached) by the tests instead.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_TRACKED_BYTES = 1024 * 1024
MAX_TOTAL_BYTES = 32 * 1024 * 1024


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [ROOT / p for p in out.stdout.decode().split("\0") if p]


def test_no_tracked_file_is_larger_than_one_mib() -> None:
    big = [(p.relative_to(ROOT).as_posix(), p.stat().st_size) for p in _tracked()
           if p.is_file() and not p.is_symlink() and p.stat().st_size > MAX_TRACKED_BYTES]
    assert big == [], f"tracked files over {MAX_TRACKED_BYTES} bytes (build them in tests): {big}"


def test_tracked_tree_stays_small() -> None:
    total = sum(p.stat().st_size for p in _tracked() if p.is_file() and not p.is_symlink())
    assert total < MAX_TOTAL_BYTES, f"tracked files total {total} bytes"


def test_no_symlink_or_venv_is_tracked() -> None:
    bad = [p.relative_to(ROOT).as_posix() for p in _tracked()
           if p.is_symlink() or ".venv" in p.relative_to(ROOT).parts]
    assert bad == []
