"""The attack and fault matrix (python-tuf's list, adapted). Every test is named after the
attack or fault, and checks both the refusal and that the device's trusted state on disk
(trust/ and models/) did not change."""

from __future__ import annotations

import hashlib
import random

import pytest

import manifests
from client_sdk import (
    DeadlineExceededError,
    FetchError,
    IntegrityError,
    Limits,
    MetadataExpiredError,
    Outcome,
    OversizeError,
    TrustError,
)
from manifests import MANIFEST_PAYLOAD_TYPE, Filters
from tests.client.conftest import trusted_state
from tests.client.onnx_models import scaled_model
from tests.client.simulator import DAY, RepositorySimulator
from tests.support.signing import seeded_key, sign_root


@pytest.fixture
def installed(make_updater, sim: RepositorySimulator, v1):
    """A device that trusts serial 1 and runs clf 1.0."""
    sim.publish("clf", [sim.release("1.0", [sim.artifact(v1)])])
    up = make_updater()
    assert up.check_once().outcome is Outcome.UPDATED
    return up


def _sign(sim: RepositorySimulator, keys, channel="prod") -> bytes:
    return manifests.sign_envelope(sim.manifest_doc(channel).to_bytes(), MANIFEST_PAYLOAD_TYPE,
                                   keys)


def _refused_untouched(up, kind: str, error: type[TrustError] = TrustError) -> None:
    before = trusted_state(up.config.data_dir)
    with pytest.raises(error) as info:
        up.check_once()
    assert info.value.kind == kind, str(info.value)
    assert trusted_state(up.config.data_dir) == before


# -- tampered bytes ------------------------------------------------------------------------

def test_tampered_artifact_is_refused(installed, sim, v2):
    art = sim.artifact(v2)
    sim.blobs["/" + art.url] = v2[:-1] + bytes([v2[-1] ^ 1])  # same length, one bit flipped
    sim.publish("clf", [sim.release("2.0", [art])])
    before = trusted_state(installed.config.data_dir)
    result = installed.check_once()
    (m,) = result.models
    assert m.outcome is Outcome.REFUSED and m.error == "IntegrityError"
    assert result.verification_failed
    after = trusted_state(installed.config.data_dir)
    assert {k: v for k, v in after.items() if k.startswith("models")} == {
        k: v for k, v in before.items() if k.startswith("models")}
    assert not list((installed.config.data_dir / "downloads").glob("*.part"))


def test_tampered_patch_falls_back_to_full_artifact(installed, sim, v1, v2):
    patch = sim.patch(v1, v2)
    sim.blobs["/" + patch.url] = b"\x00" * patch.length
    art = sim.artifact(v2, patches=[patch])
    sim.publish("clf", [sim.release("2.0", [art])])
    result = installed.check_once()
    assert result.outcome is Outcome.UPDATED
    assert installed.store.active("clf").sha256 == hashlib.sha256(v2).hexdigest()
    assert [f.path for f in sim.fetched("/blobs/")][-2:] == ["/" + patch.url, "/" + art.url]


def test_tampered_patch_and_artifact_leave_the_active_bundle(installed, sim, v1, v2):
    patch = sim.patch(v1, v2)
    sim.blobs["/" + patch.url] = b"\x01" * patch.length
    art = sim.artifact(v2, patches=[patch])
    sim.blobs["/" + art.url] = b"\x02" * art.length
    sim.publish("clf", [sim.release("2.0", [art])])
    models_before = {k: v for k, v in trusted_state(installed.config.data_dir).items()
                     if k.startswith("models")}
    assert installed.check_once().models[0].error == "IntegrityError"
    assert {k: v for k, v in trusted_state(installed.config.data_dir).items()
            if k.startswith("models")} == models_before


# -- signatures ----------------------------------------------------------------------------

def test_unsigned_manifest_is_refused(installed, sim):
    sim.publish("clf", [])
    sim.sign_with = []
    _refused_untouched(installed, "SignatureError")


