"""Key files and root documents: init, permissions, rotation per the contract."""

from __future__ import annotations

import json
import os
import stat

import pytest

import manifests
from server.publish.errors import KeyStoreError, RotationError
from server.publish.keyfile import load_release_key, load_root_keys
from server.publish.keys import KeyPaths, init_keys, load_root_chain, rotate_root

NOW = 1_800_000_000


@pytest.fixture
def paths(tmp_path):
    return KeyPaths.for_data_dir(tmp_path, keys_dir=tmp_path / "keys")


def test_init_writes_0600_key_files_and_a_self_signed_root_v1(paths):
    result = init_keys(paths, now=NOW, root_keys=3, threshold=2)
    files = list(paths.keys_dir.glob("*.key"))
    assert len(files) == 4  # 3 root + 1 release
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
    root = manifests.load_trusted_root(paths.root_path(1).read_bytes(), NOW)
    assert root.version == 1
    assert root.roles["root"].threshold == 2
    assert len(root.roles["root"].keyids) == 3
    assert root.roles["release"].keyids == [load_release_key(paths.release_key_path).keyid]
    assert result.root_bytes == paths.root_path(1).read_bytes()
    # the release key is not a root key: it cannot sign a root on its own
    assert root.roles["release"].keyids[0] not in root.roles["root"].keyids


def test_init_refuses_to_overwrite_existing_keys(paths):
    init_keys(paths, now=NOW)
    before = paths.release_key_path.read_bytes()
    with pytest.raises(KeyStoreError, match="keys rotate"):
        init_keys(paths, now=NOW)
    assert paths.release_key_path.read_bytes() == before


def test_key_file_readable_by_others_is_refused(paths):
    init_keys(paths, now=NOW)
    os.chmod(paths.release_key_path, 0o644)
    with pytest.raises(KeyStoreError, match="chmod 600"):
        load_release_key(paths.release_key_path)


def test_corrupt_key_file_is_refused_with_the_path(paths):
    init_keys(paths, now=NOW)
    doc = json.loads(paths.release_key_path.read_text())
    doc["seed_hex"] = "zz"
    paths.release_key_path.write_text(json.dumps(doc))
    with pytest.raises(KeyStoreError, match="malformed"):
        load_release_key(paths.release_key_path)


def test_keys_dir_from_environment(tmp_path, monkeypatch):
    from server.settings import Settings
    from server.wiring import key_paths

    monkeypatch.setenv("MODELFLEET_KEYS_DIR", str(tmp_path / "elsewhere"))
    assert key_paths(Settings(data_dir=tmp_path)).keys_dir == tmp_path / "elsewhere"
    assert KeyPaths.for_data_dir(tmp_path).keys_dir == tmp_path / "keys"  # settings read it


def test_rotation_makes_root_v2_signed_by_old_and_new_thresholds(paths):
    init_keys(paths, now=NOW, root_keys=3, threshold=2)
    v1 = manifests.load_trusted_root(paths.root_path(1).read_bytes())
    result = rotate_root(paths, now=NOW + 10, rotate_release=True)
    v2 = manifests.verify_root_update(v1, paths.root_path(2).read_bytes())
    assert v2.version == 2
    assert set(v2.roles["root"].keyids).isdisjoint(v1.roles["root"].keyids)
    assert v2.roles["release"].keyids == [result.release_keyid]
    assert v2.roles["release"].keyids != v1.roles["release"].keyids
    assert load_release_key(paths.release_key_path).keyid == result.release_keyid
    assert list((paths.keys_dir / "retired").glob("release-*.key"))
    assert [r.version for r, _ in load_root_chain(paths)] == [1, 2]


def test_rotation_without_enough_old_root_keys_fails_and_writes_nothing(paths, tmp_path):
    init_keys(paths, now=NOW, root_keys=3, threshold=2)
    offline = tmp_path / "offline"
    offline.mkdir()
    # only one of the three offline root keys is brought back: below threshold 2
    one = sorted(paths.keys_dir.glob("root-*.key"))[0]
    (offline / one.name).write_bytes(one.read_bytes())
    os.chmod(offline / one.name, 0o600)
    before = sorted(p.name for p in paths.keys_dir.iterdir())
    with pytest.raises(RotationError, match="needs 2"):
        rotate_root(paths, now=NOW, root_keys_dir=offline)
    assert not paths.root_path(2).exists()
    assert sorted(p.name for p in paths.keys_dir.iterdir()) == before


def test_root_v2_alone_does_not_verify_against_an_unrelated_root(paths, tmp_path):
    init_keys(paths, now=NOW)
    rotate_root(paths, now=NOW)
    other = KeyPaths.for_data_dir(tmp_path / "other", keys_dir=tmp_path / "other" / "keys")
    init_keys(other, now=NOW)
    foreign_v1 = manifests.load_trusted_root(other.root_path(1).read_bytes())
    with pytest.raises(manifests.SignatureError):
        manifests.verify_root_update(foreign_v1, paths.root_path(2).read_bytes())


def test_rotation_keeps_release_key_unless_asked(paths):
    init_keys(paths, now=NOW)
    release = load_release_key(paths.release_key_path).keyid
    rotate_root(paths, now=NOW)
    v2 = load_root_chain(paths)[-1][0]
    assert v2.roles["release"].keyids == [release]
    assert len(load_root_keys(paths.keys_dir)) == 6  # old ones stay until moved offline
