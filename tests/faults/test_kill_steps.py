"""SIGKILL a real server process at every named crash point of the server
(server/crashpoints.py) — on SQLite with the local blob directory and on PostgreSQL with S3
over HTTP (moto) — and check after each restart that it repaired what the crash left and
that every invariant holds (tests/support/invariants.py).

One chain of server lives per backend: life k is armed at step k and first finishes what
life k-1 left, then drives the release's life on until step k kills it. Lives are forked
warm (tests/faults/forkserve.py); one test runs a publish step under the real
`modelfleet serve` (granian) to show its whole process group dies and recovers the same way
(starting it costs seconds more than a fork).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.faults.harness import SERVE_STEPS, ForkServer, finish, life, rig


@pytest.mark.slow
def test_a_server_killed_at_every_step_recovers_with_every_invariant(
        backend: tuple[str, Any], forker: ForkServer, tmp_path: Path) -> None:
    url, s3 = backend
    with rig(tmp_path, url, s3, forker) as r:
        for step in SERVE_STEPS:
            assert life(r, step), f"the drive never reached {step}"
        finish(r)


@pytest.mark.slow
@pytest.mark.postgres
def test_modelfleet_serve_killed_between_commit_and_bucket_write_recovers(
        postgres_url: str, s3_bucket: Any, tmp_path: Path) -> None:
    with rig(tmp_path, postgres_url, s3_bucket) as r:
        assert life(r, "publish.committed")
        finish(r)
