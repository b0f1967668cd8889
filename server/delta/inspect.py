"""Summarize an mfdelta1 patch (which op kinds carry how many bytes) for tests and the bench."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import zstandard

from client_sdk import patching as fmt

OP_NAMES = {
    fmt.OP_COPY: "copy",
    fmt.OP_ADD_BYTES: "add_bytes",
    fmt.OP_ADD_BITS: "add_bits",
    fmt.OP_PLANES: "planes",
    fmt.OP_ZSTD: "zstd",
    fmt.OP_ADD_BYTES_SORTED: "add_bytes_sorted",
    fmt.OP_ADD_BITS_SORTED: "add_bits_sorted",
    fmt.OP_LITERAL: "literal",
}


def op_summary(patch: Path) -> dict[str, tuple[int, int]]:
    """op kind name -> (number of ops, output bytes they produce). Trusts the patch."""
    counts: Counter[str] = Counter()
    produced: Counter[str] = Counter()
    with open(patch, "rb") as f:
        fields = fmt.HEADER.unpack(f.read(fmt.HEADER.size))
        op_count, table_offset, table_length = fields[6:9]
        f.seek(table_offset)
        table = zstandard.ZstdDecompressor().decompress(f.read(table_length))
    pos = 0
    for _ in range(op_count):
        kind, width, _, length, _, _ = fmt.OP_HEADER.unpack_from(table, pos)
        pos += fmt.OP_HEADER.size + fmt.STREAM_LENGTH.size * fmt.stream_count(kind, width)
        pos += length if kind == fmt.OP_LITERAL else 0
        counts[OP_NAMES[kind]] += 1
        produced[OP_NAMES[kind]] += length
    return {name: (counts[name], produced[name]) for name in counts}
