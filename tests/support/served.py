"""Running a real server in tests: a free loopback port, and waiting until it answers."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
