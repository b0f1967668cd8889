"""SIGKILL `modelfleet keys rotate --rotate-release` at each of its crash points (root N+1
written / new release key in place / one of two channels re-signed), then start the server:
it must finish the rotation (server/publish/keys.py `finish_interrupted_rotation`) and
re-sign every channel with the key the newest root names (server/publish/resign.py), so a
device that took root N+1 never meets a manifest it must refuse."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from server.publish.keys import KeyPaths, root_versions
from tests.faults.harness import REPO, ForkServer, rig


@pytest.mark.slow
@pytest.mark.parametrize("step", ["rotate.root_written", "rotate.release_replaced",
                                  "resign.rekeyed"])
def test_a_rotation_killed_midway_is_finished_by_the_next_start(
        step: str, backend: tuple[str, Any], forker: ForkServer, tmp_path: Path) -> None:
    url, s3 = backend
    with rig(tmp_path, url, s3, forker) as r:
        r.start()  # two channels, each with a signed manifest (no model needed)
        for channel in ("prod", "beta"):
            assert r.call("POST", "/v1/channels", json={"name": channel}).status_code == 201
        r.stop()
        rotate = subprocess.run(
            [sys.executable, "-m", "modelfleet", "keys", "rotate", "--data-dir", str(r.data),
             "--rotate-release"], cwd=REPO, env=r.env(step), capture_output=True,
            start_new_session=True, timeout=120)
        assert rotate.returncode == -signal.SIGKILL, rotate.stderr
        assert root_versions(KeyPaths.for_data_dir(r.data)) == [1, 2]

        r.start()
        try:
            r.wait("every channel signed by root v2's key", lambda: r.violations() == [], 30)
        finally:
            r.stop()
        assert not (r.data / "keys" / "release-next.key").exists()
