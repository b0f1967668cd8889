"""Which server modules one upload and one device update run through, counted by tracing a
real in-process server (docs/architecture.md cites the numbers).

    python scripts/request_paths.py [--list]

Every function call in every thread (`sys.setprofile` + `threading.setprofile`) is recorded
by its source file and thread while the phase runs: the upload request; its build (the
in-process job queue's worker thread, compile sandbox off so the build runs in this process
and is traced); the rollout start; the device's poll, 304, root and artifact download. The
request phases count the request's threads (the worker's idle polling is left out), the build
phase the worker thread. A file counts when any of its code ran; imports done before a phase
(app start) do not count for it. SQLite, local blob store, a tiny ONNX model built for the
`onnx` and `coreml` platforms; the ramp loop's period is set past the run.
"""

from __future__ import annotations

import argparse
import base64
import json
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fastapi.testclient import TestClient  # noqa: E402

from server.app import create_app  # noqa: E402
from server.auth import create_token  # noqa: E402
from server.db.migrate import upgrade  # noqa: E402
from server.settings import Settings  # noqa: E402
from tests.server.server_testdata import make_onnx_bytes  # noqa: E402
from tests.support.server_keys import init_test_keys  # noqa: E402

PACKAGES = ("server", "manifests", "client_sdk")
# The in-process worker and the heartbeats of the jobs it runs (server/jobs/inprocess.py,
# server/jobs/lease.py).
WORKER_THREADS = ("modelfleet-compile", "heartbeat-")


def measure() -> dict[str, set[str]]:
    tmp = Path(tempfile.mkdtemp(prefix="mf-paths-"))
    url = f"sqlite:///{tmp / 'server.db'}"
    upgrade(url)
    data = tmp / "data"
    init_test_keys(data, root_keys=2)
    settings = Settings(env="development", data_dir=data, database_url=url, sandbox="off",
                        manifest_lifetime_seconds=86_400, ramp_check_seconds=86_400)
    phases: dict[str, set[str]] = {}
    # The in-process worker thread must be traced too: start the app inside the trace of the
    # build phase's profile hook (threading.setprofile applies to threads started later), so
    # the whole app runs under one hook and each phase reads what ran during it.
    current: list[set[tuple[bool, str]]] = []  # (in the worker thread?, file)
    roots = tuple(str(ROOT / p) + "/" for p in PACKAGES)

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and current:
            name = frame.f_code.co_filename
            if name.startswith(roots):
                worker = threading.current_thread().name.startswith(WORKER_THREADS)
                current[-1].add((worker, str(Path(name).relative_to(ROOT))))

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        with TestClient(create_app(settings), base_url="http://testserver") as client:
            app: Any = client.app
            with app.state.session_factory() as s:
                _, secret = create_token(s, ["publish", "rollout"], name="paths")
                s.commit()
            client.headers["Authorization"] = f"Bearer {secret}"
            assert client.post("/v1/models", json={"name": "clf", "task": "classification"}
                               ).status_code == 201
            meta = {"version": "1.0.0", "platforms": {"onnx": {}, "coreml": {}},
                    "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 3, 8, 8]}]}

            def phase(name: str, fn: Callable[[], Any], *, worker: bool = False) -> Any:
                current.append(set())
                try:
                    return fn()
                finally:
                    phases[name] = {f for w, f in current.pop() if w == worker}

            r = phase("upload request", lambda: client.post(
                "/v1/models/clf/versions", data={"metadata": json.dumps(meta)},
                files={"model": ("model.onnx", make_onnx_bytes(), "application/octet-stream")}))
            assert r.status_code == 201, r.text

            def settle() -> str:
                # Read with sqlite3 itself, not through our code: only the worker is traced.
                deadline = time.monotonic() + 900
                while time.monotonic() < deadline:
                    with sqlite3.connect(tmp / "server.db") as db:
                        (state,), = db.execute("SELECT state FROM model_versions").fetchall()
                    if state in ("ready", "failed"):
                        return str(state)
                    time.sleep(0.1)
                raise TimeoutError("the build did not settle")

            state = phase("build (in-process worker)", settle, worker=True)
            assert state == "ready", client.get("/v1/models/clf/versions/1.0.0").json()
            r = phase("rollout start", lambda: client.post(
                "/v1/channels/prod/rollouts", json={"model": "clf", "version": "1.0.0",
                                                    "percentage": 100}))
            assert r.status_code == 201, r.text
            client.headers.pop("Authorization")

            def device_update() -> None:
                poll = client.get("/v1/channels/prod/manifest")
                assert poll.status_code == 200
                etag = poll.headers["etag"]
                assert client.get("/v1/channels/prod/manifest",
                                  headers={"If-None-Match": etag}).status_code == 304
                assert client.get("/v1/root/1.json").status_code == 200
                doc = json.loads(base64.b64decode(poll.json()["payload"]))
                url = doc["models"]["clf"]["releases"][0]["artifacts"][0]["url"]
                assert client.get(url).status_code in (200, 302)

            phase("device update (poll, 304, root, artifact)", device_update)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return phases


def server_files(files: set[str]) -> list[str]:
    return sorted(f for f in files if f.startswith("server/"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print each phase's files")
    args = parser.parse_args()
    phases = measure()
    upload = phases["upload request"] | phases["build (in-process worker)"]
    rows = [*phases.items(), ("upload end to end (request + build)", upload)]
    print(f"{'phase':48} {'server files':>12} {'manifests/ files':>16}")
    for name, files in rows:
        manifests_files = [f for f in files if f.startswith("manifests/")]
        print(f"{name:48} {len(server_files(files)):>12} {len(manifests_files):>16}")
    if args.list:
        for name, files in rows:
            print(f"\n{name}:")
            for f in server_files(files):
                print(f"  {f}")


if __name__ == "__main__":
    main()
