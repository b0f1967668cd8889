"""Kill test: a real subprocess running an update is SIGKILLed at every step in turn; on
restart the active bundle is exactly the old or exactly the new one, and it verifies."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from client_sdk.install import STEPS, BundleStore
from tests.client.http_repo import serve
from tests.client.onnx_models import scaled_model
from tests.client.simulator import FakeClock, RepositorySimulator

UPDATER_STEPS = ("manifest_verified", "patch_applied", "download_done")
REPO = Path(__file__).resolve().parents[2]


def run_driver(base: str, data_dir: Path, root: Path, kill_at: str = ""):
    cmd = [sys.executable, "-m", "tests.client.kill_driver", base, str(data_dir), str(root)]
    return subprocess.run(cmd + ([kill_at] if kill_at else []), cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """v1 and v2 (with a bsdiff4 patch from v1) served over loopback HTTP."""
    import time

    sim = RepositorySimulator(FakeClock(time.time()))
    v1, v2 = scaled_model(1.0, padding=4000), scaled_model(2.0, padding=4000, tweak=10)
    a1 = sim.artifact(v1)
    sim.publish("clf", [sim.release("1.0", [a1])])
    root = tmp_path_factory.mktemp("root") / "root.json"
    root.write_bytes(sim.pinned_root)
    with serve(sim) as base:
        yield sim, base, root, v1, v2, a1


@pytest.fixture(scope="module")
def installed_v1(repo, tmp_path_factory):
    """A device data dir that trusts the repo and runs clf 1.0 (copied by each test)."""
    sim, base, root, _v1, _v2, a1 = repo
    sim.publish("clf", [sim.release("1.0", [a1])])
    data = tmp_path_factory.mktemp("baseline") / "device"
    first = run_driver(base, data, root)
    assert first.returncode == 0, first.stderr
    return data


@pytest.mark.parametrize("step", UPDATER_STEPS + STEPS)
def test_sigkill_at_every_install_step_leaves_exactly_old_or_new(repo, installed_v1, tmp_path,
                                                                 step):
    sim, base, root, v1, v2, a1 = repo
    data = tmp_path / "device"
    shutil.copytree(installed_v1, data)
    old_sha, new_sha = hashlib.sha256(v1).hexdigest(), hashlib.sha256(v2).hexdigest()

    sim.publish("clf", [sim.release("2.0", [sim.artifact(v2, patches=[sim.patch(v1, v2)])]),
                        sim.release("1.0", [a1])])
    killed = run_driver(base, data, root, kill_at=step)
    assert killed.returncode == -signal.SIGKILL, f"step {step} never reached: {killed.stderr}"

    store = BundleStore(data)
    store.recover_all()
    active = store.active("clf")
    assert active is not None and active.sha256 in (old_sha, new_sha)
    assert store.verify(active)
    assert active.version == ("1.0" if active.sha256 == old_sha else "2.0")

    again = run_driver(base, data, root)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["models"] == [["clf", "2.0", new_sha]]
    final = BundleStore(data).active("clf")
    assert final is not None and final.sha256 == new_sha and BundleStore(data).verify(final)
    leftovers = list((data / "models" / "clf").glob("tmp/*")) + list(
        (data / "models" / "clf").glob("journal.json"))
    assert leftovers == []


@pytest.mark.parametrize("step", ["stage_renamed", "journal_written", "pointer_written"])
def test_sigkill_during_the_first_install_leaves_nothing_or_the_new_bundle(repo, tmp_path, step):
    sim, base, root, v1, _v2, a1 = repo
    sim.publish("clf", [sim.release("1.0", [a1])])
    data = tmp_path / "device"
    killed = run_driver(base, data, root, kill_at=step)
    assert killed.returncode == -signal.SIGKILL
    store = BundleStore(data)
    store.recover_all()
    active = store.active("clf") if "clf" in store.models() else None
    assert active is None or (active.sha256 == hashlib.sha256(v1).hexdigest()
                              and store.verify(active))
    assert run_driver(base, data, root).returncode == 0
    assert BundleStore(data).active("clf").version == "1.0"
