"""The sha256 of a file, read in 1 MiB chunks: the one implementation the compile packing
and the delta patching (selection and mfdelta1) share. (The server takes from the SDK only
its public package and the patch format, so it does not borrow the SDK's own helper.)"""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 1 << 20


def file_sha256(path: Path) -> tuple[str, int]:
    """(lowercase hex sha256, length in bytes) of the file at `path`."""
    h = hashlib.sha256()
    n = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            n += len(chunk)
    return h.hexdigest(), n
