"""A second version reaches a device as a delta patch at the device's first poll after
`rollout start` — no waiting for a patch job after the rollout: the patches from versions
published before it are made while it is `patching`, before it turns ready (what `publish
--wait` waits for), so the first manifest offering it lists them. Against a real `modelfleet
serve` (in-process jobs) with the CLI and the device agent as subprocesses, as an outside
acceptance check drives them."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.cli.cli_support import WEIGHTED_INPUT, write_weighted_model
from tests.cli.conftest import Served

Run = Callable[..., subprocess.CompletedProcess[str]]


def _ok(result: subprocess.CompletedProcess[str]) -> dict:
    assert result.returncode == 0, f"{result.args}\nstdout: {result.stdout}\n{result.stderr}"
    return dict(json.loads(result.stdout))


def _device(mf: Run, served: Served, data: Path) -> dict:
    """One `device update --once` cycle of device edge-1; its JSON."""
    return _ok(mf("device", "update", "--server", served.base, "--channel", "prod",
                  "--root", str(served.data / "roots" / "1.json"), "--data-dir", str(data),
                  "--device-id", "edge-1", "--platform", "onnx", "--once"))


def _publish(mf: Run, version: str, path: Path) -> dict:
    return _ok(mf("publish", "weights", str(path), "--version", version, "--platform", "onnx",
                  "--input", WEIGHTED_INPUT, "--wait", "--json"))


def test_device_polling_right_after_rollout_start_gets_the_new_version_as_a_patch(
        mf: Run, served: Served, tmp_path: Path) -> None:
    _ok(mf("models", "create", "weights", "--task", "other", "--json"))
    device = tmp_path / "device"

    v1 = _publish(mf, "1.0.0", write_weighted_model(tmp_path / "v1.onnx"))
    assert v1["state"] == "ready" and v1["patches"] is None  # nothing published to patch from
    assert "id" in _ok(mf("rollout", "start", "prod", "weights", "1.0.0", "--percent", "100",
                          "--json"))
    first = _device(mf, served, device)
    [installed] = first["models"]
    v1_length = _full_download(v1)
    assert (installed["version"], installed["via"], installed["bytes"]) == (
        "1.0.0", "full", v1_length)

    v2 = _publish(mf, "2.0.0", write_weighted_model(tmp_path / "v2.onnx", edit=40))
    # Ready only once its patch from 1.0.0 (published) was made.
    assert v2["state"] == "ready"
    assert v2["patches"]["state"] == "done" and v2["patches"]["patches"] == 1, v2["patches"]
    started = _ok(mf("rollout", "start", "prod", "weights", "2.0.0", "--percent", "100",
                     "--json"))
    assert isinstance(started["id"], int)
    update = _device(mf, served, device)  # at once: no patch job runs after the rollout
    [updated] = update["models"]
    v2_length = _full_download(v2)
    assert (update["outcome"], updated["outcome"], updated["version"]) == (
        "updated", "updated", "2.0.0")
    assert updated["via"] == "patch", update
    assert 0 < updated["bytes"] < v2_length / 4, (updated["bytes"], v2_length)
    # Every key the agent printed before is still there, next to the new two.
    assert set(updated) == {"model", "outcome", "reason", "error", "version", "sha256",
                            "via", "bytes"}
    assert update["candidates"] == []

    again = _device(mf, served, device)
    [current] = again["models"]
    assert (current["outcome"], current["via"], current["bytes"]) == ("up_to_date", "held", 0)


def _full_download(version: dict) -> int:
    """What a device downloads for it in full: the artifact, or its compressed copy."""
    artifact = version["builds"][0]["artifact"]
    return int((artifact["compressed"] or artifact)["length"])
