"""The generated JSON Schemas: up to date, and they agree with the library on documents."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings

from manifests import MANIFEST_PAYLOAD_TYPE, Manifest, sign_envelope
from tests.manifests.manifest_builders import key, make_manifest, manifest_json, set_path
from tests.manifests.manifest_strategies import manifests_st
from tests.support.signing import make_root, sign_root

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "manifests" / "schema"


def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


MANIFEST = _validator("manifest.schema.json")
ROOT = _validator("root.schema.json")
ENVELOPE = _validator("envelope.schema.json")


def test_schema_files_match_their_generator() -> None:
    spec = importlib.util.spec_from_file_location("gen", REPO / "scripts/gen_manifest_schemas.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    for name, content in gen.build().items():
        assert (SCHEMAS / name).read_bytes() == content, (
            f"{name} is stale: run python scripts/gen_manifest_schemas.py"
        )


def test_sample_documents_validate() -> None:
    root = make_root(1, [key(1), key(2)], 2, [key(3)])
    ROOT.validate(json.loads(root.to_bytes()))
    MANIFEST.validate(json.loads(make_manifest().to_bytes()))
    ENVELOPE.validate(json.loads(sign_root(root, [key(1)])))
    ENVELOPE.validate(json.loads(sign_envelope(make_manifest().to_bytes(),
                                               MANIFEST_PAYLOAD_TYPE, [key(3)])))


def test_schema_accepts_null_optional_members() -> None:
    doc = manifest_json()
    rel = doc["models"]["detector"]["releases"][1]
    rel["rollout"].update(filters=None, shadow=None, mode="active")
    rel["artifacts"][0].update(compile_settings=None, target=None, patches=None)
    doc["models"]["detector"]["releases"][0]["rollout"]["filters"]["socs"] = None
    MANIFEST.validate(doc)
    Manifest.from_dict(doc)


def test_envelope_vectors_that_parse_validate() -> None:
    for v in json.loads((REPO / "manifests/vectors/envelopes.json").read_text()):
        errors = list(ENVELOPE.iter_errors(v["envelope"]))
        if v["error"] == "MalformedError" and "noncanonical" not in v["name"]:
            assert errors, v["name"]
        elif v["error"] != "MalformedError":
            assert not errors, (v["name"], errors)


REL = "models/detector/releases/0"
ART = f"{REL}/artifacts/0"


@pytest.mark.parametrize(
    "mutate",
    [
        set_path("serial", 0), set_path("serial", "1"), set_path("expires", KeyError),
        set_path("channel", "../prod"), set_path("type", "root"), set_path(f"{REL}/version", "a/b"),
        set_path(f"{REL}/rollout/share_ppm", 1_000_001), set_path(f"{REL}/rollout/mode", "canary"),
        set_path(f"{REL}/rollout/shadow", None), set_path(f"{REL}/rollout/salt", ""),
        set_path(f"{REL}/rollout/filters/os_versions", ["14"]),
        set_path(f"{REL}/rollout/filters/app_versions", [">=1,<"]),
        set_path(f"{ART}/sha256", "AB" * 32), set_path(f"{ART}/length", -1),
        set_path(f"{ART}/url", "http://x/a b"), set_path(f"{ART}/platform", ".."),
        set_path(f"{ART}/compile_settings", {"x": [1]}), set_path(f"{ART}/target", {"soc": 1}),
        set_path(f"{ART}/patches/0/from_sha256", "x"),
    ],
)
def test_schema_refuses_what_the_library_refuses(mutate: Any) -> None:
    doc = manifest_json()
    mutate(doc)
    assert list(MANIFEST.iter_errors(doc))
    with pytest.raises(Exception):
        Manifest.from_dict(doc)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests_st)
def test_every_document_the_library_writes_validates(m: Manifest) -> None:
    MANIFEST.validate(json.loads(m.to_bytes()))
