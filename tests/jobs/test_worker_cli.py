"""`modelfleet worker` refuses a database it cannot queue on, saying what to do instead."""

from __future__ import annotations

from typer.testing import CliRunner

from modelfleet.cli import app


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
