"""Locate the initializer tensors inside an ONNX file without loading it.

This module owns one question: where, byte for byte, do an ONNX model's weights live? It walks
the protobuf wire format (ModelProto.graph -> GraphProto.initializer -> TensorProto) and
returns each initializer's ``raw_data`` offset, length, element width and identity (name,
data type, dims). Weight bytes are skipped with ``seek``, so a multi-GB model costs a few
thousand small reads and no memory. Anything that is not a well-formed ONNX file yields an
empty layout: the caller then treats the file as opaque bytes, which is always correct.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

# Field numbers from onnx.proto3.
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_DIMS = 1
_TENSOR_DATA_TYPE = 2
_TENSOR_NAME = 8
_TENSOR_RAW_DATA = 9

# TensorProto.DataType -> bytes per element; anything unlisted (strings, 4-bit) is width 1.
_WIDTHS = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2}

_WIRE_VARINT, _WIRE_I64, _WIRE_LEN, _WIRE_I32 = 0, 1, 2, 5


@dataclass(frozen=True)
class Tensor:
    """One initializer's raw bytes inside the file."""

    name: str
    data_type: int
    dims: tuple[int, ...]
    offset: int
    length: int
    width: int

    @property
    def key(self) -> tuple[str, int, tuple[int, ...]]:
        return (self.name, self.data_type, self.dims)


class _NotOnnx(Exception):
    pass


class _Walker:
    def __init__(self, source: BinaryIO, size: int) -> None:
        self.source = source
        self.size = size

    def fields(self, start: int, end: int) -> list[tuple[int, int, int, int]]:
        """(field, wire type, value or payload offset, payload length) for a message."""
        result = []
        pos = start
        while pos < end:
            self.source.seek(pos)
            head = self.source.read(20)
            tag, used = _varint(head, 0)
            field, wire = tag >> 3, tag & 7
            if field == 0:
                raise _NotOnnx
            if wire == _WIRE_VARINT:
                value, used = _varint(head, used)
                result.append((field, wire, value, 0))
                pos += used
            elif wire == _WIRE_LEN:
                length, used = _varint(head, used)
                result.append((field, wire, pos + used, length))
                pos += used + length
            elif wire in (_WIRE_I64, _WIRE_I32):
                pos += used + (8 if wire == _WIRE_I64 else 4)
            else:
                raise _NotOnnx  # groups are not used by ONNX
        if pos != end:
            raise _NotOnnx
        return result

    def read(self, offset: int, length: int) -> bytes:
        self.source.seek(offset)
        return self.source.read(length)

    def tensor(self, start: int, end: int) -> Tensor | None:
        name, data_type, dims, raw = "", 0, [], None
        for field, wire, value, length in self.fields(start, end):
            if field == _TENSOR_DIMS and wire == _WIRE_VARINT:
                dims.append(value)
            elif field == _TENSOR_DIMS and wire == _WIRE_LEN:
                packed, pos = self.read(value, length), 0
                while pos < len(packed):
                    dim, pos = _varint(packed, pos)
                    dims.append(dim)
            elif field == _TENSOR_DATA_TYPE and wire == _WIRE_VARINT:
                data_type = value
            elif field == _TENSOR_NAME and wire == _WIRE_LEN and length <= 4096:
                name = self.read(value, length).decode("utf-8", "replace")
            elif field == _TENSOR_RAW_DATA and wire == _WIRE_LEN:
                raw = (value, length)
        if raw is None or raw[1] == 0:
            return None
        width = _WIDTHS.get(data_type, 1)
        if raw[1] % width:
            width = 1
        return Tensor(name, data_type, tuple(dims), raw[0], raw[1], width)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _NotOnnx
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7


def read_layout(path: Path) -> list[Tensor]:
    """The initializers of the ONNX model at ``path`` sorted by offset; [] if not ONNX."""
    size = os.path.getsize(path)
    with open(path, "rb") as source:
        walker = _Walker(source, size)
        try:
            tensors = []
            for field, wire, value, length in walker.fields(0, size):
                if field != _MODEL_GRAPH or wire != _WIRE_LEN:
                    continue
                for g_field, g_wire, g_value, g_length in walker.fields(value, value + length):
                    if g_field == _GRAPH_INITIALIZER and g_wire == _WIRE_LEN:
                        tensor = walker.tensor(g_value, g_value + g_length)
                        if tensor is not None:
                            tensors.append(tensor)
        except _NotOnnx:
            return []
    tensors.sort(key=lambda t: t.offset)
    for before, after in itertools.pairwise(tensors):
        if before.offset + before.length > after.offset:
            return []
    return tensors
