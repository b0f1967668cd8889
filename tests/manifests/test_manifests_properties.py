"""Property tests (hypothesis): tampering fails, documents round-trip, rollout is monotone."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from manifests import (
    ROOT_PAYLOAD_TYPE,
    DeviceProfile,
    Envelope,
    JSONValue,
    Manifest,
    ManifestError,
    Rollout,
    Root,
    SignatureError,
    bucket,
    compare_versions,
    rollout_includes,
    sign_envelope,
    verify_envelope,
    verify_manifest,
    verify_root_update,
)
from manifests.strictjson import dumps, loads
from tests.manifests.manifest_builders import key, make_manifest
from tests.manifests.manifest_strategies import json_values, manifests_st, texts
from tests.support.signing import make_root

T = "application/vnd.modelfleet.manifest+json"
KEYS = [key(1), key(2)]
PUBLIC = {k.keyid: k.public_key for k in KEYS}
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- tampering ---------------------------------------------------------------------------------

@FAST
@given(payload=st.binary(min_size=1, max_size=300), data=st.data())
def test_any_flipped_payload_byte_fails_verification(payload: bytes, data: st.DataObject) -> None:
    env = Envelope.from_bytes(sign_envelope(payload, T, KEYS), 1 << 20)
    i = data.draw(st.integers(0, len(payload) - 1))
    mask = data.draw(st.integers(1, 255))
    tampered = bytearray(payload)
    tampered[i] ^= mask
    with_bad_payload = replace(env, payload=bytes(tampered))
    try:
        verify_envelope(with_bad_payload, PUBLIC, 1, T)
    except SignatureError:
        pass
    else:
        raise AssertionError("tampered payload verified")


@FAST
@given(payload=st.binary(max_size=300), which=st.integers(0, 1), index=st.integers(0, 63),
       mask=st.integers(1, 255))
def test_any_flipped_signature_byte_fails_verification(payload: bytes, which: int, index: int,
                                                       mask: int) -> None:
    env = Envelope.from_bytes(sign_envelope(payload, T, KEYS), 1 << 20)
    sigs = list(env.signatures)
    raw = bytearray(sigs[which].sig)
    raw[index] ^= mask
    sigs[which] = replace(sigs[which], sig=bytes(raw))
    tampered = replace(env, signatures=tuple(sigs))
    # The other key's signature still stands alone; with both required, the flip must fail.
    verify_envelope(tampered, PUBLIC, 1, T)
    try:
        verify_envelope(tampered, PUBLIC, 2, T)
    except SignatureError:
        pass
    else:
        raise AssertionError("tampered signature counted")


@FAST
@given(payload=st.binary(max_size=120), data=st.data())
def test_any_flipped_byte_of_the_wire_envelope_is_refused(payload: bytes,
                                                          data: st.DataObject) -> None:
    wire = sign_envelope(payload, T, KEYS[:1])
    i = data.draw(st.integers(0, len(wire) - 1))
    tampered = bytearray(wire)
    tampered[i] ^= data.draw(st.integers(1, 255))
    try:
        env = Envelope.from_bytes(bytes(tampered), 1 << 20)
        verify_envelope(env, PUBLIC, 1, T)
    except ManifestError:
        return
    raise AssertionError(f"envelope with byte {i} flipped verified")


# --- round trips -------------------------------------------------------------------------------

@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests_st)
def test_manifest_parse_serialize_parse_is_stable(m: Manifest) -> None:
    data = m.to_bytes()
    parsed = Manifest.from_bytes(data)
    assert parsed == m
    assert parsed.to_bytes() == data
    assert Manifest.from_bytes(parsed.to_bytes()) == parsed


@FAST
@given(st.dictionaries(texts, json_values, max_size=5))
def test_strict_json_round_trips_every_allowed_value(value: dict[str, JSONValue]) -> None:
    assert loads(dumps(value)) == value


@FAST
@given(st.binary(max_size=200))
def test_strict_json_never_raises_anything_but_malformed(data: bytes) -> None:
    try:
        loads(data)
    except ManifestError:
        pass


# --- rollout -----------------------------------------------------------------------------------

@FAST
@given(salt=st.text(max_size=30), device_id=st.text(max_size=40),
       low=st.integers(0, 1_000_000), high=st.integers(0, 1_000_000))
def test_raising_share_never_removes_a_device(salt: str, device_id: str, low: int,
                                              high: int) -> None:
    low, high = min(low, high), max(low, high)
    device = DeviceProfile(device_id=device_id, platform="android")
    if rollout_includes(Rollout(low, salt or "s"), device):
        assert rollout_includes(Rollout(high, salt or "s"), device)
    assert 0 <= bucket(salt, device_id) < 1_000_000


@FAST
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=5),
       st.lists(st.integers(0, 10**6), min_size=1, max_size=5))
def test_version_compare_is_numeric_tuple_order(a: list[int], b: list[int]) -> None:
    width = max(len(a), len(b))
    pa, pb = a + [0] * (width - len(a)), b + [0] * (width - len(b))
    expected = (pa > pb) - (pa < pb)
    assert compare_versions(".".join(map(str, a)), ".".join(map(str, b))) == expected


# --- robustness: hostile but signed input never escapes the error tree ----------------------------

def _mutate(doc: Any, data: st.DataObject) -> Any:
    """Replace one randomly chosen node of ``doc`` (walking down from the top) by any JSON."""
    replacement = data.draw(json_values)
    if not isinstance(doc, (dict, list)) or not doc or data.draw(st.integers(0, 4)) == 0:
        return replacement
    if isinstance(doc, dict):
        k = data.draw(st.sampled_from(sorted(doc)))
        if data.draw(st.booleans()) and data.draw(st.integers(0, 5)) == 0:
            return {kk: vv for kk, vv in doc.items() if kk != k}  # drop a member
        return {**doc, k: _mutate(doc[k], data)}
    i = data.draw(st.integers(0, len(doc) - 1))
    return [*doc[:i], _mutate(doc[i], data), *doc[i + 1:]]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_mutated_manifest_parses_or_raises_manifest_error(data: st.DataObject) -> None:
    doc = json.loads(make_manifest().to_bytes())
    mutated = _mutate(doc, data)
    try:
        m = Manifest.from_dict(mutated)
    except ManifestError:
        return
    assert Manifest.from_bytes(m.to_bytes()) == m


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_mutated_root_parses_or_raises_manifest_error(data: st.DataObject) -> None:
    doc = json.loads(make_root(1, [key(1), key(2)], 2, [key(3)]).to_bytes())
    try:
        r = Root.from_dict(_mutate(doc, data))
    except ManifestError:
        return
    assert Root.from_bytes(r.to_bytes()) == r


@FAST
@given(st.binary(max_size=300))
def test_verify_manifest_on_arbitrary_bytes_raises_only_manifest_errors(data: bytes) -> None:
    root = make_root(1, [key(1)], 1, [key(2)])
    try:
        verify_manifest(root, data, now=0, channel="prod", trusted=None)
    except ManifestError:
        return
    raise AssertionError("arbitrary bytes verified")


# --- root rotation: accepted exactly when both thresholds are met ------------------------------

OLD_KEYS = [key(40 + i) for i in range(4)]
NEW_KEYS = [key(50 + i) for i in range(4)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(old_threshold=st.integers(1, 4), new_threshold=st.integers(1, 4),
       old_signers=st.sets(st.integers(0, 3)), new_signers=st.sets(st.integers(0, 3)),
       shared=st.booleans())
def test_root_rotation_needs_both_thresholds_of_distinct_keys(
        old_threshold: int, new_threshold: int, old_signers: set[int], new_signers: set[int],
        shared: bool) -> None:
    # With ``shared`` the new root keeps the old root keys, so one signature counts for both.
    new_keys = OLD_KEYS if shared else NEW_KEYS
    old = make_root(1, OLD_KEYS, old_threshold, [key(60)])
    new = make_root(2, new_keys, new_threshold, [key(60)])
    signers = [*(OLD_KEYS[i] for i in sorted(old_signers)),
               *(new_keys[i] for i in sorted(new_signers))]
    data = sign_envelope(new.to_bytes(), ROOT_PAYLOAD_TYPE, signers)
    distinct = {k.keyid for k in signers}
    old_ok = len(distinct & {k.keyid for k in OLD_KEYS}) >= old_threshold
    new_ok = len(distinct & {k.keyid for k in new_keys}) >= new_threshold
    try:
        assert verify_root_update(old, data) == new
        accepted = True
    except SignatureError:
        accepted = False
    assert accepted == (old_ok and new_ok)
