"""The trust core (client_sdk.trust.TrustedMetadata) decides expiry: of the root in force and
of channel manifests, both as MetadataExpiredError (a TrustError whose kind stays the
manifests name "ExpiredError"); other failures stay plain TrustErrors."""

from __future__ import annotations

import pytest

from client_sdk import MetadataExpiredError, TrustError
from client_sdk.trust import TrustedMetadata
from tests.client.simulator import DAY, START, FakeClock, RepositorySimulator
from tests.support.signing import YEAR, make_root, seeded_key, sign_root


@pytest.fixture
def sim() -> RepositorySimulator:
    return RepositorySimulator(FakeClock())


def test_root_in_force_expires_at_its_expires_second(sim):
    trusted = TrustedMetadata(sim.pinned_root, None)
    expires = trusted.root.expires
    trusted.check_root_unexpired(expires - 1)
    with pytest.raises(MetadataExpiredError, match="expired") as info:
        trusted.check_root_unexpired(expires)
    assert isinstance(info.value, TrustError) and info.value.kind == "ExpiredError"


def test_expiry_is_that_of_the_root_in_force_after_rotation(sim):
    trusted = TrustedMetadata(sim.pinned_root, None)
    old_expiry = trusted.root.expires
    v2 = make_root(2, sim.root_keys, sim.root_threshold, sim.release_keys,
                   expires=old_expiry + YEAR)
    trusted.update_root(sign_root(v2, sim.root_keys))
    trusted.check_root_unexpired(old_expiry)
    with pytest.raises(MetadataExpiredError, match="root v2"):
        trusted.check_root_unexpired(old_expiry + YEAR)


def test_expired_manifest_is_a_metadata_expired_error(sim):
    sim.publish("clf", [])
    trusted = TrustedMetadata(sim.pinned_root, None)
    with pytest.raises(MetadataExpiredError) as info:
        trusted.verify_manifest(sim.manifest_bytes(), now=START + DAY, channel="prod",
                                previous=None, max_size=1 << 20)
    assert info.value.kind == "ExpiredError"


def test_other_failures_stay_plain_trust_errors(sim):
    sim.publish("clf", [])
    sim.sign_with = [seeded_key("attacker")]
    trusted = TrustedMetadata(sim.pinned_root, None)
    with pytest.raises(TrustError) as info:
        trusted.verify_manifest(sim.manifest_bytes(), now=START, channel="prod",
                                previous=None, max_size=1 << 20)
    assert type(info.value) is TrustError and info.value.kind == "SignatureError"
