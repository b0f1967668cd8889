"""The one builder of test keys and roots: deterministic keys, root documents and their
signed envelopes (used by the manifest, client and publish tests and by
scripts/gen_manifest_vectors.py).

Keys come from a label (seed = sha256 of the label), so a key is the same in every run and
Ed25519 signatures, hence envelopes and vectors, are byte-for-byte reproducible.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from manifests import ROOT_PAYLOAD_TYPE, PublicKey, Role, Root, SigningKey, sign_envelope

NOW = 1_800_000_000
DAY = 86_400
YEAR = 365 * DAY


def seeded_key(label: str) -> SigningKey:
    """The Ed25519 key whose seed is sha256(label): the same key in every run."""
    return SigningKey.from_seed(hashlib.sha256(label.encode()).digest())


def make_root(version: int, root_keys: Sequence[SigningKey], root_threshold: int,
              release_keys: Sequence[SigningKey], release_threshold: int = 1,
              expires: int = NOW + YEAR) -> Root:
    """A root naming `root_keys` (role "root") and `release_keys` (role "release").

    No threshold checks: tests build impossible roots on purpose (the server's own builder,
    server.publish.roots.build_root, refuses them).
    """
    keys = {k.keyid: PublicKey.ed25519(k.public_key) for k in [*root_keys, *release_keys]}
    return Root(
        version=version,
        expires=expires,
        keys=keys,
        roles={
            "root": Role([k.keyid for k in root_keys], root_threshold),
            "release": Role([k.keyid for k in release_keys], release_threshold),
        },
    )


def sign_root(root: Root, signers: Sequence[SigningKey]) -> bytes:
    """The DSSE envelope of `root` signed by every key in `signers` (duplicates kept)."""
    return sign_envelope(root.to_bytes(), ROOT_PAYLOAD_TYPE, signers)
