"""The compile-area CLI: `modelfleet worker` (refuses SQLite, saying what to do instead) and
`modelfleet builds` (gate results as a table or JSON)."""

from __future__ import annotations

from typer.testing import CliRunner

from modelfleet.cli import app
from server.compile.sandbox import SandboxPolicy, pipeline_factory

# Builds as a deployment runs them by default: in the compile sandbox.
SANDBOXED = pipeline_factory(SandboxPolicy())


def test_worker_on_the_sqlite_default_explains_the_embedded_mode(tmp_path, monkeypatch):
    monkeypatch.delenv("MODELFLEET_DATABASE_URL", raising=False)
    result = CliRunner().invoke(app, ["worker", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "needs PostgreSQL" in result.output and "modelfleet serve" in result.output


def test_worker_help_lists_its_tuning_options():
    result = CliRunner().invoke(app, ["worker", "--help"])
    assert result.exit_code == 0
    for option in ("--concurrency", "--heartbeat", "--stalled-after"):
        assert option in result.output


def test_builds_command_shows_gates_and_json(convnet_files, tmp_path):
    import json

    from fastapi.testclient import TestClient

    from server.app import create_app
    from server.jobs.inprocess import InProcessJobQueue
    from server.jobs.interface import NullJobQueue
    from server.jobs.runner import BuildRunner
    from tests.jobs.jobs_helpers import make_settings, publish_token, uploader

    data = tmp_path / "data"
    data.mkdir()
    settings = make_settings(f"sqlite:///{(data / 'modelfleet.db').resolve()}", data)
    api = create_app(settings, job_queue=NullJobQueue())
    with TestClient(api) as client:
        uploader(client, publish_token(settings))(
            "conv", "1.0.0", convnet_files.onnx,
            [{"name": "image", "dtype": "float32", "shape": [1, 3, 16, 16]}], ["onnx"],
            reference=convnet_files.reference)
    InProcessJobQueue(BuildRunner(api.state.session_factory, api.state.blob_store,
                                  worker_id="w", pipeline_factory=SANDBOXED)).drain()

    runner = CliRunner()
    out = runner.invoke(app, ["builds", "conv", "1.0.0", "--data-dir", str(data), "--json",
                                  "--wait"])
    assert out.exit_code == 0, out.output
    snap = json.loads(out.output)
    assert snap["state"] == "ready" and snap["builds"][0]["gates"]["numeric"]["passed"]
    table = runner.invoke(app, ["builds", "conv", "1.0.0", "--data-dir", str(data)])
    assert table.exit_code == 0 and "passed" in table.output and "onnx" in table.output
    missing = runner.invoke(app, ["builds", "conv", "9.9.9", "--data-dir", str(data)])
    assert missing.exit_code == 1 and "9.9.9" in missing.output
