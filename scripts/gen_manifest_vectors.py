#!/usr/bin/env python3
"""Regenerate the manifest contract's test vectors in manifests/vectors/ (deterministic).

Keys come from fixed seeds and Ed25519 signatures are deterministic, so running this twice
gives identical files; tests/manifests/test_vectors.py fails when the files are stale.

    python scripts/gen_manifest_vectors.py          # rewrite the files
    python scripts/gen_manifest_vectors.py --check  # exit 1 if any file is out of date
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from manifests import (  # noqa: E402
    MANIFEST_PAYLOAD_TYPE,
    ROOT_PAYLOAD_TYPE,
    SigningKey,
    bucket,
    pae,
    sign_envelope,
)
from manifests.versions import VersionRange  # noqa: E402

VECTORS_DIR = ROOT / "manifests" / "vectors"


def _key(label: str) -> SigningKey:
    return SigningKey.from_seed(hashlib.sha256(f"modelfleet-vector-key:{label}".encode()).digest())


def _dump(value: Any) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False) + "\n").encode()


# --- bucketing ---------------------------------------------------------------------------------

def bucketing_vectors() -> list[dict[str, Any]]:
    rng = random.Random(20261129)  # noqa: S311 -- fixed seed on purpose: reproducible vectors
    salts = ["", "release-2.0", "4f2a9c1e", "sälz", "鹽", "a:b", "detector@3.1.0#prod"]
    devices = [
        "", "device-0001", "00000000-0000-0000-0000-000000000000",
        "3f2504e0-4f89-11d3-9a0c-0305e82c3301", "Pixel 8 Pro", "iPhone16,2",
        "café",            # precomposed é (U+00E9)
        "cafe\u0301",      # e + combining acute: different bytes, different bucket (no NFC)
        "日本語デバイス", "устройство", "📱-42", "a:b", " leading-space", "x" * 200,
    ]
    pairs = [(s, d) for s in salts for d in devices[:4]] + [(salts[1], d) for d in devices[4:]]
    pairs += [(salts[rng.randrange(len(salts))], f"dev-{rng.getrandbits(64):016x}")
              for _ in range(20)]
    out: list[dict[str, Any]] = []
    for i, (salt, device_id) in enumerate(pairs):
        b = bucket(salt, device_id)
        # Cycle through the edges: nobody, everybody, exactly at the bucket (out), one above (in),
        # and a random share.
        share = [0, 1_000_000, b, b + 1, rng.randrange(1_000_001)][i % 5]
        out.append({"salt": salt, "device_id": device_id, "bucket": b,
                    "share_ppm": share, "included": b < share})
    return out


# --- envelopes ---------------------------------------------------------------------------------

def _env(payload: bytes, payload_type: str, keys: list[SigningKey]) -> dict[str, Any]:
    env: dict[str, Any] = json.loads(sign_envelope(payload, payload_type, keys))
    return env


def _flip_b64(text: str, byte_index: int) -> str:
    raw = bytearray(base64.b64decode(text))
    raw[byte_index] ^= 0x01
    return base64.b64encode(bytes(raw)).decode()


def envelope_vectors() -> list[dict[str, Any]]:
    k1, k2, k3, stranger = _key("one"), _key("two"), _key("three"), _key("stranger")
    manifest_payload = json.dumps(
        {"type": "manifest", "channel": "prod", "serial": 1, "expires": 1800000000,
         "models": {}}, separators=(",", ":")).encode()
    utf8_payload = '{"note":"ünïcödé ✓ 日本"}'.encode()
    keys2 = {k.keyid: k.public_key.hex() for k in (k1, k2)}
    keys3 = {k.keyid: k.public_key.hex() for k in (k1, k2, k3)}
    M = MANIFEST_PAYLOAD_TYPE

    def case(name: str, env: dict[str, Any], public_keys: dict[str, str], threshold: int,
             error: str | None, expected_type: str = M, note: str = "") -> dict[str, Any]:
        return {"name": name, "note": note, "public_keys": public_keys, "threshold": threshold,
                "payload_type": expected_type, "envelope": env, "valid": error is None,
                "error": error}

    def mutated(env: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        copy = json.loads(json.dumps(env))
        change(copy)
        return copy

    base = _env(manifest_payload, M, [k1, k2])
    out = [
        case("valid_one_of_two", _env(manifest_payload, M, [k1]), keys2, 1, None),
        case("valid_two_of_three", base, keys3, 2, None),
        case("valid_utf8_payload", _env(utf8_payload, M, [k2]), keys2, 1, None,
             note="lengths in PAE count bytes, not characters"),
        case("valid_empty_payload", _env(b"", M, [k1]), keys2, 1, None),
        case("valid_root_payload_type", _env(b"{}", ROOT_PAYLOAD_TYPE, [k1]), keys2, 1, None,
             expected_type=ROOT_PAYLOAD_TYPE),
        case("valid_unknown_key_ignored", _env(manifest_payload, M, [stranger, k1]), keys2, 1,
             None, note="a signature by a key id not in public_keys is skipped"),
        case("valid_bad_signature_ignored_when_threshold_met",
             mutated(base, lambda e: e["signatures"][0].update(
                 sig=_flip_b64(e["signatures"][0]["sig"], 0))), keys2, 1, None,
             note="an invalid signature does not poison a valid one"),
        case("valid_duplicate_signatures_threshold_1", _env(manifest_payload, M, [k1, k1]),
             keys2, 1, None),
        case("tampered_payload",
             mutated(base, lambda e: e.update(payload=_flip_b64(e["payload"], 10))),
             keys2, 1, "SignatureError"),
        case("tampered_payload_appended",
             mutated(base, lambda e: e.update(
                 payload=base64.b64encode(manifest_payload + b" ").decode())),
             keys2, 1, "SignatureError", note="trailing whitespace changes the signed bytes"),
        case("tampered_signature",
             mutated(_env(manifest_payload, M, [k1]), lambda e: e["signatures"][0].update(
                 sig=_flip_b64(e["signatures"][0]["sig"], 63))), keys2, 1, "SignatureError"),
        case("unknown_key", _env(manifest_payload, M, [stranger]), keys2, 1, "SignatureError"),
        case("keyid_relabelled",
             mutated(_env(manifest_payload, M, [stranger]), lambda e: e["signatures"][0].update(
                 keyid=k1.keyid)), keys2, 1, "SignatureError",
             note="a stranger's signature filed under a trusted key id"),
        case("below_threshold", _env(manifest_payload, M, [k1]), keys3, 2, "SignatureError"),
        case("duplicate_signatures_one_key", _env(manifest_payload, M, [k1, k1, k1]), keys3, 2,
             "SignatureError", note="one key id counts once however often it signs"),
        case("no_signatures", _env(manifest_payload, M, []), keys2, 1, "SignatureError"),
        case("short_signature",
             mutated(_env(manifest_payload, M, [k1]), lambda e: e["signatures"][0].update(
                 sig=base64.b64encode(base64.b64decode(e["signatures"][0]["sig"])[:63]).decode())),
             keys2, 1, "SignatureError", note="a signature that is not 64 bytes never verifies"),
        case("wrong_payload_type", _env(manifest_payload, ROOT_PAYLOAD_TYPE, [k1]), keys2, 1,
             "WrongTypeError", note="a root envelope offered where a manifest is expected"),
        case("payload_type_swapped",
             mutated(_env(manifest_payload, ROOT_PAYLOAD_TYPE, [k1]),
                     lambda e: e.update(payloadType=M)), keys2, 1, "SignatureError",
             note="the payloadType is signed (PAE), so relabelling breaks the signature"),
        case("payload_not_base64",
             mutated(base, lambda e: e.update(payload="not base64!")), keys2, 1,
             "MalformedError"),
        case("payload_base64_unpadded",
             mutated(_env(b"ab", M, [k1]), lambda e: e.update(payload="YWI")), keys2, 1,
             "MalformedError", note="standard base64 with '=' padding is required"),
        case("payload_base64_noncanonical",
             mutated(_env(b"ab", M, [k1]), lambda e: e.update(payload="YWJ=")), keys2, 1,
             "MalformedError", note="padding bits must be zero (YWI= is the canonical form)"),
        case("payload_base64url",
             mutated(_env(b"\xfb\xff", M, [k1]), lambda e: e.update(payload="-_8=")), keys2, 1,
             "MalformedError", note="the URL-safe alphabet is not accepted"),
        case("signatures_missing", mutated(base, lambda e: e.pop("signatures")), keys2, 1,
             "MalformedError"),
    ]
    for v in out:  # make the PAE of every vector explicit for implementers
        try:
            payload = base64.b64decode(v["envelope"]["payload"], validate=True)
            v["pae_hex"] = pae(v["envelope"]["payloadType"], payload).hex()
        except (ValueError, KeyError, TypeError):
            v["pae_hex"] = None
    return out


# --- version ranges ----------------------------------------------------------------------------

def version_range_vectors() -> list[dict[str, Any]]:
    checks = [
        (">=14.0,<18", ["13.9", "14", "14.0.0", "17.99", "18", "18.0.1"]),
        (">=14.9", ["14.10", "14.9", "14.8.99", "15"]),
        (" >= 1.2 , != 1.2.5 , < 2 ", ["1.2", "1.2.5", "1.2.50", "2.0", "1.10"]),
        ("==3", ["3", "3.0", "3.0.0.0.0.0.0.0", "3.0.1", "03"]),
        (">0", ["0", "0.0.1", "1"]),
        ("<=2.1", ["2.1", "2.1.0", "2.1.1", "2.09"]),
        ("<1", ["", "1-beta", "0.9-rc1", "v0.9", "0.9"]),
    ]
    out: list[dict[str, Any]] = []
    for text, versions in checks:
        rng = VersionRange.parse(text)
        for v in versions:
            out.append({"range": text, "version": v, "valid_range": True,
                        "matches": rng.contains(v)})
    for bad in ["", ">=", "14", "=>1", "=1", "~1.2", "^1", ">=1.", ">=.1", ">=1..2", ">= a",
                ">=1,", ",>=1", ">=1 <2", ">=1;<2", ">=1.2.3.4.5.6.7.8.9", ">=1234567890",
                ">=1\t", ">=-1", ">=1.0-beta", ">=１"]:
        out.append({"range": bad, "version": "1", "valid_range": False, "matches": False})
    return out


# --- strict JSON -------------------------------------------------------------------------------

def strict_json_vectors() -> list[dict[str, Any]]:
    cases = [
        ("object", b'{"a":1}', True),
        ("whitespace_allowed", b' {\n "a" : [ 1 , 2 ] }\n', True),
        ("max_safe_integer", b'{"a":9007199254740991}', True),
        ("min_safe_integer", b'{"a":-9007199254740991}', True),
        ("negative_zero_integer", b'{"a":-0}', True),
        ("unicode_escape", b'{"a":"\\u00e9\\ud83d\\ude80"}', True),
        ("duplicate_key", b'{"a":1,"a":1}', False),
        ("duplicate_key_nested", b'{"a":{"b":1,"b":2}}', False),
        ("duplicate_key_via_escape", b'{"a":1,"\\u0061":2}', False),
        ("nan", b'{"a":NaN}', False),
        ("infinity", b'{"a":Infinity}', False),
        ("negative_infinity", b'{"a":-Infinity}', False),
        ("float_fraction", b'{"a":1.5}', False),
        ("float_integral", b'{"a":1.0}', False),
        ("float_exponent", b'{"a":1e2}', False),
        ("integer_2_pow_53", b'{"a":9007199254740992}', False),
        ("integer_negative_2_pow_53", b'{"a":-9007199254740992}', False),
        ("integer_huge", b'{"a":' + b"9" * 400 + b"}", False),
        ("lone_surrogate", b'{"a":"\\ud800"}', False),
        ("invalid_utf8", b'{"a":"\xc3\x28"}', False),
        ("utf8_bom", b'\xef\xbb\xbf{"a":1}', False),
        ("top_level_array", b'[1]', False),
        ("top_level_string", b'"a"', False),
        ("trailing_garbage", b'{"a":1}x', False),
        ("trailing_comma", b'{"a":1,}', False),
        ("single_quotes", b"{'a':1}", False),
        ("leading_zero", b'{"a":01}', False),
        ("control_character_in_string", b'{"a":"\x01"}', False),
        ("depth_64", b'{"a":' + b"[" * 63 + b"]" * 63 + b"}", True),
        ("depth_65", b'{"a":' + b"[" * 64 + b"]" * 64 + b"}", False),
        ("depth_65_objects", b'{"a":' * 65 + b"1" + b"}" * 65, False),
    ]
    return [{"name": n, "json_base64": base64.b64encode(d).decode(), "valid": ok,
             "error": None if ok else "MalformedError"} for n, d, ok in cases]


def build() -> dict[str, bytes]:
    return {
        "bucketing.json": _dump(bucketing_vectors()),
        "envelopes.json": _dump(envelope_vectors()),
        "version_ranges.json": _dump(version_range_vectors()),
        "strict_json.json": _dump(strict_json_vectors()),
    }


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, content in build().items():
        path = VECTORS_DIR / name
        if path.exists() and path.read_bytes() == content:
            continue
        stale.append(name)
        if not check:
            VECTORS_DIR.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(content)
            tmp.replace(path)
    if check and stale:
        print(f"stale vectors: {', '.join(stale)}; run python scripts/gen_manifest_vectors.py")
        return 1
    print(f"{'checked' if check else 'wrote'} {VECTORS_DIR.relative_to(ROOT)}: "
          f"{', '.join(stale) or 'all up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
