"""Apply delta patches on the device: ``bsdiff4`` and the tensor-aware ``mfdelta1``.

This module owns turning (base file, patch file) into the new file, safely: the output is
written to a temporary file beside ``out``, fsynced and renamed into place, so ``out`` is
either untouched or complete. It never touches the network. Creation lives in
``server/delta/``; the byte format of ``mfdelta1`` is specified in ``docs/delta.md`` and its
constants are defined here so the encoder and this decoder cannot drift apart.

Errors (all raised by :func:`apply_patch`; ``OSError`` from reading or writing files passes
through unchanged)::

    PatchError                  base: the patch could not be applied
     ├── UnknownAlgorithmError  the manifest names an algorithm this SDK does not know
     ├── CorruptPatchError      the patch is malformed, truncated or fails its checksum
     ├── BaseMismatchError      the local base is not the file the patch was made from
     └── OutputTooLargeError    the patch would produce more than ``max_output`` bytes

A caller that gets any ``PatchError`` should fall back to downloading the full artifact.
"""

from __future__ import annotations

import bz2
import hashlib
import os
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Final

import bsdiff4.core
import numpy as np
import numpy.typing as npt
import zstandard

from client_sdk.fsutil import fsync_dir

__all__ = [
    "ALGORITHMS",
    "BaseMismatchError",
    "CorruptPatchError",
    "OutputTooLargeError",
    "PatchError",
    "UnknownAlgorithmError",
    "apply_patch",
]

ALGORITHMS: Final = ("bsdiff4", "mfdelta1")


class PatchError(Exception):
    """A patch could not be applied; download the full artifact instead."""


class UnknownAlgorithmError(PatchError):
    """The patch names an algorithm this SDK cannot apply."""


class CorruptPatchError(PatchError):
    """The patch is malformed, truncated, or its output fails the embedded checksum."""


class BaseMismatchError(PatchError):
    """The local base file is not the one the patch was created from."""


class OutputTooLargeError(PatchError):
    """Applying the patch would write more than the caller's ``max_output`` bytes."""


# --- mfdelta1 format constants (docs/delta.md is the normative description) ---------------

MAGIC: Final = b"MFDELTA1"
# magic, flags (u32, must be 0), base length, base sha256, output length, output sha256,
# op count (u32), op table offset (u64), op table compressed / raw length (u32 each)
HEADER: Final = struct.Struct("<8sIQ32sQ32sIQII")
# Op record in the (zstd-compressed) op table: kind (u8), width (u8), reserved (u16, 0),
# length, base offset, ref length (u64 each); then one u32 per stream (its compressed
# length in the data section); an OP_LITERAL record is followed by its ``length`` bytes.
OP_HEADER: Final = struct.Struct("<BBHQQQ")
STREAM_LENGTH: Final = struct.Struct("<I")

OP_COPY: Final = 0  # output = base[offset : offset + length]
OP_ADD_BYTES: Final = 1  # output = base element + unzigzag(diff), diff as byte planes
OP_ADD_BITS: Final = 2  # same, diff as bit planes
OP_PLANES: Final = 3  # output = elements assembled from byte planes (no base)
OP_ZSTD: Final = 4  # output = one zstd frame, optionally with a base range as raw dictionary
OP_ADD_BYTES_SORTED: Final = 5  # OP_ADD_BYTES with the diff stored in context order
OP_ADD_BITS_SORTED: Final = 6  # OP_ADD_BITS with the diff stored in context order
OP_LITERAL: Final = 7  # output = bytes stored inline in the op table (small pieces)
OP_KINDS: Final = frozenset(range(8))
_ADD_KINDS: Final = frozenset({OP_ADD_BYTES, OP_ADD_BITS, OP_ADD_BYTES_SORTED, OP_ADD_BITS_SORTED})
_BIT_KINDS: Final = frozenset({OP_ADD_BITS, OP_ADD_BITS_SORTED})
_SORTED_KINDS: Final = frozenset({OP_ADD_BYTES_SORTED, OP_ADD_BITS_SORTED})
WIDTHS: Final = (1, 2, 4, 8)

# Caps that bound the decoder's memory whatever the patch says (a few times these values).
MAX_OP_LENGTH: Final = 8 * 1024 * 1024  # bytes one non-COPY op may produce
MAX_REF_LENGTH: Final = 16 * 1024 * 1024  # bytes of base one OP_ZSTD may use as dictionary
MAX_ZSTD_WINDOW: Final = 1 << 25  # no frame may need a larger window than 32 MiB
MAX_TABLE_LENGTH: Final = 16 * 1024 * 1024  # decompressed op table (held in memory)
MAX_LITERAL_LENGTH: Final = 64 * 1024  # bytes one OP_LITERAL may carry

