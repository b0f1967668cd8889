"""Trust decisions: verify roots and manifests from bytes, given what the client trusts now.

Pure functions (no I/O, no clock). A client persists the returned state itself: the latest
verified root bytes and a ``TrustedManifest`` per channel.
"""

from __future__ import annotations

from dataclasses import dataclass

from .envelope import MANIFEST_PAYLOAD_TYPE, ROOT_PAYLOAD_TYPE, Envelope, verify_envelope
from .errors import (
    EquivocationError,
    ExpiredError,
    RollbackError,
    RootRotationError,
    WrongChannelError,
    WrongTypeError,
)
from .manifest import Manifest
from .root import RELEASE_ROLE, ROOT_ROLE, Root

ROOT_MAX_SIZE = 512 * 1024
MANIFEST_MAX_SIZE = 4 * 1024 * 1024


@dataclass(frozen=True)
class TrustedManifest:
    """What a client remembers about the last manifest it accepted on a channel."""

    serial: int
    sha256: str

    @classmethod
    def of(cls, manifest: Manifest) -> TrustedManifest:
        """The state to persist after ``verify_manifest`` returned ``manifest``."""
        if manifest.raw_sha256 is None:
            raise ValueError("manifest was not parsed from bytes; use verify_manifest's result")
        return cls(manifest.serial, manifest.raw_sha256)


def _verify_root_with(signers: Root, env: Envelope) -> bytes:
    role = signers.roles[ROOT_ROLE]
    return verify_envelope(env, signers.role_keys(ROOT_ROLE), role.threshold, ROOT_PAYLOAD_TYPE)


def load_trusted_root(
    data: bytes, now: int | None = None, *, max_size: int = ROOT_MAX_SIZE
) -> Root:
    """Load a root the caller already trusts by other means (the pinned root shipped in the app,
    or the root it persisted): it must be well-formed and signed by a threshold of its own root
    keys; with ``now``, it must not be expired.

    Raises:
        OversizeError, MalformedError, WrongTypeError, SignatureError, ExpiredError.
    """
    env = Envelope.from_bytes(data, max_size)
    if env.payload_type != ROOT_PAYLOAD_TYPE:
        raise WrongTypeError(
            f"payloadType is {env.payload_type!r}, expected {ROOT_PAYLOAD_TYPE!r}"
        )
    root = Root.from_bytes(env.payload)
    _verify_root_with(root, env)
    if now is not None and root.is_expired(now):
        raise ExpiredError(f"root version {root.version} expired at {root.expires} (now {now})")
    return root


def verify_root_update(trusted: Root, data: bytes, *, max_size: int = ROOT_MAX_SIZE) -> Root:
    """Accept root version N+1 from ``data`` given trusted root N (TUF rotation).

    The new root must be signed by a threshold of the trusted root's root-role keys AND a
    threshold of its own root-role keys, and its version must be exactly N+1. Expiry is not
    checked here (an intermediate root may be expired); check the final root with
    ``root.is_expired(now)``.

    Raises:
        OversizeError, MalformedError, WrongTypeError, SignatureError (either threshold),
        RootRotationError (version is not N+1).
    """
    env = Envelope.from_bytes(data, max_size)
    payload = _verify_root_with(trusted, env)
    new = Root.from_bytes(payload)
    if new.version != trusted.version + 1:
        raise RootRotationError(
            f"root update has version {new.version}, expected exactly {trusted.version + 1}"
        )
    _verify_root_with(new, env)
    return new


def verify_manifest(
    root: Root,
    data: bytes,
    *,
    now: int,
    channel: str,
    trusted: TrustedManifest | None,
    max_size: int = MANIFEST_MAX_SIZE,
) -> Manifest:
    """Verify a channel manifest envelope and return it with ``raw_sha256`` set.

    Checks, in order: size, envelope shape, payloadType and release-role threshold, document
    shape and type, channel, serial vs ``trusted`` (lower: rollback; equal with other bytes:
    equivocation), expiry (``now >= expires``). Equal serial with equal bytes is accepted
    (a re-fetch of the same manifest).

    Raises:
        OversizeError, MalformedError, WrongTypeError, SignatureError, WrongChannelError,
        RollbackError, EquivocationError, ExpiredError.
    """
    env = Envelope.from_bytes(data, max_size)
    role = root.roles[RELEASE_ROLE]
    payload = verify_envelope(env, root.role_keys(RELEASE_ROLE), role.threshold,
                              MANIFEST_PAYLOAD_TYPE)
    manifest = Manifest.from_bytes(payload)
    if manifest.channel != channel:
        raise WrongChannelError(
            f"manifest is for channel {manifest.channel!r}, expected {channel!r}"
        )
    sha = manifest.raw_sha256 or ""
    if trusted is not None:
        if manifest.serial < trusted.serial:
            raise RollbackError(
                f"manifest serial {manifest.serial} is lower than the trusted {trusted.serial}"
            )
        if manifest.serial == trusted.serial and sha != trusted.sha256:
            raise EquivocationError(
                f"manifest serial {manifest.serial} equals the trusted one but its bytes differ "
                f"(sha256 {sha[:16]}… vs {trusted.sha256[:16]}…)"
            )
    if manifest.is_expired(now):
        raise ExpiredError(
            f"manifest serial {manifest.serial} expired at {manifest.expires} (now {now})"
        )
    return manifest
