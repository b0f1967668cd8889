"""DSSE envelope: PAE bytes, signing, strict parsing, threshold counting."""

from __future__ import annotations

import base64
import json

import pytest

from manifests import (
    MAX_SIGNATURES,
    Envelope,
    MalformedError,
    OversizeError,
    SignatureError,
    SigningKey,
    WrongTypeError,
    key_id,
    pae,
    sign_envelope,
    verify_envelope,
    verify_signature,
)
from tests.manifests.manifest_builders import key

T = "application/vnd.modelfleet.manifest+json"


def test_pae_matches_the_dsse_v1_definition() -> None:
    assert pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )
    assert pae("", b"") == b"DSSEv1 0  0 "
    # Lengths count UTF-8 bytes, not characters.
    assert pae("é", b"\x00") == b"DSSEv1 2 \xc3\xa9 1 \x00"


def test_signing_key_matches_rfc8032_test_vector_1() -> None:
    k = SigningKey.from_seed(
        bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    )
    assert k.public_key.hex() == "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
    assert k.sign(b"").hex() == (
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555"
        "fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
    )


def test_key_id_is_hex_sha256_of_raw_public_key() -> None:
    public = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
    assert key_id(public) == "21fe31dfa154a261626bf854046fd2271b7bed4b6abe45aa58877ef47f9721b9"
    with pytest.raises(ValueError, match="32 bytes"):
        key_id(b"short")


def test_signing_key_round_trips_its_seed() -> None:
    k = SigningKey.generate()
    assert SigningKey.from_seed(k.seed).public_key == k.public_key
    assert verify_signature(k.public_key, b"m", k.sign(b"m"))
    assert not verify_signature(k.public_key, b"n", k.sign(b"m"))
    assert "seed" not in repr(k) and k.seed.hex() not in repr(k)


def _keys(*ks: SigningKey) -> dict[str, bytes]:
    return {k.keyid: k.public_key for k in ks}


def test_sign_then_verify_returns_the_exact_payload() -> None:
    payload = b'{"x": 1,  "y":"\xc3\xa9"}'  # not canonical on purpose: bytes are what counts
    data = sign_envelope(payload, T, [key(1), key(2)])
    env = Envelope.from_bytes(data, max_size=10_000)
    assert verify_envelope(env, _keys(key(1), key(2)), 2, T) == payload


def test_duplicate_signatures_of_one_key_count_once() -> None:
    env = Envelope.from_bytes(sign_envelope(b"p", T, [key(1), key(1), key(1)]), 10_000)
    assert verify_envelope(env, _keys(key(1), key(2)), 1, T) == b"p"
    with pytest.raises(SignatureError, match="1 valid signature"):
        verify_envelope(env, _keys(key(1), key(2)), 2, T)


def test_unknown_key_signatures_are_ignored() -> None:
    env = Envelope.from_bytes(sign_envelope(b"p", T, [key(7), key(1)]), 10_000)
    assert verify_envelope(env, _keys(key(1)), 1, T) == b"p"
    only_unknown = Envelope.from_bytes(sign_envelope(b"p", T, [key(7)]), 10_000)
    with pytest.raises(SignatureError):
        verify_envelope(only_unknown, _keys(key(1)), 1, T)


def test_signature_claiming_another_keys_id_does_not_count() -> None:
    env = Envelope.from_bytes(sign_envelope(b"p", T, [key(7)]), 10_000)
    forged = Envelope(env.payload_type, env.payload,
                      (env.signatures[0].__class__(key(1).keyid, env.signatures[0].sig),))
    with pytest.raises(SignatureError):
        verify_envelope(forged, _keys(key(1)), 1, T)


def test_wrong_payload_type_is_refused_before_signatures() -> None:
    env = Envelope.from_bytes(sign_envelope(b"p", "application/other", [key(1)]), 10_000)
    with pytest.raises(WrongTypeError, match="application/other"):
        verify_envelope(env, _keys(key(1)), 1, T)


def test_signature_over_other_payload_type_fails_even_if_type_is_swapped() -> None:
    data = json.loads(sign_envelope(b"p", "application/other", [key(1)]))
    data["payloadType"] = T
    env = Envelope.from_bytes(json.dumps(data).encode(), 10_000)
    with pytest.raises(SignatureError):
        verify_envelope(env, _keys(key(1)), 1, T)


def test_zero_threshold_is_a_caller_bug() -> None:
    env = Envelope.from_bytes(sign_envelope(b"p", T, []), 10_000)
    with pytest.raises(ValueError, match="threshold"):
        verify_envelope(env, {}, 0, T)


def test_oversize_envelope_is_refused_before_parsing() -> None:
    data = sign_envelope(b"x" * 1000, T, [key(1)])
    with pytest.raises(OversizeError, match="cap"):
        Envelope.from_bytes(data, max_size=len(data) - 1)
    assert Envelope.from_bytes(data, max_size=len(data)).payload == b"x" * 1000


def test_too_many_signatures_is_oversize() -> None:
    one = json.loads(sign_envelope(b"p", T, [key(1)]))
    one["signatures"] = one["signatures"] * (MAX_SIGNATURES + 1)
    with pytest.raises(OversizeError, match="signatures"):
        Envelope.from_bytes(json.dumps(one).encode(), 1_000_000)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda e: e.pop("payloadType"), "payloadType"),
        (lambda e: e.update(payload=5), "payload"),
        (lambda e: e.update(payload="not base64!"), "base64"),
        (lambda e: e.update(payload="cA"), "base64"),  # missing padding
        (lambda e: e.update(payload="cB=="), "canonical"),  # non-zero padding bits
        (lambda e: e.update(signatures={}), "signatures"),
        (lambda e: e["signatures"].append("x"), "signatures"),
        (lambda e: e["signatures"][0].pop("keyid"), "keyid"),
        (lambda e: e["signatures"][0].update(sig="@@"), "base64"),
    ],
)
def test_malformed_envelopes_are_refused(mutate, reason: str) -> None:
    env = json.loads(sign_envelope(b"p", T, [key(1)]))
    mutate(env)
    with pytest.raises(MalformedError, match=reason):
        Envelope.from_bytes(json.dumps(env).encode(), 10_000)


def test_envelope_round_trips_through_bytes() -> None:
    data = sign_envelope(b"payload", T, [key(1), key(2)])
    env = Envelope.from_bytes(data, 10_000)
    assert env.to_bytes() == data
    assert base64.b64decode(json.loads(data)["payload"]) == b"payload"
