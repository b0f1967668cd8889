"""ASGI factory for the serving benchmark: the real app from MODELFLEET_* settings
(`uvicorn bench.serve.app:make_app --factory --workers N`).

Two bench-only knobs, from the environment bench/serve/run.py sets:
- MF_BENCH_RELOAD_DELAY (seconds): every manifest reload sleeps this long first — a stand-in
  for slower cores or a slower database, where a reload takes a noticeable share of the
  cache time.
- MF_BENCH_STATS_DIR: each worker writes its `PollStats` (which path answered each poll) to
  `<dir>/<pid>.json` every half second, for the table's shortcut share.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from pathlib import Path

from fastapi import FastAPI

from server.app import create_app
from server.publish.manifest_cache import ManifestCache, ManifestLoader
from server.settings import Settings


def slowed(loader: ManifestLoader, delay_s: float) -> ManifestLoader:
    def load(channel: str) -> tuple[bytes, str]:
        time.sleep(delay_s)
        return loader(channel)

    return load


def write_stats_periodically(cache: ManifestCache, directory: Path) -> None:
    """A thread (the worker may be stopped by a signal without running exit handlers)."""
    path = directory / f"{os.getpid()}.json"

    def loop() -> None:
        while True:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(dataclasses.asdict(cache.stats)))
            os.replace(tmp, path)
            time.sleep(0.5)

    threading.Thread(target=loop, name="bench-poll-stats", daemon=True).start()


def make_app() -> FastAPI:
    app = create_app(Settings())
    cache: ManifestCache = app.state.services.manifest_cache
    delay = float(os.environ.get("MF_BENCH_RELOAD_DELAY", "0") or 0)
    if delay > 0:
        cache.loader = slowed(cache.loader, delay)
    stats_dir = os.environ.get("MF_BENCH_STATS_DIR")
    if stats_dir:
        write_stats_periodically(cache, Path(stats_dir))
    return app
