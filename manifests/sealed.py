"""The sealed-file format of protected releases (docs/security.md): a stream encrypted with
libsodium's ``crypto_secretstream_xchacha20poly1305`` (through pynacl), in chunks, so a large
model is never held whole. The server seals artifacts and patches under a release's content
key; a device re-seals what it keeps at rest under its own device-local key, in the same
format.

Layout: ``MAGIC`` (8 bytes) | chunk size (4 bytes, big-endian) | the secretstream header
(24 bytes) | ciphertext chunks, each ``chunk size + ABYTES`` bytes but the last, which is
shorter and carries ``TAG_FINAL``. A truncated, reordered, extended or altered stream, or the
wrong key, fails with ``SealedError`` (the AEAD tag of a chunk does not verify), never with
wrong bytes.

The manifest signs the sealed bytes' sha256 and length as for any artifact, so a device
checks them before it decrypts; ``Sealed`` names the plaintext's sha256 and length, which a
device checks after a patch rebuilt the plaintext.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from nacl import bindings as sodium
from nacl.exceptions import CryptoError

from ._fields import Fields, merge_extra
from .strictjson import JSONObject, JSONValue

MAGIC = b"MFSEAL1\n"
SCHEME = "mfseal1"
KEY_BYTES: int = sodium.crypto_secretstream_xchacha20poly1305_KEYBYTES
HEADER_BYTES: int = sodium.crypto_secretstream_xchacha20poly1305_HEADERBYTES
ABYTES: int = sodium.crypto_secretstream_xchacha20poly1305_ABYTES
CHUNK = 1 << 20
_PREFIX = len(MAGIC) + 4
_TAG_MESSAGE: int = sodium.crypto_secretstream_xchacha20poly1305_TAG_MESSAGE
_TAG_FINAL: int = sodium.crypto_secretstream_xchacha20poly1305_TAG_FINAL
MAX_CHUNK = 1 << 24


class SealedError(ValueError):
    """The sealed stream is not ours, is damaged or truncated, or the key is wrong."""


@dataclass(frozen=True)
class Sealed:
    """The manifest's ``sealed`` object of a protected artifact: the scheme and what the
    plaintext must hash to."""

    plain_sha256: str
    plain_length: int
    scheme: str = SCHEME
    extra: JSONObject = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: JSONValue, path: str = "sealed") -> Sealed:
        f = Fields(value, path)
        scheme = f.literal("scheme", (SCHEME,))
        return cls(f.sha256("plain_sha256"), f.integer("plain_length"), scheme, f.extra())

    def to_dict(self) -> JSONObject:
        return merge_extra({"scheme": self.scheme, "plain_sha256": self.plain_sha256,
                            "plain_length": self.plain_length}, self.extra)


def new_key() -> bytes:
    return sodium.crypto_secretstream_xchacha20poly1305_keygen()


def _rechunk(chunks: Iterable[bytes], size: int) -> Iterator[bytes]:
    buf = bytearray()
    for c in chunks:
        buf += c
        while len(buf) >= size:
            yield bytes(buf[:size])
            del buf[:size]
    yield bytes(buf)  # the last, possibly empty, chunk (it carries TAG_FINAL)


def seal(key: bytes, chunks: Iterable[bytes], chunk: int = CHUNK) -> Iterator[bytes]:
    """The sealed stream of the plaintext ``chunks`` under ``key``, piece by piece."""
    if len(key) != KEY_BYTES:
        raise SealedError(f"a sealing key is {KEY_BYTES} bytes, not {len(key)}")
    state = sodium.crypto_secretstream_xchacha20poly1305_state()
    header = sodium.crypto_secretstream_xchacha20poly1305_init_push(state, key)
    yield MAGIC + struct.pack(">I", chunk) + header
    pieces = _rechunk(chunks, chunk)
    current = next(pieces)
    for following in pieces:
        yield sodium.crypto_secretstream_xchacha20poly1305_push(state, current, None,
                                                                 _TAG_MESSAGE)
        current = following
    yield sodium.crypto_secretstream_xchacha20poly1305_push(state, current, None, _TAG_FINAL)


def _read(source: BinaryIO, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        got = source.read(n - len(out))
        if not got:
            break
        out += got
    return bytes(out)


def unseal(key: bytes, source: BinaryIO) -> Iterator[bytes]:
    """The plaintext of the sealed stream read from ``source``, chunk by chunk; raises
    ``SealedError`` at the first chunk that does not verify (or when the end is missing)."""
    if len(key) != KEY_BYTES:
        raise SealedError(f"a sealing key is {KEY_BYTES} bytes, not {len(key)}")
    prefix = _read(source, _PREFIX + HEADER_BYTES)
    if len(prefix) < _PREFIX + HEADER_BYTES or not prefix.startswith(MAGIC):
        raise SealedError("not a sealed (mfseal1) file")
    (chunk,) = struct.unpack(">I", prefix[len(MAGIC):_PREFIX])
    if not 0 < chunk <= MAX_CHUNK:
        raise SealedError(f"sealed chunk size {chunk} is out of range")
    state = sodium.crypto_secretstream_xchacha20poly1305_state()
    try:
        sodium.crypto_secretstream_xchacha20poly1305_init_pull(state, prefix[_PREFIX:], key)
        while True:
            block = _read(source, chunk + ABYTES)
            if len(block) < ABYTES:
                raise SealedError("the sealed file ends before its final chunk")
            plain, tag = sodium.crypto_secretstream_xchacha20poly1305_pull(state, block, None)
            yield plain
            if tag == _TAG_FINAL:
                if source.read(1):
                    raise SealedError("bytes follow the final chunk of the sealed file")
                return
            if len(block) < chunk + ABYTES:
                raise SealedError("the sealed file ends before its final chunk")
    except CryptoError as e:
        raise SealedError(f"the sealed file does not decrypt with this key ({e})") from None


def sealed_length(plain_length: int, chunk: int = CHUNK) -> int:
    """How long the sealed stream of ``plain_length`` plaintext bytes is."""
    return _PREFIX + HEADER_BYTES + (plain_length // chunk + 1) * ABYTES + plain_length


def seal_file(key: bytes, source: BinaryIO, sink: BinaryIO) -> tuple[str, int, str, int]:
    """Seals ``source`` into ``sink``; (plain sha256, plain length, sealed sha256, sealed
    length)."""
    plain_h, sealed_h = hashlib.sha256(), hashlib.sha256()
    plain_n = sealed_n = 0

    def reading() -> Iterator[bytes]:
        nonlocal plain_n
        while block := source.read(CHUNK):
            plain_h.update(block)
            plain_n += len(block)
            yield block

    for piece in seal(key, reading()):
        sealed_h.update(piece)
        sealed_n += len(piece)
        sink.write(piece)
    return plain_h.hexdigest(), plain_n, sealed_h.hexdigest(), sealed_n