def test_manifest_signed_by_unknown_key_is_refused(installed, sim):
    sim.publish("clf", [])
    sim.sign_with = [seeded_key("attacker")]
    _refused_untouched(installed, "SignatureError")


def _require_two_release_signatures(installed, sim) -> None:
    """Rotate (legitimately) to a root whose release role needs 2 signatures."""
    sim.release_threshold = 2
    sim.publish_root(2, sim.root_keys, sim.root_keys)
    sim.publish("clf", [])
    installed.check_once()
    assert installed.trusted.root.version == 2


def test_manifest_below_threshold_is_refused(installed, sim):
    _require_two_release_signatures(installed, sim)
    sim.publish("clf", [])
    sim.sign_with = sim.release_keys[:1]  # … but only one signs
    _refused_untouched(installed, "SignatureError")


def test_duplicate_signatures_by_one_key_count_once(installed, sim):
    _require_two_release_signatures(installed, sim)
    sim.publish("clf", [])
    k = sim.release_keys[0]
    sim.manifest_override["prod"] = _sign(sim, [k, k])
    _refused_untouched(installed, "SignatureError")


# -- freshness ---------------------------------------------------------------------------

def test_replayed_older_serial_is_refused(installed, sim, v2):
    old = sim.manifest_bytes()
    sim.publish("clf", [sim.release("2.0", [sim.artifact(v2)])])
    installed.check_once()
    sim.manifest_override["prod"] = old
    _refused_untouched(installed, "RollbackError")


def test_same_serial_with_different_bytes_is_refused(installed, sim, v2):
    sim.serial["prod"] -= 1  # keep serial 1 …
    sim.publish("clf", [sim.release("9.9", [sim.artifact(v2)])])  # … with other content
    _refused_untouched(installed, "EquivocationError")


def test_expired_manifest_is_refused_freeze_attack(installed, sim, clock):
    clock.advance(2 * DAY)  # the server stopped re-signing; the attacker freezes serial 1
    _refused_untouched(installed, "ExpiredError", MetadataExpiredError)


def test_expired_root_is_refused_freeze_attack(installed, sim, clock):
    """No newer root is served once the trusted one expires: a fresh, validly signed manifest
    is still refused, by the trust core's typed error, before the manifest is fetched."""
    clock.advance(366 * DAY)
    sim.publish("clf", [sim.release("9.0", [sim.artifact(b"x" * 10)])])
    sim.fetches.clear()
    _refused_untouched(installed, "ExpiredError", MetadataExpiredError)
    assert sim.fetched("/v1/channels/") == []


def test_manifest_for_another_channel_is_refused(installed, sim):
    sim.publish("clf", [], channel="beta")
    sim.manifest_override["prod"] = sim.manifest_bytes("beta")
    _refused_untouched(installed, "WrongChannelError")


# -- root rotation ---------------------------------------------------------------------------

def test_root_rotation_good_chain_is_followed_link_by_link(installed, sim):
    new_keys = [seeded_key("root-new-0"), seeded_key("root-new-1")]
    sim.publish_root(2, new_keys, sim.root_keys + new_keys)
    newer = [seeded_key("root-newer-0"), seeded_key("root-newer-1")]
    sim.publish_root(3, newer, new_keys + newer)
    sim.publish("clf", [])
    sim.fetches.clear()
    installed.check_once()
    assert [f.path for f in sim.fetched("/v1/root/")] == [
        "/v1/root/2.json", "/v1/root/3.json", "/v1/root/4.json"]
    assert installed.trusted.root.version == 3
    stored = (installed.config.data_dir / "trust" / "root.json").read_bytes()
    assert stored == sim.roots[3]


def test_root_rotation_skipped_version_is_refused(installed, sim):
    new_keys = [seeded_key("root-new-0"), seeded_key("root-new-1")]
    doc = sim.root_doc(3, new_keys)  # served as 2.json but claims version 3
    sim.roots[2] = sign_root(doc, sim.root_keys + new_keys)
    _refused_untouched(installed, "RootRotationError")