_IO_BLOCK: Final = 1024 * 1024

# Element arrays are little-endian unsigned integers of the op's width (uint8..uint64).
UIntArray = npt.NDArray[Any]


def stream_count(kind: int, width: int) -> int:
    """Number of data-section streams an op of this kind and width reads."""
    if kind in (OP_COPY, OP_LITERAL):
        return 0
    if kind in _BIT_KINDS:
        return 8 * width
    if kind == OP_ZSTD:
        return 1
    return width


def element_dtype(width: int) -> np.dtype[Any]:
    """Little-endian unsigned integer dtype of ``width`` bytes (the element view)."""
    return np.dtype(f"<u{width}")


def unzigzag(z: UIntArray) -> UIntArray:
    """Inverse of zigzag: 0,1,2,3,... -> 0,-1,1,-2,... as wrapped unsigned integers."""
    ones = np.array(np.iinfo(z.dtype).max, dtype=z.dtype)
    result: UIntArray = (z >> 1) ^ ((z & 1) * ones)
    return result


def context_order(old: UIntArray) -> UIntArray:
    """Indices of ``old`` stably sorted by each element's most significant byte.

    Sorted ops store the diff of element ``order[j]`` at position ``j``: grouping elements
    by the base value's top byte (sign and exponent of a float, the whole value of an int8)
    puts diffs with similar statistics together, which zstd then codes far better.
    """
    key = (old >> np.array(8 * old.dtype.itemsize - 8, dtype=old.dtype)).astype(np.uint8)
    order: UIntArray = np.argsort(key, kind="stable")
    return order


def join_byte_planes(planes: list[bytes], count: int, width: int) -> UIntArray:
    """Elements whose k-th little-endian byte is ``planes[k][i]``."""
    matrix = np.empty((count, width), dtype=np.uint8)
    for k, plane in enumerate(planes):
        matrix[:, k] = np.frombuffer(plane, dtype=np.uint8)
    return matrix.view(element_dtype(width)).reshape(count)


def transpose8(x: UIntArray) -> UIntArray:
    """Transpose the 8x8 bit matrix in each uint64 (bit k of byte m <-> bit m of byte k).

    Bit-plane ops use it on groups of 8 elements (an involution: the same call undoes it).
    Hacker's Delight, 7-3 ("transpose8"), on whole arrays at once.
    """
    x = x.copy()
    steps = ((7, 0x00AA00AA00AA00AA), (14, 0x0000CCCC0000CCCC), (28, 0x00000000F0F0F0F0))
    for shift, mask in steps:
        s, m = np.uint64(shift), np.uint64(mask)
        t = (x ^ (x >> s)) & m
        x ^= t ^ (t << s)
    return x


def join_bit_planes(planes: list[bytes], count: int, width: int) -> UIntArray:
    """Elements whose bit j is bit i of ``planes[j]`` (packed most significant bit first)."""
    groups = (count + 7) // 8
    lanes = np.empty((width, groups * 8), dtype=np.uint8)
    for lane in range(width):
        matrix = np.empty((groups, 8), dtype=np.uint8)
        for k in range(8):
            matrix[:, k] = np.frombuffer(planes[8 * lane + k], dtype=np.uint8)
        # Column k is plane k: as a little-endian uint64, byte k (weight 2^8k) holds bit k of
        # the group's 8 elements, element i at bit 7 - i. Transposing yields, per byte of
        # weight 2^(8*(7-i)), element i, so the big-endian bytes are the elements in order.
        flipped = transpose8(matrix.view("<u8").reshape(groups))
        lanes[lane] = flipped.astype(">u8").view(np.uint8)
    matrix_out = np.ascontiguousarray(lanes[:, :count].T)
    return matrix_out.view(element_dtype(width)).reshape(count)


# --- public entry point ------------------------------------------------------------------


