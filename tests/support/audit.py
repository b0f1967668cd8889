"""Count what the code under test opens, through CPython's audit hooks (PEP 578): real file
opens, no patching. Hooks cannot be removed, so one hook is installed per process and records
only while a ``recording()`` block is active."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_active: list[list[tuple[str, str]]] = []
_lock = threading.Lock()
_installed = False


def _hook(event: str, args: tuple[object, ...]) -> None:
    if event == "open" and _active and isinstance(args[0], str | bytes | Path):
        path = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
        mode = args[1] if isinstance(args[1], str) else ""
        if args[1] is None and isinstance(args[2], int):  # os.open: only flags are given
            mode = "w" if args[2] & (os.O_WRONLY | os.O_RDWR) else "r"
        for log in _active:
            log.append((path, mode))


@contextmanager
def recording() -> Iterator[list[tuple[str, str]]]:
    """Every (path, mode) opened by Python code inside the block (modes like "rb", "w")."""
    global _installed
    with _lock:
        if not _installed:
            sys.addaudithook(_hook)
            _installed = True
    log: list[tuple[str, str]] = []
    _active.append(log)
    try:
        yield log
    finally:
        _active.remove(log)


def reads_of(log: list[tuple[str, str]], name: str) -> list[str]:
    """The paths named ``name`` that were opened for reading only."""
    return [p for p, mode in log if Path(p).name == name
            and "r" in mode and not any(c in mode for c in "wa+x")]
