"""Compressed copies of built artifacts (manifests/compressed.py), made where artifacts are
stored — not in the compile sandbox, whose packing (server/compile/packing.py) stays an
uncompressed tar or file so delta patches diff contents.
"""

from __future__ import annotations

import os
from pathlib import Path

from client_sdk import compression
from server.hashing import file_sha256


def compress_copy(src: Path, out: Path) -> tuple[str, int, str] | None:
    """``src`` compressed into ``out`` (same bytes in, same bytes out) with the codec that
    makes it smallest (``compression.best_codec``); its (sha256, length, codec), or None (and
    no file) when it saves less than ``compression.MIN_SAVING`` of the size — not worth a
    second blob, a second download path and the device's inflate time."""
    size = src.stat().st_size
    tmp = out.with_name(out.name + ".partial")
    try:
        with src.open("rb") as f, tmp.open("wb") as dst:
            codec = compression.best_codec(f, size)
            compression.compress(f, dst, size, codec=codec)
        if tmp.stat().st_size > size * (1 - compression.MIN_SAVING):
            return None
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return (*file_sha256(out), codec)
