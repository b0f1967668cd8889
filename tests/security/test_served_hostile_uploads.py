"""The two code-on-load payloads uploaded through a real `modelfleet serve` subprocess (the
embedded default as users run it: SQLite, local blobs, in-process compile worker, a release
key under DATA_DIR/keys): both builds fail with a clear message, the key's seed is in no
response and in no line the server logged, and the pickle's commands changed nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.security import hostile_models as hostile
from tests.support.served import free_port, wait_until_up

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
X = [{"name": "x", "dtype": "float32", "shape": [1, 4]}]


def _mf(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "modelfleet", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=180)


def test_code_on_load_payloads_through_modelfleet_serve_leak_and_change_nothing(
        tmp_path: Path) -> None:
    data = tmp_path / "srv"
    assert _mf("keys", "init", "--data-dir", str(data), "--root-keys", "1",
               "--threshold", "1").returncode == 0
    made = _mf("tokens", "create", "--data-dir", str(data), "--name", "attacker",
               "--scope", "publish")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip().splitlines()[-1]
    key_path = data / "keys" / "release.key"
    seed = json.loads(key_path.read_text())["seed_hex"]
    tag = uuid.uuid4().hex[:8]
    markers = [tmp_path / f"pwned-{tag}", data / f"pwned-{tag}", Path(f"/tmp/pwned-{tag}")]
    thief = hostile.torchscript_key_thief(tmp_path / "thief.pt", key_path)
    pickled = hostile.pt2_pickle_payload(tmp_path / "evil.pt2", "import os\n" + "".join(
        f"os.system('touch {m}')\n" for m in markers))

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "modelfleet", "serve", "--data-dir",
                                 str(data), "--port", str(port)], cwd=REPO,
                                env={**os.environ, "MODELFLEET_PUBLIC_BASE_URL": base},
                                stdout=sink, stderr=subprocess.STDOUT)
        try:
            wait_until_up(f"{base}/v1/root/1.json", proc, log, 60)
            auth = {"Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=base, timeout=60) as c:
                for name, path in (("thief", thief), ("pickled", pickled)):
                    assert c.post("/v1/models", json={"name": name},
                                  headers=auth).status_code == 201
                    r = c.post(f"/v1/models/{name}/versions", headers=auth,
                               files={"model": (path.name, path.read_bytes())},
                               data={"metadata": json.dumps(
                                   {"version": "1.0.0", "platforms": ["onnx"], "inputs": X})})
                    assert r.status_code == 201, r.text
                states = {}
                deadline = time.monotonic() + 600
                while time.monotonic() < deadline and len(states) < 2:
                    for name in ("thief", "pickled"):
                        state = c.get(f"/v1/models/{name}/versions/1.0.0").json()["state"]
                        if state in ("ready", "failed"):
                            states[name] = state
                    time.sleep(1)
                texts = [c.get(p).text for name in ("thief", "pickled") for p in (
                    f"/v1/models/{name}/versions/1.0.0",
                    f"/v1/models/{name}/versions/1.0.0/builds",
                    f"/v1/models/{name}/versions/1.0.0/builds?logs=true")]
                builds = {name: c.get(f"/v1/models/{name}/versions/1.0.0/builds").json()
                          for name in ("thief", "pickled")}
        finally:
            proc.terminate()
            proc.wait(30)
    assert states == {"thief": "failed", "pickled": "failed"}, states
    assert all(seed not in t and seed[:16] not in t for t in texts)
    assert seed not in log.read_text(errors="replace")
    assert [m for m in markers if m.exists()] == []
    assert "cannot load" in builds["thief"][0]["error"]
    assert "cannot load" in builds["pickled"][0]["error"]