def apply_patch(algorithm: str, base: Path, patch: Path, out: Path, *, max_output: int) -> None:
    """Write ``base`` patched with ``patch`` to ``out``, atomically.

    ``max_output`` caps the size of the result (pass the artifact length from the signed
    manifest). On any error ``out`` is left as it was and no temporary file remains.

    Raises:
        UnknownAlgorithmError: ``algorithm`` is not one of :data:`ALGORITHMS`.
        CorruptPatchError: the patch is malformed or its result fails the embedded checksum.
        BaseMismatchError: ``base`` is not the file the patch was made from (mfdelta1).
        OutputTooLargeError: the result would be larger than ``max_output``.
        OSError: reading ``base``/``patch`` or writing next to ``out`` failed.
    """
    _applier(algorithm, max_output)
    fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as sink, open(base, "rb") as b, open(patch, "rb") as p:
            apply_patch_streams(algorithm, b, p, sink, max_output=max_output)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(out.parent)  # makes the rename durable


def _applier(algorithm: str, max_output: int) -> Callable[[BinaryIO, BinaryIO, BinaryIO, int],
                                                          None]:
    appliers: dict[str, Callable[[BinaryIO, BinaryIO, BinaryIO, int], None]] = {
        "bsdiff4": _apply_bsdiff4,
        "mfdelta1": _apply_mfdelta1,
    }
    applier = appliers.get(algorithm)
    if applier is None:
        raise UnknownAlgorithmError(
            f"unknown patch algorithm {algorithm!r}; this SDK applies {', '.join(ALGORITHMS)} "
            "- download the full artifact instead"
        )
    if max_output < 0:
        raise ValueError("max_output must be >= 0")
    return applier


def apply_patch_streams(algorithm: str, base: BinaryIO, patch: BinaryIO, sink: BinaryIO, *,
                        max_output: int) -> None:
    """``apply_patch`` between open, seekable streams (a protected release's base and patch
    decrypted into memory: ``io.BytesIO``); writes the result to ``sink`` as it goes."""
    _applier(algorithm, max_output)(base, patch, sink, max_output)


def _read_exact(source: BinaryIO, size: int, what: str) -> bytes:
    data = source.read(size)
    if len(data) != size:
        raise CorruptPatchError(f"patch is truncated: expected {size} bytes of {what}")
    return data


# --- bsdiff4 -----------------------------------------------------------------------------


def _bz2_bounded(data: bytes, limit: int, what: str) -> bytes:
    # bsdiff4.format.read_patch would inflate blocks without a cap (a decompression bomb).
    decompressor = bz2.BZ2Decompressor()
    try:
        result = decompressor.decompress(data, max_length=limit + 1)
    except (OSError, EOFError, ValueError) as e:
        raise CorruptPatchError(f"bsdiff4 patch: {what} block is not valid bz2: {e}") from e
    if len(result) > limit:
        raise CorruptPatchError(f"bsdiff4 patch: {what} block is larger than the output")
    if not decompressor.eof:
        raise CorruptPatchError(f"bsdiff4 patch: {what} block is truncated")
    if decompressor.unused_data:
        raise CorruptPatchError(f"bsdiff4 patch: trailing bytes after the {what} block")
    return result


def _apply_bsdiff4(base: BinaryIO, source: BinaryIO, sink: BinaryIO, max_output: int) -> None:
    # bsdiff4 is the baseline: it needs base, output and blocks in memory at once.
    header = _read_exact(source, 32, "bsdiff4 header")
    if header[:8] != b"BSDIFF40":
        raise CorruptPatchError("bsdiff4 patch: bad magic (expected BSDIFF40)")
    sizes = [int(bsdiff4.core.decode_int64(header[i : i + 8])) for i in (8, 16, 24)]
    len_control, len_diff, len_dst = sizes
    if min(sizes) < 0:
        raise CorruptPatchError("bsdiff4 patch: negative length in header")
    if len_dst > max_output:
        raise OutputTooLargeError(
            f"bsdiff4 patch would write {len_dst} bytes, more than max_output={max_output}"
        )
    control = _bz2_bounded(
        _read_exact(source, len_control, "control block"), 24 * (len_dst + 1), "control"
    )
    if len(control) % 24:
        raise CorruptPatchError("bsdiff4 patch: control block is not a whole number of entries")
    diff = _bz2_bounded(_read_exact(source, len_diff, "diff block"), len_dst, "diff")
    extra = _bz2_bounded(source.read(), len_dst, "extra")
    source_bytes = base.read()
    try:
        result = bsdiff4.core.patch(source_bytes, len_dst, control, diff, extra)
    except (ValueError, OverflowError, MemoryError) as e:
        raise CorruptPatchError(f"bsdiff4 patch does not apply to this base: {e}") from e
    if not isinstance(result, bytes) or len(result) != len_dst:
        raise CorruptPatchError("bsdiff4 patch produced a result of the wrong length")
    sink.write(result)


