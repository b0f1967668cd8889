"""Compressed artifact copies (manifests/compressed.py): the codec both sides use.

The server compresses with :func:`compress`; a device inflates with :func:`decompress`.
zstd (the ``zstandard`` wheel the SDK already needs for mfdelta1 patches): one frame, fixed
settings, so the same content always gives the same compressed bytes (the sha256 a manifest
signs and caches key on stays stable). docs/benchmarks.md "Compressed artifacts" has the
measurements against zlib and xz behind the choice.

Codecs (the manifest's ``compressed.codec``): ``zstd`` is the content as one frame;
``zstd-shuffle2`` / ``zstd-shuffle4`` first transpose the bytes of each ``BLOCK`` of content
as elements of 2 / 4 bytes (all first bytes, then all second bytes…: HDF5's and Blosc's
"shuffle" filter, done with numpy), so the sign-and-exponent bytes of FP16 / FP32 weights
sit together, where zstd finds them alike: 4–9% fewer bytes than plain zstd on float
artifacts (docs/benchmarks.md "Compressed artifact copies: shuffled"). The transform is a
fixed permutation per block, so the copy still inflates as a stream, a block at a time.
An SDK that knows only ``zstd`` ignores such a copy and downloads the content.

Decompression is hostile-input handling, although the input's sha256 was checked first (a
leaked signing key, or a bug in our own compressor, must not take the device down): the
frame's window is capped (decoder memory), the frame header must declare exactly the signed
content length, and the output is read in bounded pieces and refused the moment it would
exceed that length — a decompression bomb is never inflated whole, in memory or on disk.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import IO, BinaryIO, Protocol, cast

import numpy as np
import zstandard

CODEC = "zstd"
# Shuffled codecs: the element size the bytes of each block are transposed as.
SHUFFLED = {"zstd-shuffle2": 2, "zstd-shuffle4": 4}
CODECS = (CODEC, *SHUFFLED)
BLOCK = 1 << 20  # bytes of content per transposed block (the unit a device inflates)
# A shuffled copy is chosen only when it is this much smaller than the plain one: an SDK that
# knows only zstd downloads the uncompressed content instead of a shuffled copy.
MIN_SHUFFLE_GAIN = 0.01
# The level follows the size alone (so the same content still gives the same bytes). Level 19
# finds the layout redundancy of small quantized packages (a QNN context binary: 0.35 of its
# content at 19, 0.385 at 9) at 4-8 MB/s of one core; on large packages, whose bytes are
# mostly weights, it gains nothing over level 3 (float weights 0.916 vs 0.917, INT8 0.638 vs
# 0.643) at a hundredth of the speed: all-MiniLM-L6-v2's three artifacts took 62 s of server
# CPU at 19, under 1 s at 3 (docs/benchmarks.md "Compressed artifact copies: the level").
LEVEL = 19
LARGE_LEVEL = 3
LARGE = 8 * 1024**2  # bytes of content from which LARGE_LEVEL is used (19 costs <= ~2 s below)
# An 8 MiB window, set explicitly at either level; the decoder refuses more, so a device never
# allocates more than that (plus buffers) for one artifact.
WINDOW_LOG = 23
MAX_WINDOW = 1 << WINDOW_LOG
PIECE = 1 << 20  # bytes of output per read: the most held at once
MAGIC = zstandard.FRAME_HEADER
FRAME_HEADER_MAX = 18  # ZSTD_FRAMEHEADERSIZE_MAX: magic, descriptor, window, dict id, size
# Not worth a second blob and a manifest field for less than this saving.
MIN_SAVING = 0.05


class Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


class DecompressionError(ValueError):
    """The compressed copy does not inflate to the signed content (bomb, damage, wrong codec)."""


def compress(src: BinaryIO, dst: BinaryIO, size: int, level: int | None = None,
             codec: str = CODEC) -> None:
    """``size`` bytes of ``src`` as one zstd frame into ``dst`` (shuffled first for a
    shuffled ``codec``), reproducibly: a level fixed by the size (`level_for`; ``level``
    overrides it, for benchmarks), a fixed window, content size in the header, no checksum
    (the manifest signs sha256s), one thread (the output does not depend on the machine)."""
    params = zstandard.ZstdCompressionParameters.from_level(
        level_for(size) if level is None else level, source_size=size,
        window_log=WINDOW_LOG, write_content_size=True, write_checksum=False, threads=0)
    reader: Readable = src if _element(codec) == 1 else _Shuffled(src, _element(codec), size)
    zstandard.ZstdCompressor(compression_params=params).copy_stream(
        cast(IO[bytes], reader), dst, size=size)


def best_codec(src: BinaryIO, size: int) -> str:
    """The codec whose copy of ``size`` bytes of ``src`` is smallest, judged at
    ``LARGE_LEVEL`` (fast; a pure function of the content, like the copy itself); a shuffled
    codec only when it saves ``MIN_SHUFFLE_GAIN`` of the plain copy."""
    sizes = {}
    for codec in CODECS:
        src.seek(0)
        counter = _Counter()
        compress(src, cast(BinaryIO, counter), size, LARGE_LEVEL, codec)
        sizes[codec] = counter.n
    src.seek(0)
    best = min(SHUFFLED, key=lambda c: sizes[c])
    return best if sizes[best] < sizes[CODEC] * (1 - MIN_SHUFFLE_GAIN) else CODEC


def _element(codec: str) -> int:
    if codec == CODEC:
        return 1
    if codec not in SHUFFLED:
        raise DecompressionError(f"unknown codec {codec!r} (this SDK knows {list(CODECS)})")
    return SHUFFLED[codec]


def shuffle(block: bytes, element: int) -> bytes:
    """``block``'s bytes transposed as elements of ``element`` bytes (a tail shorter than one
    element stays as it is)."""
    whole = len(block) - len(block) % element
    return np.frombuffer(block, np.uint8, whole).reshape(-1, element).T.tobytes() \
        + block[whole:]


def unshuffle(block: bytes, element: int) -> bytes:
    """The inverse of :func:`shuffle` for a block of the same length.

    Each element is put back together as a little-endian integer from its byte planes
    (plane k shifted by 8k): numpy's strided transpose of bytes ran at ~300 MB/s for 2-byte
    elements, this at ~1,300 (docs/benchmarks.md "Compressed artifact copies: shuffled")."""
    n = len(block) // element
    planes = np.frombuffer(block, np.uint8, n * element).reshape(element, n)
    dtype = np.dtype(f"<u{element}")
    out = np.empty(n, dtype)
    tmp = np.empty(n, dtype)
    np.left_shift(planes[element - 1], 8 * (element - 1), out=out, dtype=dtype)
    for k in range(element - 2, 0, -1):
        np.left_shift(planes[k], 8 * k, out=tmp, dtype=dtype)
        out |= tmp
    out |= planes[0]
    return out.tobytes() + block[n * element:]


def level_for(size: int) -> int:
    """The zstd level for ``size`` bytes of content: ``LEVEL`` below ``LARGE``, else
    ``LARGE_LEVEL``."""
    return LEVEL if size < LARGE else LARGE_LEVEL


def is_compressed(head: bytes) -> bool:
    """Whether bytes start like a copy made by :func:`compress` (a zstd frame)."""
    return head.startswith(MAGIC)


def declared_length(head: bytes) -> int:
    """The content length a frame's header (its first ``FRAME_HEADER_MAX`` bytes) declares;
    DecompressionError when it is no zstd frame or declares none (never ours: a bomb)."""
    try:
        declared = zstandard.get_frame_parameters(head).content_size
    except zstandard.ZstdError as e:
        raise DecompressionError(f"not a zstd frame ({e}); the compressed copy is damaged "
                                 "or in another codec") from None
    if declared == zstandard.CONTENTSIZE_UNKNOWN:
        raise DecompressionError("the zstd frame declares no content length (our copies "
                                 "always do): refused before inflating")
    return int(declared)


def decompress_chunks(src: Readable, expected_length: int, codec: str = CODEC
                      ) -> Iterator[bytes]:
    """The decompressed content of ``src`` in pieces of at most ``PIECE`` bytes, refusing
    (DecompressionError) anything but exactly ``expected_length`` bytes of output."""
    element = _element(codec)
    if element == 1:
        yield from _inflate(src, expected_length)
        return
    buf = bytearray()
    for piece in _inflate(src, expected_length):
        buf += piece
        while len(buf) >= BLOCK:
            yield unshuffle(bytes(buf[:BLOCK]), element)
            del buf[:BLOCK]
    if buf:
        yield unshuffle(bytes(buf), element)


def _inflate(src: Readable, expected_length: int) -> Iterator[bytes]:
    head = src.read(FRAME_HEADER_MAX)
    declared = declared_length(head)
    if declared != expected_length:
        raise DecompressionError(
            f"the zstd frame declares {declared} bytes of content, not the signed "
            f"{expected_length}: refused before inflating (a decompression bomb or the "
            "copy of another artifact)")
    reader = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW).stream_reader(
        cast(IO[bytes], _Prefixed(head, src)), read_across_frames=False, closefd=False)
    total = 0
    try:
        while True:
            piece = reader.read(min(PIECE, expected_length - total + 1))
            if not piece:
                break
            total += len(piece)
            if total > expected_length:
                raise DecompressionError(
                    f"decompression passed the signed content length of {expected_length} "
                    "bytes: refused mid-stream (a decompression bomb)")
            yield piece
    except zstandard.ZstdError as e:
        raise DecompressionError(f"the zstd frame is damaged ({e})") from None
    if total != expected_length:
        raise DecompressionError(f"decompressed {total} bytes, not the signed "
                                 f"{expected_length}: the compressed copy is truncated")


def decompress(src: Readable, dst: BinaryIO, expected_length: int, codec: str = CODEC) -> str:
    """Inflates ``src`` into ``dst`` (see :func:`decompress_chunks`); the output's sha256."""
    digest = hashlib.sha256()
    for piece in decompress_chunks(src, expected_length, codec):
        digest.update(piece)
        dst.write(piece)
    return digest.hexdigest()


