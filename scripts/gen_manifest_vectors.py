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
sys.path.insert(0, str(ROOT))  # a script run by path: make manifests and tests.support importable

from manifests import (  # noqa: E402
    MANIFEST_PAYLOAD_TYPE,
    ROOT_PAYLOAD_TYPE,
    Artifact,
    DeviceProfile,
    Filters,
    Manifest,
    ManifestError,
    ModelEntry,
    Patch,
    Release,
    Rollout,
    Root,
    ShadowThresholds,
    SigningKey,
    TrustedManifest,
    bucket,
    load_trusted_root,
    pae,
    select_artifact,
    select_release,
    sign_envelope,
    verify_manifest,
    verify_root_update,
)
from manifests.versions import VersionRange  # noqa: E402
from tests.support.signing import make_root, seeded_key  # noqa: E402

VECTORS_DIR = ROOT / "manifests" / "vectors"


def _key(label: str) -> SigningKey:
    return seeded_key(f"modelfleet-vector-key:{label}")


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


ED25519_L = 2**252 + 27742317777372353535851937790883648493


def _malleate_b64(text: str) -> str:
    """The same signature with S replaced by S + L: valid under a lax verifier, refused by a
    strict one (RFC 8032 section 5.1.7 requires S < L)."""
    raw = base64.b64decode(text)
    s = int.from_bytes(raw[32:], "little") + ED25519_L
    return base64.b64encode(raw[:32] + s.to_bytes(32, "little")).decode()


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
        case("signature_s_not_reduced",
             mutated(_env(manifest_payload, M, [k1]), lambda e: e["signatures"][0].update(
                 sig=_malleate_b64(e["signatures"][0]["sig"]))), keys2, 1, "SignatureError",
             note="S + L instead of S: RFC 8032 requires S < L; lax verifiers accept it"),
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


# --- trust decisions ---------------------------------------------------------------------------

NOW = 1_800_000_000
YEAR = 365 * 86_400


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _root(version: int, root_keys: list[SigningKey], root_threshold: int,
          release_keys: list[SigningKey]) -> Root:
    return make_root(version, root_keys, root_threshold, release_keys, expires=NOW + YEAR)


def _in_share(name: str, salt: str = "detector-2.0", share: int = 300_000) -> str:
    """The first id name-0, name-1, ... inside the share, so filter cases are not masked by it."""
    return next(f"{name}-{i}" for i in range(10_000) if bucket(salt, f"{name}-{i}") < share)


DENIED = _in_share("bad")


def _sample_manifest(serial: int, expires: int = NOW + 86_400, channel: str = "prod") -> Manifest:
    def artifact(version: str, platform: str, soc: str = "") -> Artifact:
        target = {"runtime": "onnxruntime"} | ({"soc": soc} if soc else {})
        name = f"{version}/{platform}/{soc or 'generic'}"
        return Artifact(platform=platform, variant=soc or "generic", format="onnx",
                        url=f"https://cdn.example/detector/{name}.onnx", length=1000 + serial,
                        sha256=_sha(name), compile_settings={"opset": 18, "fp16": True},
                        target=target,
                        patches=[Patch(_sha(f"1.0/{platform}/generic"),
                                       f"https://cdn.example/detector/{name}.patch", 77,
                                       _sha(f"patch:{name}"), "bsdiff4")])
    new = Release("2.0", Rollout(
        share_ppm=300_000, salt="detector-2.0", mode="shadow",
        filters=Filters(platforms=["android", "ios"], os_versions=[">=14.0,<18", ">=34"],
                        app_versions=[">=3.2"], device_allow=["lab-1"], device_deny=[DENIED]),
        shadow=ShadowThresholds(max_kl_micro=20_000, max_latency_p99_us=15_000, min_samples=500)),
        [artifact("2.0", "android", "sm8650"), artifact("2.0", "android"), artifact("2.0", "ios")])
    old = Release("1.0", Rollout(share_ppm=1_000_000, salt="detector-1.0"),
                  [artifact("1.0", "android"), artifact("1.0", "ios")])
    seg = Release("1.0", Rollout(share_ppm=1_000_000, salt="seg-1.0",
                                 filters=Filters(socs=["sm8650", "sm8550"])),
                  [artifact("seg-1.0", "android", "sm8650"),
                   artifact("seg-1.0", "android", "sm8550")])
    return Manifest(channel=channel, serial=serial, expires=expires,
                    models={"detector": ModelEntry([new, old]), "segmenter": ModelEntry([seg])})


