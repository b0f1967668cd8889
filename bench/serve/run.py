"""Manifest polls per second, 200 and 304, ModelFleet's API vs nginx serving the same bytes.

One run on this machine, on loopback: builds a real signed manifest (keys, SQLite, a channel
with a two-platform release at 10%), writes the exact bytes under an nginx root, starts
uvicorn (--workers N, the poll fast path or plain httptools, uvloop, no access log; with
--compare-plain both) and nginx (worker_processes N, no access log), and drives each with wrk
(--latency) in alternating rounds: 200, and 304 (If-None-Match with the server's own ETag).
Prints a markdown table and, with --write-docs, replaces the "## Serving" section of
docs/benchmarks.md.

    python bench/serve/run.py [--workers 2] [--duration 5] [--rounds 3] [--connections 64]
                              [--http httptools] [--compare-plain]
                              [--no-proxy-headers] [--reload-delay 0.3] [--write-docs]

Besides req/s, p99 and server CPU per poll, the table gives the share of the API's polls
answered by the protocol shortcut (each worker counts which path answered, in
`ManifestCache.stats`). `--reload-delay S` makes every manifest reload take S seconds longer:
a stand-in for slower cores, on which a reload takes a larger part of the 1 s cache time.

Needs Debian's nginx and wrk (apt-get install -y nginx wrk).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import free_port, group_cpu_seconds, wait_http  # noqa: E402


def prepare(data: Path) -> None:
    """Keys, database, a channel with one rollout: a realistic signed manifest."""
    import time as _t

    from server.blobstore import LocalBlobStore
    from server.db import models as db
    from server.db.migrate import upgrade
    from server.db.session import make_engine, make_session_factory
    from server.publish import rollouts as ro
    from server.publish.keys import KeyPaths, init_keys
    from server.settings import Settings
    from server.wiring import make_publisher

    init_keys(KeyPaths.for_data_dir(data), now=int(_t.time()), root_keys=1, threshold=1)
    settings = Settings(data_dir=data)
    upgrade(settings.resolved_database_url)
    factory = make_session_factory(make_engine(settings.resolved_database_url))
    store = LocalBlobStore(settings.resolved_blob_dir)
    pub = make_publisher(settings, store)
    ro.create_channel(factory, pub, "prod", actor="bench")
    with factory() as s:
        m = db.Model(name="classifier")
        s.add(m)
        s.flush()
        v = db.ModelVersion(model_id=m.id, version="1.0.0", state=db.VersionState.ready,
                            metadata_json={}, source_format="onnx")
        s.add(v)
        s.flush()
        for platform, fmt in (("android", "qnn_context"), ("ios", "mlpackage")):
            data_bytes = os.urandom(4096)
            import hashlib

            sha = hashlib.sha256(data_bytes).hexdigest()
            store.put(f"artifacts/{sha}", [data_bytes])
            s.add(db.Artifact(version_id=v.id, platform=platform, variant="224", format=fmt,
                              sha256=sha, length=len(data_bytes), blob_key=f"artifacts/{sha}",
                              target={"soc": "sm8650"} if platform == "android" else {},
                              compile_settings={"fp16": True}))
        s.commit()
    ro.start_rollout(factory, pub, "prod", ro.RolloutSpec("classifier", "1.0.0", 10),
                     actor="bench")


HTTP_PROTOCOLS = {"httptools": "httptools"}

NGINX_CONF = """
worker_processes {workers};
pid {dir}/nginx.pid;
error_log {dir}/error.log;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/tmp; proxy_temp_path {dir}/tmp; fastcgi_temp_path {dir}/tmp;
    uwsgi_temp_path {dir}/tmp; scgi_temp_path {dir}/tmp;
    default_type application/json;
    server {{
        listen 127.0.0.1:{port};
        root {dir}/www;
        location / {{ add_header Cache-Control "public, max-age=60, must-revalidate"; }}
    }}
}}
"""


def run_wrk(url: str, duration: int, connections: int, threads: int,
            headers: dict[str, str]) -> dict[str, float]:
    cmd = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration}s", "--latency"]
    for k, v in headers.items():
        cmd += ["-H", f"{k}: {v}"]
    proc = subprocess.run([*cmd, url], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
    out = proc.stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    assert p99 is not None, out
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[p99.group(2)]
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    errors = (int(non2xx.group(1)) if non2xx else 0) + (
        sum(int(g) for g in sock.groups()) if sock else 0)
    if errors:
        print(f"warning: {url}: {errors} errors\n{out}", file=sys.stderr)
    return {"rps": rps, "p99_ms": float(p99.group(1)) * scale, "errors": float(errors)}


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def status_and_etag(url: str, etag: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"If-None-Match": etag} if etag else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.headers.get("ETag", "")
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("ETag", "")


def start_api(args: argparse.Namespace, http: str, port: int, data: Path,
              stats_dir: Path) -> subprocess.Popen[bytes]:
    stats_dir.mkdir(parents=True)
    env = {**os.environ, "MODELFLEET_DATA_DIR": str(data),
           "MODELFLEET_PUBLIC_BASE_URL": "http://127.0.0.1:8000",  # same bytes for every API
           "MF_BENCH_STATS_DIR": str(stats_dir), "MF_BENCH_RELOAD_DELAY": str(args.reload_delay)}
    return subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "bench.serve.app:make_app", "--factory",
         "--host", "127.0.0.1", "--port", str(port), "--workers", str(args.workers),
         "--http", HTTP_PROTOCOLS[http], "--loop", "uvloop", "--no-access-log",
         "--log-level", "warning", *(["--no-proxy-headers"] if args.no_proxy_headers else [])],
        cwd=ROOT, env=env, start_new_session=True)


def poll_stats(stats_dir: Path) -> dict[str, int]:
    """Which path answered the polls, summed over the server's workers."""
    total: dict[str, int] = {}
    for path in stats_dir.glob("*.json"):
        for key, value in json.loads(path.read_text()).items():
            total[key] = total.get(key, 0) + int(value)
    return total


