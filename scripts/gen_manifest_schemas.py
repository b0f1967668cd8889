#!/usr/bin/env python3
"""Regenerate the JSON Schemas (draft 2020-12) in manifests/schema/ from the library's rules.

The schemas serve editors, servers and other languages as a structural check; the library
(and docs/manifest.md) stay normative for what a schema cannot say: duplicate keys, key id =
sha256(public key), role key ids present in ``keys``, threshold <= number of key ids, unique
release versions, canonical base64, integers only (JSON Schema counts 1.0 as an integer).

    python scripts/gen_manifest_schemas.py          # rewrite the files
    python scripts/gen_manifest_schemas.py --check  # exit 1 if any file is out of date
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from manifests import (  # noqa: E402
    MANIFEST_PAYLOAD_TYPE,
    MAX_SAFE_INTEGER,
    MAX_SIGNATURES,
    PPM,
    ROOT_PAYLOAD_TYPE,
)
from manifests._fields import NAME_PATTERN, SHA256_PATTERN  # noqa: E402
from manifests.root import MAX_KEYS  # noqa: E402

SCHEMA_DIR = ROOT / "manifests" / "schema"
BASE_ID = "https://modelfleet.dev/schema/"
DRAFT = "https://json-schema.org/draft/2020-12/schema"

_VERSION = r"[0-9]{1,9}(\.[0-9]{1,9}){0,7}"
_CLAUSE = rf" *(>=|<=|==|!=|>|<) *{_VERSION} *"
RANGE_PATTERN = rf"^{_CLAUSE}(,{_CLAUSE})*$"

NAME = {"type": "string", "pattern": f"^{NAME_PATTERN}$"}
SHA256 = {"type": "string", "pattern": f"^{SHA256_PATTERN}$"}
COUNT = {"type": "integer", "minimum": 0, "maximum": MAX_SAFE_INTEGER}
URL = {"type": "string", "pattern": "^[!-~]{1,4096}$"}
STRINGS = {"type": "array", "items": {"type": "string", "minLength": 1}}


def _obj(required: list[str], properties: dict[str, Any], **more: Any) -> dict[str, Any]:
    # additionalProperties stays open: unknown fields are allowed and preserved.
    return {"type": "object", "required": required, "properties": properties, **more}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    # Optional members may be null, meaning absent (what many serializers write).
    return {"anyOf": [{"type": "null"}, schema]}


def envelope_schema() -> dict[str, Any]:
    b64 = {"type": "string",
           "pattern": "^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"}
    return {
        "$schema": DRAFT, "$id": BASE_ID + "envelope.schema.json",
        "title": "ModelFleet DSSE v1 envelope",
        **_obj(["payloadType", "payload", "signatures"], {
            "payloadType": {"type": "string",
                            "examples": [ROOT_PAYLOAD_TYPE, MANIFEST_PAYLOAD_TYPE]},
            "payload": b64,
            "signatures": {"type": "array", "maxItems": MAX_SIGNATURES, "items": _obj(
                ["keyid", "sig"], {"keyid": {"type": "string"}, "sig": b64})},
        }),
    }


def root_schema() -> dict[str, Any]:
    role = _obj(["keyids", "threshold"], {
        "keyids": {"type": "array", "items": SHA256, "minItems": 1, "maxItems": MAX_KEYS,
                   "uniqueItems": True},
        "threshold": {"type": "integer", "minimum": 1, "maximum": MAX_KEYS},
    })
    return {
        "$schema": DRAFT, "$id": BASE_ID + "root.schema.json",
        "title": "ModelFleet root document (payloadType " + ROOT_PAYLOAD_TYPE + ")",
        **_obj(["type", "version", "expires", "keys", "roles"], {
            "type": {"const": "root"},
            "version": {**COUNT, "minimum": 1},
            "expires": {**COUNT, "description": "Unix seconds (UTC); expired when now >= expires"},
            "keys": {
                "type": "object", "maxProperties": MAX_KEYS,
                "propertyNames": {"pattern": f"^{SHA256_PATTERN}$"},
                "additionalProperties": _obj(["keytype", "public"], {
                    "keytype": {"const": "ed25519"},
                    "public": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                }),
            },
            "roles": {"type": "object", "required": ["root", "release"],
                      "additionalProperties": role},
        }),
    }


def manifest_schema() -> dict[str, Any]:
    patch = _obj(["from_sha256", "url", "length", "sha256", "algorithm"], {
        "from_sha256": SHA256, "url": URL, "length": COUNT, "sha256": SHA256, "algorithm": NAME,
    })
    artifact = _obj(["platform", "variant", "format", "url", "length", "sha256"], {
        "platform": NAME,
        "variant": {"anyOf": [NAME, {"const": ""}]},
        "format": NAME, "url": URL, "length": COUNT, "sha256": SHA256,
        "compile_settings": _nullable({"type": "object", "additionalProperties": {
            "anyOf": [{"type": "string"}, {"type": "boolean"},
                      {"type": "integer", "minimum": -MAX_SAFE_INTEGER,
                       "maximum": MAX_SAFE_INTEGER}]}}),
        "target": _nullable({"type": "object", "additionalProperties": {"type": "string"}}),
        "patches": _nullable({"type": "array", "items": patch}),
        "requires": _nullable({"type": "array", "maxItems": 16, "items": NAME}),
    })
    ranges = _nullable({"type": "array", "items": {"type": "string", "pattern": RANGE_PATTERN}})
    strings = _nullable(STRINGS)
    filters = _obj([], {
        "platforms": strings, "socs": strings, "archs": strings,
        "os_versions": ranges, "app_versions": ranges,
        "device_allow": strings, "device_deny": strings,
    })
    shadow = _obj(["max_kl_micro", "max_latency_p99_us", "min_samples"], {
        "max_kl_micro": {**COUNT, "description": "KL divergence x 10^6"},
        "max_latency_p99_us": {**COUNT, "description": "p99 latency in microseconds"},
        "min_samples": COUNT,
    })
    rollout = _obj(["share_ppm", "salt", "mode"], {
        "share_ppm": {"type": "integer", "minimum": 0, "maximum": PPM},
        "salt": {"type": "string", "minLength": 1, "maxLength": 256},
        "mode": {"enum": ["active", "shadow"]},
        "filters": _nullable(filters),
        "shadow": _nullable(shadow),
    }, **{"if": {"properties": {"mode": {"const": "shadow"}}},
          "then": {"required": ["shadow"], "properties": {"shadow": shadow}}})
    release = _obj(["version", "rollout", "artifacts"], {
        "version": NAME, "rollout": rollout, "artifacts": {"type": "array", "items": artifact},
        # Platforms released without their build: their devices take the portable artifact.
        "failed_platforms": _nullable(STRINGS),
    })
    model = _obj(["releases"], {"releases": {"type": "array", "items": release}})
    return {
        "$schema": DRAFT, "$id": BASE_ID + "manifest.schema.json",
        "title": "ModelFleet channel manifest (payloadType " + MANIFEST_PAYLOAD_TYPE + ")",
        **_obj(["type", "channel", "serial", "expires", "models"], {
            "type": {"const": "manifest"},
            "channel": NAME,
            "serial": {**COUNT, "minimum": 1},
            "expires": {**COUNT, "description": "Unix seconds (UTC); expired when now >= expires"},
            "models": {"type": "object", "propertyNames": {"pattern": f"^{NAME_PATTERN}$"},
                       "additionalProperties": model},
        }),
    }


def build() -> dict[str, bytes]:
    schemas = {"envelope.schema.json": envelope_schema(), "root.schema.json": root_schema(),
               "manifest.schema.json": manifest_schema()}
    return {name: (json.dumps(s, indent=2) + "\n").encode() for name, s in schemas.items()}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, content in build().items():
        path = SCHEMA_DIR / name
        if path.exists() and path.read_bytes() == content:
            continue
        stale.append(name)
        if not check:
            SCHEMA_DIR.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(content)
            tmp.replace(path)
    if check and stale:
        print(f"stale schemas: {', '.join(stale)}; run python scripts/gen_manifest_schemas.py")
        return 1
    print(f"{'checked' if check else 'wrote'} {SCHEMA_DIR.relative_to(ROOT)}: "
          f"{', '.join(stale) or 'all up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
