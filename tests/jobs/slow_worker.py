"""A `modelfleet worker` whose first compile hangs (to be SIGKILLed mid-build by a test).

Same `run_worker` as the CLI, same procrastinate + PostgreSQL; only the pipeline is wrapped:
the first build it runs writes `started` into the marker file and then sleeps for a minute.
Usage: python slow_worker.py MARKER_FILE (settings from MODELFLEET_* environment variables).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from server.compile import Pipeline
from server.settings import Settings


class HangingPipeline(Pipeline):
    def __init__(self, log: Any, marker: Path) -> None:
        super().__init__(log=log)
        self._marker = marker

    def build(self, spec: Any, workdir: Path) -> Any:
        if not self._marker.exists():
            self._marker.write_text("started")
            time.sleep(60)
        return super().build(spec, workdir)


def main() -> None:
    from server.jobs.procrastinate_queue import run_worker
    from server.jobs.runner import BuildRunner
    from server.wiring import build_worker

    marker = Path(sys.argv[1])
    settings = Settings()
    made = build_worker(settings, heartbeat_s=0.5, stalled_after_s=3)
    runner = BuildRunner(
        made.core.session_factory, made.core.blob_store,
        worker_id=made.runner.worker_id.replace("worker:", "slow:", 1),
        pipeline_factory=lambda log: HangingPipeline(log, marker),
        heartbeat_s=0.5, stale_after_s=3)
    run_worker(settings.resolved_database_url, runner, made.patch_runner, heartbeat_s=0.5,
               stalled_after_s=3)


if __name__ == "__main__":
    main()
