"""The bucket's read paths (server/publish/bucket.py): written at publish, copied for data
stored before the v1/ layout, repaired when a write failed or crossed another, and backfilled
by `modelfleet bucket sync`."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from modelfleet.cli import app as cli
from server.blobstore import LocalBlobStore
from server.db import models as db
from server.db.migrate import upgrade
from server.publish.bucket import ManifestWriter, sync_served
from server.publish.publisher import Publisher
from server.rollouts import channels
from server.rollouts import service as ro
from server.settings import Settings
from server.wiring import core
from tests.publish.conftest import version_maker
from tests.support.rollouts import start_rollout

ACTOR = "test"


def read(store: LocalBlobStore, key: str) -> bytes:
    with store.open(key) as f:
        return f.read()


def newest_manifest(factory, store: LocalBlobStore) -> bytes:  # type: ignore[no-untyped-def]
    with factory() as s:
        row = s.scalars(select(db.SignedManifest).order_by(db.SignedManifest.serial.desc())
                        ).first()
    return read(store, row.blob_key)


def test_publishing_copies_what_the_manifest_offers_to_its_read_keys_before_naming_it(
        factory, pub: Publisher, blob_store: LocalBlobStore, make_version) -> None:  # type: ignore[no-untyped-def]
    channels.create_channel(factory, pub, "prod", actor=ACTOR)
    shas = make_version("clf", "1.0")  # stored under the old artifacts/<sha> keys
    assert not any(blob_store.exists(f"v1/artifacts/{sha}") for sha in shas.values())
    start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "1.0", 10), actor=ACTOR)
    for sha in shas.values():
        assert hashlib.sha256(read(blob_store, f"v1/artifacts/{sha}")).hexdigest() == sha
    assert read(blob_store, "v1/channels/prod/manifest") == newest_manifest(factory, blob_store)
    with factory() as s:  # the rows now name the copies: the next publish needs no I/O
        keys = set(s.scalars(select(db.Artifact.blob_key)))
    assert keys == {f"v1/artifacts/{sha}" for sha in shas.values()}


def test_a_failed_bucket_copy_never_blocks_a_halt(
        factory, pub: Publisher, blob_store: LocalBlobStore, make_version,  # type: ignore[no-untyped-def]
        caplog: pytest.LogCaptureFixture) -> None:
    channels.create_channel(factory, pub, "prod", actor=ACTOR)
    make_version("clf", "1.0")
    shas = make_version("clf", "2.0")
    for sha in shas.values():
        blob_store.delete(f"artifacts/{sha}")  # lost from the store: the copy must fail
    start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "1.0", 100), actor=ACTOR)
    view = start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "2.0", 10),
                            actor=ACTOR)
    assert "could not copy" in caplog.text
    halted = ro.halt_rollout(factory, pub, view.record.id, actor=ACTOR)
    assert halted.serial == view.serial + 1
    assert read(blob_store, "v1/channels/prod/manifest") == newest_manifest(factory, blob_store)


def test_crossed_writes_keep_the_newest_serial_in_the_bucket(
        blob_store: LocalBlobStore) -> None:
    writer = ManifestWriter()
    assert writer.write(blob_store, "prod", 5, b"serial 5")
    assert not writer.write(blob_store, "prod", 4, b"serial 4")  # committed first, wrote late
    assert read(blob_store, "v1/channels/prod/manifest") == b"serial 5"
    assert writer.write(blob_store, "prod", 6, b"serial 6")


def test_a_lost_or_stale_bucket_manifest_is_rewritten_by_the_sync(
        factory, pub: Publisher, blob_store: LocalBlobStore, make_version) -> None:  # type: ignore[no-untyped-def]
    channels.create_channel(factory, pub, "prod", actor=ACTOR)
    channels.create_channel(factory, pub, "beta", actor=ACTOR)
    old = read(blob_store, "v1/channels/prod/manifest")
    make_version("clf", "1.0")
    start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "1.0", 10), actor=ACTOR)
    blob_store.put("v1/channels/prod/manifest", [old])  # another process's late write
    blob_store.delete("v1/channels/beta/manifest")  # a write that failed
    report = sync_served(factory, blob_store, ManifestWriter())
    assert sorted(report.channels) == ["beta", "prod"]
    assert read(blob_store, "v1/channels/prod/manifest") == newest_manifest(factory, blob_store)
    assert sync_served(factory, blob_store, ManifestWriter()).channels == []


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    data = tmp_path / "srv"
    for var in ("MODELFLEET_DATA_DIR", "MODELFLEET_BLOB_STORE", "MODELFLEET_DATABASE_URL"):
        monkeypatch.delenv(var, raising=False)
    made = CliRunner().invoke(cli, ["keys", "init", "--data-dir", str(data), "--root-keys", "1",
                                    "--threshold", "1"])
    assert made.exit_code == 0, made.output
    return data


def test_bucket_sync_backfills_data_stored_before_the_read_layout(data_dir: Path) -> None:
    settings = Settings(data_dir=data_dir)
    upgrade(settings.resolved_database_url)
    with core(settings) as c:
        store = c.blob_store
        channels.create_channel(c.session_factory, c.publisher, "prod", actor=ACTOR)
        shas = version_maker(c.session_factory, store)("clf", "1.0")  # type: ignore[arg-type]
        start_rollout(c.session_factory, c.publisher, "prod",
                         ro.RolloutSpec("clf", "1.0", 10), actor=ACTOR)
        with c.session_factory() as s:  # a patch stored under its old key, too
            art = s.scalars(select(db.Artifact)).first()
            assert art is not None
            store.put("patches/" + "ab" * 32, [b"patch bytes"])
            s.add(db.Patch(from_artifact_id=art.id, to_artifact_id=art.id, algorithm="bsdiff4",
                           sha256=hashlib.sha256(b"patch bytes").hexdigest(), length=11,
                           blob_key="patches/" + "ab" * 32))
            s.commit()
        manifest = newest_manifest(c.session_factory, store)  # type: ignore[arg-type]
        # What a server before the v1/ layout left: no v1/ keys, rows naming the old ones.
        for key in store.list_keys("v1/"):
            store.delete(key)
        with c.session_factory() as s:
            for row in s.scalars(select(db.Artifact)):
                row.blob_key = f"artifacts/{row.sha256}"
            s.commit()
    result = CliRunner().invoke(cli, ["bucket", "sync", "--data-dir", str(data_dir)])
    assert result.exit_code == 0, result.output
    assert "roots written: [1]" in result.output and "artifacts copied: 2" in result.output
    assert "patches copied: 1" in result.output
    assert read(store, "v1/root/1.json") == (data_dir / "roots" / "1.json").read_bytes()
    assert read(store, "v1/channels/prod/manifest") == manifest
    for sha in shas.values():
        assert hashlib.sha256(read(store, f"v1/artifacts/{sha}")).hexdigest() == sha
    patch_sha = hashlib.sha256(b"patch bytes").hexdigest()
    assert read(store, f"v1/patches/{patch_sha}") == b"patch bytes"
    again = CliRunner().invoke(cli, ["bucket", "sync", "--data-dir", str(data_dir)])
    assert "roots written: none; manifests rewritten: none; artifacts copied: 0; " \
        "patches copied: 0" in again.output


def test_keys_rotate_writes_the_new_root_to_the_bucket(data_dir: Path) -> None:
    store = LocalBlobStore(data_dir / "blobs")
    assert read(store, "v1/root/1.json") == (data_dir / "roots" / "1.json").read_bytes()
    rotated = CliRunner().invoke(cli, ["keys", "rotate", "--data-dir", str(data_dir)])
    assert rotated.exit_code == 0, rotated.output
    assert read(store, "v1/root/2.json") == (data_dir / "roots" / "2.json").read_bytes()