class _Prefixed:
    """``head`` then the rest of ``src``, as a readable stream (the header was peeked)."""

    def __init__(self, head: bytes, src: Readable) -> None:
        self._head = head
        self._src = src

    def read(self, n: int = -1) -> bytes:
        if self._head:
            out, self._head = (self._head, b"") if n < 0 or n >= len(self._head) else (
                self._head[:n], self._head[n:])
            return out
        return self._src.read(n)


class _Shuffled:
    """``size`` bytes of ``src``, each ``BLOCK`` shuffled, as a readable stream."""

    def __init__(self, src: Readable, element: int, size: int) -> None:
        self._src, self._element, self._left = src, element, size
        self._buf, self._pos = b"", 0

    def read(self, n: int = -1) -> bytes:
        if self._pos >= len(self._buf) and self._left > 0:
            # Whole blocks: a short read must not move the boundaries the device unshuffles at.
            want, parts = min(BLOCK, self._left), []
            while want > 0:
                part = self._src.read(want)
                if not part:
                    break
                parts.append(part)
                want -= len(part)
            block = b"".join(parts)
            self._left = self._left - len(block) if block else 0
            self._buf, self._pos = shuffle(block, self._element), 0
        end = len(self._buf) if n < 0 else min(len(self._buf), self._pos + n)
        out = self._buf[self._pos:end]
        self._pos = end
        return out


class _Counter:
    """A sink that only counts what is written to it."""

    def __init__(self) -> None:
        self.n = 0

    def write(self, b: bytes) -> int:
        self.n += len(b)
        return len(b)


class ChunkReader:
    """An iterator of byte chunks as a readable stream (e.g. a sealed copy's plaintext)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._it = iter(chunks)
        self._buf = b""
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        if self._pos >= len(self._buf):  # refill: one chunk at a time, never all of them
            self._buf, self._pos = next(self._it, b""), 0
            while not self._buf:
                nxt = next(self._it, None)
                if nxt is None:
                    return b""
                self._buf = nxt
        end = len(self._buf) if n < 0 else min(len(self._buf), self._pos + n)
        out = self._buf[self._pos:end]
        self._pos = end
        return out
