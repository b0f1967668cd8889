"""`frozen_heap()`: keeps the process's long-lived objects out of full garbage collections
while a build runs.

`coremltools.convert` ends with `gc.collect()`. In a process that has imported torch,
coremltools and onnx (~340k tracked objects) one full collection costs ~0.25 s, and a build
or a conformance run converts many programs: before this, 60% of the ONNX node-case suite's
time was that rescan. `gc.freeze()` moves everything alive at entry into the permanent
generation, so collections during the block only walk what the block allocates; on exit the
objects return to the oldest generation and are collected as usual again.

`gc.get_freeze_count()` walks the whole permanent generation (O(frozen objects)); asked on
every entry, it cost a test worker's conformance half 23 of its 42 s (775 nested entries
over ~1M frozen objects). A nested entry is known from our own flag instead; only an
outermost one asks whether another owner froze the heap.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

_owned = False  # a frozen_heap block holds the current freeze


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Freezes the current heap for the block; nested or inside a process that froze its
    heap itself (server/app.py), it leaves the owner's freeze alone."""
    global _owned
    if _owned or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    _owned = True
    try:
        yield
    finally:
        _owned = False
        gc.unfreeze()
