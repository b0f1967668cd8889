"""Manifest polls per second, 200 and 304, in one run: nginx serving the bucket directory, the
API's plain route, and a device poll through the caching proxy in front of the bucket.

One run on this machine, on loopback: builds a real signed manifest (keys, SQLite, a channel
with a two-platform release at 10%) with the real publisher, which writes it to the local
blob store's read path (v1/channels/prod/manifest). Then starts, each in its own process
group:
- `nginx`: Debian's nginx serving that blob directory as it is, with the configuration
  `modelfleet bucket nginx --blob-dir` prints (server/publish/nginxconf.py);
- `api`: the app (bench/serve/app.py: every poll through its route, a Starlette route inside
  the FastAPI app, server/api/serving.py) under granian with `modelfleet serve`'s options
  (`--workers N`, uvloop, no access log) — uvicorn --http httptools where granian is absent;
- `proxy`: the device cache of docker-compose (`caching_proxy`) in front of the `nginx`
  bucket, so a poll is answered from its cache (revalidated upstream once a second);
- with --floor, `floor`: the same answers from a bare ASGI callable under the same granian
  (the server's own cost per request, below any framework);
and drives each with wrk (--latency) in alternating rounds: 200, and 304 (If-None-Match with
the server's own ETag). Server CPU per poll is the user + system time of the server's
processes (from /proc, apart from wrk's), for `proxy` its own plus the bucket's behind it.
Prints a markdown table and, with --write-docs, replaces the "## Serving" section of
docs/benchmarks.md.

    python bench/serve/run.py [--workers 2] [--duration 5] [--rounds 3] [--connections 64]
                              [--floor] [--write-docs]

Needs Debian's nginx and wrk: `apt-get install -y nginx wrk` (scripts/setup does it as root
with the dev extra).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
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
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import free_port, group_cpu_seconds, wait_http  # noqa: E402

SERVERS = ("nginx", "api", "proxy")
LABELS = {"nginx": "nginx (bucket dir)", "api": "API route", "proxy": "device cache",
          "floor": "granian floor (bare ASGI)"}


def prepare(data: Path) -> None:
    """Keys, database, a channel with one rollout: a realistic signed manifest, published."""
    import time as _t

    from server.db import models as db
    from server.db.migrate import upgrade
    from server.jobs.interface import NullJobQueue
    from server.publish.keys import KeyPaths, init_keys
    from server.rollouts import channels
    from server.rollouts import service as ro
    from server.settings import Settings
    from server.wiring import core

    init_keys(KeyPaths.for_data_dir(data), now=int(_t.time()), root_keys=1, threshold=1)
    settings = Settings(data_dir=data)
    upgrade(settings.resolved_database_url)
    with core(settings) as c:
        factory, pub = c.session_factory, c.publisher
        channels.create_channel(factory, pub, "prod", actor="bench")
        with factory() as s:
            m = db.Model(name="classifier")
            s.add(m)
            s.flush()
            v = db.ModelVersion(model_id=m.id, version="1.0.0", state=db.VersionState.ready,
                                metadata_json={}, source_format="onnx")
            s.add(v)
            s.flush()
            for platform, fmt in (("android", "qnn_context"), ("ios", "mlpackage")):
                blob = os.urandom(4096)
                sha = hashlib.sha256(blob).hexdigest()
                key = f"v1/artifacts/{sha}"
                c.blob_store.put(key, [blob])
                s.add(db.Artifact(version_id=v.id, platform=platform, variant="224", format=fmt,
                                  sha256=sha, length=len(blob), blob_key=key,
                                  target={"soc": "sm8650"} if platform == "android" else {},
                                  compile_settings={"fp16": True}))
            s.commit()
        ro.start_rollout(factory, pub, "prod", ro.RolloutSpec("classifier", "1.0.0", 10),
                         actor="bench", patches=NullJobQueue())


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


def fetch(url: str, etag: str | None = None) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, headers={"If-None-Match": etag} if etag else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.headers.get("ETag", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("ETag", ""), b""


def api_command(workers: int, port: int, target: str = "bench.serve.app:make_app"
                ) -> tuple[list[str], str]:
    """granian (what `modelfleet serve` runs) where installed, else plain uvicorn."""
    granian = Path(sys.executable).parent / "granian"
    if granian.exists():
        from server.settings import Settings

        limits = Settings()  # the request-head limits `modelfleet serve` sets
        return ([str(granian), "--interface", "asgi", "--factory", "--host", "127.0.0.1",
                 "--port", str(port), "--workers", str(workers), "--http", "1", "--no-ws",
                 # as `modelfleet serve` (server/http_server.py): one single-threaded
                 # runtime per worker, no hand-over between threads per request
                 "--runtime-mode", "st", "--loop", "uvloop", "--log-level", "warning",
                 "--http1-header-read-timeout",
                 str(int(limits.header_read_timeout_seconds * 1000)),
                 "--http1-buffer-size", str(limits.max_header_bytes), target],
                f"granian --interface asgi --workers {workers} --http 1 --runtime-mode st "
                "--loop uvloop")
    return ([sys.executable, "-m", "uvicorn", target, "--factory",
             "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
             "--http", "httptools", "--loop", "uvloop", "--no-access-log",
             "--log-level", "warning"],
            f"uvicorn --workers {workers} --http httptools --loop uvloop --no-access-log")


def nginx_conf(work: Path, body: str, workers: int) -> Path:
    from server.publish import nginxconf

    (work / "tmp").mkdir(parents=True)
    conf = work / "nginx.conf"
    conf.write_text(nginxconf.standalone(body, work, workers=workers,
                                         user="root" if os.geteuid() == 0 else None))
    return conf


def start_servers(args: argparse.Namespace, work: Path, data: Path, ports: dict[str, int]
                  ) -> tuple[dict[str, subprocess.Popen[bytes]], str]:
    from server.publish import nginxconf

    procs: dict[str, subprocess.Popen[bytes]] = {}
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    bucket = nginx_conf(work / "nginx", nginxconf.directory_server(
        data / "blobs" / "objects", f"127.0.0.1:{ports['nginx']}"), args.workers)
    procs["nginx"] = subprocess.Popen([nginx, "-c", str(bucket), "-g", "daemon off;"],
                                      start_new_session=True)
    proxy = nginx_conf(work / "proxy", nginxconf.caching_proxy(
        f"http://127.0.0.1:{ports['nginx']}", f"127.0.0.1:{ports['proxy']}", work / "cache"),
        args.workers)
    env = {**os.environ, "MODELFLEET_DATA_DIR": str(data)}
    cmd, api_label = api_command(args.workers, ports["api"])
    procs["api"] = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True)
    if "floor" in ports:
        floor, _ = api_command(args.workers, ports["floor"], "bench.serve.app:make_floor")
        procs["floor"] = subprocess.Popen(floor, cwd=ROOT, env=env, start_new_session=True)
    wait_http(f"http://127.0.0.1:{ports['nginx']}/v1/channels/prod/manifest", timeout=10)
    procs["proxy"] = subprocess.Popen([nginx, "-c", str(proxy), "-g", "daemon off;"],
                                      start_new_session=True)
    return procs, api_label


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (median)")
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--floor", action="store_true",
                    help="also a bare ASGI app under the same server: the server's own cost")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    servers = (*SERVERS, "floor") if args.floor else SERVERS
    for tool in ("nginx", "wrk"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            sys.exit(f"{tool} not found: apt-get install -y nginx wrk")

    work = Path(tempfile.mkdtemp(prefix="mf-bench-serve-"))
    data = work / "data"
    prepare(data)
    ports = {name: free_port() for name in servers}
    urls = {name: f"http://127.0.0.1:{port}/v1/channels/prod/manifest"
            for name, port in ports.items()}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        procs, api_label = start_servers(args, work, data, ports)
        for name in servers:
            wait_http(urls[name], timeout=60)
        body = fetch(urls["api"])[2]
        cases: dict[tuple[str, int], tuple[str, dict[str, str]]] = {}
        for name, url in urls.items():
            status, etag, got = fetch(url)
            assert (status, got) == (200, body), f"{name} serves other bytes"
            assert fetch(url, etag)[0] == 304, name
            cases[(name, 200)] = (url, {})
            cases[(name, 304)] = (url, {"If-None-Match": etag})
        w = dict(duration=args.duration, connections=args.connections, threads=args.threads)
        # Short alternating rounds, median per case: the machine is shared, and background
        # load then hits every server alike instead of whichever ran during a burst.
        rounds: dict[tuple[str, int], list[dict[str, float]]] = {k: [] for k in cases}
        groups = {"nginx": ["nginx"], "api": ["api"], "proxy": ["proxy", "nginx"],
                  "floor": ["floor"]}
        for _ in range(args.rounds):
            for key, (url, hdrs) in cases.items():
                pgids = [procs[n].pid for n in groups[key[0]]]
                cpu = sum(group_cpu_seconds(p) for p in pgids)
                run = run_wrk(url, headers=hdrs, **w)
                used = sum(group_cpu_seconds(p) for p in pgids) - cpu
                run["cpu_us"] = used * 1e6 / (run["rps"] * args.duration)  # per request
                rounds[key].append(run)
        results = {k: median_of(v) for k, v in rounds.items()}
    finally:
        for proc in procs.values():
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    table = report(args, servers, rounds, results, api_label, len(body))
    print(table)
    print(json.dumps({f"{k[0]}_{k[1]}": v for k, v in results.items()}))
    if args.write_docs:
        write_section(ROOT / "docs" / "benchmarks.md", "Serving", table)


def report(args: argparse.Namespace, servers: tuple[str, ...],
           rounds: dict[tuple[str, int], list[dict[str, float]]],
           results: dict[tuple[str, int], dict[str, float]], api_label: str,
           size: int) -> str:
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cmd = " ".join(["python bench/serve/run.py", *sys.argv[1:]])
    intro = (
        f"Run {date} on this machine ({os.cpu_count()} cores, shared with other work; load "
        f"average {os.getloadavg()[0]:.1f} at the end), loopback, wrk -t{args.threads} "
        f"-c{args.connections} -d{args.duration}s --latency, {args.rounds} alternating rounds, "
        f"median of each (range in brackets); the same {size}-byte signed manifest, written "
        f"by the publisher to the blob directory. nginx (bucket dir): Debian's nginx, "
        f"worker_processes {args.workers}, serving the blob directory with `modelfleet "
        f"bucket nginx --blob-dir`'s configuration; API route: {api_label}, every poll "
        f"through the app's poll route (bench/serve/app.py); device cache: the compose "
        f"device-cache configuration (`caching_proxy`, worker_processes {args.workers}) in "
        f"front of that nginx, its CPU counted with the bucket's behind it."
        + (" granian floor: the same answers from a bare ASGI callable under the same "
           "granian (bench/serve/app.py `make_floor`), the server's own cost."
           if "floor" in servers else "") + f" Command: `{cmd}`.")
    lines = [textwrap.fill(intro, width=96), "",
             "| server | 200 req/s | 200 p99 | 304 req/s | 304 p99 | 304 / nginx | "
             "server CPU µs per poll (200 / 304) |", "|---|---|---|---|---|---|---|"]

    def spread(key: tuple[str, int]) -> str:
        rps = [r["rps"] for r in rounds[key]]
        return f"{results[key]['rps']:,.0f} [{min(rps):,.0f}–{max(rps):,.0f}]"

    nginx_304 = results[("nginx", 304)]["rps"]
    for name in servers:
        ok, nm = results[(name, 200)], results[(name, 304)]
        lines.append(
            f"| {LABELS[name]} | {spread((name, 200))} | {ok['p99_ms']:.2f} ms | "
            f"{spread((name, 304))} | {nm['p99_ms']:.2f} ms | {nm['rps'] / nginx_304:.0%} | "
            f"{ok['cpu_us']:.0f} / {nm['cpu_us']:.0f} |")
    ratio = results[("api", 304)]["rps"] / nginx_304
    per_round = sorted(a["rps"] / b["rps"] for a, b in
                       zip(rounds[("api", 304)], rounds[("nginx", 304)], strict=True))
    lines += ["", f"Goal: the API's 304 at ≥ 50% of nginx's rate — "
              f"{'met' if ratio >= 0.5 else 'NOT met'} ({ratio:.0%}; per round "
              f"{', '.join(f'{r:.0%}' for r in per_round)})."]
    return "\n".join(lines)


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
