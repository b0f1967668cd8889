"""What this device trusts, and the only way it changes: verified roots and manifests.

``TrustStore`` persists the newest verified root envelope and, per channel, the last trusted
manifest (serial, sha256, bytes, ETag), each written atomically. ``TrustedMetadata`` is the
I/O-free core: it takes bytes (and the time, as a value) and returns verified documents through
the ``manifests`` contract, translating its errors into ``TrustError`` — expiry of the root or
of a manifest into its subclass ``MetadataExpiredError``; nothing is persisted until
verification succeeded.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path

import manifests
from client_sdk.errors import InstallError, MetadataExpiredError, TrustError
from client_sdk.fsutil import atomic_write_bytes, atomic_write_json, check_name
from manifests import Manifest, Root, TrustedManifest


@dataclass(frozen=True)
class ChannelState:
    """The last manifest this device trusted for one channel."""

    serial: int
    sha256: str
    etag: str
    manifest: bytes

    @property
    def trusted(self) -> TrustedManifest:
        return TrustedManifest(serial=self.serial, sha256=self.sha256)


def _trust_error(what: str, e: manifests.ManifestError) -> TrustError:
    message = f"{what} rejected ({type(e).__name__}): {e}"
    if isinstance(e, manifests.ExpiredError):
        return MetadataExpiredError(message)
    return TrustError(message, kind=type(e).__name__)


class TrustedMetadata:
    """The verified root in force, starting from the app's pinned root."""

    def __init__(self, pinned_root: bytes, stored_root: bytes | None) -> None:
        try:
            self.root: Root = manifests.load_trusted_root(pinned_root)
        except manifests.ManifestError as e:
            raise _trust_error("pinned root", e) from e
        self.root_bytes = pinned_root
        if stored_root is not None:
            try:
                stored = manifests.load_trusted_root(stored_root)
            except manifests.ManifestError as e:
                raise _trust_error("stored root (delete the data dir's trust/ to reset)", e) from e
            if stored.version > self.root.version:
                self.root, self.root_bytes = stored, stored_root

    def update_root(self, data: bytes) -> Root:
        """Verify root N+1 against the trusted root N and make it the trusted root."""
        try:
            new = manifests.verify_root_update(self.root, data)
        except manifests.ManifestError as e:
            raise _trust_error(f"root v{self.root.version + 1}", e) from e
        self.root, self.root_bytes = new, data
        return new

    def check_root_unexpired(self, now: int) -> None:
        """Raise MetadataExpiredError when the root in force has expired at ``now`` (call it
        after following every rotation link: intermediate roots may be expired, the last not)."""
        if self.root.is_expired(now):
            raise MetadataExpiredError(
                f"trusted root v{self.root.version} expired at {self.root.expires}; "
                "the server must publish a new root"
            )

    def verify_manifest(
        self, data: bytes, *, now: int, channel: str, previous: ChannelState | None, max_size: int
    ) -> Manifest:
        """Verify a channel manifest against the trusted root and the last trusted serial."""
        try:
            return manifests.verify_manifest(
                self.root,
                data,
                now=now,
                channel=channel,
                trusted=previous.trusted if previous else None,
                max_size=max_size,
            )
        except manifests.ManifestError as e:
            raise _trust_error(f"manifest for channel {channel!r}", e) from e


class TrustStore:
    """Trusted metadata on disk under ``<data_dir>/trust``."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir / "trust"

    @property
    def root_path(self) -> Path:
        return self.dir / "root.json"

    def load_root(self) -> bytes | None:
        return self.root_path.read_bytes() if self.root_path.exists() else None

    def save_root(self, data: bytes) -> None:
        atomic_write_bytes(self.root_path, data)

    def _channel_path(self, channel: str) -> Path:
        return self.dir / f"channel-{check_name('channel', channel)}.json"

    def load_channel(self, channel: str) -> ChannelState | None:
        path = self._channel_path(channel)
        if not path.exists():
            return None
        try:
            obj = json.loads(path.read_bytes())
            state = ChannelState(
                serial=int(obj["serial"]),
                sha256=str(obj["sha256"]),
                etag=str(obj["etag"]),
                manifest=base64.b64decode(obj["manifest"], validate=True),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise InstallError(f"trust state {path} is unreadable ({e}); delete it to reset") from e
        return state

    def save_channel(self, channel: str, state: ChannelState) -> None:
        atomic_write_json(
            self._channel_path(channel),
            {
                "serial": state.serial,
                "sha256": state.sha256,
                "etag": state.etag,
                "manifest": base64.b64encode(state.manifest).decode(),
            },
        )

    def snapshot(self) -> dict[str, bytes]:
        """Every trusted file's bytes (tests assert an attack left them unchanged)."""
        if not self.dir.exists():
            return {}
        return {p.name: p.read_bytes() for p in sorted(self.dir.iterdir()) if p.is_file()}
