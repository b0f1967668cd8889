"""One measured operation, run in its own process so its peak RSS can be read with wait4.

Usage: python -m bench.delta.worker {create|apply} {mfdelta1|bsdiff4} BASE NEW_OR_PATCH OUT
Prints {"seconds": <time of the operation alone, without interpreter start-up>}.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    action, algorithm, base, second, out = argv
    if action == "create":
        if algorithm == "mfdelta1":
            from server.delta.mfdelta1 import create_mfdelta1

            start = time.perf_counter()
            create_mfdelta1(Path(base), Path(second), Path(out))
        else:
            import bsdiff4

            start = time.perf_counter()
            bsdiff4.file_diff(base, second, out)
    else:
        from client_sdk.patching import apply_patch

        start = time.perf_counter()
        apply_patch(algorithm, Path(base), Path(second), Path(out), max_output=1 << 40)
    print(json.dumps({"seconds": time.perf_counter() - start}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
