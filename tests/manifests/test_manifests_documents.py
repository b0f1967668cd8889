"""Documents: round trips, unknown-field preservation, and the field rules."""

from __future__ import annotations

import json
from typing import Any

import pytest

from manifests import MalformedError, Manifest, Root, WrongTypeError
from tests.manifests.manifest_builders import key, make_manifest, manifest_json, set_path
from tests.support.signing import make_root


def test_manifest_round_trips_through_bytes() -> None:
    m = make_manifest()
    assert Manifest.from_bytes(m.to_bytes()) == m
    assert Manifest.from_bytes(m.to_bytes()).to_bytes() == m.to_bytes()


def test_root_round_trips_through_bytes() -> None:
    r = make_root(4, [key(1), key(2)], 2, [key(3)])
    assert Root.from_bytes(r.to_bytes()) == r


def test_unknown_fields_are_preserved_at_every_level() -> None:
    doc = manifest_json()
    doc["future_top"] = {"nested": [1, "x", None]}
    doc["models"]["detector"]["future_model"] = 1
    rel = doc["models"]["detector"]["releases"][0]
    rel["future_release"] = True
    rel["rollout"]["future_rollout"] = "r"
    rel["rollout"]["filters"]["future_filter"] = ["f"]
    rel["rollout"]["shadow"]["future_shadow"] = 2
    rel["artifacts"][0]["future_artifact"] = "a"
    rel["artifacts"][0]["patches"][0]["future_patch"] = "p"
    data = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    m = Manifest.from_bytes(data)
    assert m.extra == {"future_top": {"nested": [1, "x", None]}}
    assert m.models["detector"].releases[0].artifacts[0].patches[0].extra == {"future_patch": "p"}
    assert m.to_bytes() == data


def test_optional_fields_default_to_empty() -> None:
    doc = manifest_json()
    rel = doc["models"]["detector"]["releases"][0]
    rel["rollout"] = {"share_ppm": 5, "salt": "s", "mode": "active"}
    for k in ("compile_settings", "target", "patches"):
        del rel["artifacts"][0][k]
    m = Manifest.from_dict(doc)
    r = m.models["detector"].releases[0]
    assert r.rollout.filters.platforms == [] and r.rollout.shadow is None
    assert r.artifacts[0].patches == [] and r.artifacts[0].target == {}


def test_null_optional_members_mean_absent() -> None:
    doc = manifest_json()
    rel = doc["models"]["detector"]["releases"][1]
    rel["rollout"].update(filters=None, shadow=None, mode="active")
    art = rel["artifacts"][0]
    art.update(compile_settings=None, target=None, patches=None)
    r = Manifest.from_dict(doc).models["detector"].releases[1]
    assert r.rollout.filters.platforms == [] and r.rollout.shadow is None
    assert (r.artifacts[0].compile_settings, r.artifacts[0].target, r.artifacts[0].patches) == (
        {}, {}, [])
    doc["models"]["detector"]["releases"][0]["rollout"]["filters"]["socs"] = None
    assert Manifest.from_dict(doc).models["detector"].releases[0].rollout.filters.socs == []


REL = "models/detector/releases/0"
ART = f"{REL}/artifacts/0"


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (set_path("serial", 0), "serial must be between 1"),
        (set_path("serial", "1"), "serial must be an integer"),
        (set_path("serial", True), "serial must be an integer"),
        (set_path("expires", KeyError), "expires is required"),
        (set_path("channel", "../prod"), "is not a name"),
        (set_path("models", []), "models must be an object"),
        (set_path(f"{REL}/version", "a/b"), "is not a name"),
        (set_path(f"{REL}/rollout/share_ppm", 1_000_001),
         "share_ppm must be between 0 and 1000000"),
        (set_path(f"{REL}/rollout/mode", "canary"), "mode must be one of active, shadow"),
        (set_path(f"{REL}/rollout/shadow", None), "shadow is required when mode is 'shadow'"),
        (set_path(f"{REL}/rollout/salt", ""), "salt must not be empty"),
        (set_path(f"{REL}/rollout/filters/os_versions", ["14"]), "version range"),
        (set_path(f"{REL}/rollout/filters/socs", [1]), "must be a non-empty string"),
        (set_path(f"{REL}/rollout/filters/socs", [""]), "must be a non-empty string"),
        (set_path(f"{REL}/rollout/filters/device_allow", [""]), "must be a non-empty string"),
        (set_path(f"{ART}/sha256", "AB" * 32), "64 lowercase hex"),
        (set_path(f"{ART}/length", -1), "length must be between 0"),
        (set_path(f"{ART}/url", "http://x/a b"), "printable ASCII"),
        (set_path(f"{ART}/platform", ".."), "is not a name"),
        (set_path(f"{ART}/compile_settings", {"x": [1]}), "string, integer or boolean"),
        (set_path(f"{ART}/target", {"soc": 1}), "must be a string"),
        (set_path(f"{ART}/patches/0/from_sha256", "x"), "64 lowercase hex"),
        (set_path(f"{ART}/patches/0/algorithm", ""), "must not be empty"),
    ],
)
def test_manifest_field_rules(mutate, reason: str) -> None:
    doc = manifest_json()
    mutate(doc)
    with pytest.raises(MalformedError, match=reason):
        Manifest.from_dict(doc)


def test_duplicate_release_versions_are_refused() -> None:
    doc = manifest_json()
    rels = doc["models"]["detector"]["releases"]
    rels[1]["version"] = rels[0]["version"]
    with pytest.raises(MalformedError, match="one version twice"):
        Manifest.from_dict(doc)


def test_document_type_mismatch_is_wrong_type() -> None:
    doc = manifest_json()
    doc["type"] = "root"
    with pytest.raises(WrongTypeError):
        Manifest.from_dict(doc)


def _root_json() -> dict[str, Any]:
    return json.loads(make_root(1, [key(1), key(2)], 2, [key(3)]).to_bytes())


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (set_path("version", 0), "version must be between 1"),
        (set_path("roles/release", KeyError), "roles.release is required"),
        (set_path("roles/root/threshold", 3), "threshold must be between 1 and 2"),
        (set_path("roles/root/threshold", 0), "threshold must be between 1 and 2"),
        (set_path("roles/root/keyids", []), "keyids must not be empty"),
        (set_path("roles/release/keyids", [key(9).keyid]), "not in root.keys"),
    ],
)
def test_root_field_rules(mutate, reason: str) -> None:
    doc = _root_json()
    mutate(doc)
    with pytest.raises(MalformedError, match=reason):
        Root.from_dict(doc)


def test_root_key_id_must_match_its_key() -> None:
    doc = _root_json()
    keys = doc["keys"]
    a, b = list(keys)[:2]
    keys[a], keys[b] = keys[b], keys[a]
    with pytest.raises(MalformedError, match="not sha256 of the public key"):
        Root.from_dict(doc)


def test_root_duplicate_keyids_in_role_are_refused() -> None:
    doc = _root_json()
    kid = doc["roles"]["root"]["keyids"][0]
    doc["roles"]["root"]["keyids"] = [kid, kid]
    with pytest.raises(MalformedError, match="twice"):
        Root.from_dict(doc)


def test_to_bytes_refuses_a_document_no_verifier_would_accept() -> None:
    from dataclasses import replace
    with pytest.raises(MalformedError, match="serial"):
        replace(make_manifest(), serial=0).to_bytes()
