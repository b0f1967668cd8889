"""Protected versions' content keys and sealed blobs (docs/security.md).

Each protected version has one random content key (manifests/sealed.py: secretstream
XChaCha20-Poly1305) that seals its artifacts and the patches to them. The key is stored only
wrapped — a pynacl `SecretBox` under the server's key-encryption key (KEK), the file
`content.kek` in the keys directory (32 random bytes as hex, mode 0600, created on first
use; refused when group or others can read it) — and is never logged. A device gets it
sealed to its own X25519 key (`SealedBox`) from server/services/fleet/content_keys.py.

Whoever seals needs the KEK: the compile worker (artifacts), the publish worker (patches)
and the API (key requests); none of them needs it for an unprotected version.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from nacl.exceptions import CryptoError
from nacl.public import PublicKey, SealedBox
from nacl.secret import SecretBox
from nacl.utils import random as random_bytes
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from manifests import sealed
from server import watermark
from server.db import models as db
from server.publish.errors import KeyStoreError

KEK_FILE = "content.kek"


@dataclass(frozen=True)
class SealedFile:
    """What sealing a file produced: the sealed bytes' sha256 and length (what the manifest
    signs and the blob store holds) and the plaintext's."""

    sha256: str
    length: int
    plain_sha256: str
    plain_length: int


def _read_kek(path: Path) -> bytes:
    st = path.stat()
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyStoreError(f"key file {path} is accessible by group or others (mode "
                            f"{stat.S_IMODE(st.st_mode):o}); run `chmod 600 {path}`")
    try:
        kek = bytes.fromhex(path.read_text().strip())
    except ValueError as e:
        raise KeyStoreError(f"{path} is not a hex key ({e}); restore it from backup") from e
    if len(kek) != SecretBox.KEY_SIZE:
        raise KeyStoreError(f"{path} holds {len(kek)} bytes, not a {SecretBox.KEY_SIZE}-byte "
                            "key; restore it from backup")
    return kek


def load_or_create_kek(path: Path) -> bytes:
    """The KEK at `path`, created (O_EXCL, 0600: the first writer wins) when missing."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return _read_kek(path)
        with os.fdopen(fd, "w") as f:
            f.write(random_bytes(SecretBox.KEY_SIZE).hex() + "\n")
            f.flush()
            os.fsync(f.fileno())
    return _read_kek(path)


@dataclass
class ContentKeys:
    """The content keys of protected versions, wrapped under the KEK at `kek_path`."""

    kek_path: Path
    _kek: bytes | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __repr__(self) -> str:  # never print a key
        return f"ContentKeys(kek_path={self.kek_path!s})"

    def _box(self) -> SecretBox:
        with self._lock:
            if self._kek is None:
                self._kek = load_or_create_kek(self.kek_path)
            return SecretBox(self._kek)

    @property
    def kek_id(self) -> str:
        self._box()
        assert self._kek is not None
        return hashlib.sha256(self._kek).hexdigest()[:16]

    def store(self, session: Session, version_id: int, key: bytes) -> None:
        """Records `key` (wrapped) as the version's content key, in the caller's
        transaction (a new version's: its sources were sealed with it before the row)."""
        session.add(db.ContentKey(version_id=version_id, wrapped=self._box().encrypt(key),
                                  kek_id=self.kek_id))
        session.flush()

    def key_for(self, session: Session, version_id: int, *, create: bool = False) -> bytes:
        """The version's content key (made and stored wrapped, when `create` and missing;
        the caller commits). KeyStoreError when it is missing or does not unwrap."""
        row = session.get(db.ContentKey, version_id)
        if row is None:
            if not create:
                raise KeyStoreError(f"version {version_id} has no content key")
            key = sealed.new_key()
            try:
                with session.begin_nested():
                    self.store(session, version_id, key)
                return key
            except IntegrityError:  # a concurrent caller stored one first
                row = session.get(db.ContentKey, version_id)
                assert row is not None
        try:
            return self._box().decrypt(row.wrapped)
        except CryptoError:
            raise KeyStoreError(
                f"the content key of version {version_id} does not unwrap with {self.kek_path} "
                f"(kek id {self.kek_id}, wrapped under {row.kek_id})",
                ) from None



WATERMARK_KEY_FILE = "watermark.key"


@dataclass
class WatermarkSecret:
    """The server's watermark secret (KEYS_DIR/watermark.key, made like the KEK on first
    use); builds get only a release's key derived from it (server/watermark.release_key)."""

    path: Path
    _secret: bytes | None = field(default=None, repr=False)

    def __repr__(self) -> str:  # never print a key
        return f"WatermarkSecret(path={self.path!s})"

    def release_key(self, model: str, version: str) -> bytes:
        if self._secret is None:
            self._secret = load_or_create_kek(self.path)
        return watermark.release_key(self._secret, model, version)


def seal_file(key: bytes, source: BinaryIO, sink: BinaryIO) -> SealedFile:
    """Seals `source` into `sink` under the content key `key`."""
    plain_sha, plain_n, sha, n = sealed.seal_file(key, source, sink)
    return SealedFile(sha, n, plain_sha, plain_n)


def seal_to_device(key: bytes, box_public_key_hex: str) -> bytes:
    """The content key sealed (anonymous `SealedBox`) to the device's X25519 public key."""
    return SealedBox(PublicKey(bytes.fromhex(box_public_key_hex))).encrypt(key)


def unseal_path(key: bytes, source: Path, dest: Path) -> Path:
    """Decrypts the sealed file `source` into `dest` (a short-lived server work file)."""
    with source.open("rb") as f, dest.open("wb") as out:
        for piece in sealed.unseal(key, f):
            out.write(piece)
    return dest
