"""The corpus tests compile real models in-process: see tests/compile/conftest.py's
`_frozen_heap` (server/compile/heap.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from server.compile.heap import frozen_heap


@pytest.fixture(autouse=True)
def _frozen_heap() -> Iterator[None]:
    with frozen_heap():
        yield
