"""A real `modelfleet serve` (embedded default, in-process compile jobs) on a free loopback
port with keys and a publish+rollout token, for the CLI to talk to over HTTP; and `mf(...)`,
the CLI run as a subprocess with MODELFLEET_SERVER / MODELFLEET_TOKEN in its environment
(pipes, so no progress is drawn)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli.cli_support import MODELFLEET, REPO, run_cli
from tests.support.served import free_port, wait_until_up


@dataclass(frozen=True)
class Served:
    base: str
    data: Path
    token: str
    log: Path

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MODELFLEET_")}
        env |= {"MODELFLEET_SERVER": self.base, "MODELFLEET_TOKEN": self.token,
                "MODELFLEET_CONFIG": str(self.data.parent / "no-config.json"),
                "PYTHONPATH": str(REPO)}
        return env | extra


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("served")
    data, log = root / "data", root / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELFLEET_")}
    # Unbuffered: tests read the access log while the server runs.
    env |= {"MODELFLEET_JOB_BACKEND": "inprocess", "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1"}
    subprocess.run([*MODELFLEET, "keys", "init", "--data-dir", str(data)], env=env, cwd=REPO,
                   check=True, capture_output=True, timeout=120)
    token = subprocess.run(
        [*MODELFLEET, "tokens", "create", "--data-dir", str(data), "--scope", "publish",
         "--scope", "rollout"], env=env, cwd=REPO, check=True, capture_output=True, text=True,
        timeout=120).stdout.strip().splitlines()[-1]
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen([*MODELFLEET, "serve", "--data-dir", str(data), "--port",
                                 str(port)], env=env, cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{base}/healthz", proc, log)
        yield Served(base, data, token, log)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def mf(served: Served) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env=served.env(**env))

    return run
