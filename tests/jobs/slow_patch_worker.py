"""A `modelfleet worker` whose first patch creation hangs (to be SIGKILLed mid-job by a test).

Same `run_worker` as the CLI, same procrastinate + PostgreSQL; only the delta policy is
wrapped: the first patch it creates writes `started` into the marker file and sleeps.
Usage: python slow_patch_worker.py MARKER_FILE (settings from MODELFLEET_* variables).
"""

from __future__ import annotations

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
    from server.jobs.procrastinate_queue import run_worker
    from server.wiring import build_worker

    marker = Path(sys.argv[1])
    settings = Settings()
    made = build_worker(settings, heartbeat_s=0.5, stalled_after_s=3)
    made.patch_runner.policy = DeltaPolicy(creators=hanging_creators(marker))
    run_worker(settings.resolved_database_url, made.runner, made.patch_runner,
               heartbeat_s=0.5, stalled_after_s=3)


if __name__ == "__main__":
    main()
