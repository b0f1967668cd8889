"""`frozen_heap()`: keeps the process's long-lived objects out of full garbage collections
while a build runs.

`coremltools.convert` ends with `gc.collect()`. In a process that has imported torch,
coremltools and onnx (~340k tracked objects) one full collection costs ~0.25 s, and a build
or a conformance run converts many programs: before this, 60% of the ONNX node-case suite's
time was that rescan. `gc.freeze()` moves everything alive at entry into the permanent
generation, so collections during the block only walk what the block allocates; on exit the
objects return to the oldest generation and are collected as usual again.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Freezes the current heap for the block; nested or inside a process that froze its
    heap itself (server/app.py), it leaves the owner's freeze alone."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
