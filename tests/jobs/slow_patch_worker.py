"""A `modelfleet worker` whose first patch creation hangs (to be SIGKILLed mid-job by a test).

Same `run_worker` as the CLI, same procrastinate + PostgreSQL; only the delta policy is
wrapped: the first patch it creates writes `started` into the marker file and sleeps.
Usage: python slow_patch_worker.py MARKER_FILE (settings from MODELFLEET_* variables).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from server.delta import DeltaPolicy
from server.delta.select import CREATORS
from server.settings import Settings


def hanging_creators(marker: Path) -> dict[str, Any]:
    def wrap(create: Any) -> Any:
        def hang_first(*args: Any) -> None:
            if not marker.exists():
                marker.write_text("started")
                time.sleep(60)
            create(*args)
        return hang_first
    return {name: wrap(create) for name, create in CREATORS.items()}


def main() -> None:
    from server.blobstore import make_blob_store
    from server.db.session import make_engine, make_session_factory
    from server.jobs.procrastinate_queue import make_patch_runner, run_worker
    from server.jobs.runner import BuildRunner

    marker = Path(sys.argv[1])
    settings = Settings()
    factory = make_session_factory(make_engine(settings.resolved_database_url))
    store = make_blob_store(settings)
    name = f"slow:{socket.gethostname()}:{os.getpid()}"
    patches = make_patch_runner(settings, factory, store, worker_id=name,
                                policy=DeltaPolicy(creators=hanging_creators(marker)),
                                heartbeat_s=0.5, stale_after_s=3)
    runner = BuildRunner(factory, store, worker_id=name, heartbeat_s=0.5, stale_after_s=3)
    run_worker(settings, runner=runner, patch_runner=patches, heartbeat_s=0.5,
               stalled_after_s=3)


if __name__ == "__main__":
    main()
