"""The published test vectors: up to date with their generator, and each one re-verified."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

import manifests
from manifests import (
    DeviceProfile,
    Envelope,
    Manifest,
    ManifestError,
    Rollout,
    TrustedManifest,
    bucket,
    load_trusted_root,
    pae,
    rollout_includes,
    select_artifact,
    select_release,
    verify_envelope,
    verify_manifest,
    verify_root_update,
)
from manifests.strictjson import loads
from manifests.versions import VersionRange

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "manifests" / "vectors"


def _load(name: str) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads((VECTORS / name).read_text(encoding="utf-8"))
    return data


def test_vector_files_match_their_generator() -> None:
    spec = importlib.util.spec_from_file_location("gen", REPO / "scripts/gen_manifest_vectors.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    for name, content in gen.build().items():
        assert (VECTORS / name).read_bytes() == content, (
            f"{name} is stale: run python scripts/gen_manifest_vectors.py"
        )


# --- bucketing ---------------------------------------------------------------------------------

BUCKETING = _load("bucketing.json")


def test_bucketing_vectors_cover_the_required_edges() -> None:
    assert len(BUCKETING) >= 50
    shares = {v["share_ppm"] for v in BUCKETING}
    assert {0, 1_000_000} <= shares
    assert any(not v["device_id"].isascii() for v in BUCKETING)
    assert any(not v["salt"].isascii() for v in BUCKETING)
    assert any(v["share_ppm"] == v["bucket"] for v in BUCKETING)  # boundary: not included
    assert {True, False} == {v["included"] for v in BUCKETING}


@pytest.mark.parametrize("v", BUCKETING, ids=lambda v: f"{v['salt']!r}:{v['device_id'][:20]!r}")
def test_bucketing_vector(v: dict[str, Any]) -> None:
    # Independent re-statement of the formula, so a library bug cannot bless itself.
    digest = hashlib.sha256((v["salt"] + ":" + v["device_id"]).encode("utf-8")).digest()
    assert v["bucket"] == int.from_bytes(digest[:8], "big") % 1_000_000
    assert bucket(v["salt"], v["device_id"]) == v["bucket"]
    assert v["included"] == (v["bucket"] < v["share_ppm"])
    device = DeviceProfile(device_id=v["device_id"], platform="any")
    assert rollout_includes(Rollout(share_ppm=v["share_ppm"], salt=v["salt"] or "-"), device) == (
        bucket(v["salt"] or "-", v["device_id"]) < v["share_ppm"]
    )


def test_bucketing_does_not_normalize_unicode() -> None:
    by_id = {v["device_id"]: v["bucket"] for v in BUCKETING if v["salt"] == "release-2.0"}
    assert by_id["café"] != by_id["cafe\u0301"]


# --- envelopes ---------------------------------------------------------------------------------

ENVELOPES = _load("envelopes.json")


def test_envelope_vectors_cover_the_required_cases() -> None:
    names = {v["name"] for v in ENVELOPES}
    assert {"valid_one_of_two", "tampered_payload", "tampered_signature", "unknown_key",
            "below_threshold", "duplicate_signatures_one_key", "wrong_payload_type"} <= names
    assert len(names) == len(ENVELOPES)


def _verify_vector(v: dict[str, Any]) -> bytes:
    env = Envelope.from_bytes(json.dumps(v["envelope"]).encode(), max_size=1 << 20)
    keys = {kid: bytes.fromhex(h) for kid, h in v["public_keys"].items()}
    return verify_envelope(env, keys, v["threshold"], v["payload_type"])


@pytest.mark.parametrize("v", ENVELOPES, ids=lambda v: v["name"])
def test_envelope_vector(v: dict[str, Any]) -> None:
    for kid, public_hex in v["public_keys"].items():
        assert manifests.key_id(bytes.fromhex(public_hex)) == kid
    if v["pae_hex"] is not None:
        payload = base64.b64decode(v["envelope"]["payload"])
        assert pae(v["envelope"]["payloadType"], payload).hex() == v["pae_hex"]
    if v["valid"]:
        assert v["error"] is None
        assert _verify_vector(v) == base64.b64decode(v["envelope"]["payload"])
    else:
        error = getattr(manifests, v["error"])
        assert issubclass(error, ManifestError)
        with pytest.raises(error):
            _verify_vector(v)


# --- version ranges and strict JSON ------------------------------------------------------------

@pytest.mark.parametrize("v", _load("version_ranges.json"),
                         ids=lambda v: f"{v['range']!r}~{v['version']!r}")
def test_version_range_vector(v: dict[str, Any]) -> None:
    if not v["valid_range"]:
        with pytest.raises(manifests.MalformedError):
            VersionRange.parse(v["range"])
        return
    assert VersionRange.parse(v["range"]).contains(v["version"]) is v["matches"]


def test_version_range_vectors_include_numeric_not_string_order() -> None:
    hits = [v for v in _load("version_ranges.json")
            if v["range"] == ">=14.9" and v["version"] == "14.10"]
    assert hits and hits[0]["matches"] is True


@pytest.mark.parametrize("v", _load("strict_json.json"), ids=lambda v: v["name"])
def test_strict_json_vector(v: dict[str, Any]) -> None:
    data = base64.b64decode(v["json_base64"])
    if v["valid"]:
        assert isinstance(loads(data), dict)
    else:
        with pytest.raises(manifests.MalformedError):
            loads(data)


# --- trust decisions and selection -------------------------------------------------------------

TRUST = _load("trust.json")


def test_trust_vectors_cover_every_error() -> None:
    errors = {v["error"] for v in TRUST}
    assert errors >= {None, "SignatureError", "RollbackError", "EquivocationError",
                      "ExpiredError", "WrongTypeError", "WrongChannelError", "OversizeError",
                      "MalformedError", "RootRotationError"}


def _decide(v: dict[str, Any]) -> tuple[int, Manifest]:
    root = load_trusted_root(v["pinned_root"].encode())
    for update in v["root_updates"]:
        root = verify_root_update(root, update.encode())
    trusted = None if v["trusted_manifest"] is None else TrustedManifest(**v["trusted_manifest"])
    m = verify_manifest(root, v["manifest"].encode(), now=v["now"], channel=v["channel"],
                        trusted=trusted, max_size=v["max_size"])
    return root.version, m


@pytest.mark.parametrize("v", TRUST, ids=lambda v: v["name"])
def test_trust_vector(v: dict[str, Any]) -> None:
    if v["valid"]:
        root_version, m = _decide(v)
        assert v["expected"] == {"root_version": root_version, "serial": m.serial,
                                 "sha256": m.raw_sha256}
        payload = Envelope.from_bytes(v["manifest"].encode(), v["max_size"]).payload
        assert hashlib.sha256(payload).hexdigest() == m.raw_sha256
    else:
        with pytest.raises(getattr(manifests, v["error"])):
            _decide(v)


SELECTION = _load("selection.json")


def test_selection_vectors_exercise_every_outcome() -> None:
    cases = [c for s in SELECTION for c in s["cases"]]
    assert {c["release"] for c in cases} == {"3.0", "2.0", "1.0", None}
    assert len({c["artifact_sha256"] for c in cases}) >= 6
    # A platform the release lists as failed gets the portable onnx artifact.
    (failed,) = [s for s in SELECTION if s["name"] == "failed_platforms"]
    by_device = {c["device"]["device_id"]: c for c in failed["cases"]}
    portable = by_device["pc-1"]["artifact_sha256"]
    assert portable is not None and by_device["mac-1"]["artifact_sha256"] == portable
    assert by_device["tv-1"]["release"] is None


@pytest.mark.parametrize("s", SELECTION, ids=lambda s: s["name"])
def test_selection_vector(s: dict[str, Any]) -> None:
    manifest = Manifest.from_dict(s["manifest"])
    for c in s["cases"]:
        device = DeviceProfile(**c["device"])
        release = select_release(manifest, c["model"], device)
        assert (release.version if release else None) == c["release"], c
        artifact = select_artifact(release, device) if release else None
        assert (artifact.sha256 if artifact else None) == c["artifact_sha256"], c
