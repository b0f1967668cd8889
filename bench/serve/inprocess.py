"""CPU time of one manifest poll inside the app, without an HTTP server: the ASGI app called
directly with a poll's scope, `time.process_time` per poll, so wrk and the server's socket work
do not count and a loaded machine disturbs the figure less than a wall-clock rate.

Compares, in one run, the app `modelfleet serve` runs (bench/serve/app.py) with a bare
FastAPI app and a bare Starlette app, each holding one route that answers the same bytes
with the same headers (the floor of the framework and of the toolkit under it), and
`--profile` writes a pyinstrument (or cProfile) report of the app's polls.

    python bench/serve/inprocess.py [--polls 5000] [--profile out.html]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def poll_scope(etag: str | None) -> dict[str, Any]:
    headers = [(b"host", b"127.0.0.1"), (b"user-agent", b"wrk")]
    if etag is not None:
        headers.append((b"if-none-match", etag.encode()))
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "method": "GET", "scheme": "http",
            "path": "/v1/channels/prod/manifest", "raw_path": b"/v1/channels/prod/manifest",
            "root_path": "", "query_string": b"", "headers": headers,
            "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000), "state": {}}


async def poll(app: ASGIApp, etag: str | None) -> tuple[int, dict[bytes, bytes], bytes]:
    out: dict[str, Any] = {"body": b""}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
            out["headers"] = dict(message["headers"])
        else:
            out["body"] += message.get("body", b"")

    await app(poll_scope(etag), receive, send)
    return out["status"], out["headers"], out["body"]


async def cpu_per_poll(apps: dict[str, ASGIApp], etag: str | None, polls: int,
                       batches: int = 7) -> dict[str, float]:
    """CPU µs per poll for each app: the median of `batches` batches, the apps' batches
    alternating so background load hits each alike."""
    for app in apps.values():
        for _ in range(200):  # warm: caches filled, code paths specialised
            await poll(app, etag)
    runs: dict[str, list[float]] = {name: [] for name in apps}
    for _ in range(batches):
        for name, app in apps.items():
            start = time.process_time()
            for _ in range(polls // batches):
                await poll(app, etag)
            runs[name].append((time.process_time() - start) * 1e6 / (polls // batches))
    return {name: statistics.median(r) for name, r in runs.items()}


def bare_starlette(body: bytes, etag: str, cache_control: str) -> ASGIApp:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def manifest(request: Request) -> Response:
        headers = {"ETag": etag, "Cache-Control": cache_control}
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        return Response(body, media_type="application/json", headers=headers)

    return Starlette(routes=[Route("/v1/channels/{channel}/manifest", manifest)])


def bare_fastapi(body: bytes, etag: str, cache_control: str) -> ASGIApp:
    from fastapi import FastAPI, Request, Response

    # Without the OpenTelemetry hooks, as the app (server/app.py): a like-for-like floor.
    bare = FastAPI(telemetry={"tracing": False, "metrics": False, "logs": False})

    @bare.get("/v1/channels/{channel}/manifest")
    async def manifest(channel: str, request: Request) -> Response:
        headers = {"ETag": etag, "Cache-Control": cache_control}
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        return Response(body, media_type="application/json", headers=headers)

    return bare


async def measure(args: argparse.Namespace, data: Path) -> dict[str, dict[str, float]]:
    os.environ["MODELFLEET_DATA_DIR"] = str(data)
    from bench.serve.app import make_app

    app = make_app()
    async with app.router.lifespan_context(app):
        status, headers, body = await poll(app, None)
        assert status == 200, (status, body)
        etag = headers[b"etag"].decode()
        assert (await poll(app, etag))[0] == 304
        same = (body, etag, headers[b"cache-control"].decode())
        apps = {"bare Starlette route": bare_starlette(*same),
                "bare FastAPI route": bare_fastapi(*same), "our app": app}
        by_status = {"200": await cpu_per_poll(apps, None, args.polls),
                     "304": await cpu_per_poll(apps, etag, args.polls)}
        results = {name: {status: r[name] for status, r in by_status.items()}
                   for name in apps}
        if args.profile:
            await profile(app, etag, args)
    return results


async def profile(app: ASGIApp, etag: str, args: argparse.Namespace) -> None:
    try:
        from pyinstrument import Profiler
    except ImportError:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.polls):
            await poll(app, etag)
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").dump_stats(args.profile)
        return
    profiler = Profiler(interval=0.0001, async_mode="disabled")
    profiler.start()
    for _ in range(args.polls):
        await poll(app, etag)
    profiler.stop()
    Path(args.profile).write_text(profiler.output_text(unicode=True, show_all=True))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--polls", type=int, default=5000)
    ap.add_argument("--profile", help="write a profile of the app's 304 polls here")
    args = ap.parse_args()
    from bench.serve.run import prepare

    with tempfile.TemporaryDirectory(prefix="mf-bench-inproc-") as tmp:
        data = Path(tmp) / "data"
        prepare(data)
        try:
            import uvloop

            results = uvloop.run(measure(args, data))
        except ImportError:
            results = asyncio.run(measure(args, data))
    print("| in-process poll | CPU µs (200) | CPU µs (304) |\n|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['200']:.0f} | {r['304']:.0f} |")


if __name__ == "__main__":
    main()
