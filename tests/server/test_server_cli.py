"""The operator commands, run as a user would: `modelfleet tokens …` and `modelfleet serve`
(a real uvicorn process on a free port), then the README quick-start over HTTP."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.server_testdata import make_onnx_bytes

MODELFLEET = [sys.executable, "-m", "modelfleet"]


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MODELFLEET, *args], capture_output=True, text=True, timeout=120,
                          check=check, cwd=Path(__file__).resolve().parents[2])


def test_tokens_create_prints_the_token_alone_on_the_last_line(tmp_path: Path) -> None:
    out = run("tokens", "create", "--data-dir", str(tmp_path), "--scope", "publish",
              "--scope", "rollout", "--name", "ci").stdout
    token = out.strip().splitlines()[-1]
    assert token.startswith("mf_") and " " not in token and len(token) > 40
    listed = json.loads(run("tokens", "list", "--data-dir", str(tmp_path), "--json").stdout)
    assert [(t["id"], t["scopes"], t["revoked"]) for t in listed] == [
        (1, ["publish", "rollout"], False)]
    assert token not in json.dumps(listed)  # the secret is never shown again


def test_tokens_create_json_output(tmp_path: Path) -> None:
    out = run("tokens", "create", "--data-dir", str(tmp_path), "--scope", "admin", "--json")
    doc = json.loads(out.stdout)
    assert doc["scopes"] == ["admin"] and doc["token"].startswith("mf_")


def test_tokens_create_refuses_unknown_scope(tmp_path: Path) -> None:
    r = run("tokens", "create", "--data-dir", str(tmp_path), "--scope", "root", check=False)
    assert r.returncode == 2 and "unknown scope 'root'" in r.stderr


def test_tokens_create_an_enroll_token_with_quota_rate_and_expiry(tmp_path: Path) -> None:
    out = run("tokens", "create", "--data-dir", str(tmp_path), "--scope", "enroll",
              "--device-quota", "500", "--enroll-per-hour", "50", "--expires-in", "30d",
              "--json")
    doc = json.loads(out.stdout)
    assert (doc["scopes"], doc["device_quota"], doc["enroll_per_hour"]) == (["enroll"], 500, 50)
    assert doc["expires_at"] > time.strftime("%Y-%m-%dT", time.gmtime(time.time() + 29 * 86_400))
    r = run("tokens", "create", "--data-dir", str(tmp_path), "--scope", "publish",
            "--device-quota", "5", check=False)
    assert r.returncode == 2 and "for enroll tokens" in r.stderr
    r = run("tokens", "create", "--data-dir", str(tmp_path), "--scope", "enroll",
            "--expires-in", "soon", check=False)
    assert r.returncode == 2 and "not a duration" in r.stderr


def test_tokens_revoke(tmp_path: Path) -> None:
    run("tokens", "create", "--data-dir", str(tmp_path), "--scope", "admin")
    assert "revoked token 1" in run("tokens", "revoke", "1", "--data-dir", str(tmp_path)).stdout
    listed = json.loads(run("tokens", "list", "--data-dir", str(tmp_path), "--json").stdout)
    assert listed[0]["revoked"] is True
    missing = run("tokens", "revoke", "99", "--data-dir", str(tmp_path), check=False)
    assert missing.returncode == 1 and "no token with id 99" in missing.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    port = _free_port()
    data = tmp_path / "data"
    env = {**os.environ, "MODELFLEET_JOB_BACKEND": "inprocess"}
    proc = subprocess.Popen(
        [*MODELFLEET, "serve", "--data-dir", str(data), "--host", "127.0.0.1",
         "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
        cwd=Path(__file__).resolve().parents[2],
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    out = proc.stdout.read().decode() if proc.stdout else ""
                    raise AssertionError(f"server did not start:\n{out}") from None
                time.sleep(0.2)
        yield base, data
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_quickstart_serve_token_create_model_upload_list(served: tuple[str, Path]) -> None:
    base, data = served
    assert (data / "modelfleet.db").exists()  # migrated at start
    token = run("tokens", "create", "--data-dir", str(data), "--scope", "publish") \
        .stdout.strip().splitlines()[-1]
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, timeout=30) as c:
        r = c.post("/v1/models", json={"name": "mobilenet", "task": "classification"},
                   headers=headers)
        assert r.status_code == 201, r.text
        metadata = {"version": "1.0.0", "platforms": ["onnx"],
                    "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 3, 8, 8]}]}
        r = c.post("/v1/models/mobilenet/versions", headers=headers,
                   files={"model": ("model.onnx", make_onnx_bytes(), "application/octet-stream")},
                   data={"metadata": json.dumps(metadata)})
        assert r.status_code == 201, r.text
        got = c.get("/v1/models/mobilenet/versions/1.0.0").json()
        assert got["state"] in {"uploaded", "compiling", "ready", "failed"}
        listed = c.get("/v1/models/mobilenet/versions").json()["versions"]
        assert [v["version"] for v in listed] == ["1.0.0"]
        assert c.post("/v1/models", json={"name": "x"}).status_code == 401
