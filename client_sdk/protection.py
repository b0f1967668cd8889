"""Protected releases on the device (docs/security.md).

An artifact the manifest marks ``sealed`` arrives encrypted under its release's content key
(manifests/sealed.py); every signed check (length, sha256) runs on those bytes before anything
is decrypted. The content key comes from ``POST v1/devices/content-key``, signed with the
device's Ed25519 identity like its telemetry, sealed by the server to the device's X25519
key (``box`` in the ``KeyStore``). The device never keeps plaintext on disk: it re-seals the
model under its device-local key (``at-rest``) as it decrypts, and decrypts it into memory to
load it (onnxruntime accepts the model as bytes). A patch is applied in memory between
plaintexts and its result checked against the signed plaintext sha256 before it is sealed.

The content key itself is never stored: a device that lost its local key, or whose access
was revoked, fails with a typed ``ProtectionError`` and keeps serving what it had.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from nacl.exceptions import CryptoError
from nacl.public import PrivateKey, SealedBox

from client_sdk.clock import Clock
from client_sdk.errors import ContentKeyError, IntegrityError, LocalKeyError
from client_sdk.fsutil import sha256_file
from client_sdk.identity import DeviceIdentity
from client_sdk.keystore import KeyStore, default_keystore
from client_sdk.transport import Transport
from manifests import Sealed, SealedError, sealed

BOX = "box"
AT_REST = "at-rest"
MAX_REPLY = 16 * 1024
_keystores: dict[Path, KeyStore] = {}
_lock = threading.Lock()


def use_keystore(data_dir: Path, keystore: KeyStore) -> None:
    """Make ``keystore`` the one for ``data_dir`` in this process (``UpdaterConfig`` and
    ``ModelRuntime`` call it when given one); else the 0600 file store is used."""
    with _lock:
        _keystores[Path(data_dir).resolve()] = keystore


def keystore_for(data_dir: Path) -> KeyStore:
    with _lock:
        return _keystores.get(Path(data_dir).resolve()) or default_keystore(data_dir)


def box_key(store: KeyStore) -> PrivateKey:
    """The device's X25519 key (made on first use)."""
    secret = store.get(BOX) or store.put(BOX, bytes(PrivateKey.generate()))
    return PrivateKey(secret)


def box_public_hex(store: KeyStore) -> str:
    return bytes(box_key(store).public_key).hex()


def at_rest_key(store: KeyStore, *, create: bool) -> bytes:
    secret = store.get(AT_REST)
    if secret is None:
        if not create:
            raise LocalKeyError("the device-local key of protected models is missing; "
                                "run an update to fetch and re-seal them")
        secret = store.put(AT_REST, sealed.new_key())
    if len(secret) != sealed.KEY_BYTES:
        raise LocalKeyError(f"the device-local key is {len(secret)} bytes, not "
                            f"{sealed.KEY_BYTES}; delete it and update again")
    return secret


def is_sealed(path: Path) -> bool:
    """Whether ``path`` is a sealed file (a protected model at rest on this device)."""
    with path.open("rb") as f:
        return f.read(len(sealed.MAGIC)) == sealed.MAGIC


def _unsealed(key: bytes, source: BinaryIO, what: str) -> Iterator[bytes]:
    try:
        yield from sealed.unseal(key, source)
    except SealedError as e:
        raise LocalKeyError(f"{what} does not open: {e}") from None


def read_plain(path: Path, store: KeyStore) -> bytes:
    """The plaintext of a file on the device: itself, or decrypted into memory when sealed."""
    if not is_sealed(path):
        return path.read_bytes()
    key = at_rest_key(store, create=False)
    with path.open("rb") as f:
        return b"".join(_unsealed(key, f, str(path.name)))


