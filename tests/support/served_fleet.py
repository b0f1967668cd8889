"""A real `modelfleet serve` (granian, server/http_server.py) over a seeded fleet, for tests
that must talk to the HTTP server itself over sockets: the data (tokens, two released model
versions, a rollout on `prod`, enrolled devices) is made in-process first through the API
(tests/fleet/conftest.py `open_fleet`), then the server process is started on the same
database and data directory, its settings passed as MODELFLEET_* variables.

Raw HTTP/1.1 helpers too: a request's bytes, reading whole answers, parsing one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server.settings import Settings
from tests.fleet.conftest import fleet_settings, open_fleet
from tests.support.fleet_devices import FleetDevice
from tests.support.served import free_port, tree_status_kib, wait_until_up

REPO = Path(__file__).resolve().parents[2]


@dataclass
class ServedFleet:
    port: int
    proc: subprocess.Popen[bytes]
    settings: Settings
    log: Path  # the server's stdout and stderr (access log included)
    ops: dict[str, str]  # rollout token headers
    publish: dict[str, str]  # publish token headers
    devices: dict[str, FleetDevice]  # enrolled, by id

    def raw(self, data: bytes, *, until_close: bool = False, timeout: float = 10) -> bytes:
        """Sends `data` on a new connection; the first whole answer (or all, to EOF)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(data)
            return read_all(s) if until_close else read_responses(s, 1)

    def rss_kib(self) -> int:
        """Resident memory of the server's processes (the serve process and its workers)."""
        return tree_status_kib(self.proc.pid, "VmRSS")

    def events(self) -> int:
        """Telemetry rows stored."""
        from sqlalchemy import create_engine, text

        engine = create_engine(self.settings.resolved_database_url)
        try:
            with engine.connect() as conn:
                return int(conn.execute(text("SELECT count(*) FROM telemetry_events"))
                           .scalar_one())
        finally:
            engine.dispose()

    def metrics(self) -> str:
        r, _ = parse(self.raw(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n"))
        assert r.status == 200
        return r.body.decode()


def settings_env(settings: Settings) -> dict[str, str]:
    """The MODELFLEET_* variables that rebuild `settings` in a server process."""
    env = {}
    for name, value in settings.model_dump(mode="json", exclude_unset=True).items():
        env[f"MODELFLEET_{name.upper()}"] = (value if isinstance(value, str)
                                             else json.dumps(value))
    return env


@contextmanager
def served_fleet(root: Path, database_url: str, *, devices: int = 4,
                 **settings: Any) -> Iterator[ServedFleet]:
    """The seeded fleet under a real server; `settings` override Settings fields."""
    config = fleet_settings(database_url, root, **settings)
    enrolled: dict[str, FleetDevice] = {}
    for fleet in open_fleet(config):
        from server.auth import create_token

        with fleet.client.app.state.session_factory() as s:  # type: ignore[attr-defined]
            _, publish = create_token(s, ["publish"], name="publisher")
            s.commit()
        fleet.rollout("1.0")
        for i in range(devices):
            device = fleet.enroll(FleetDevice(f"served-{i:02d}"))
            enrolled[device.device_id] = device
        ops = fleet.ops
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELFLEET_")}
    env.update(settings_env(config), PYTHONPATH=str(REPO))
    env.pop("MODELFLEET_DATA_DIR")
    port = free_port()
    log = root / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "modelfleet", "serve", "--data-dir",
             str(config.data_dir), "--port", str(port)],
            cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until_up(f"http://127.0.0.1:{port}/healthz", proc, log, 60)
        yield ServedFleet(port, proc, config, log, ops,
                          {"Authorization": f"Bearer {publish}"}, enrolled)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# ------------------------------------------------------------------ raw HTTP/1.1


def request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
            *extra: str, length: bool = True, version: str = "1.1") -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: t",
             *(f"{k}: {v}" for k, v in (headers or {}).items()), *extra]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return "\r\n".join([*lines, "", ""]).encode() + body


def chunked(method: str, path: str, body: bytes, headers: dict[str, str],
            trailers: dict[str, str]) -> bytes:
    """A chunked request whose last chunk carries `trailers` as trailer fields."""
    head = request(method, path, b"", headers, "Transfer-Encoding: chunked", length=False)
    tail = "".join(f"{k}: {v}\r\n" for k, v in trailers.items()).encode()
    return head + b"%x\r\n%s\r\n0\r\n%s\r\n" % (len(body), body, tail)


@dataclass
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name), None)


def parse(data: bytes) -> tuple[Answer, bytes]:
    """The first answer in `data` (Content-Length framed) and what follows it."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    assert sep, f"no complete answer in {data[:200]!r}"
    lines = head.decode("latin-1").split("\r\n")
    headers = [(k.strip().lower(), v.strip()) for k, _, v in
               (line.partition(":") for line in lines[1:])]
    length = int(next((v for k, v in headers if k == "content-length"), "0"))
    return Answer(int(lines[0].split()[1]), headers, rest[:length]), rest[length:]


def _complete(data: bytes, count: int) -> bool:
    rest = data
    for _ in range(count):
        head, sep, body = rest.partition(b"\r\n\r\n")
        if not sep:
            return False
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        if int(head.split()[1]) == 100:  # an interim answer has no body
            length = 0
        if len(body) < length:
            return False
        rest = body[length:]
    return True


def read_responses(s: socket.socket, count: int, timeout: float = 10) -> bytes:
    """Reads until `count` whole answers arrived (or the peer closed, or `timeout`)."""
    data = b""
    deadline = time.monotonic() + timeout
    while not _complete(data, count) and time.monotonic() < deadline:
        s.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            break
        data += chunk
    return data


def read_all(s: socket.socket, timeout: float = 10) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            chunk = s.recv(65536)
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        data += chunk
    return data
