"""Running a real server in tests: a free loopback port, waiting until it answers, and the
memory of its processes (`modelfleet serve` runs the app in worker processes of its own)."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # gw0, gw1, ... under pytest-xdist
    return int(worker[2:]) if worker[2:].isdigit() else 0


def free_port() -> int:
    """A loopback port free right now, from a range of its own per pytest-xdist worker
    (below the kernel's ephemeral range): two workers never hand out the same port, so a
    server that lost a race for its port cannot be mistaken for another worker's."""
    base = 10_000 + (_worker_index() % 4) * 5_000
    for _ in range(200):
        port = random.randrange(base, base + 5_000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {base}..{base + 4_999}")


def wait_until_up(url: str, proc: subprocess.Popen[bytes], log: Path,
                  timeout: float = 90) -> None:
    """Returns once `url` answers 200; fails with the server's log tail if `proc` exits or
    the timeout passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"modelfleet serve exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"modelfleet serve did not come up: {log.read_text()[-2000:]}")


def process_tree(pid: int) -> list[int]:
    """`pid` and every process under it."""
    pids, i = [pid], 0
    while i < len(pids):
        try:
            for task in Path(f"/proc/{pids[i]}/task").iterdir():
                pids.extend(int(c) for c in (task / "children").read_text().split())
        except FileNotFoundError:  # exited meanwhile
            pass
        i += 1
    return pids


def tree_status_kib(pid: int, field: str) -> int:
    """The sum of a /proc status field (VmRSS, VmHWM; KiB) over `pid`'s process tree."""
    total = 0
    for each in process_tree(pid):
        try:
            lines = Path(f"/proc/{each}/status").read_text().splitlines()
        except FileNotFoundError:
            continue
        total += next((int(line.split()[1]) for line in lines
                       if line.startswith(field + ":")), 0)
    return total
