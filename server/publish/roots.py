"""Root documents: building and signing root v1 and each rotation N → N+1 (pure, no I/O).

The root names the offline root keys (and their threshold) and the online release key(s)
allowed to sign channel manifests. Rotation follows the contract (manifests.verify_root_update):
root N+1 is signed by a threshold of root N's root keys AND a threshold of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import manifests
from manifests import PublicKey, Role, Root, SigningKey
from server.publish.errors import RotationError
from server.publish.signer import KeySigner, sign_envelope

ROOT_LIFETIME_SECONDS = 365 * 24 * 3600


def build_root(
    *,
    version: int,
    expires: int,
    root_keys: Sequence[SigningKey],
    root_threshold: int,
    release_keys: Sequence[SigningKey],
    release_threshold: int = 1,
) -> Root:
    """The root document naming these keys; raises RotationError on an impossible threshold."""
    if not 1 <= root_threshold <= len(root_keys):
        raise RotationError(
            f"root threshold {root_threshold} must be between 1 and the number of root keys "
            f"({len(root_keys)}); pass a smaller --threshold or more --root-keys"
        )
    if not 1 <= release_threshold <= len(release_keys):
        raise RotationError(
            f"release threshold {release_threshold} must be between 1 and {len(release_keys)}"
        )
    keys = {
        k.keyid: PublicKey(keytype="ed25519", public_hex=k.public_key.hex())
        for k in (*root_keys, *release_keys)
    }
    roles = {
        "root": Role(keyids=[k.keyid for k in root_keys], threshold=root_threshold),
        "release": Role(keyids=[k.keyid for k in release_keys], threshold=release_threshold),
    }
    return Root(version=version, expires=expires, keys=keys, roles=roles)


def sign_root(root: Root, signers: Sequence[SigningKey]) -> bytes:
    """The DSSE envelope bytes of `root` signed by each of `signers` (one signature per key)."""
    return sign_envelope(root.to_bytes(), manifests.ROOT_PAYLOAD_TYPE,
                         [KeySigner(k) for k in signers])


def root_signers_for_rotation(
    old: Root, available: Sequence[SigningKey]
) -> list[SigningKey]:
    """The old root keys that will countersign root N+1, or RotationError if below threshold."""
    role = old.roles["root"]
    present = [k for k in available if k.keyid in role.keyids]
    unique = list({k.keyid: k for k in present}.values())
    if len(unique) < role.threshold:
        raise RotationError(
            f"root v{old.version} needs {role.threshold} of its root keys to sign v"
            f"{old.version + 1} but only {len(unique)} were found; copy the offline root key "
            f"files (root-*.key) into the directory given by --root-keys-dir and retry"
        )
    return unique[: role.threshold]
