"""Ed25519 keys and key ids (pynacl). The only module that touches the crypto library."""

from __future__ import annotations

import hashlib

import nacl.exceptions
import nacl.signing

PUBLIC_KEY_SIZE = 32
SEED_SIZE = 32
SIGNATURE_SIZE = 64


def key_id(public_key: bytes) -> str:
    """Lowercase hex sha256 of the raw 32-byte Ed25519 public key."""
    if len(public_key) != PUBLIC_KEY_SIZE:
        raise ValueError(f"an Ed25519 public key is {PUBLIC_KEY_SIZE} bytes, got {len(public_key)}")
    return hashlib.sha256(public_key).hexdigest()


def verify_signature(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """True when ``signature`` is a valid Ed25519 signature of ``message`` by ``public_key``.

    Never raises for bad input: a wrong-length key or signature simply does not verify.
    """
    if len(public_key) != PUBLIC_KEY_SIZE or len(signature) != SIGNATURE_SIZE:
        return False
    try:
        nacl.signing.VerifyKey(public_key).verify(message, signature)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, ValueError):
        return False
    return True


class SigningKey:
    """An Ed25519 private key. Holds the 32-byte seed; never printed by ``repr``."""

    __slots__ = ("_key",)

    def __init__(self, key: nacl.signing.SigningKey) -> None:
        self._key = key

    @classmethod
    def generate(cls) -> SigningKey:
        """A fresh random key (OS randomness)."""
        return cls(nacl.signing.SigningKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> SigningKey:
        """The key determined by a 32-byte seed (RFC 8032 private key)."""
        if len(seed) != SEED_SIZE:
            raise ValueError(f"an Ed25519 seed is {SEED_SIZE} bytes, got {len(seed)}")
        return cls(nacl.signing.SigningKey(seed))

    @property
    def seed(self) -> bytes:
        return bytes(self._key)

    @property
    def public_key(self) -> bytes:
        return bytes(self._key.verify_key)

    @property
    def keyid(self) -> str:
        return key_id(self.public_key)

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``data``."""
        return bytes(self._key.sign(data).signature)

    def __repr__(self) -> str:
        return f"SigningKey(keyid={self.keyid[:16]}…)"
