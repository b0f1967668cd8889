"""The server's log handlers write to the current sys.stderr/sys.stdout, so a command run
twice in one process (tests with CliRunner, an embedding app) never writes to a stream that
the first run's caller has closed ("--- Logging error ---" in the next command's output)."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from server.commands.accesslog import StdStreamHandler, log_config


@pytest.fixture
def private_logger():
    log = logging.getLogger("modelfleet.test.streams")
    log.propagate = False
    log.setLevel(logging.INFO)
    yield log
    log.handlers.clear()


def test_both_configured_handlers_follow_the_current_std_streams():
    handlers = log_config("json")["handlers"]
    assert {h["()"] for h in handlers.values()} == {"server.commands.accesslog.StdStreamHandler"}
    assert {name: h["which"] for name, h in handlers.items()} == {
        "default": "stderr", "access": "stdout"}


def test_log_lines_follow_sys_stderr_after_the_configuring_stream_is_closed(
        monkeypatch, private_logger):
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    private_logger.addHandler(StdStreamHandler("stderr"))
    first.close()  # CliRunner closes its captured stream when the command returns
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    private_logger.info("after the first stream closed")
    assert "after the first stream closed" in second.getvalue()
    assert "Logging error" not in second.getvalue()


def test_the_stdout_handler_writes_to_the_current_stdout(monkeypatch, private_logger):
    private_logger.addHandler(StdStreamHandler("stdout"))
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    private_logger.info("GET /v1/models 200")
    assert "GET /v1/models 200" in out.getvalue()


def test_a_handler_for_another_stream_name_is_refused():
    with pytest.raises(ValueError, match="stderr or stdout"):
        StdStreamHandler("stdin")
