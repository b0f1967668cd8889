"""Mixed-load soak: polls, telemetry, two compiling uploads, ramps and a halt at once, on
PostgreSQL with two API processes and a worker, bounded and on loopback only.

One run: a fresh database on the machine's PostgreSQL (migrated), signing keys, two ready
releases on `prod` (`soak-ramp` at 10 %, ramped by the operator to 100 % during the run;
`soak-halt` at 50 %, halted halfway), `--devices` enrolled devices, then two
`modelfleet serve --workers 1` processes on their own ports over the same database and data
directory (two replicas) and one `modelfleet worker` (procrastinate). The traffic
(bench/soak/load.py) runs for `--duration` seconds: polls at `--poll-rate`/s with
If-None-Match, signed telemetry batches at `--telemetry-rate`/s, the two uploads compiling
(onnx), the ramps and the halt. Printed:

- p50 / p99 latency per kind of request;
- 5xx: intended = a 503 or 507 with an error code and Retry-After (a deliberate, retryable
  refusal, e.g. upload slots busy); unintended = every other 5xx; apart from those, requests
  the load generator gave up on (no answer in 30 s: on a loaded machine its own event loop
  is starved as much as the servers);
- lost reports: ids of every report in a batch answered 200 that are not in
  `telemetry_events` (each looked up after the run);
- queue latency of the build jobs: created (upload committed) → started (a worker took it);
- server CPU per request: user+system of both API processes over the load / requests.

    python -m bench.soak [--duration 60] [--long] [--poll-rate 20] [--telemetry-rate 5]
                         [--devices 500] [--write-docs]

`--long` runs 300 s. Needs PostgreSQL at 127.0.0.1:5432 (user postgres, trust).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    drop_database,
    enrol_devices,
    free_port,
    fresh_database,
    group_cpu_seconds,
    load_note,
    ready_version,
    wait_http,
)
from bench.soak import load

ROOT = Path(__file__).resolve().parents[2]
LONG_S = 300
SETTLE_S = 240  # the uploads' builds must settle within this after the load


def onnx_model(scale: float) -> bytes:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])
    k = numpy_helper.from_array(np.array(scale, dtype=np.float32), name="k")
    graph = helper.make_graph([helper.make_node("Mul", ["x", "k"], ["y"])], "g", [x], [y], [k])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]
                             ).SerializeToString()


def seed(url: str, data: Path, n_devices: int) -> tuple[str, list[tuple[str, Any]], int, int]:
    """(token, devices, id of the rollout to ramp, id of the rollout to halt)."""
    from server.auth import create_token
    from server.db.migrate import upgrade
    from server.jobs.interface import NullJobQueue
    from server.publish.keys import KeyPaths, init_keys
    from server.rollouts import service as ro
    from server.settings import Settings
    from server.wiring import build_core

    upgrade(url)
    init_keys(KeyPaths.for_data_dir(data), now=int(time.time()), root_keys=1, threshold=1)
    core = build_core(Settings(data_dir=data, database_url=url))
    try:
        ids = []
        for model, share in (("soak-ramp", 10), ("soak-halt", 50)):
            ready_version(core, model, "1.0")
            view = ro.start_rollout(core.session_factory, core.publisher, "prod",
                                    ro.RolloutSpec(model, "1.0", share), actor="soak",
                                    patches=NullJobQueue())
            ids.append(view.record.id)
        for model in ("soak-up-a", "soak-up-b"):
            from server.services import registry

            with core.session_factory() as s:
                registry.create_model(s, "soak", name=model)
                s.commit()
        with core.session_factory() as s:
            _, token = create_token(s, ["publish", "rollout"], name="soak")
            s.commit()
        devices = enrol_devices(core.engine, n_devices, prefix="soak")
    finally:
        core.close()
    return token, devices, ids[0], ids[1]


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "modelfleet", *args], cwd=ROOT, env=env,
                            start_new_session=True, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)


def query(url: str, sql: str, params: dict[str, Any] | None = None) -> list[Any]:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(sql), params or {}))
    finally:
        engine.dispose()


def lost_reports(url: str, ids: list[str]) -> int:
    stored = {row[0] for row in query(
        url, "SELECT report_id FROM telemetry_events WHERE report_id = ANY(:ids)",
        {"ids": ids})}
    return len(set(ids) - stored)


def queue_latencies(url: str) -> list[float]:
    """Per build: created (the upload committed) → started (a worker claimed it, its last
    attempt). procrastinate deletes a finished job with its events, so the builds' own
    timestamps are the record."""
    rows = query(url, "SELECT created_at, started_at FROM builds WHERE started_at IS NOT NULL")
    return [(started - created).total_seconds() for created, started in rows]


def wait_settled(url: str, models: list[str]) -> dict[str, str]:
    deadline = time.monotonic() + SETTLE_S
    while True:
        rows = query(url, """
            SELECT m.name, v.state FROM model_versions v JOIN models m ON m.id = v.model_id
            WHERE m.name = ANY(:names)""", {"names": models})
        states = {name: str(state) for name, state in rows}
        if (len(states) == len(models) and all(s in ("ready", "failed")
                                               for s in states.values())) \
                or time.monotonic() > deadline:
            return states
        time.sleep(1.0)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--long", action="store_true", help=f"run {LONG_S} s")
    # Rates a shared 2-core machine sustains beside everything else; raise them elsewhere.
    ap.add_argument("--poll-rate", type=float, default=20)
    ap.add_argument("--telemetry-rate", type=float, default=5)
    ap.add_argument("--reports-per-batch", type=int, default=20)
    ap.add_argument("--devices", type=int, default=500)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    if args.long:
        args.duration = LONG_S

    name = fresh_database("mf_bench_soak")
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    procs: list[subprocess.Popen[bytes]] = []
    load_before = load_note()
    try:
        with tempfile.TemporaryDirectory(prefix="mf-soak-") as tmp_s:
            tmp = Path(tmp_s)
            data = tmp / "data"
            token, devices, ramp_id, halt_id = seed(url, data, args.devices)
            env = {**os.environ, "PYTHONPATH": str(ROOT), "MODELFLEET_DATABASE_URL": url,
                   "MODELFLEET_DATA_DIR": str(data), "MODELFLEET_JOB_BACKEND": "procrastinate"}
            ports = [free_port(), free_port()]
            servers = [start(["serve", "--data-dir", str(data), "--host", "127.0.0.1",
                              "--port", str(p), "--workers", "1"], env, tmp / f"serve-{p}.log")
                       for p in ports]
            worker = start(["worker", "--data-dir", str(data)], env, tmp / "worker.log")
            procs = [*servers, worker]
            for p in ports:
                wait_http(f"http://127.0.0.1:{p}/readyz", timeout=90)
            meta = json.dumps({"version": "1.0.0", "platforms": ["onnx"], "inputs": [
                {"name": "x", "dtype": "float32", "shape": [1, 3, 8, 8]}]})
            plan = load.Plan(
                bases=[f"http://127.0.0.1:{p}" for p in ports], token=token, devices=devices,
                duration_s=args.duration, poll_rate=args.poll_rate,
                telemetry_rate=args.telemetry_rate, reports_per_batch=args.reports_per_batch,
                ramp_rollout=ramp_id, halt_rollout=halt_id,
                uploads=[("soak-up-a", onnx_model(2.0), meta),
                         ("soak-up-b", onnx_model(3.0), meta)])
            cpu_before = sum(group_cpu_seconds(s.pid) for s in servers)
            out = asyncio.run(load.run(plan))
            server_cpu = sum(group_cpu_seconds(s.pid) for s in servers) - cpu_before
            states = wait_settled(url, ["soak-up-a", "soak-up-b"])
            result = summarize(out, url, server_cpu, states, args)
            logs = {p.name: p.read_text()[-3000:] for p in tmp.glob("*.log")}
    finally:
        for proc in procs:
            stop(proc)
        drop_database(name)
    table = render(result, args, load_before, load_note())
    print(table)
    if result["unintended"] or result["no_answer_n"]:
        for log_name, tail in logs.items():
            print(f"--- {log_name} (tail)\n{tail}", file=sys.stderr)
    if args.write_docs:
        write_docs(table)


def summarize(out: load.Outcome, url: str, server_cpu: float, states: dict[str, str],
              args: argparse.Namespace) -> dict[str, Any]:
    by_kind: dict[str, list[load.Sample]] = {}
    for s in out.samples:
        by_kind.setdefault(s.kind, []).append(s)
    intended = [s for s in out.samples if s.status in (503, 507) and s.code and s.retry_after]
    unintended = [s for s in out.samples if s.status >= 500 and s not in intended]
    no_answer = [s for s in out.samples if s.status == 0]
    answered = [s for s in out.samples if s.status]
    queue = queue_latencies(url)
    return {
        "kinds": {kind: {"n": len(ss), "ok": sum(1 for s in ss if s.status < 400 and s.status),
                         "p50": 1000 * pct([s.seconds for s in ss], 0.50),
                         "p99": 1000 * pct([s.seconds for s in ss], 0.99)}
                  for kind, ss in sorted(by_kind.items())},
        "intended": len(intended), "unintended": len(unintended),
        "no_answer": sorted({s.kind for s in no_answer}), "no_answer_n": len(no_answer),
        "behind": out.behind, "lag_p99": 1000 * pct(out.lag, 0.99),
        "unintended_detail": sorted({(s.kind, s.status, s.code) for s in unintended}),
        "accepted": len(out.accepted_ids), "lost": lost_reports(url, out.accepted_ids),
        "queue": queue, "states": states,
        "cpu_ms": 1000 * server_cpu / len(answered) if answered else float("nan"),
        "rps": len(answered) / args.duration,
    }


def render(r: dict[str, Any], args: argparse.Namespace, load_before: str,
           load_after: str) -> str:
    date = dt.date.today().isoformat()
    queue = r["queue"]
    lines = [
        f"### bench/soak run ({date})",
        "",
        f"`python -m bench.soak --duration {args.duration:g} --poll-rate {args.poll_rate:g} "
        f"--telemetry-rate {args.telemetry_rate:g} --reports-per-batch "
        f"{args.reports_per_batch} --devices {args.devices}`: two `modelfleet serve --workers 1` "
        "processes and one `modelfleet worker` on PostgreSQL 127.0.0.1, loopback; polls, "
        "telemetry, two uploads compiling, four operator ramps and a halt at once.",
        "",
        "| requests | count | answered < 400 | p50 ms | p99 ms |",
        "|---|---|---|---|---|",
        *(f"| {kind} | {k['n']} | {k['ok']} | {k['p50']:.1f} | {k['p99']:.1f} |"
          for kind, k in r["kinds"].items()),
        "",
        "| figure | value | goal |",
        "|---|---|---|",
        f"| requests/s (all kinds, both API processes) | {r['rps']:.0f} | — |",
        f"| server CPU per request (both API processes) | {r['cpu_ms']:.2f} ms | — |",
        f"| reports accepted (in batches answered 200) | {r['accepted']} | — |",
        f"| lost reports (accepted, not in the database) | {r['lost']} | 0 |",
        f"| intended 5xx (503/507 with code and Retry-After) | {r['intended']} | — |",
        f"| unintended 5xx | {r['unintended']} "
        f"{r['unintended_detail'] if r['unintended'] else ''} | 0 |",
        f"| no answer within 30 s (client gave up) | {r['no_answer_n']} "
        f"{r['no_answer'] if r['no_answer_n'] else ''} | 0 |",
        f"| arrivals not sent: the generator had {load.IN_FLIGHT} open per kind already | "
        f"{sum(r['behind'].values())} {r['behind'] if r['behind'] else ''} | 0 |",
        f"| generator lag p99 (arrival sent after it was due) | {r['lag_p99']:.0f} ms | — |",
        f"| build jobs: queue latency created → started, median / max | "
        f"{statistics.median(queue) if queue else float('nan'):.2f} s / "
        f"{max(queue) if queue else float('nan'):.2f} s ({len(queue)} jobs) | — |",
        f"| uploads after the run | {', '.join(f'{m}: {s}' for m, s in r['states'].items())}"
        " | ready |",
        "",
        f"Machine: shared with the other agents' builds and tests while it ran ({load_before} "
        f"before, {load_after} after); the load generator, the worker and PostgreSQL ran on "
        "the same cores.",
    ]
    return "\n".join(lines)


def write_docs(table: str) -> None:
    """Adds the run at the top of docs/benchmarks.md's soak section (created if missing)."""
    path = ROOT / "docs" / "benchmarks.md"
    text = path.read_text()
    heading = "## Mixed-load soak (issue 24)\n"
    if heading not in text:
        text = text.rstrip() + "\n\n" + heading + "\n" + table + "\n"
    else:
        at = text.index(heading) + len(heading)
        text = text[:at] + "\n" + table + "\n" + text[at:]
    path.write_text(text)


if __name__ == "__main__":
    main()