def store_sealed(plain: Iterator[bytes], store: KeyStore, dest: Path,
                 expect: Sealed) -> tuple[str, int]:
    """Seals ``plain`` under the device-local key into ``dest`` while checking it hashes to
    ``expect``; (sha256, length) of the sealed file. IntegrityError (and no file) otherwise."""
    h, n = hashlib.sha256(), 0

    def counted() -> Iterator[bytes]:
        nonlocal n
        for piece in plain:
            h.update(piece)
            n += len(piece)
            yield piece

    key = at_rest_key(store, create=True)
    try:
        with dest.open("wb") as out:
            for piece in sealed.seal(key, counted()):
                out.write(piece)
        if (h.hexdigest(), n) != (expect.plain_sha256, expect.plain_length):
            raise IntegrityError(f"the decrypted model is not the signed plaintext (sha256 "
                                 f"{h.hexdigest()[:16]}…, {n} bytes)")
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return sha256_file(dest), dest.stat().st_size


def reseal(content_key: bytes, source: Path, store: KeyStore, dest: Path,
           expect: Sealed) -> tuple[str, int]:
    """A downloaded sealed artifact (verified) re-sealed under the device-local key."""
    with source.open("rb") as f:
        try:
            return store_sealed(sealed.unseal(content_key, f), store, dest, expect)
        except SealedError as e:
            raise ContentKeyError(f"the artifact does not open with its content key: {e}"
                                  ) from None


def open_with(content_key: bytes, path: Path) -> io.BytesIO:
    """A downloaded (verified) sealed file, e.g. a patch, decrypted into memory."""
    with path.open("rb") as f:
        try:
            return io.BytesIO(b"".join(sealed.unseal(content_key, f)))
        except SealedError as e:
            raise ContentKeyError(f"{path.name} does not open with its content key: {e}"
                                  ) from None


class KeyClient:
    """Fetches content keys for this device (see the module docstring)."""

    def __init__(self, data_dir: Path, base_url: str, transport: Transport, device_id: str,
                 channel: str, clock: Clock, timeout: float) -> None:
        self.data_dir = Path(data_dir)
        self.base_url, self.transport, self.device_id = base_url, transport, device_id
        self.channel, self.clock, self.timeout = channel, clock, timeout
        self.store = keystore_for(self.data_dir)
        self._keys: dict[tuple[str, str], bytes] = {}

    def content_key(self, model: str, version: str) -> bytes:
        """The release's content key (asked once per process and release)."""
        hit = self._keys.get((model, version))
        if hit is not None:
            return hit
        identity = DeviceIdentity.load_or_create(self.data_dir)
        body = json.dumps({"device_id": self.device_id, "channel": self.channel,
                           "model": model, "version": version,
                           "sent_at": int(self.clock.time())}, separators=(",", ":")).encode()
        url = urllib.parse.urljoin(self.base_url.rstrip("/") + "/", "v1/devices/content-key")
        resp = self.transport.post(url, body, {
            "Content-Type": "application/json", "X-Device-Id": self.device_id,
            "X-Device-Signature": identity.sign_b64(body)}, self.timeout)
        try:
            reply = b""
            for chunk in resp.chunks:
                reply += chunk
                if len(reply) > MAX_REPLY:
                    raise ContentKeyError(f"the content-key reply exceeds {MAX_REPLY} bytes")
        finally:
            resp.close()
        try:
            doc = json.loads(reply)
        except ValueError:
            doc = {}
        if resp.status != 200 or not isinstance(doc, dict):
            code = doc.get("code", "") if isinstance(doc, dict) else ""
            detail = doc.get("detail", "") if isinstance(doc, dict) else ""
            raise ContentKeyError(f"no content key for {model} {version}: HTTP {resp.status} "
                                  f"{code} {detail}".rstrip())
        try:
            key = SealedBox(box_key(self.store)).decrypt(
                base64.b64decode(str(doc.get("sealed_key", "")), validate=True))
        except (CryptoError, ValueError) as e:
            raise ContentKeyError(f"the content key of {model} {version} does not open with "
                                  f"this device's X25519 key: {e}") from None
        self._keys[(model, version)] = key
        return key
