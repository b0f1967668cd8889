"""The one interface every signature goes through: `Signer` (issue 9).

A signer exposes a key id and signs a message (the DSSE PAE bytes) — nothing else, so the
private key can live in a file (`LocalKeySigner`, today's release.key), in memory for the
offline root ceremony (`KeySigner`), or later in an HSM / cloud KMS behind the same two
methods. `sign_envelope` turns signers into the DSSE envelope bytes devices verify.

Only the processes that publish use a release signer: the API's publish path and
`modelfleet worker --role publish|all`. A compile worker never runs a job that signs (so it
never reads the key file), and the compile sandbox cannot see the key at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from manifests import Envelope, Signature, SigningKey, pae
from server.publish.keyfile import load_release_key


@runtime_checkable
class Signer(Protocol):
    def keyid(self) -> str:
        """Lowercase hex sha256 of the raw public key (raises if the key is unusable)."""
        ...

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of `message`."""
        ...


class KeySigner:
    """A key already in memory (root keys during `keys init` / `keys rotate`)."""

    def __init__(self, key: SigningKey) -> None:
        self._key = key

    def keyid(self) -> str:
        return self._key.keyid

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)


class LocalKeySigner:
    """The release key file (mode 0600), read at each use: a key rotated with
    `modelfleet keys rotate --rotate-release` signs from the next publish on, no restart."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _key(self) -> SigningKey:
        return load_release_key(self.path)

    def keyid(self) -> str:
        return self._key().keyid

    def sign(self, message: bytes) -> bytes:
        return self._key().sign(message)


def sign_envelope(payload: bytes, payload_type: str, signers: Sequence[Signer]) -> bytes:
    """The DSSE envelope bytes of `payload`, one signature per distinct key id."""
    message = pae(payload_type, payload)
    sigs: dict[str, Signature] = {}
    for signer in signers:
        keyid = signer.keyid()
        if keyid not in sigs:
            sigs[keyid] = Signature(keyid, signer.sign(message))
    return Envelope(payload_type, payload, tuple(sigs.values())).to_bytes()
