"""`modelfleet serve --workers 2 --log-format json` as an operator runs it: /metrics sums
every worker process's counters (prometheus_client multiprocess mode, a fresh directory per
run, removed at exit), every log line is one JSON object, and the access line carries the
request id the response echoed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support.metrics import sample
from tests.support.served import free_port, wait_until_up

REPO = Path(__file__).resolve().parents[2]
REQUESTS = 60


def counter_files(run: Path) -> list[Path]:
    return sorted(run.glob("counter_*.db"))


def per_file(path: Path) -> float:
    """GET /v1/models 200s counted in one process's file."""
    from prometheus_client.mmap_dict import MmapedDict

    total = 0.0
    if path.stat().st_size < 4:  # the process created it and has not laid it out yet
        return total
    for key, value, *_rest in MmapedDict.read_all_values_from_file(str(path)):
        name, _help, labels, *_ = json.loads(key)
        if (name == "modelfleet_http_requests" and labels.get("route") == "/v1/models"
                and labels.get("status") == "200"):
            total += value
    return total


def get_models(base: str) -> bool:
    """A new connection each (so that both workers take some)."""
    with urllib.request.urlopen(f"{base}/v1/models", timeout=10) as r:
        return r.status == 200


def scrape(base: str) -> str:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        return r.read().decode()


def test_serve_with_two_workers_sums_metrics_and_writes_json_logs(tmp_path: Path) -> None:
    port = free_port()
    parent = tmp_path / "tmp"
    parent.mkdir()
    env = {**os.environ, "TMPDIR": str(parent)}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.pop("MODELFLEET_LOG_FORMAT", None)
    out, err = tmp_path / "out.log", tmp_path / "err.log"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from modelfleet.cli import main; main()", "serve",
             "--data-dir", str(tmp_path / "data"), "--port", str(port), "--workers", "2",
             "--log-format", "json"], stdout=o, stderr=e, env=env, cwd=REPO)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_until_up(f"{base}/healthz", proc, err)
            runs = list(parent.glob("modelfleet-metrics-*"))
            assert len(runs) == 1  # serve made a fresh directory for this run
            # Concurrent connections until both worker processes served some (each writes
            # its own counter file; the kernel hands a connection to whichever accepts).
            sent = 0
            deadline = time.monotonic() + 60
            with ThreadPoolExecutor(8) as pool:
                while len([n for n in map(per_file, counter_files(runs[0])) if n > 0]) < 2:
                    assert time.monotonic() < deadline, "one worker took every connection"
                    assert all(pool.map(lambda _: get_models(base), range(REQUESTS)))
                    sent += REQUESTS
            request = urllib.request.Request(f"{base}/v1/models?limit=3",
                                             headers={"X-Request-Id": "trace-abc.1"})
            with urllib.request.urlopen(request, timeout=10) as r:
                assert r.headers["X-Request-Id"] == "trace-abc.1"
            # A worker counts a request after its last byte is sent, so the client can see
            # its answer a moment before the count lands: wait for the total, then check
            # that every scrape, whichever process answers it, sums both (a process-local
            # registry would see only its own share of the requests).
            counted = time.monotonic() + 10
            while sample(scrape(base), "modelfleet_http_requests_total", method="GET",
                         route="/v1/models", status="200") != sent + 1:
                assert time.monotonic() < counted, "the requests were never all counted"
                time.sleep(0.05)
            for _ in range(4):
                assert sample(scrape(base), "modelfleet_http_requests_total", method="GET",
                              route="/v1/models", status="200") == sent + 1
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    assert not runs[0].exists()  # removed at exit: the next run starts from zero
    lines = [line for line in (out.read_text() + err.read_text()).splitlines()
             if line and not line.startswith("ModelFleet API on ")]  # serve's one banner
    bad = [line for line in lines if not line.startswith("{")]
    assert not bad, bad
    records = [json.loads(line) for line in lines]  # every log line is one JSON object
    traced = [r for r in records if r.get("request_id") == "trace-abc.1"]
    assert len(traced) == 1
    assert (traced[0]["logger"], traced[0]["route"], traced[0]["status"]) == (
        "modelfleet.access", "/v1/models", 200)
    assert any(r["logger"].startswith("_granian") for r in records)  # the server's too
