"""The checked-in mfdelta1 test vectors (for other SDKs) apply with this SDK."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from client_sdk.patching import apply_patch

VECTORS = json.loads((Path(__file__).parent / "vectors" / "mfdelta1.json").read_text())["vectors"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_mfdelta1_vector_applies_to_the_expected_bytes(tmp_path: Path, vector: dict) -> None:
    (tmp_path / "base").write_bytes(bytes.fromhex(vector["base"]))
    (tmp_path / "patch").write_bytes(bytes.fromhex(vector["patch"]))
    apply_patch("mfdelta1", tmp_path / "base", tmp_path / "patch", tmp_path / "out",
                max_output=1 << 20)
    assert (tmp_path / "out").read_bytes() == bytes.fromhex(vector["new"])


def test_vectors_cover_every_op_kind() -> None:
    import zstandard

    from client_sdk import patching

    seen = set()
    for vector in VECTORS:
        patch = bytes.fromhex(vector["patch"])
        fields = patching.HEADER.unpack_from(patch)
        table = zstandard.ZstdDecompressor().decompress(patch[fields[7] : fields[7] + fields[8]])
        pos = 0
        for _ in range(fields[6]):
            kind, width, _, length, _, _ = patching.OP_HEADER.unpack_from(table, pos)
            seen.add(kind)
            pos += patching.OP_HEADER.size + 4 * patching.stream_count(kind, width)
            pos += length if kind == patching.OP_LITERAL else 0
    assert seen == set(patching.OP_KINDS)