def test_root_rotation_missing_old_key_signatures_is_refused(installed, sim):
    new_keys = [seeded_key("root-new-0"), seeded_key("root-new-1")]
    sim.publish_root(2, new_keys, new_keys)  # the attacker's keys only
    _refused_untouched(installed, "SignatureError")


def test_root_rotation_missing_new_key_signatures_is_refused(installed, sim):
    new_keys = [seeded_key("root-new-0"), seeded_key("root-new-1")]
    sim.publish_root(2, new_keys, sim.root_keys)  # new keys never proved possession
    _refused_untouched(installed, "SignatureError")


# -- endless data and slow retrieval -------------------------------------------------------------

def test_oversize_manifest_is_refused(make_updater, sim, v1):
    sim.publish("clf", [sim.release("1.0", [sim.artifact(v1)])])
    up = make_updater(limits=Limits(max_manifest_bytes=512))
    before = trusted_state(up.config.data_dir)
    with pytest.raises(OversizeError):
        up.check_once()
    assert trusted_state(up.config.data_dir) == before


def test_endless_artifact_is_cut_at_its_signed_length(installed, sim, v2):
    art = sim.artifact(v2)
    sim.faults.endless.add("/" + art.url)
    sim.publish("clf", [sim.release("2.0", [art])])
    before = trusted_state(installed.config.data_dir)
    (m,) = installed.check_once().models
    assert m.outcome is Outcome.REFUSED and m.error == "OversizeError"
    assert {k for k in trusted_state(installed.config.data_dir) if k.startswith("models")} == {
        k for k in before if k.startswith("models")}


def test_artifact_declared_over_the_device_cap_is_refused(make_updater, sim, v1):
    sim.publish("clf", [sim.release("1.0", [sim.artifact(v1)])])
    up = make_updater(limits=Limits(max_artifact_bytes=1024))
    (m,) = up.check_once().models
    assert m.outcome is Outcome.REFUSED and m.error == "OversizeError"
    assert sim.fetched("/blobs/") == [] and up.store.active("clf") is None


def test_endless_root_is_refused(installed, sim):
    sim.roots[2] = b"x"
    sim.faults.endless.add("/v1/root/2.json")
    before = trusted_state(installed.config.data_dir)
    with pytest.raises(OversizeError):
        installed.check_once()
    assert trusted_state(installed.config.data_dir) == before


def test_endless_patch_output_is_capped_then_full_download(installed, sim, v1, v2):
    import bsdiff4

    huge = v2 + b"\0" * (len(v2) * 20)  # the patch expands far beyond the signed length
    patch = sim.patch(v1, v2, data=bsdiff4.diff(v1, huge))
    art = sim.artifact(v2, patches=[patch])
    sim.publish("clf", [sim.release("2.0", [art])])
    result = installed.check_once()
    assert result.outcome is Outcome.UPDATED
    assert installed.store.active("clf").sha256 == hashlib.sha256(v2).hexdigest()
    assert sim.fetched("/" + art.url)


def test_slow_server_hits_the_overall_deadline(installed, sim, v2):
    art = sim.artifact(v2)
    sim.publish("clf", [sim.release("2.0", [art])])
    sim.faults.slow_seconds_per_chunk = 20.0  # 60 s deadline; manifest + 4 artifact chunks
    before = trusted_state(installed.config.data_dir)
    (m,) = installed.check_once().models
    assert m.outcome is Outcome.FAILED and m.error == "DeadlineExceededError"
    after = trusted_state(installed.config.data_dir)
    assert {k: v for k, v in after.items() if k.startswith("models")} == {
        k: v for k, v in before.items() if k.startswith("models")}


