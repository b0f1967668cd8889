"""The API client's error mapping against real HTTP servers (a 5xx and a non-JSON answer
from a plain http.server), and where the CLI takes its server and token from."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from modelfleet import config
from modelfleet.api_client import ApiClient, RefusedError, ServerError
from tests.cli.cli_support import run_cli


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/v1/models"):
            body = json.dumps({"detail": "database unreachable", "code": "unavailable",
                               "fix": "check MODELFLEET_DATABASE_URL"}).encode()
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
        elif self.path.startswith("/v1/audit"):
            body = json.dumps({"detail": "this endpoint needs a token", "code": "auth"}).encode()
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
        else:
            body = b"<html>a proxy page</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        # Refuse before reading the body (as an auth-first server does) and hang up.
        body = json.dumps({"detail": "missing API token", "code": "unauthenticated"}).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def plain_server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_server_errors_carry_the_servers_detail_and_fix(plain_server: str) -> None:
    with ApiClient(plain_server) as client:
        with pytest.raises(ServerError) as failed:
            client.get("/v1/models")
        assert failed.value.message == "database unreachable (HTTP 503)"
        assert failed.value.fix == "check MODELFLEET_DATABASE_URL"
        assert failed.value.status == 503 and failed.value.code == "unavailable"
        with pytest.raises(RefusedError) as refused:
            client.get("/v1/audit")
        assert "modelfleet login" in (refused.value.fix or "")  # a 401 says how to fix it
        with pytest.raises(ServerError, match="not JSON"):
            client.get("/somewhere")


def test_an_upload_refused_before_its_body_reports_the_refusal(plain_server: str,
                                                               tmp_path) -> None:
    big = tmp_path / "model.onnx"
    big.write_bytes(b"\0" * (32 * 1024 * 1024))
    with ApiClient(plain_server) as client, pytest.raises(RefusedError) as refused:
        client.upload_version("m", {"model": big}, {"version": "1.0.0"})
    assert refused.value.status == 401  # not "connection reset by peer"


def test_a_5xx_exits_4_with_one_line(plain_server: str, tmp_path) -> None:
    env = {"MODELFLEET_SERVER": plain_server, "MODELFLEET_CONFIG": str(tmp_path / "none"),
           "PATH": "/usr/bin:/bin"}
    r = run_cli("models", "list", env=env)
    assert r.returncode == 4
    assert r.stderr.strip() == ("error: database unreachable (HTTP 503) "
                                "(fix: check MODELFLEET_DATABASE_URL)")


def test_flags_beat_environment_beat_config_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MODELFLEET_CONFIG", str(tmp_path / "c.json"))
    monkeypatch.delenv("MODELFLEET_SERVER", raising=False)
    monkeypatch.delenv("MODELFLEET_TOKEN", raising=False)
    assert config.resolve(None, None) == config.Target(config.DEFAULT_SERVER, None)
    config.save("http://fleet:8000", "mf_stored_secret_0123456789")
    assert (tmp_path / "c.json").stat().st_mode & 0o777 == 0o600
    assert config.resolve(None, None) == config.Target("http://fleet:8000",
                                                       "mf_stored_secret_0123456789")
    monkeypatch.setenv("MODELFLEET_TOKEN", "mf_env")
    assert config.resolve(None, None).token == "mf_env"
    assert config.resolve(None, "mf_flag").token == "mf_flag"
    monkeypatch.setenv("MODELFLEET_SERVER", "http://env:1/")
    assert config.resolve(None, None) == config.Target("http://env:1", "mf_env")
    assert config.resolve("http://flag:2", None).server == "http://flag:2"


def test_the_stored_token_is_not_sent_to_another_server(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MODELFLEET_CONFIG", str(tmp_path / "c.json"))
    monkeypatch.delenv("MODELFLEET_TOKEN", raising=False)
    monkeypatch.delenv("MODELFLEET_SERVER", raising=False)
    config.save("http://fleet:8000", "mf_stored_secret_0123456789")
    assert config.resolve("http://attacker.example", None).token is None
    assert config.mask("mf_stored_secret_0123456789") == "mf_store…"


def test_a_server_without_a_scheme_is_a_usage_error(tmp_path) -> None:
    r = run_cli("models", "list", "--server", "127.0.0.1:8000",
                env={"MODELFLEET_CONFIG": str(tmp_path / "none"), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "--server http://127.0.0.1:8000" in r.stderr


def test_an_unreadable_config_file_is_a_usage_error(tmp_path) -> None:
    bad = tmp_path / "c.json"
    bad.write_text("{not json")
    r = run_cli("models", "list", env={"MODELFLEET_CONFIG": str(bad), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "modelfleet login" in r.stderr
