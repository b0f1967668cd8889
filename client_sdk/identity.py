"""The device's own Ed25519 identity: made on first run, kept 0600 in the data directory.

``<data_dir>/identity/device.key`` holds the 32-byte seed, written atomically with mode 0600
(created 0600, never widened). The keyid is the lowercase hex sha256 of the raw 32-byte public
key (the rule of ``manifests.keys``). Telemetry batches are signed with it; the server knows
the public key from the device's one enrolment.
"""

from __future__ import annotations

import base64
import hashlib
import os
import uuid
from pathlib import Path

import nacl.signing

from client_sdk.errors import InstallError
from client_sdk.fsutil import fsync_dir

SEED_BYTES = 32


class DeviceIdentity:
    """The device key (see the module docstring)."""

    def __init__(self, key: nacl.signing.SigningKey) -> None:
        self._key = key

    @property
    def public_key_hex(self) -> str:
        return bytes(self._key.verify_key).hex()

    @property
    def keyid(self) -> str:
        return hashlib.sha256(bytes(self._key.verify_key)).hexdigest()

    def sign_b64(self, body: bytes) -> str:
        """Standard base64 of the Ed25519 signature over exactly ``body``."""
        return base64.b64encode(self._key.sign(body).signature).decode("ascii")

    @classmethod
    def load_or_create(cls, data_dir: Path) -> DeviceIdentity:
        path = Path(data_dir) / "identity" / "device.key"
        if path.exists():
            seed = path.read_bytes()
            if len(seed) != SEED_BYTES:
                raise InstallError(f"{path} is not a {SEED_BYTES}-byte Ed25519 seed; delete it "
                                   "to make a new identity (the device must enrol again)")
            return cls(nacl.signing.SigningKey(seed))
        key = nacl.signing.SigningKey.generate()
        _write_private(path, bytes(key))
        return cls(key)


def _write_private(path: Path, data: bytes) -> None:
    """Atomic write of a secret: the temporary file is created 0600 (O_EXCL), fsynced, then
    renamed over ``path`` (an existing key is never overwritten: first writer wins)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # fails if another process made the key first
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    fsync_dir(path.parent)