def test_stalled_manifest_fetch_hits_the_deadline(installed, sim):
    sim.faults.slow_seconds_per_chunk = 100.0
    sim.publish("clf", [])
    before = trusted_state(installed.config.data_dir)
    with pytest.raises(DeadlineExceededError):
        installed.check_once()
    assert trusted_state(installed.config.data_dir) == before


# -- interrupted downloads ---------------------------------------------------------------------

def test_resume_after_a_cut_at_a_random_offset(installed, sim, v2):
    art = sim.artifact(v2)
    cut = random.Random(7).randrange(1, art.length - 1)
    sim.faults.cut_after["/" + art.url] = cut
    sim.publish("clf", [sim.release("2.0", [art])])
    (m,) = installed.check_once().models
    assert m.outcome is Outcome.FAILED and m.error == "FetchError"
    assert installed.store.active("clf").version == "1.0"
    del sim.faults.cut_after["/" + art.url]
    sim.fetches.clear()
    assert installed.check_once().outcome is Outcome.UPDATED
    (resumed,) = sim.fetched("/" + art.url)
    assert resumed.headers["Range"] == f"bytes={cut}-" and resumed.status == 206
    assert installed.store.verify(installed.store.active("clf"))


def test_changed_artifact_restarts_the_download_from_zero(installed, sim, v2):
    art = sim.artifact(v2)
    sim.faults.cut_after["/" + art.url] = art.length // 2
    sim.publish("clf", [sim.release("2.0", [art])])
    installed.check_once()
    v3 = scaled_model(3.0, padding=4000, tweak=20)
    art3 = sim.artifact(v3, )
    sim.blobs["/" + art.url] = v3  # same URL, new content and new signed hash
    art3 = art3.__class__(**{**art3.__dict__, "url": art.url})
    del sim.faults.cut_after["/" + art.url]
    sim.publish("clf", [sim.release("3.0", [art3])])
    sim.fetches.clear()
    assert installed.check_once().models[0].version == "3.0"
    (fresh,) = sim.fetched("/" + art.url)
    assert "Range" not in fresh.headers
    assert installed.store.active("clf").sha256 == hashlib.sha256(v3).hexdigest()


# -- offers not meant for this device ------------------------------------------------------------

def test_signed_offer_for_another_platform_is_refused(make_updater, sim, v1):
    sim.publish("clf", [sim.release("1.0", [sim.artifact(v1, platform="android")])])
    up = make_updater()
    result = up.check_once()
    assert result.outcome is Outcome.REFUSED and not result.verification_failed
    assert "includes this device" in result.models[0].reason
    assert up.store.active("clf") is None and sim.fetched("/blobs/") == []


def test_signed_offer_outside_the_filters_is_refused(installed, sim, v2, v1):
    a1 = sim.artifact(v1)
    sim.publish("clf", [
        sim.release("2.0", [sim.artifact(v2)], filters=Filters(os_versions=[">=7"])),
        sim.release("1.5", [sim.artifact(v2)], filters=Filters(device_deny=["device-1"])),
        sim.release("1.4", [sim.artifact(v2)], share_ppm=0),
        sim.release("1.0", [a1]),
    ])
    sim.fetches.clear()
    result = installed.check_once()
    assert result.outcome is Outcome.UP_TO_DATE and result.models[0].version == "1.0"
    assert sim.fetched("/blobs/") == []


def test_path_traversal_in_model_name_is_refused(installed, sim, v2):
    with pytest.raises(manifests.MalformedError):
        sim.publish("../../etc", [sim.release("2.0", [sim.artifact(v2)])])
        sim.manifest_bytes()


def test_network_failure_is_a_fetch_error_and_changes_nothing(installed, sim):
    before = trusted_state(installed.config.data_dir)
    installed.config.base_url = "https://elsewhere.test"
    with pytest.raises(FetchError):
        installed.check_once()
    assert trusted_state(installed.config.data_dir) == before


def test_integrity_error_is_exported(installed):
    assert issubclass(IntegrityError, Exception)
