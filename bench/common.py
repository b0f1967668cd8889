"""Helpers the benchmarks share: a free loopback port, waiting for a server, and a
server's own CPU time (apart from the load generator's on the same cores)."""

from __future__ import annotations

import os
import socket
import time
import urllib.request
from pathlib import Path


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
