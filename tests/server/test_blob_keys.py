"""Blob keys come from one module, and are byte for byte the keys earlier releases stored
(rows keep them, so a changed key would orphan every stored blob)."""

from __future__ import annotations

import re
from pathlib import Path

from server.blobstore import validate_key
from server.blobstore.keys import (
    artifact_key,
    current_manifest_key,
    manifest_key,
    patch_key,
    source_key,
)

SHA = "ab" * 32
ROOT = Path(__file__).resolve().parents[2]


def test_keys_are_the_ones_earlier_releases_stored() -> None:
    assert source_key("clf", "1.2.0", "model", "0123abcd") == "sources/clf/1.2.0/0123abcd/model"
    assert artifact_key("clf", "1.2.0", "coreml", "fp16", SHA, "model.mlpackage.tar") == \
        f"artifacts/clf/1.2.0/coreml/fp16/{SHA}/model.mlpackage.tar"
    assert patch_key(SHA) == f"patches/{SHA}"
    assert manifest_key("prod", 7) == "manifests/prod/7.json"
    assert current_manifest_key("prod") == "manifests/prod.json"


def test_each_upload_gets_its_own_source_key() -> None:
    a, b = source_key("clf", "1.0.0", "model"), source_key("clf", "1.0.0", "model")
    assert a != b
    assert re.fullmatch(r"sources/clf/1\.0\.0/[0-9a-f]{32}/model", a)


def test_every_key_is_valid_for_every_blob_store() -> None:
    for key in (source_key("m", "1", "reference"), artifact_key("m", "1", "qnn", "v", SHA, "a"),
                patch_key(SHA), manifest_key("c", 1), current_manifest_key("c")):
        assert validate_key(key) == key


def test_no_other_server_module_spells_a_blob_key() -> None:
    spelled = re.compile(r"""f?["'](sources|artifacts|patches|manifests)/""")
    bad = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "server").rglob("*.py"))
           if p.name != "keys.py" or p.parent.name != "blobstore"
           for n, line in enumerate(p.read_text().splitlines(), 1) if spelled.search(line)]
    assert bad == [], f"blob keys spelled outside server/blobstore/keys.py: {bad}"
