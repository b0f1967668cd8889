"""Test driver: run one update cycle in this process, SIGKILLing itself at a named step.

Usage: python -m tests.client.kill_driver BASE_URL DATA_DIR ROOT_FILE [KILL_AT]
The step name arrives through argv (the SDK reads no environment variables). Prints the
result as JSON when it survives.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from client_sdk import DeviceProfile, Updater, UpdaterConfig


def main() -> None:
    base, data_dir, root_file = sys.argv[1:4]
    kill_at = sys.argv[4] if len(sys.argv) > 4 else ""

    def hook(step: str) -> None:
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    cfg = UpdaterConfig(
        base_url=base, channel="prod", pinned_root=Path(root_file).read_bytes(),
        device=DeviceProfile("device-1", "linux"), data_dir=Path(data_dir),
        formats=["onnx"], fault_hook=hook, update_deadline_seconds=60,
    )
    result = Updater(cfg).check_once()
    print(json.dumps({"outcome": result.outcome.value,
                      "models": [[m.model, m.version, m.sha256] for m in result.models]}))


if __name__ == "__main__":
    main()
