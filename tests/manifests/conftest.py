"""Fixtures for the manifest contract tests (builders live in manifest_builders.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from manifests import MANIFEST_PAYLOAD_TYPE, Manifest, Root, SigningKey, sign_envelope
from tests.manifests.manifest_builders import key
from tests.support.signing import make_root


@pytest.fixture
def root_keys() -> list[SigningKey]:
    return [key(1), key(2), key(3)]


@pytest.fixture
def release_keys() -> list[SigningKey]:
    return [key(10), key(11)]


@pytest.fixture
def root_v1(root_keys: list[SigningKey], release_keys: list[SigningKey]) -> Root:
    return make_root(1, root_keys, 2, release_keys, 1)


@pytest.fixture
def sign_manifest(release_keys: list[SigningKey]) -> Callable[..., bytes]:
    def sign(manifest: Manifest, signers: Sequence[SigningKey] | None = None) -> bytes:
        return sign_envelope(manifest.to_bytes(), MANIFEST_PAYLOAD_TYPE,
                             release_keys[:1] if signers is None else signers)

    return sign
