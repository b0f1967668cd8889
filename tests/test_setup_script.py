"""scripts/setup, run in a scratch copy of the repository with a fake python (it logs each
pip call instead of installing): switching between `./scripts/serve` (server,client,compile)
and `./scripts/test` (those plus dev) installs once per missing extra, not on every switch."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

FAKE_PYTHON = """#!/usr/bin/env bash
# "python -m venv DIR" makes DIR/bin/python (this script again); anything else is logged.
if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0
fi
if [ "$1" = "--version" ]; then echo "Python 3.11.0"; exit 0; fi
echo "$*" >> "$PIP_LOG"
"""


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "setup", tmp_path / "scripts" / "setup")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return fake, tmp_path / "pip.log"


def _run(tmp_path: Path, fake: Path, log: Path, extras: str) -> str:
    env = {**os.environ, "PYTHON": str(fake), "PIP_LOG": str(log)}
    r = subprocess.run(["bash", str(tmp_path / "scripts" / "setup"), extras], env=env,
                       capture_output=True, text=True, timeout=60, check=True)
    return r.stdout


def _installs(log: Path) -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [line for line in lines if "install -q -e" in line]


def test_switching_between_serve_and_test_installs_each_extra_once(tmp_path: Path) -> None:
    fake, log = _setup(tmp_path)
    first = _run(tmp_path, fake, log, "server,client,compile")
    assert "first run takes a few minutes" in first
    assert _installs(log) == ["-m pip install -q -e .[server,client,compile]"]
    more = _run(tmp_path, fake, log, "server,client,compile,dev")  # ./scripts/test
    assert "adding modelfleet[dev]" in more and "first run" not in more
    assert len(_installs(log)) == 2
    for extras in ("server,client,compile", "server,client,compile,dev", "client", "dev"):
        assert _run(tmp_path, fake, log, extras) == ""  # a subset: nothing to do
    assert len(_installs(log)) == 2


def test_a_changed_pyproject_installs_again(tmp_path: Path) -> None:
    fake, log = _setup(tmp_path)
    _run(tmp_path, fake, log, "server,client,compile,dev")
    with (tmp_path / "pyproject.toml").open("a") as f:
        f.write("\n# changed\n")
    assert "first run takes a few minutes" in _run(tmp_path, fake, log, "server")
    assert _installs(log)[-1] == "-m pip install -q -e .[server]"
    assert _run(tmp_path, fake, log, "server") == ""
    assert "adding modelfleet[dev]" in _run(tmp_path, fake, log, "server,dev")
