"""server.hashing is the one file digest of compile packing and delta patching."""

from __future__ import annotations

import hashlib
from pathlib import Path

from server.hashing import CHUNK, file_sha256


def test_file_digest_matches_hashlib_across_chunk_boundaries(tmp_path: Path) -> None:
    for size in (0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 7):
        data = bytes(i % 251 for i in range(size))
        path = tmp_path / f"f{size}"
        path.write_bytes(data)
        assert file_sha256(path) == (hashlib.sha256(data).hexdigest(), size)
