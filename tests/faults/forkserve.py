"""A fork server for the random-kill runs: this process imports the API once (several
seconds on a loaded machine), then forks one real server process per request, which starts
in well under a second. Each child leads a session of its own, takes its MODELFLEET_*
settings from the request, and runs the same app (`server.app.create_app`, lifespan and
in-process compile worker included) under uvicorn on a loopback port — so its crash points
SIGKILL a real process serving real HTTP, as under `modelfleet serve` (which
tests/faults/test_kill_steps.py drives itself).

Protocol (stdin/stdout, one JSON line each): {"env": {...}, "port": N, "log": PATH} →
{"pid": PID}. Children are reaped automatically (SIGCHLD ignored), so a dead one is gone.
Usage: python -m tests.faults.forkserve
"""

from __future__ import annotations

import json
import os
import signal
import sys


def serve_child(env: dict[str, str], port: int, log: str) -> None:
    os.setsid()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    for key in [k for k in os.environ if k.startswith("MODELFLEET_")]:
        del os.environ[key]
    os.environ.update(env)
    import uvicorn

    from server.app import create_app
    from server.settings import Settings

    uvicorn.run(create_app(Settings()), host="127.0.0.1", port=port, log_level="warning")
    os._exit(0)


def main() -> None:
    import uvicorn  # noqa: F401  (imported before any fork: the children start warm)

    import server.app  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                serve_child(request["env"], request["port"], request["log"])
            finally:
                os._exit(1)
        print(json.dumps({"pid": pid}), flush=True)


if __name__ == "__main__":
    main()
