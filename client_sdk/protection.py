"""Protected releases on the device (docs/security.md).

An artifact the manifest marks ``sealed`` arrives encrypted under its release's content key
(manifests/sealed.py); every signed check (length, sha256) runs on those bytes before anything
is decrypted. The content key comes from ``POST v1/devices/content-key``, signed with the
device's Ed25519 identity like its telemetry, sealed by the server to the device's X25519
key (``box`` in the ``KeyStore``). The device never keeps plaintext on disk: the model stays
sealed under its content key exactly as served, and the content key is kept only wrapped
under the device-local key (``at-rest``, in the ``KeyStore``), in the bundle's
``bundle.json`` (``Member.wrapped_key``). To load it, the model is decrypted into memory
(onnxruntime accepts the model as bytes). A patch is applied in memory between plaintexts,
its result checked against the signed plaintext sha256, then sealed under the content key.

A device that lost its local key, or whose access was revoked, fails with a typed
``ProtectionError`` and keeps serving what it had.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import threading
import urllib.parse
from collections.abc import Iterable
from pathlib import Path

from nacl.exceptions import CryptoError
from nacl.public import PrivateKey, SealedBox
from nacl.secret import SecretBox

from client_sdk.clock import Clock
from client_sdk.errors import ContentKeyError, LocalKeyError
from client_sdk.identity import DeviceIdentity
from client_sdk.install import Member
from client_sdk.keystore import KeyStore, default_keystore
from client_sdk.transport import Transport
from manifests import SealedError, sealed

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
                                "run an update to fetch them again")
        secret = store.put(AT_REST, sealed.new_key())
    if len(secret) != sealed.KEY_BYTES:
        raise LocalKeyError(f"the device-local key is {len(secret)} bytes, not "
                            f"{sealed.KEY_BYTES}; delete it and update again")
    return secret


def wrap(store: KeyStore, content_key: bytes) -> str:
    """The content key wrapped (``SecretBox``) under the device-local key, as hex: what a
    bundle member records, so the key is never on disk in the clear."""
    return SecretBox(at_rest_key(store, create=True)).encrypt(content_key).hex()


def unwrap(store: KeyStore, wrapped: str) -> bytes:
    try:
        return SecretBox(at_rest_key(store, create=False)).decrypt(bytes.fromhex(wrapped))
    except (CryptoError, ValueError):
        raise LocalKeyError("the device-local key does not open this model's content key "
                            "(the key store was reset?); run an update to fetch it again"
                            ) from None


def read_plain(path: Path, member: Member, store: KeyStore) -> bytes:
    """The plaintext of a member file: itself, or (protected) decrypted into memory."""
    if member.wrapped_key is None:
        return path.read_bytes()
    key = unwrap(store, member.wrapped_key)
    with path.open("rb") as f:
        try:
            return b"".join(sealed.unseal(key, f))
        except SealedError as e:
            raise LocalKeyError(f"{path.name} does not open with its content key: {e}"
                                ) from None


def seal_plain(content_key: bytes, plain: bytes, dest: Path) -> tuple[str, int]:
    """A plaintext the device rebuilt (a patch's result, checked against the signed
    plaintext sha256) sealed under its content key into ``dest``; (sha256, length)."""
    return seal_chunks(content_key, [plain], dest)


def seal_chunks(content_key: bytes, plain: Iterable[bytes], dest: Path) -> tuple[str, int]:
    """``seal_plain`` of a plaintext that arrives in pieces (never held whole); a failure
    while the pieces are produced deletes ``dest``."""
    h, n = hashlib.sha256(), 0
    try:
        with dest.open("wb") as out:
            for piece in sealed.seal(content_key, plain):
                h.update(piece)
                n += len(piece)
                out.write(piece)
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return h.hexdigest(), n


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
