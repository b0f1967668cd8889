"""Helpers the benchmarks share: a free loopback port, waiting for a server, a server's own
CPU time (apart from the load generator's on the same cores), a fresh PostgreSQL database on
the machine's server, enrolled devices and the machine's load."""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                r.read()
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up within {timeout} s")


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU time of every live process in a process group (a server's master
    and workers), from /proc: the server's own cost, apart from wrk's on the same cores."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / tick


def postgres_cpu_seconds(dsn: str) -> float:
    """On-CPU time of the local PostgreSQL backends connected to the database of `dsn` (a
    libpq URL), from /proc/<pid>/schedstat (nanoseconds): the database's share of the work
    apart from other clients of the same server. Shared background processes (WAL writer,
    checkpointer) are not counted; backends that ended are not either, so measure while the
    server under test keeps its connections. 0.0 when PostgreSQL runs on another machine."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        pids = [row[0] for row in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()")]
    total = 0
    for pid in pids:
        try:
            total += int((Path("/proc") / str(pid) / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # ended meanwhile, or not on this machine
            continue
    return total / 1e9


def fresh_database(prefix: str) -> str:
    """A new, empty database on the machine's PostgreSQL (PG_ADMIN): its name."""
    import psycopg

    name = f"{prefix}_{os.getpid()}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return name


def drop_database(name: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def enrol_devices(engine: Any, count: int, prefix: str = "bench") -> list[tuple[str, Any]]:
    """`count` devices with keys made here, inserted as enrolled (half android, half ios):
    [(device_id, nacl SigningKey)]."""
    from nacl.signing import SigningKey
    from sqlalchemy import insert

    from server.db import models as db
    from server.db.types import utcnow

    now = utcnow()
    rows, devices = [], []
    for i in range(count):
        key = SigningKey.generate()
        device_id = f"{prefix}-{i:05d}"
        rows.append({"id": device_id, "profile": {"platform": ("android", "ios")[i % 2]},
                     "first_seen_at": now, "last_seen_at": now,
                     "public_key": bytes(key.verify_key).hex(),
                     "keyid": hashlib.sha256(bytes(key.verify_key)).hexdigest(),
                     "enrolled_at": now, "active_versions": {}})
        devices.append((device_id, key))
    with engine.begin() as conn:
        conn.execute(insert(db.Device), rows)
    return devices


def load_note() -> str:
    la = os.getloadavg()
    return f"load average {la[0]:.1f} / {la[1]:.1f} / {la[2]:.1f} on {os.cpu_count()} cores"


def ready_version(core: Any, model: str, version: str,
                  platforms: tuple[str, ...] = ("android", "ios")) -> None:
    """A model version in state `ready` with one small artifact per platform, made straight
    in the database and blob store of `core` (server.wiring.Core): no compile."""
    from tests.support.versions import add_version

    add_version(core.session_factory, core.blob_store, model, version,
                {p: f"{model}-{version}-{p}".encode() * 64 for p in platforms})


def report(kind: str, at: int, model: str, version: str,
           channel: str = "prod") -> dict[str, object]:
    """One device report of `kind` (shadow | health | update) as docs/shadow.md specifies,
    with a fresh random id."""
    base = {"id": secrets.token_hex(16), "kind": kind, "at": at, "model": model,
            "version": version, "artifact_sha256": None, "channel": channel}
    if kind == "shadow":
        return base | {"samples": 180, "dropped": 2, "kl_mean_micro": 1200, "kl_max_micro": 9000,
                       "cosine_min_micro": None, "snr_min_centi_db": None,
                       "active_p50_us": 900, "active_p99_us": 1500, "candidate_p50_us": 1000,
                       "candidate_p99_us": 1700, "verdict": "pending", "reason": None}
    if kind == "health":
        return base | {"predictions": 500, "errors": 0, "p99_us": 1500, "rolled_back": False}
    return base | {"event": "downloaded", "via": "patch", "bytes": 123_456, "reason": None}
