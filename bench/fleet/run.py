"""Telemetry ingestion into PostgreSQL on this machine: single-report requests/s and
reports/s in batches of 50, 0 lost, with the server's CPU per request.

One run, on loopback: a fresh PostgreSQL database (migrated), signing keys, a released model
version on channel `prod`, `--devices` enrolled devices (keys made here), then the real
server as deployed: `modelfleet serve --workers N` (granian, server/http_server.py; the
ordinary `POST /v1/telemetry` route over the group commit). For each phase, the
requests are built and signed beforehand (unique report ids, fresh `sent_at`, round-robin
over the devices so the per-device rate limit is never the bottleneck) and replayed by wrk
(bench/fleet/requests.lua) for `--duration` seconds; the rows in `telemetry_events` are
counted after each round: lost = reports answered 200 − rows stored. Rounds alternate the
phases; the table gives medians (range in brackets). Server CPU per request = the server's
user+system time over the round / requests answered.

    python bench/fleet/run.py [--workers 2] [--duration 5] [--rounds 3] [--connections 32]
                              [--devices 1000] [--write-docs]

Needs PostgreSQL at 127.0.0.1:5432 (user postgres, trust) and wrk (apt-get install -y wrk).
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    drop_database,
    enrol_devices,
    free_port,
    fresh_database,
    group_cpu_seconds,
    load_note,
    postgres_cpu_seconds,
    ready_version,
    report,
    wait_http,
)

BATCH = 50


def seed(url: str, data: Path, n_devices: int) -> list[tuple[str, object]]:
    """Keys, a ready version with artifacts, a shadow rollout on `prod`, enrolled devices."""
    from manifests import ShadowThresholds
    from server.db.migrate import upgrade
    from server.jobs.interface import NullJobQueue
    from server.publish.keys import KeyPaths, init_keys
    from server.rollouts import service as ro
    from server.settings import Settings
    from server.wiring import build_core

    upgrade(url)
    init_keys(KeyPaths.for_data_dir(data), now=int(time.time()), root_keys=1, threshold=1)
    core = build_core(Settings(data_dir=data, database_url=url))
    ready_version(core, "clf", "2.0")
    ro.start_rollout(core.session_factory, core.publisher, "prod", ro.RolloutSpec(
        "clf", "2.0", 100, "shadow", shadow=ShadowThresholds(5_000, 20_000, 200),
        guard=ro.GuardRule(min_devices=1_000_000)), actor="bench", patches=NullJobQueue())
    devices = enrol_devices(core.engine, n_devices)
    core.close()
    return devices


def build_requests(devices: list[tuple[str, object]], count: int, per: int, path: Path) -> None:
    """`count` signed requests of `per` reports each, round-robin over the devices."""
    kinds = ("shadow", "health", "update")
    now = int(time.time())
    with path.open("w") as out:
        for i in range(count):
            device_id, key = devices[i % len(devices)]
            reports = [report(kinds[(i + j) % 3] if per > 1 else "shadow", now, "clf", "2.0")
                       for j in range(per)]
            body = json.dumps({"device_id": device_id, "sent_at": now, "reports": reports},
                              separators=(",", ":")).encode()
            sig = base64.b64encode(key.sign(body).signature).decode()  # type: ignore[attr-defined]
            out.write(f"{device_id}\t{sig}\t{body.decode()}\n")


def start_server(url: str, data: Path, port: int, workers: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "MODELFLEET_DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "modelfleet", "serve", "--data-dir", str(data),
         "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)],
        cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL)


def rows(url: str) -> int:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM telemetry_events")).scalar_one())
    finally:
        engine.dispose()


def settled_rows(url: str) -> int:
    """The row count once requests still in flight when wrk stopped have finished."""
    last = rows(url)
    while True:
        time.sleep(1.0)
        now = rows(url)
        if now == last:
            return now
        last = now


def run_wrk(port: int, script: Path, requests: Path, args: argparse.Namespace) -> dict[str, float]:
    threads = 2
    out = subprocess.run(
        ["wrk", "-t", str(threads), "-c", str(args.connections), "-d", f"{args.duration}s",
         "--timeout", "30s", "--latency", "-s", str(script), f"http://127.0.0.1:{port}",
         "--", str(requests), str(threads)], capture_output=True, text=True, check=True).stdout
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}
    return {"requests": total, "non2xx": int(bad.group(1)) if bad else 0,
            "p99_ms": float(p99.group(1)) * scale[p99.group(2)] if p99 else float("nan")}


def phase(name: str, per: int, port: int, url: str, server: subprocess.Popen[bytes],
          devices: list[tuple[str, object]], tmp: Path, args: argparse.Namespace,
          expect_rps: int) -> dict[str, float]:
    reqs = tmp / f"{name}.tsv"
    count = int(expect_rps * args.duration * 1.5)
    build_requests(devices, count, per, reqs)
    before_rows, before_cpu = rows(url), group_cpu_seconds(server.pid)
    dsn = url.replace("postgresql+psycopg://", "postgresql://", 1)
    before_pg = postgres_cpu_seconds(dsn)
    result = run_wrk(port, Path(__file__).with_name("requests.lua"), reqs, args)
    cpu = group_cpu_seconds(server.pid) - before_cpu
    pg_cpu = postgres_cpu_seconds(dsn) - before_pg
    stored = settled_rows(url) - before_rows
    ok = result["requests"] - result["non2xx"]
    reqs.unlink()
    return {"req_s": ok / args.duration, "reports_s": stored / args.duration,
            # Requests still in flight when wrk stopped are stored but not counted as answered.
            "lost": max(0, ok * per - stored) if result["requests"] <= count else float("nan"),
            "non2xx": result["non2xx"], "cpu_ms_per_req": 1000 * cpu / ok if ok else 0.0,
            "pg_cpu_ms_per_req": 1000 * pg_cpu / ok if ok else 0.0,
            "p99_ms": result["p99_ms"], "wrapped": float(result["requests"] > count)}


def median_range(values: list[float], fmt: str) -> str:
    return (f"{format(statistics.median(values), fmt)} "
            f"[{format(min(values), fmt)}–{format(max(values), fmt)}]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()

    name = fresh_database("mf_bench_fleet")
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    server = None
    results: dict[str, list[dict[str, float]]] = {"single": [], "batch": []}
    load_before = load_note()
    try:
        with tempfile.TemporaryDirectory(prefix="mf-bench-fleet-") as tmp_s:
            tmp = Path(tmp_s)
            devices = seed(url, tmp / "data", args.devices)
            port = free_port()
            server = start_server(url, tmp / "data", port, args.workers)
            wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60)
            # Warm-up: every device's key into the workers' caches, connections pooled.
            phase("warm", 1, port, url, server, devices, tmp,
                  argparse.Namespace(**{**vars(args), "duration": 2}), 1500)
            for i in range(args.rounds):
                results["single"].append(phase(f"single{i}", 1, port, url, server, devices,
                                               tmp, args, 3000))
                results["batch"].append(phase(f"batch{i}", BATCH, port, url, server, devices,
                                              tmp, args, 800))
                print(f"round {i + 1}: single {results['single'][-1]} batch "
                      f"{results['batch'][-1]}", file=sys.stderr)
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
        drop_database(name)
    table = render(results, args, load_before, load_note())
    print(table)
    if args.write_docs:
        write_docs(table)


def render(results: dict[str, list[dict[str, float]]], args: argparse.Namespace,
           load_before: str, load_after: str) -> str:
    def row(label: str, rs: list[dict[str, float]], per: int, goal: str) -> str:
        lost = sum(r["lost"] for r in rs)
        return (f"| {label} | {median_range([r['req_s'] for r in rs], ',.0f')} | "
                f"{median_range([r['reports_s'] for r in rs], ',.0f')} | "
                f"{median_range([r['cpu_ms_per_req'] for r in rs], '.2f')} | "
                f"{median_range([r['pg_cpu_ms_per_req'] for r in rs], '.2f')} | "
                f"{median_range([r['p99_ms'] for r in rs], '.1f')} | "
                f"{'0' if lost == 0 else lost:} | {sum(r['non2xx'] for r in rs):.0f} | {goal} |")

    date = dt.date.today().isoformat()
    lines = [
        f"### bench/fleet run ({date})",
        "",
        f"`python bench/fleet/run.py --workers {args.workers} --duration {args.duration} "
        f"--rounds {args.rounds} --connections {args.connections} --devices {args.devices}`: "
        "`modelfleet serve` (granian, the ordinary route) into PostgreSQL 127.0.0.1, signed "
        "requests replayed by "
        "wrk on loopback; medians of the rounds [range]. Server CPU = user+system of the "
        "server processes per request answered, PostgreSQL CPU = on-CPU time of the "
        "PostgreSQL backends connected to the bench's database per request answered (not the "
        "shared WAL writer and checkpointer); lost = reports answered 200 − rows stored "
        "(counted after each round).",
        "",
        "| requests | requests/s | reports/s | server CPU ms/request | PostgreSQL CPU ms/request "
        "| p99 ms | lost | non-2xx | goal |",
        "|---|---|---|---|---|---|---|---|---|",
        row("1 report each", results["single"], 1, "≥ 1,000 requests/s"),
        row(f"{BATCH} reports each", results["batch"], BATCH, "≥ 20,000 reports/s"),
        "",
        f"Machine: shared with the other agents' builds and tests while it ran ({load_before} "
        f"before, {load_after} after); wrk and PostgreSQL ran on the same cores.",
    ]
    return "\n".join(lines)


def write_docs(table: str) -> None:
    """Adds the run at the top of docs/benchmarks.md's telemetry section (the earlier runs
    stay below it, for comparison)."""
    path = ROOT / "docs" / "benchmarks.md"
    text = path.read_text()
    heading = re.compile(r"^## Fleet telemetry ingestion.*\n", re.M)
    found = heading.search(text)
    if found is None:
        text = text.rstrip() + "\n\n## Fleet telemetry ingestion\n\n" + table + "\n"
    else:
        text = text[:found.end()] + "\n" + table + "\n" + text[found.end():]
    path.write_text(text)


if __name__ == "__main__":
    main()
