"""The README's quick start (the CLI) and its curl twin in docs/api.md, each run word for word
(only the port differs) against a real `modelfleet serve`: keys, token, model, upload,
compile, rollout, device update, predict. Keeps both true: a command that stops working there
fails here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.served import free_port, wait_until_up

REPO = Path(__file__).resolve().parent.parent


def quickstart_script(doc: str = "README.md", heading: str = "## Quick start") -> str:
    text = (REPO / doc).read_text(encoding="utf-8")
    assert heading in text, f"{doc} lost its {heading!r} section"
    section = text.split(heading, 1)[1]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match, f"{doc} lost its quick-start shell block"
    return match.group(1)


@pytest.mark.slow
@pytest.mark.parametrize(("doc", "heading"), [("README.md", "## Quick start"),
                                              ("docs/api.md", "## Quick start with curl")])
def test_readme_quick_start_runs_word_for_word(tmp_path: Path, doc: str, heading: str) -> None:
    script = quickstart_script(doc, heading)
    port = free_port()
    script = script.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    # The README runs from the repository root, where .venv lives.
    venv = Path(sys.prefix)  # the virtualenv running this suite
    assert (venv / "bin" / "activate").exists(), f"tests must run inside a venv, not {venv}"
    (tmp_path / ".venv").symlink_to(venv)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELFLEET_")}
    log = tmp_path / "serve.log"
    modelfleet = venv / "bin" / "modelfleet"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [str(modelfleet), "serve", "--data-dir", "./data", "--host", "127.0.0.1",
             "--port", str(port)], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until_up(f"http://127.0.0.1:{port}/healthz", server, log)
        run = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=600)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert run.returncode == 0, f"stdout:\n{run.stdout[-3000:]}\nstderr:\n{run.stderr[-3000:]}"
    if doc == "README.md":  # the CLI's own answers: the gate reports and the rollout's id
        assert "mobilenet 1.0.0: ready" in run.stdout
        assert "onnx · shape variant default · succeeded" in run.stdout
        assert "rollout 1: mobilenet 1.0.0 on prod at 100%, active" in run.stdout
        assert "prod: manifest serial" in run.stdout
    # The last command is `device predict`: one JSON document from the rolled-out version.
    prediction = json.loads(run.stdout.strip().splitlines()[-1])
    assert prediction["model"] == "mobilenet" and prediction["version"] == "1.0.0"
    assert prediction["outputs"]["linear"]["shape"] == [1, 10]
    # And the device's update step reported an update to that version (curl prints no final
    # newline, so the agent's JSON may share a line with the manifest before it).
    update = next(json.loads(line[line.index('{"active"'):])
                  for line in run.stdout.splitlines() if '{"active"' in line)
    assert update["outcome"] == "updated"
    assert update["active"][0]["version"] == "1.0.0"
