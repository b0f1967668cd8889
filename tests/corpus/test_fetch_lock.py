"""The model cache is shared by parallel test workers: `fetch.locked` must keep a second
process out while the first one fetches or builds, and let it in afterwards."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.corpus import fetch

REPO = Path(__file__).resolve().parents[2]
# Another process asks for the same lock without waiting; prints whether it got it.
PROBE = """
import fcntl, sys
from tests.corpus import fetch
with open(fetch.root() / "locks" / (sys.argv[1] + ".lock"), "a") as h:
    try:
        fcntl.flock(h, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("busy")
    else:
        print("free")
"""


def _probe(name: str, cache: Path) -> str:
    run = subprocess.run([sys.executable, "-c", PROBE, name], capture_output=True, text=True,
                         cwd=REPO, env={"PYTHONPATH": str(REPO),
                                        "MODELFLEET_MODEL_CACHE": str(cache)},
                         timeout=60, check=True)
    return run.stdout.strip()


def test_a_second_worker_cannot_build_a_cached_model_while_the_first_one_holds_its_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELFLEET_MODEL_CACHE", str(tmp_path))
    with fetch.locked("corpus-minilm-l6-dynamo"):
        assert _probe("corpus-minilm-l6-dynamo", tmp_path) == "busy"
        assert _probe("corpus-unet-dynamo", tmp_path) == "free"  # one lock per model
    assert _probe("corpus-minilm-l6-dynamo", tmp_path) == "free"