def trust_vectors() -> list[dict[str, Any]]:
    r1a, r1b, r1c = _key("root-1a"), _key("root-1b"), _key("root-1c")
    rel1, r2, rel2, stranger = _key("release-1"), _key("root-2"), _key("release-2"), _key("x")
    root1 = _root(1, [r1a, r1b, r1c], 2, [rel1])
    pinned = sign_envelope(root1.to_bytes(), ROOT_PAYLOAD_TYPE, [r1a, r1b])
    root2 = _root(2, [r2], 1, [rel2])
    root2_ok = sign_envelope(root2.to_bytes(), ROOT_PAYLOAD_TYPE, [r1a, r1c, r2])
    M = MANIFEST_PAYLOAD_TYPE

    def man(serial: int = 5, signers: list[SigningKey] | None = None, **kw: Any) -> bytes:
        return sign_envelope(_sample_manifest(serial, **kw).to_bytes(), M,
                             [rel1] if signers is None else signers)

    def raw(payload: dict[str, Any] | bytes, signers: list[SigningKey] | None = None,
            payload_type: str = M) -> bytes:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        return sign_envelope(data, payload_type, [rel1] if signers is None else signers)

    doc = json.loads(_sample_manifest(5).to_bytes())
    same5 = man(5)
    trusted5 = {"serial": 5, "sha256": hashlib.sha256(_sample_manifest(5).to_bytes()).hexdigest()}

    def edited(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        copy = json.loads(json.dumps(doc))
        change(copy)
        return copy

    text_float = json.dumps(doc).replace('"serial": 5', '"serial": 5.0').encode()
    text_dup = json.dumps(doc).replace('"serial": 5', '"serial": 5, "serial": 6').encode()
    cases: list[dict[str, Any]] = []

    def case(name: str, manifest: bytes, *, updates: tuple[bytes, ...] | list[bytes] = (),
             now: int = NOW,
             channel: str = "prod", trusted: dict[str, Any] | None = None,
             max_size: int = 4 * 1024 * 1024, note: str = "") -> None:
        vector: dict[str, Any] = {
            "name": name, "note": note, "pinned_root": pinned.decode(),
            "root_updates": [u.decode() for u in updates], "now": now, "channel": channel,
            "trusted_manifest": trusted, "max_size": max_size, "manifest": manifest.decode(),
        }
        try:
            root = load_trusted_root(pinned)
            for u in updates:
                root = verify_root_update(root, u)
            trusted_state = None if trusted is None else TrustedManifest(**trusted)
            m = verify_manifest(root, manifest, now=now, channel=channel, trusted=trusted_state,
                                max_size=max_size)
            vector.update(valid=True, error=None, expected={
                "root_version": root.version, "serial": m.serial, "sha256": m.raw_sha256})
        except ManifestError as e:
            vector.update(valid=False, error=type(e).__name__, expected=None)
        cases.append(vector)

    case("valid", man())
    case("valid_same_bytes_refetch", man(5, [rel1, stranger]), trusted=trusted5,
         note="same serial and payload as trusted; extra signatures do not matter")
    case("valid_higher_serial", man(6), trusted=trusted5)
    case("valid_one_second_before_expiry", man(), now=NOW + 86_399)
    case("valid_unknown_fields", raw(edited(lambda d: d.update(future={"x": [1, None]}))),
         note="unknown members are ignored by verifiers")
    case("valid_after_root_rotation", man(5, [rel2]), updates=[root2_ok])
    case("release_key_of_old_root_after_rotation", man(5, [rel1]), updates=[root2_ok])
    case("rotation_missing_new_root_signature", man(5, [rel2]),
         updates=[sign_envelope(root2.to_bytes(), ROOT_PAYLOAD_TYPE, [r1a, r1b])])
    case("rotation_below_old_threshold", man(5, [rel2]),
         updates=[sign_envelope(root2.to_bytes(), ROOT_PAYLOAD_TYPE, [r1a, r2])])
    case("rotation_skips_a_version", man(5, [rel2]), updates=[sign_envelope(
        _root(3, [r2], 1, [rel2]).to_bytes(), ROOT_PAYLOAD_TYPE, [r1a, r1b, r2])])
    case("rotation_replays_same_version", man(), updates=[pinned])
    case("unsigned", man(5, []))
    case("signed_by_unknown_key", man(5, [stranger]))
    case("signed_by_root_key_not_release_key", man(5, [r1a, r1b]))
    case("rollback", man(4), trusted=trusted5)
    case("equivocation", man(5, expires=NOW + 2 * 86_400), trusted=trusted5)
    case("expired", man(), now=NOW + 86_400, note="expired when now >= expires")
    case("expired_and_rollback", man(4), now=NOW + 86_400, trusted=trusted5,
         note="rollback is checked before expiry")
    case("wrong_channel", man(5, channel="beta"))
    case("root_envelope_as_manifest", raw(doc, payload_type=ROOT_PAYLOAD_TYPE))
    case("manifest_type_field_root", raw(edited(lambda d: d.update(type="root"))))
    case("oversize", same5, max_size=len(same5) - 1)
    case("exactly_at_size_cap", same5, max_size=len(same5))
    case("signed_float", raw(text_float), note="5.0 is not an integer")
    case("signed_duplicate_key", raw(text_dup))
    case("signed_integer_above_2_53", raw(edited(lambda d: d.update(expires=2**53))))
    case("signed_nan", raw(json.dumps(doc).replace('"serial": 5', '"serial": NaN').encode()))
    case("signed_missing_models", raw(edited(lambda d: d.pop("models"))))
    case("signed_bad_version_range", raw(edited(lambda d: d["models"]["detector"]["releases"][0][
        "rollout"]["filters"].update(os_versions=["14"]))))
    case("signed_path_traversal_model_name", raw(edited(lambda d: d["models"].update(
        {"../etc": d["models"]["detector"]}))))
    case("signed_share_above_million", raw(edited(lambda d: d["models"]["detector"]["releases"][0][
        "rollout"].update(share_ppm=1_000_001))))
    case("signed_shadow_mode_without_thresholds", raw(edited(lambda d: d["models"]["detector"][
        "releases"][0]["rollout"].update(shadow=None))))
    return cases


def selection_vectors() -> list[dict[str, Any]]:
    manifest = _sample_manifest(1)
    doc = manifest.to_dict()
    devices = [
        DeviceProfile("lab-1", "android", "sm8650", "arm64", "13", "1.0"),
        DeviceProfile("lab-1", "linux", "", "x86_64", "6.1", "3.4"),
        DeviceProfile(DENIED, "android", "sm8650", "arm64", "14.2", "3.4"),
        DeviceProfile("", "android", "sm8650", "arm64", "14.2", "3.4"),
        DeviceProfile(_in_share("pixel"), "android", "", "arm64", "14.10", "3.2.0"),
        DeviceProfile(_in_share("pixel"), "android", "", "arm64", "14.9", "3.2"),
        DeviceProfile(_in_share("pixel"), "android", "", "arm64", "14.10", "3.1.9"),
        DeviceProfile(_in_share("pixel"), "android", "", "arm64", "34", "3.2"),
        DeviceProfile(_in_share("pixel"), "android", "", "arm64", "18", "3.2"),
        DeviceProfile(_in_share("pixel"), "android", "", "arm64", "14-beta", "3.2"),
        DeviceProfile(_in_share("pixel"), "android", "", "arm64", "", "3.2"),
        DeviceProfile(_in_share("pixel"), "linux", "", "x86_64", "15", "3.2"),
        DeviceProfile(_in_share("iphone"), "ios", "", "arm64", "17.1", "3.2"),
        DeviceProfile(_in_share("s24"), "android", "sm8650", "arm64", "14", "3.3"),
        DeviceProfile(_in_share("s23"), "android", "sm8550", "arm64", "14", "3.3"),
        DeviceProfile(_in_share("s22"), "android", "sm8450", "arm64", "14", "3.3"),
        DeviceProfile(_in_share("é"), "ios", "", "arm64", "16.0", "4"),
    ] + [DeviceProfile(f"fleet-{i:03d}", "android", "sm8650", "arm64", "15.0.1", "3.5")
         for i in range(16)]
    out: list[dict[str, Any]] = []
    for model in ("detector", "segmenter", "absent"):
        for d in devices:
            release = select_release(manifest, model, d)
            artifact = select_artifact(release, d) if release else None
            out.append({
                "model": model,
                "device": {"device_id": d.device_id, "platform": d.platform, "soc": d.soc,
                           "arch": d.arch, "os_version": d.os_version,
                           "app_version": d.app_version},
                "release": release.version if release else None,
                "artifact_sha256": artifact.sha256 if artifact else None,
            })
    return [{"name": "sample", "manifest": doc, "cases": out}, _failed_platforms_vectors()]


def _failed_platforms_vectors() -> dict[str, Any]:
    """A release whose coreml build failed and was released anyway: coreml devices take the
    portable onnx artifact; qnn devices their own; a platform not listed gets nothing."""
    def artifact(platform: str, fmt: str, soc: str = "") -> Artifact:
        name = f"ocr/3.0/{platform}/{soc or 'generic'}"
        return Artifact(platform=platform, variant=soc or "fp32", format=fmt,
                        url=f"https://cdn.example/{name}", length=2000, sha256=_sha(name),
                        target={"soc": soc} if soc else {})
    release = Release("3.0", Rollout(share_ppm=1_000_000, salt="ocr-3.0"),
                      [artifact("onnx", "onnx"), artifact("qnn", "onnx-epcontext", "SM8650")],
                      failed_platforms=["coreml"])
    manifest = Manifest(channel="prod", serial=1, expires=NOW + 86_400,
                        models={"ocr": ModelEntry([release])})
    devices = [DeviceProfile("mac-1", "coreml", "", "arm64"),
               DeviceProfile("s24-1", "qnn", "SM8650", "v75"),
               DeviceProfile("s23-1", "qnn", "SM8550", "v73"),
               DeviceProfile("pc-1", "onnx", "", "x86_64"),
               DeviceProfile("tv-1", "tflite", "", "arm64")]
    cases = []
    for d in devices:
        chosen = select_release(manifest, "ocr", d)
        artifact_ = select_artifact(chosen, d) if chosen else None
        cases.append({
            "model": "ocr",
            "device": {"device_id": d.device_id, "platform": d.platform, "soc": d.soc,
                       "arch": d.arch, "os_version": d.os_version, "app_version": d.app_version},
            "release": chosen.version if chosen else None,
            "artifact_sha256": artifact_.sha256 if artifact_ else None,
        })
    return {"name": "failed_platforms", "manifest": manifest.to_dict(), "cases": cases}


def build() -> dict[str, bytes]:
    return {
        "bucketing.json": _dump(bucketing_vectors()),
        "envelopes.json": _dump(envelope_vectors()),
        "version_ranges.json": _dump(version_range_vectors()),
        "strict_json.json": _dump(strict_json_vectors()),
        "trust.json": _dump(trust_vectors()),
        "selection.json": _dump(selection_vectors()),
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
