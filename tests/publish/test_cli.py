"""`modelfleet keys …` as a user runs it, then the API serving what it wrote."""

from __future__ import annotations

import json
import stat
import time

from fastapi.testclient import TestClient
from typer.testing import CliRunner

import manifests
from modelfleet.cli import app as cli
from server.app import create_app
from server.auth import create_token
from server.settings import Settings


def test_keys_init_then_server_serves_root_v1_and_rotation_adds_v2(tmp_path):
    data = tmp_path / "data"
    runner = CliRunner()
    r = runner.invoke(cli, ["keys", "init", "--data-dir", str(data), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["root_version"] == 1 and out["root_threshold"] == 2
    assert stat.S_IMODE((data / "keys").stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in (data / "keys").glob("*.key"))
    r = runner.invoke(cli, ["keys", "init", "--data-dir", str(data)])
    assert r.exit_code == 1 and "keys rotate" in r.output
    with TestClient(create_app(Settings(data_dir=data))) as client:
        served = client.get("/v1/root/1.json")
        assert served.status_code == 200
        assert served.content == (data / "roots" / "1.json").read_bytes()
        v1 = manifests.load_trusted_root(served.content)
        with client.app.state.session_factory() as s:
            _, secret = create_token(s, ["rollout"])
            s.commit()
        assert client.post("/v1/channels", json={"name": "prod"},
                           headers={"Authorization": f"Bearer {secret}"}).status_code == 201
        # rotation while the server runs: the CLI stores v2 in the database directly and
        # re-signs every channel with the new release key
        r = runner.invoke(cli, ["keys", "rotate", "--data-dir", str(data), "--rotate-release"])
        assert r.exit_code == 0, r.output
        assert "re-signed 1 channel(s)" in r.output
        v2 = manifests.verify_root_update(v1, client.get("/v1/root/2.json").content)
        assert v2.roles["release"].keyids != v1.roles["release"].keyids
        m = manifests.verify_manifest(v2, client.get("/v1/channels/prod/manifest").content,
                                      now=int(time.time()), channel="prod", trusted=None)
        assert m.serial == 2
    r = runner.invoke(cli, ["keys", "show", "--data-dir", str(data), "--json"])
    assert [row["version"] for row in json.loads(r.output)] == [1, 2]