# --- mfdelta1 ----------------------------------------------------------------------------


class _Mfdelta1Reader:
    """Decodes one mfdelta1 patch op by op; each op's output is at most MAX_OP_LENGTH.

    Op records come from the decompressed op table (``table``); the compressed streams they
    name are read one after another from the data section of ``patch``.
    """

    def __init__(self, base: BinaryIO, patch: BinaryIO, base_length: int, table: bytes) -> None:
        self.base = base
        self.patch = patch
        self.base_length = base_length
        self.table = memoryview(table)
        self.table_pos = 0
        self.plain = zstandard.ZstdDecompressor(max_window_size=MAX_ZSTD_WINDOW)

    def table_bytes(self, size: int, what: str) -> bytes:
        if self.table_pos + size > len(self.table):
            raise CorruptPatchError(f"mfdelta1 op table ends inside {what}")
        data = bytes(self.table[self.table_pos : self.table_pos + size])
        self.table_pos += size
        return data

    def next_op(self) -> tuple[int, int, int, int, int, int, list[int]]:
        kind, width, reserved, length, offset, ref_length = OP_HEADER.unpack(
            self.table_bytes(OP_HEADER.size, "an op record")
        )
        _check_op(kind, width, reserved, length, offset, ref_length)
        sizes = [
            STREAM_LENGTH.unpack(self.table_bytes(STREAM_LENGTH.size, "stream sizes"))[0]
            for _ in range(stream_count(kind, width))
        ]
        return kind, width, reserved, length, offset, ref_length, sizes

    def base_range(self, offset: int, length: int) -> bytes:
        if offset + length > self.base_length:
            raise CorruptPatchError(
                f"patch op reads base bytes {offset}..{offset + length}, "
                f"past the base's end ({self.base_length})"
            )
        self.base.seek(offset)
        data = self.base.read(length)
        if len(data) != length:
            raise BaseMismatchError("base file changed while the patch was being applied")
        return data

    def stream(
        self, size: int, expected: int, decompressor: zstandard.ZstdDecompressor | None = None
    ) -> bytes:
        if size > MAX_OP_LENGTH + 65536:
            raise CorruptPatchError(f"patch stream of {size} bytes exceeds the format's cap")
        frame = _read_exact(self.patch, size, "stream")
        return _decompress(decompressor or self.plain, frame, expected)

    def op(
        self, kind: int, width: int, length: int, offset: int, ref_length: int, sizes: list[int]
    ) -> bytes:
        count = length // width
        if kind == OP_LITERAL:
            return self.table_bytes(length, "literal bytes")
        if kind in _ADD_KINDS:
            old = np.frombuffer(self.base_range(offset, length), dtype=element_dtype(width))
            if kind in _BIT_KINDS:
                planes = [self.stream(size, (count + 7) // 8) for size in sizes]
                zigzagged = join_bit_planes(planes, count, width)
            else:
                planes = [self.stream(size, count) for size in sizes]
                zigzagged = join_byte_planes(planes, count, width)
            if kind in _SORTED_KINDS:
                stored = zigzagged
                zigzagged = np.empty_like(stored)
                zigzagged[context_order(old)] = stored
            return (old + unzigzag(zigzagged)).tobytes()
        if kind == OP_PLANES:
            planes = [self.stream(size, count) for size in sizes]
            return join_byte_planes(planes, count, width).tobytes()
        # OP_ZSTD
        if ref_length == 0:
            return self.stream(sizes[0], length)
        ref = zstandard.ZstdCompressionDict(
            self.base_range(offset, ref_length), dict_type=zstandard.DICT_TYPE_RAWCONTENT
        )
        with_ref = zstandard.ZstdDecompressor(dict_data=ref, max_window_size=MAX_ZSTD_WINDOW)
        return self.stream(sizes[0], length, with_ref)


def _decompress(decompressor: zstandard.ZstdDecompressor, frame: bytes, expected: int) -> bytes:
    try:
        content_size = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as e:
        raise CorruptPatchError(f"patch stream is not a zstd frame: {e}") from e
    if content_size != expected:
        raise CorruptPatchError(
            f"patch stream declares {content_size} bytes where the op needs {expected}"
        )
    try:
        data = decompressor.decompress(frame, max_output_size=expected, allow_extra_data=False)
    except zstandard.ZstdError as e:
        raise CorruptPatchError(f"patch stream does not decompress: {e}") from e
    if len(data) != expected:
        raise CorruptPatchError("patch stream decompressed to the wrong length")
    return data


def _check_op(
    kind: int, width: int, reserved: int, length: int, offset: int, ref_length: int
) -> None:
    if kind not in OP_KINDS:
        raise CorruptPatchError(f"unknown mfdelta1 op kind {kind}")
    if width not in WIDTHS or reserved != 0 or length == 0 or length % width:
        raise CorruptPatchError("malformed mfdelta1 op header (width, reserved or length)")
    if kind in (OP_COPY, OP_ZSTD, OP_LITERAL) and width != 1:
        raise CorruptPatchError("mfdelta1 copy/zstd/literal ops must have width 1")
    if kind == OP_LITERAL and length > MAX_LITERAL_LENGTH:
        raise CorruptPatchError(f"mfdelta1 literal of {length} bytes exceeds the format's cap")
    if kind != OP_COPY and length > MAX_OP_LENGTH:
        raise CorruptPatchError(f"mfdelta1 op of {length} bytes exceeds the format's cap")
    if kind in (OP_PLANES, OP_LITERAL) and offset != 0:
        raise CorruptPatchError("mfdelta1 planes/literal ops must have base offset 0")
    if (kind != OP_ZSTD and ref_length != 0) or ref_length > MAX_REF_LENGTH:
        raise CorruptPatchError("mfdelta1 op has an invalid dictionary length")


def _hash_file(source: BinaryIO) -> tuple[int, bytes]:
    digest = hashlib.sha256()
    size = 0
    source.seek(0)
    while block := source.read(_IO_BLOCK):
        digest.update(block)
        size += len(block)
    return size, digest.digest()


def _apply_mfdelta1(base_file: BinaryIO, patch_file: BinaryIO, sink: BinaryIO,
                    max_output: int) -> None:
    fields = HEADER.unpack(_read_exact(patch_file, HEADER.size, "mfdelta1 header"))
    magic, flags, base_length, base_sha, out_length, out_sha, op_count = fields[:7]
    table_offset, table_length, table_raw_length = fields[7:]
    if magic != MAGIC or flags != 0:
        raise CorruptPatchError("not an mfdelta1 patch (bad magic or unknown flags)")
    if out_length > max_output:
        raise OutputTooLargeError(
            f"mfdelta1 patch would write {out_length} bytes, more than max_output={max_output}"
        )
    here = patch_file.tell()
    patch_length = patch_file.seek(0, os.SEEK_END)
    patch_file.seek(here)
    if table_offset < HEADER.size or table_offset + table_length != patch_length:
        raise CorruptPatchError("mfdelta1 op table is not where the header says")
    if table_raw_length > MAX_TABLE_LENGTH:
        raise CorruptPatchError(f"mfdelta1 op table of {table_raw_length} bytes exceeds cap")
    if _hash_file(base_file) != (base_length, base_sha):
        raise BaseMismatchError(
            "the local base is not the file this mfdelta1 patch was made from "
            f"(expected sha256 {base_sha.hex()}); download the full artifact"
        )
    patch_file.seek(table_offset)
    table = _decompress(
        zstandard.ZstdDecompressor(max_window_size=MAX_ZSTD_WINDOW),
        _read_exact(patch_file, table_length, "op table"),
        table_raw_length,
    )
    patch_file.seek(HEADER.size)
    reader = _Mfdelta1Reader(base_file, patch_file, base_length, table)
    digest = hashlib.sha256()
    written = 0
    for _ in range(op_count):
        kind, width, _reserved, length, offset, ref_length, sizes = reader.next_op()
        if written + length > out_length:
            raise CorruptPatchError("mfdelta1 ops produce more bytes than the header says")
        if kind == OP_COPY:
            end = offset + length
            if end > base_length:
                raise CorruptPatchError("mfdelta1 copy op reads past the base's end")
            for start in range(offset, end, _IO_BLOCK):
                chunk = reader.base_range(start, min(_IO_BLOCK, end - start))
                digest.update(chunk)
                sink.write(chunk)
        else:
            chunk = reader.op(kind, width, length, offset, ref_length, sizes)
            digest.update(chunk)
            sink.write(chunk)
        written += length
    if patch_file.tell() != table_offset or reader.table_pos != len(table):
        raise CorruptPatchError("mfdelta1 patch has unused bytes after its last op")
    if written != out_length or digest.digest() != out_sha:
        raise CorruptPatchError("mfdelta1 output does not match the checksum in the patch")
