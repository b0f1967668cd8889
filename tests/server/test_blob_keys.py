"""Blob keys come from one module. The private ones are byte for byte the keys earlier
releases stored; the `v1/` ones are the API's read routes, so a bucket served as it is answers
devices at the URLs the API does."""

from __future__ import annotations

import re
from pathlib import Path

from starlette.routing import compile_path

from server.blobstore import validate_key
from server.blobstore.keys import (
    artifact_key,
    channel_manifest_key,
    manifest_key,
    patch_key,
    root_key,
    source_key,
)

SHA = "ab" * 32
ROOT = Path(__file__).resolve().parents[2]


def test_private_keys_are_the_ones_earlier_releases_stored() -> None:
    assert source_key("clf", "1.2.0", "model", "0123abcd") == "sources/clf/1.2.0/0123abcd/model"
    assert manifest_key("prod", 7) == "manifests/prod/7.json"


def test_read_api_keys_are_the_paths_of_the_api_routes() -> None:
    from server.api.serving import POLL_ROUTES, router

    routes = [compile_path(r.path)[0]  # type: ignore[attr-defined]
              for r in [*POLL_ROUTES, *router.routes]]
    keys = {artifact_key(SHA): f"/v1/artifacts/{SHA}", patch_key(SHA): f"/v1/patches/{SHA}",
            channel_manifest_key("prod"): "/v1/channels/prod/manifest",
            root_key(3): "/v1/root/3.json"}
    for key, path in keys.items():
        assert "/" + key == path
        assert any(r.fullmatch(path) for r in routes), f"no API route serves {path}"


def test_each_upload_gets_its_own_source_key() -> None:
    a, b = source_key("clf", "1.0.0", "model"), source_key("clf", "1.0.0", "model")
    assert a != b
    assert re.fullmatch(r"sources/clf/1\.0\.0/[0-9a-f]{32}/model", a)


def test_every_key_is_valid_for_every_blob_store() -> None:
    for key in (source_key("m", "1", "reference"), artifact_key(SHA), patch_key(SHA),
                manifest_key("c", 1), channel_manifest_key("c"), root_key(1)):
        assert validate_key(key) == key


def test_no_other_server_module_spells_a_blob_key() -> None:
    spelled = re.compile(r"""f?["'](sources|artifacts|patches|manifests|v1)/""")
    bad = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "server").rglob("*.py"))
           if p.name != "keys.py" or p.parent.name != "blobstore"
           for n, line in enumerate(p.read_text().splitlines(), 1) if spelled.search(line)]
    assert bad == [], f"blob keys spelled outside server/blobstore/keys.py: {bad}"