def shortcut_share(stats: dict[str, int]) -> float:
    answered = stats.get("shortcut", 0) + stats.get("app", 0) + stats.get("route", 0)
    return stats.get("shortcut", 0) / answered if answered else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (median)")
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--http", choices=sorted(HTTP_PROTOCOLS), default="httptools",
                    help="httptools: plain uvicorn")
    ap.add_argument("--compare-plain", action="store_true",
                    help="also measure plain uvicorn (--http httptools) in the same rounds")
    ap.add_argument("--no-proxy-headers", action="store_true",
                    help="uvicorn without X-Forwarded-* handling (direct exposure only)")
    ap.add_argument("--reload-delay", type=float, default=0.0,
                    help="seconds added to every manifest reload (stands in for slow cores)")
    args = ap.parse_args()
    for tool in ("nginx", "wrk"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            sys.exit(f"{tool} not found: apt-get install -y nginx wrk")

    work = Path(tempfile.mkdtemp(prefix="mf-bench-serve-"))
    work.chmod(0o755)  # nginx workers run as www-data and must read the served file
    data = work / "data"
    prepare(data)
    servers = {"api": args.http}
    if args.compare_plain and args.http != "httptools":
        servers["plain"] = "httptools"
    ports = {name: free_port() for name in (*servers, "nginx")}
    procs: list[subprocess.Popen[bytes]] = []
    nginx_dir = work / "nginx"
    (nginx_dir / "tmp").mkdir(parents=True)
    conf = nginx_dir / "nginx.conf"
    conf.write_text(NGINX_CONF.format(workers=args.workers, dir=nginx_dir, port=ports["nginx"]))
    try:
        urls = {name: f"http://127.0.0.1:{port}/v1/channels/prod/manifest"
                for name, port in ports.items()}
        for name, http in servers.items():
            procs.append(start_api(args, http, ports[name], data, work / f"stats-{name}"))
        for name in servers:
            wait_http(urls[name])
        with urllib.request.urlopen(urls["api"]) as r:
            body = r.read()
        target = nginx_dir / "www" / "v1" / "channels" / "prod" / "manifest"
        target.parent.mkdir(parents=True)
        target.write_bytes(body)  # the same signed bytes
        procs.append(subprocess.Popen(["nginx", "-c", str(conf), "-g", "daemon off;"],
                                      start_new_session=True))
        wait_http(urls["nginx"])
        cases: dict[tuple[str, int], tuple[str, dict[str, str]]] = {}
        for name, url in urls.items():
            with urllib.request.urlopen(url) as r:
                assert r.read() == body, f"{name} serves other bytes"
            status, etag = status_and_etag(url)
            assert status_and_etag(url, etag)[0] == 304, name
            cases[(name, 200)] = (url, {})
            cases[(name, 304)] = (url, {"If-None-Match": etag})
        w = dict(duration=args.duration, connections=args.connections, threads=args.threads)
        # Short alternating rounds, median per case: the machine is shared, and background
        # load then hits every server alike instead of whichever ran during a burst.
        rounds: dict[tuple[str, int], list[dict[str, float]]] = {k: [] for k in cases}
        pgids = {name: proc.pid for name, proc in zip((*servers, "nginx"), procs, strict=True)}
        for _ in range(args.rounds):
            for key, (url, hdrs) in cases.items():
                cpu = group_cpu_seconds(pgids[key[0]])
                run = run_wrk(url, headers=hdrs, **w)
                # server CPU per request, in µs (requests = rate × duration)
                run["cpu_us"] = ((group_cpu_seconds(pgids[key[0]]) - cpu) * 1e6
                                 / (run["rps"] * args.duration))
                rounds[key].append(run)
        results = {k: median_of(v) for k, v in rounds.items()}
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        stats = {name: poll_stats(work / f"stats-{name}") for name in servers}
        shutil.rmtree(work, ignore_errors=True)

    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cmd = " ".join(["python bench/serve/run.py", *sys.argv[1:]])
    proto = {"httptools": "`--http httptools`"}
    lines = [
        f"Run {date} on this machine ({os.cpu_count()} cores, shared with other work; load "
        f"average {os.getloadavg()[0]:.1f} at the end), loopback, wrk -t{args.threads} "
        f"-c{args.connections} -d{args.duration}s --latency, {args.rounds} alternating rounds, "
        f"median of each (range in brackets); uvicorn --workers {args.workers} "
        f"{proto[args.http]} --loop uvloop --no-access-log"
        f"{' --no-proxy-headers' if args.no_proxy_headers else ''}, nginx worker_processes "
        f"{args.workers} with access_log off; both send Date and Server headers; the same "
        f"{len(body)}-byte signed manifest; manifest reloads delayed by {args.reload_delay} s "
        f"(`--reload-delay`). Command: `{cmd}`.",
        "",
    ]
    columns = [("api", "API fast path")]
    if "plain" in servers:
        columns.append(("plain", "plain uvicorn (as before)"))
    lines.append("| response | " + " | ".join(f"{label} req/s | p99" for _, label in columns)
                 + " | nginx req/s | p99 | "
                 + " | ".join(f"{label} / nginx" for _, label in columns)
                 + " | server CPU µs per request: " + ", ".join(label for _, label in columns)
                 + ", nginx | polls answered by the shortcut: "
                 + ", ".join(label for _, label in columns) + " |")
    lines.append("|---" * (2 + 3 * len(columns) + 3) + "|")

    def spread(key: tuple[str, int]) -> str:
        rps = [r["rps"] for r in rounds[key]]
        return f"{results[key]['rps']:,.0f} [{min(rps):,.0f}–{max(rps):,.0f}]"

    for status in (200, 304):
        n = results[("nginx", status)]
        row = [str(status)]
        row += [f"{spread((c, status))} | {results[(c, status)]['p99_ms']:.2f} ms"
                for c, _ in columns]
        row.append(f"{spread(('nginx', status))} | {n['p99_ms']:.2f} ms")
        row += [f"{results[(c, status)]['rps'] / n['rps']:.0%}" for c, _ in columns]
        row.append(", ".join(f"{results[(c, status)]['cpu_us']:.0f}"
                             for c in (*(c for c, _ in columns), "nginx")))
        row.append(", ".join(f"{shortcut_share(stats[c]):.1%}" for c, _ in columns)
                   if status == 200 else "(all polls, 200 and 304)")
        lines.append("| " + " | ".join(row) + " |")
    ratio = results[("api", 304)]["rps"] / results[("nginx", 304)]["rps"]
    per_round = sorted(a["rps"] / b["rps"] for a, b in
                       zip(rounds[("api", 304)], rounds[("nginx", 304)], strict=True))
    lines += ["", f"Goal: the 304 path at ≥ 50% of nginx's rate — "
              f"{'met' if ratio >= 0.5 else 'NOT met'} ({ratio:.0%}; per round "
              f"{', '.join(f'{r:.0%}' for r in per_round)})."]
    lines[0] = textwrap.fill(lines[0], width=96)
    table = "\n".join(lines)
    print(table)
    print(json.dumps({**{f"{k[0]}_{k[1]}": v for k, v in results.items()},
                      **{f"{name}_paths": v for name, v in stats.items()}}))
    if args.write_docs:
        write_section(ROOT / "docs" / "benchmarks.md", "Serving", table)


def write_section(path: Path, heading: str, body: str) -> None:
    """Replace (or append) the `## heading` section, leaving every other section as it is."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    # ends at the next heading or at another section's marker comment (<!-- delta:begin -->)
    pattern = re.compile(rf"^## {re.escape(heading)}\n.*?(?=^## |^<!-- |\Z)", re.M | re.S)
    section = f"## {heading}\n\n{body}\n\n"
    text = pattern.sub(lambda _m: section, text) if pattern.search(text) else (
        text.rstrip("\n") + "\n\n" + section)
    path.write_text(text.rstrip("\n") + "\n")


if __name__ == "__main__":
    main()
