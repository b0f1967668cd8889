"""Create ``mfdelta1`` patches: tensor-aware deltas that work on any pair of files.

This module owns the encoder. The decoder (and the format constants) live in
``client_sdk/patching.py``; ``docs/delta.md`` is the byte-level spec.

How the new file is cut into ops: ONNX initializers are paired with the base's by
(name, data type, dims) (see ``onnx_layout``); a changed pair becomes the element-wise integer
difference new - old, zigzag-coded, split into byte planes (or bit planes for 1- and 2-byte
elements) and zstd-compressed plane by plane; an unchanged pair is a COPY. Everything else
(protobuf framing, unpaired tensors, whole non-ONNX files) is cut into 1 MiB pieces compressed
with the base bytes at the corresponding position as a zstd raw-content dictionary, and, for
large pieces, also tried as a same-offset 4-byte difference. Each piece keeps whichever
encoding is smallest. Work is done chunk by chunk, so memory stays at a few times
``TENSOR_CHUNK`` whatever the file size.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt
import zstandard

from client_sdk import patching as fmt
from server.delta.onnx_layout import Tensor, read_layout
from server.hashing import file_sha256

TENSOR_CHUNK = 4 * 1024 * 1024  # bytes of one tensor encoded as one op (<= fmt.MAX_OP_LENGTH)
# Elements per tensor op: context order needs an 8-byte index per element on both sides, so
# int8 ops are kept to 1 MiB (8 MiB of index) rather than 4 MiB (32 MiB).
TENSOR_CHUNK_ELEMENTS = 1024 * 1024
GAP_CHUNK = 1024 * 1024  # bytes of opaque data per OP_ZSTD
REF_SLACK = 256 * 1024  # base bytes before the mapped position kept in the dictionary
# zstd level 3 on large inputs has a 2 MiB window; dictionary + piece must fit in it.
REF_BUDGET = 2 * 1024 * 1024 - GAP_CHUNK
MIN_BIT_PLANE_ELEMENTS = 4096  # below this the 8-16 stream headers cost more than they save
GAP_DIFF_MIN = 64 * 1024  # opaque pieces at least this long also try a 4-byte difference
LITERAL_MAX = 4096  # pieces up to this long may ride inline in the op table
LITERAL_BUDGET = 8 * 1024 * 1024  # total inline bytes (the decoder holds the table in memory)
DICT_LEVEL_MIN = 3  # lower levels have smaller windows than REF_BUDGET assumes

UIntArray = npt.NDArray[Any]


@dataclass(frozen=True)
class Region:
    """A run of the new file and where it probably came from in the base."""

    new_offset: int
    length: int
    width: int
    base_offset: int | None  # paired tensor in the base, or None
    mapped: int  # best guess of the matching base position for opaque data
    is_tensor: bool


@dataclass(frozen=True)
class Encoded:
    kind: int
    width: int
    base_offset: int
    ref_length: int
    streams: list[bytes]
    literal: bytes = b""

    @property
    def size(self) -> int:
        # Estimate: op records compress to a few bytes in the op table; literals barely do.
        return 8 + sum(len(s) for s in self.streams) + len(self.literal)

    def record(self, length: int) -> bytes:
        head = fmt.OP_HEADER.pack(
            self.kind, self.width, 0, length, self.base_offset, self.ref_length
        )
        sizes = b"".join(fmt.STREAM_LENGTH.pack(len(s)) for s in self.streams)
        return head + sizes + self.literal


def plan_regions(new: list[Tensor], base: list[Tensor], new_size: int) -> list[Region]:
    """Cover [0, new_size) with tensor regions (paired when possible) and the gaps between."""
    base_by_key: dict[tuple[str, int, tuple[int, ...]], Tensor | None] = {}
    for t in base:
        base_by_key[t.key] = None if t.key in base_by_key else t
    new_counts = Counter(t.key for t in new)
    duplicated = {k for k, n in new_counts.items() if n > 1}
    pairs: list[tuple[Tensor, Tensor | None]] = []
    for t in new:
        match = base_by_key.get(t.key) if t.key not in duplicated else None
        if match is not None and match.length != t.length:
            match = None
        pairs.append((t, match))

    regions: list[Region] = []
    shift = 0  # base position - new position, taken from the last paired tensor

    def add_gap(start: int, end: int) -> None:
        if end > start:
            regions.append(Region(start, end - start, 1, None, start + shift, False))

    cursor = 0
    for t, match in pairs:
        add_gap(cursor, t.offset)
        if match is not None:
            shift = match.offset - t.offset
            regions.append(Region(t.offset, t.length, t.width, match.offset, match.offset, True))
        else:
            regions.append(Region(t.offset, t.length, t.width, None, t.offset + shift, True))
        cursor = t.offset + t.length
    add_gap(cursor, new_size)
    return regions


def _zigzag(delta: UIntArray, width: int) -> UIntArray:
    signed = delta.view(f"<i{width}")
    result: UIntArray = ((signed << 1) ^ (signed >> (8 * width - 1))).view(f"<u{width}")
    return result


def _byte_planes(values: UIntArray, width: int) -> list[UIntArray]:
    matrix = values.view(np.uint8).reshape(-1, width)
    return [np.ascontiguousarray(matrix[:, k]) for k in range(width)]


def _bit_planes(values: UIntArray, width: int) -> list[UIntArray]:
    """Plane j = bit j of every element, packed 8 per byte, first element in the top bit."""
    count = len(values)
    groups = (count + 7) // 8
    lanes = values.view(np.uint8).reshape(count, width)
    planes = []
    for lane in range(width):
        padded = np.zeros(groups * 8, dtype=np.uint8)
        padded[:count] = lanes[:, lane]
        # Big-endian: element i of a group of 8 sits in the byte of weight 2^(8*(7-i)), so
        # after the transpose byte k (weight 2^8k) holds bit k with element i at bit 7 - i.
        flipped = fmt.transpose8(padded.view(">u8").astype("<u8"))
        matrix = flipped.view(np.uint8).reshape(groups, 8)
        planes += [np.ascontiguousarray(matrix[:, k]) for k in range(8)]
    return planes


class Encoder:
    """Encodes regions of one (base, new) pair; owns the zstd contexts and file handles."""

    def __init__(self, base: BinaryIO, base_size: int, level: int) -> None:
        self.literal_budget = LITERAL_BUDGET
        self.base = base
        self.base_size = base_size
        self.level = level
        self.plain = zstandard.ZstdCompressor(level=level, write_checksum=False)
        self.dict_level = max(level, DICT_LEVEL_MIN)

    def read_base(self, offset: int, length: int) -> bytes:
        self.base.seek(offset)
        return self.base.read(length)

    def compress(self, planes: list[UIntArray]) -> list[bytes]:
        return [self.plain.compress(p.data) for p in planes]

    def tensor_chunk(
        self, data: bytes, width: int, base_offset: int | None, mapped: int
    ) -> Encoded:
        if base_offset is None:
            return self.smallest(
                [self.planes(data, width), self.opaque(data, mapped), *self.literal(data)]
            )
        old_bytes = self.read_base(base_offset, len(data))
        if old_bytes == data:
            return Encoded(fmt.OP_COPY, 1, base_offset, 0, [])
        new_values = np.frombuffer(data, dtype=fmt.element_dtype(width))
        old_values = np.frombuffer(old_bytes, dtype=fmt.element_dtype(width))
        zigzagged = _zigzag(new_values - old_values, width)
        candidates = [
            self.add(fmt.OP_ADD_BYTES, zigzagged, width, base_offset),
            *self.literal(data),
        ]
        if len(zigzagged) >= MIN_BIT_PLANE_ELEMENTS:
            # Ordering diffs by the base value's top byte groups alike statistics (an int8
            # near +-127 moves on re-quantization far more often than one near 0).
            in_context = zigzagged[fmt.context_order(old_values)]
            candidates.append(self.add(fmt.OP_ADD_BYTES_SORTED, in_context, width, base_offset))
            candidates.append(self.add(fmt.OP_ADD_BITS_SORTED, in_context, width, base_offset))
        if min(c.size for c in candidates) > len(data) * 2 // 5:
            # Weights that moved far from the base (or unrelated ones): raw planes may win.
            candidates.append(self.planes(data, width))
        return self.smallest(candidates)

    def add(self, kind: int, zigzagged: UIntArray, width: int, base_offset: int) -> Encoded:
        split = _bit_planes if kind in (fmt.OP_ADD_BITS, fmt.OP_ADD_BITS_SORTED) else _byte_planes
        return Encoded(kind, width, base_offset, 0, self.compress(split(zigzagged, width)))

    def planes(self, data: bytes, width: int) -> Encoded:
        values = np.frombuffer(data, dtype=fmt.element_dtype(width))
        return Encoded(fmt.OP_PLANES, width, 0, 0, self.compress(_byte_planes(values, width)))

    def opaque(self, data: bytes, mapped: int) -> Encoded:
        ref_start = min(max(0, mapped - REF_SLACK), self.base_size)
        ref_end = min(self.base_size, ref_start + REF_BUDGET)
        if ref_end <= ref_start:
            return Encoded(fmt.OP_ZSTD, 1, 0, 0, [self.plain.compress(data)])
        ref = zstandard.ZstdCompressionDict(
            self.read_base(ref_start, ref_end - ref_start),
            dict_type=zstandard.DICT_TYPE_RAWCONTENT,
        )
        with_ref = zstandard.ZstdCompressor(
            level=self.dict_level, dict_data=ref, write_checksum=False
        )
        return Encoded(fmt.OP_ZSTD, 1, ref_start, ref_end - ref_start, [with_ref.compress(data)])

    def literal(self, data: bytes) -> list[Encoded]:
        """An inline candidate for a small piece, while the table budget lasts."""
        if len(data) > LITERAL_MAX or len(data) > self.literal_budget:
            return []
        return [Encoded(fmt.OP_LITERAL, 1, 0, 0, [], data)]

    def gap_chunk(self, data: bytes, mapped: int) -> Encoded:
        inline = self.literal(data)
        if inline and len(data) <= 256:
            return inline[0]  # protobuf framing between tensors: a dictionary cannot pay off
        candidates = [self.opaque(data, mapped), *inline]
        if (
            len(data) >= GAP_DIFF_MIN
            and len(data) % 4 == 0
            and 0 <= mapped
            and mapped + len(data) <= self.base_size
        ):
            candidates.append(self.tensor_chunk(data, 4, mapped, mapped))
        return self.smallest(candidates)

    def smallest(self, candidates: list[Encoded]) -> Encoded:
        best = min(candidates, key=lambda c: c.size)
        self.literal_budget -= len(best.literal)
        return best


def _chunks(region: Region) -> Iterator[tuple[int, int]]:
    """(offset within region, length) pieces; tensor pieces keep whole elements."""
    if region.is_tensor:
        step = min(TENSOR_CHUNK, TENSOR_CHUNK_ELEMENTS * region.width)
    else:
        step = GAP_CHUNK
    step -= step % region.width
    for start in range(0, region.length, step):
        yield start, min(step, region.length - start)


def create_mfdelta1(base: Path, new: Path, out: Path, *, level: int = 3) -> None:
    """Write an mfdelta1 patch turning ``base`` into ``new`` to ``out`` (atomically)."""
    base_hex, base_size = file_sha256(base)
    base_sha = bytes.fromhex(base_hex)
    new_size = os.path.getsize(new)
    regions = plan_regions(read_layout(new), read_layout(base), new_size)
    fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as sink, open(base, "rb") as base_file, open(new, "rb") as src:
            sink.write(b"\0" * fmt.HEADER.size)  # filled in once the output hash is known
            encoder = Encoder(base_file, base_size, level)
            digest = hashlib.sha256()
            table = bytearray()
            op_count = 0
            for region in regions:
                for start, length in _chunks(region):
                    src.seek(region.new_offset + start)
                    data = src.read(length)
                    digest.update(data)
                    if region.is_tensor:
                        base_offset = (
                            None if region.base_offset is None else region.base_offset + start
                        )
                        encoded = encoder.tensor_chunk(
                            data, region.width, base_offset, region.mapped + start
                        )
                    else:
                        encoded = encoder.gap_chunk(data, region.mapped + start)
                    for stream in encoded.streams:
                        sink.write(stream)
                    table += encoded.record(length)
                    op_count += 1
            if len(table) > fmt.MAX_TABLE_LENGTH:
                raise ValueError("mfdelta1 op table over the format's cap; raise TENSOR_CHUNK")
            table_offset = sink.tell()
            compressed_table = zstandard.ZstdCompressor(level=19).compress(bytes(table))
            sink.write(compressed_table)
            sink.seek(0)
            sink.write(
                fmt.HEADER.pack(
                    fmt.MAGIC, 0, base_size, base_sha, new_size, digest.digest(), op_count,
                    table_offset, len(compressed_table), len(table),
                )
            )
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(tmp_name, out)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
