"""Regenerate mfdelta1.json: hand-built mfdelta1 patches, one op kind each, plus a mixed one.

    python -m tests.delta.vectors.generate   (from the repository root)

The vectors are for other SDKs (Swift, Kotlin) implementing docs/delta.md: apply ``patch`` to
``base`` and expect ``new``. They are checked in; regenerate only when the format changes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import zstandard

from client_sdk import patching as fmt
from server.delta.mfdelta1 import Encoded, _bit_planes, _byte_planes, _zigzag

ZSTD = zstandard.ZstdCompressor(level=19, write_checksum=False)


def build(base: bytes, pieces: list[tuple[Encoded, bytes]]) -> tuple[bytes, bytes]:
    """(patch, new) from ops and the output bytes each must produce."""
    data = b"".join(s for op, _ in pieces for s in op.streams)
    table = b"".join(op.record(len(out)) for op, out in pieces)
    new = b"".join(out for _, out in pieces)
    compressed = ZSTD.compress(table)
    header = fmt.HEADER.pack(
        fmt.MAGIC, 0, len(base), hashlib.sha256(base).digest(), len(new),
        hashlib.sha256(new).digest(), len(pieces), fmt.HEADER.size + len(data),
        len(compressed), len(table),
    )
    return header + data + compressed, new


def z(planes: list) -> list[bytes]:
    return [ZSTD.compress(memoryview(p)) for p in planes]


def add(kind: int, base: bytes, offset: int, new_values: np.ndarray) -> tuple[Encoded, bytes]:
    width = new_values.dtype.itemsize
    old = np.frombuffer(base[offset : offset + new_values.nbytes], dtype=f"<u{width}")
    zig = _zigzag(new_values - old, width)
    if kind in (fmt.OP_ADD_BYTES_SORTED, fmt.OP_ADD_BITS_SORTED):
        zig = zig[fmt.context_order(old)]
    bits = kind in (fmt.OP_ADD_BITS, fmt.OP_ADD_BITS_SORTED)
    streams = z(_bit_planes(zig, width) if bits else _byte_planes(zig, width))
    return Encoded(kind, width, offset, 0, streams), new_values.tobytes()


def main() -> None:
    rng = np.random.default_rng(2026)
    base = rng.standard_normal(64).astype("<f4").tobytes() + bytes(range(256))
    floats = np.frombuffer(base[:256], dtype="<u4")
    nudged = (np.frombuffer(base[:256], dtype="<f4") * np.float32(1.001)).astype("<f4")
    int8s = np.frombuffer(base[256:], dtype=np.uint8)
    requant = (int8s.astype(np.int16) + rng.integers(-1, 2, 256)).astype(np.uint8)
    ref = zstandard.ZstdCompressionDict(base[256:], dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    text = b"tensor layer3.weight " + base[300:340]
    cases = {
        "copy": [(Encoded(fmt.OP_COPY, 1, 16, 0, []), base[16:116])],
        "add_bytes_f32": [add(fmt.OP_ADD_BYTES, base, 0, nudged.view("<u4"))],
        "add_bits_f32": [add(fmt.OP_ADD_BITS, base, 0, nudged.view("<u4"))],
        "planes_f32": [
            (Encoded(fmt.OP_PLANES, 4, 0, 0, z(_byte_planes(floats, 4))), floats.tobytes())
        ],
        "zstd_plain": [(Encoded(fmt.OP_ZSTD, 1, 0, 0, [ZSTD.compress(text)]), text)],
        "zstd_with_base_dictionary": [
            (
                Encoded(fmt.OP_ZSTD, 1, 256, 256, [
                    zstandard.ZstdCompressor(level=3, dict_data=ref, write_checksum=False)
                    .compress(text)
                ]),
                text,
            )
        ],
        "add_bytes_sorted_int8": [add(fmt.OP_ADD_BYTES_SORTED, base, 256, requant)],
        "add_bits_sorted_int8": [add(fmt.OP_ADD_BITS_SORTED, base, 256, requant)],
        "literal": [(Encoded(fmt.OP_LITERAL, 1, 0, 0, [], b"hello, device"), b"hello, device")],
        "add_bits_sorted_u16": [
            add(fmt.OP_ADD_BITS_SORTED, base, 2, (floats[:20].astype("<u2") + 3).astype("<u2"))
        ],
        "add_bytes_u64": [
            add(fmt.OP_ADD_BYTES, base, 8, np.frombuffer(base[8:72], "<u8") - np.uint64(5))
        ],
    }
    cases["mixed"] = [piece for name in ("literal", "copy", "add_bits_sorted_int8",
                                         "zstd_with_base_dictionary", "add_bytes_f32")
                      for piece in cases[name]]
    vectors = []
    for name, pieces in cases.items():
        patch, new = build(base, pieces)
        vectors.append({"name": name, "base": base.hex(), "new": new.hex(), "patch": patch.hex()})
    out = Path(__file__).with_name("mfdelta1.json")
    out.write_text(json.dumps({"format": "mfdelta1", "vectors": vectors}, indent=1) + "\n")


if __name__ == "__main__":
    main()
