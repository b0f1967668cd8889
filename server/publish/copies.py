"""Compressed copies of built artifacts (manifests/compressed.py), made where artifacts are
stored — not in the compile sandbox, whose packing (server/compile/packing.py) stays an
uncompressed tar or file so delta patches diff contents.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

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
        with src.open("rb") as f:
            if compression.level_for(size) == compression.LARGE_LEVEL:
                codec = _kept_trial(f, size, tmp)
            else:
                codec = compression.best_codec(f, size)
                with tmp.open("wb") as dst:
                    compression.compress(f, dst, size, codec=codec)
        if tmp.stat().st_size > size * (1 - compression.MIN_SAVING):
            return None
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return (*file_sha256(out), codec)


def _kept_trial(src: BinaryIO, size: int, tmp: Path) -> str:
    """Content compressed at ``LARGE_LEVEL``: ``best_codec``'s trials are the copies
    themselves (same level, same bytes), so each is written to a file and the one it picks
    becomes `tmp` — a pass over the content fewer than a trial and then the copy (about a
    quarter of the copy's CPU on a 90 MB model)."""
    trials = {codec: tmp.with_name(f"{tmp.name}.{codec}") for codec in compression.CODECS}
    try:
        sizes = {}
        for codec, path in trials.items():
            src.seek(0)
            with path.open("wb") as dst:
                compression.compress(src, dst, size, codec=codec)
            sizes[codec] = path.stat().st_size
        codec = compression.smallest(sizes)
        os.replace(trials[codec], tmp)
        return codec
    finally:
        for path in trials.values():
            path.unlink(missing_ok=True)
