"""Protobuf framing of an ONNX file, read field by field without parsing it (stdlib only).

Shared by the upload checks (server/services/sourcefiles.py) and by the compile sandbox's
parent, which sniffs the artifacts a sandboxed child hands back: both must look at untrusted
bytes without loading them into a protobuf library.
"""

from __future__ import annotations

from typing import BinaryIO

# ModelProto fields (onnx.proto3): number -> wire type (0 varint, 2 length-delimited).
ONNX_FIELDS = {1: 0, 2: 2, 3: 2, 4: 2, 5: 0, 6: 2, 7: 2, 8: 2, 14: 2, 20: 2, 25: 2}
ONNX_GRAPH_FIELD = 7
MAX_TOP_LEVEL_FIELDS = 100_000


def read_varint(f: BinaryIO) -> int | None:
    """The next base-128 varint, or None at end of file / past 10 bytes."""
    result = 0
    for shift in range(0, 70, 7):
        b = f.read(1)
        if not b:
            return None
        result |= (b[0] & 0x7F) << shift
        if not b[0] & 0x80:
            return result
    return None


def is_onnx(f: BinaryIO) -> bool:
    """Whether `f` is framed like an ONNX ModelProto (see `_is_onnx`); rewinds `f`."""
    try:
        return _is_onnx(f)
    finally:
        f.seek(0)


def _is_onnx(f: BinaryIO) -> bool:
    """Walks the top-level protobuf fields of a ModelProto (skipping nested messages by
    length): every tag must be a known ModelProto field of the right wire type, a graph must
    be present, and the walk must end exactly at end of file."""
    end = f.seek(0, 2)
    f.seek(0)
    if end == 0:
        return False
    seen_graph = False
    for _ in range(MAX_TOP_LEVEL_FIELDS):
        if f.tell() == end:
            return seen_graph
        tag = read_varint(f)
        if tag is None:
            return False
        number, wire = tag >> 3, tag & 7
        if ONNX_FIELDS.get(number) != wire:
            return False
        if wire == 0:
            if read_varint(f) is None:
                return False
        else:
            size = read_varint(f)
            if size is None or f.tell() + size > end:
                return False
            f.seek(size, 1)
        seen_graph = seen_graph or number == ONNX_GRAPH_FIELD
    return False
