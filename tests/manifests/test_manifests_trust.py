"""Trust decisions: the attack matrix against load_trusted_root / verify_root_update /
verify_manifest. Each refusal is its own error type; the caller's trusted state is an input,
so "state unchanged" is the caller keeping what it passed in."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

import pytest

from manifests import (
    MANIFEST_PAYLOAD_TYPE,
    ROOT_PAYLOAD_TYPE,
    EquivocationError,
    ExpiredError,
    MalformedError,
    Manifest,
    OversizeError,
    RollbackError,
    Root,
    RootRotationError,
    SignatureError,
    SigningKey,
    TrustedManifest,
    WrongChannelError,
    WrongTypeError,
    load_trusted_root,
    sign_envelope,
    verify_manifest,
    verify_root_update,
)
from tests.manifests.manifest_builders import key, make_manifest
from tests.support.signing import DAY, NOW, make_root, sign_root

Sign = Callable[..., bytes]


def test_pinned_root_loads_when_self_signed_to_threshold(root_v1: Root,
                                                          root_keys: list[SigningKey]) -> None:
    loaded = load_trusted_root(sign_root(root_v1, root_keys[:2]), now=NOW)
    assert loaded == root_v1
    assert loaded.raw_sha256 is not None


def test_pinned_root_below_its_threshold_is_refused(root_v1: Root,
                                                    root_keys: list[SigningKey]) -> None:
    with pytest.raises(SignatureError):
        load_trusted_root(sign_root(root_v1, root_keys[:1]))


def test_pinned_root_signed_by_release_key_only_is_refused(
        root_v1: Root, release_keys: list[SigningKey]) -> None:
    with pytest.raises(SignatureError):
        load_trusted_root(sign_root(root_v1, release_keys))


def test_expired_pinned_root_is_refused_when_now_given(root_v1: Root,
                                                       root_keys: list[SigningKey]) -> None:
    data = sign_root(root_v1, root_keys)
    with pytest.raises(ExpiredError):
        load_trusted_root(data, now=root_v1.expires)
    assert load_trusted_root(data).version == 1  # without now: no expiry check


def test_manifest_envelope_offered_as_root_is_wrong_type(sign_manifest: Sign) -> None:
    with pytest.raises(WrongTypeError):
        load_trusted_root(sign_manifest(make_manifest()))


def test_root_payload_with_manifest_document_type_is_wrong_type(
        root_keys: list[SigningKey]) -> None:
    data = sign_envelope(make_manifest().to_bytes(), ROOT_PAYLOAD_TYPE, root_keys)
    with pytest.raises(WrongTypeError, match="expected 'root'"):
        load_trusted_root(data)


# --- root rotation ---------------------------------------------------------------------------

def test_root_rotation_to_new_keys_needs_both_thresholds(root_v1: Root,
                                                         root_keys: list[SigningKey]) -> None:
    new_keys = [key(20), key(21)]
    v2 = make_root(2, new_keys, 2, [key(10)], 1)
    both = root_keys[:2] + new_keys
    assert verify_root_update(root_v1, sign_root(v2, both)) == v2
    with pytest.raises(SignatureError):  # only the old keys: new root not self-signed
        verify_root_update(root_v1, sign_root(v2, root_keys))
    with pytest.raises(SignatureError):  # only the new keys: not authorised by root 1
        verify_root_update(root_v1, sign_root(v2, new_keys))
    with pytest.raises(SignatureError):  # below the old threshold
        verify_root_update(root_v1, sign_root(v2, root_keys[:1] + new_keys))
    with pytest.raises(SignatureError):  # below the new threshold
        verify_root_update(root_v1, sign_root(v2, root_keys[:2] + new_keys[:1]))


@pytest.mark.parametrize("version", [1, 3, 0 + 1_000])
def test_root_rotation_must_be_exactly_n_plus_1(root_v1: Root, root_keys: list[SigningKey],
                                                version: int) -> None:
    other = replace(root_v1, version=version)
    with pytest.raises(RootRotationError, match="expected exactly 2"):
        verify_root_update(root_v1, sign_root(other, root_keys))


def test_root_rotation_chain_then_old_key_cannot_sign(root_v1: Root,
                                                      root_keys: list[SigningKey]) -> None:
    v2 = make_root(2, [key(20)], 1, [key(10)], 1)
    r2 = verify_root_update(root_v1, sign_root(v2, [*root_keys[:2], key(20)]))
    v3 = make_root(3, [key(30)], 1, [key(10)], 1)
    with pytest.raises(SignatureError):  # root 1's keys no longer matter
        verify_root_update(r2, sign_root(v3, [*root_keys, key(30)]))
    assert verify_root_update(r2, sign_root(v3, [key(20), key(30)])).version == 3


def test_expired_intermediate_root_still_rotates(root_v1: Root,
                                                 root_keys: list[SigningKey]) -> None:
    v2 = make_root(2, root_keys, 2, [key(10)], 1, expires=NOW - DAY)
    r2 = verify_root_update(root_v1, sign_root(v2, root_keys))
    assert r2.is_expired(NOW)


# --- manifests --------------------------------------------------------------------------------

def test_valid_manifest_verifies_and_reports_its_hash(root_v1: Root, sign_manifest: Sign) -> None:
    m = make_manifest(serial=3)
    got = verify_manifest(root_v1, sign_manifest(m), now=NOW, channel="prod", trusted=None)
    assert got == m
    assert TrustedManifest.of(got) == TrustedManifest(3, got.raw_sha256 or "")


def test_manifest_signed_by_root_key_not_release_key_is_refused(
        root_v1: Root, root_keys: list[SigningKey], sign_manifest: Sign) -> None:
    with pytest.raises(SignatureError):
        verify_manifest(root_v1, sign_manifest(make_manifest(), root_keys), now=NOW,
                        channel="prod", trusted=None)


def test_unsigned_manifest_is_refused(root_v1: Root, sign_manifest: Sign) -> None:
    with pytest.raises(SignatureError, match="0 valid"):
        verify_manifest(root_v1, sign_manifest(make_manifest(), []), now=NOW, channel="prod",
                        trusted=None)


def test_replayed_older_serial_is_rollback(root_v1: Root, sign_manifest: Sign) -> None:
    trusted = TrustedManifest(5, "0" * 64)
    with pytest.raises(RollbackError, match="lower than the trusted 5"):
        verify_manifest(root_v1, sign_manifest(make_manifest(serial=4)), now=NOW,
                        channel="prod", trusted=trusted)


def test_same_serial_different_bytes_is_equivocation(root_v1: Root, sign_manifest: Sign) -> None:
    first = verify_manifest(root_v1, sign_manifest(make_manifest(serial=5)), now=NOW,
                            channel="prod", trusted=None)
    trusted = TrustedManifest.of(first)
    other = make_manifest(serial=5, expires=NOW + 2 * DAY)
    with pytest.raises(EquivocationError):
        verify_manifest(root_v1, sign_manifest(other), now=NOW, channel="prod", trusted=trusted)
    # The same bytes again (a re-fetch) are fine, even with an extra signature.
    again = verify_manifest(root_v1, sign_manifest(make_manifest(serial=5), [key(10), key(11)]),
                            now=NOW, channel="prod", trusted=trusted)
    assert again == first


def test_expired_manifest_is_refused(root_v1: Root, sign_manifest: Sign) -> None:
    data = sign_manifest(make_manifest(expires=NOW))
    with pytest.raises(ExpiredError, match="expired"):
        verify_manifest(root_v1, data, now=NOW, channel="prod", trusted=None)
    assert verify_manifest(root_v1, data, now=NOW - 1, channel="prod", trusted=None)


def test_other_channels_manifest_is_refused(root_v1: Root, sign_manifest: Sign) -> None:
    with pytest.raises(WrongChannelError, match="'beta'"):
        verify_manifest(root_v1, sign_manifest(make_manifest(channel="beta")), now=NOW,
                        channel="prod", trusted=None)


def test_root_envelope_offered_as_manifest_is_wrong_type(root_v1: Root,
                                                         release_keys: list[SigningKey]) -> None:
    data = sign_envelope(make_manifest().to_bytes(), ROOT_PAYLOAD_TYPE, release_keys)
    with pytest.raises(WrongTypeError):
        verify_manifest(root_v1, data, now=NOW, channel="prod", trusted=None)


def test_oversize_manifest_is_refused(root_v1: Root, sign_manifest: Sign) -> None:
    data = sign_manifest(make_manifest())
    with pytest.raises(OversizeError):
        verify_manifest(root_v1, data, now=NOW, channel="prod", trusted=None,
                        max_size=len(data) - 1)


def test_signed_but_malformed_manifest_is_refused(root_v1: Root,
                                                  release_keys: list[SigningKey]) -> None:
    doc = json.loads(make_manifest().to_bytes())
    doc["serial"] = 1.5
    payload = json.dumps(doc).encode()
    data = sign_envelope(payload, MANIFEST_PAYLOAD_TYPE, release_keys)
    with pytest.raises(MalformedError, match="integers only"):
        verify_manifest(root_v1, data, now=NOW, channel="prod", trusted=None)


def test_trusted_manifest_of_unparsed_manifest_is_a_caller_bug() -> None:
    with pytest.raises(ValueError, match="verify_manifest"):
        TrustedManifest.of(make_manifest())
    assert isinstance(Manifest.from_bytes(make_manifest().to_bytes()).raw_sha256, str)
