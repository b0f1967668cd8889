"""The invariant checker (tests/support/invariants.py) reports each invariant broken on
purpose: a state made by a real server (two release cycles: builds, patches, a ramp step, a
guard halt) holds every invariant, and each test breaks one thing in a copy of it."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

import manifests
from manifests import SigningKey
from server.blobstore import LocalBlobStore
from server.blobstore.keys import channel_manifest_key
from server.db import audit
from server.db import models as db
from server.db.session import make_engine, make_session_factory
from tests.faults.harness import ForkServer, Rig, rig
from tests.support.invariants import blob_references, manifest_payload, violations


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, forker: ForkServer) -> Rig:
    root = tmp_path_factory.mktemp("made")
    with rig(root, f"sqlite:///{root / 'mf.db'}", None, forker) as r:
        r.start()
        r.drive(new_cycles=2)
        r.stop()
    return r


class Copy:
    def __init__(self, made: Rig, tmp: Path) -> None:
        shutil.copytree(made.root / "data", tmp / "data")
        for part in made.root.glob("mf.db*"):  # the WAL too: the server was SIGKILLed
            shutil.copy(part, tmp / part.name)
        self.engine = make_engine(f"sqlite:///{tmp / 'mf.db'}")
        self.factory = make_session_factory(self.engine)
        self.store = LocalBlobStore(tmp / "data" / "blobs")
        self.seen = dict(made.seen)

    def change(self, edit: Callable[[Session], object]) -> None:
        with self.factory() as s:
            edit(s)
            s.commit()

    def found(self) -> list[str]:
        return violations(self.factory, self.store, self.seen)

    def served(self) -> bytes:
        with self.store.open(channel_manifest_key("prod")) as f:
            return f.read()


@pytest.fixture
def copy(made: Rig, tmp_path: Path) -> Copy:
    c = Copy(made, tmp_path)
    yield c
    c.engine.dispose()


def one(found: list[str], words: str) -> None:
    assert any(words in f for f in found), found


@pytest.mark.slow
def test_the_state_a_server_made_holds_every_invariant(copy: Copy) -> None:
    assert copy.found() == []
    assert len(copy.seen) >= 3  # the devices' polls saw several serials


@pytest.mark.slow
def test_a_deleted_artifact_of_a_served_manifest_is_reported(copy: Copy) -> None:
    key, _ = next(blob_references(manifest_payload(copy.served())))
    copy.store.delete(key)
    one(copy.found(), f"references {key}, which is missing")


@pytest.mark.slow
def test_a_serial_with_two_contents_is_reported(copy: Copy) -> None:
    with copy.factory() as s:
        row = s.scalars(select(db.SignedManifest).order_by(db.SignedManifest.serial)).first()
        assert row is not None
        key, serial = row.blob_key, row.serial
    with copy.store.open(key) as f:
        other = f.read().replace(b'"payload"', b'"payload" ', 1)  # same serial, other bytes
    copy.store.put(key, [other])
    one(copy.found(), f"prod serial {serial}: {key} no longer holds the bytes")
    copy.seen[("prod", serial)] = hashlib.sha256(other).hexdigest()
    one(copy.found(), f"prod serial {serial} was served with other bytes")


@pytest.mark.slow
def test_a_served_serial_that_was_never_committed_is_reported(copy: Copy) -> None:
    copy.seen[("prod", 999)] = "0" * 64
    one(copy.found(), "prod serial 999 was served but never committed")


@pytest.mark.slow
def test_a_version_stuck_compiling_with_nothing_to_run_is_reported(copy: Copy) -> None:
    copy.change(lambda s: s.execute(update(db.ModelVersion).where(db.ModelVersion.id == 1)
                                    .values(state=db.VersionState.compiling)))
    one(copy.found(), "version 1 is compiling with no build queued or running")


@pytest.mark.slow
def test_a_version_stuck_patching_without_a_patch_job_is_reported(copy: Copy) -> None:
    copy.change(lambda s: s.execute(update(db.ModelVersion).where(db.ModelVersion.id == 2)
                                    .values(state=db.VersionState.patching)))
    one(copy.found(), "version 2 is patching with no patch job queued or running")


@pytest.mark.slow
def test_a_running_build_nobody_holds_is_reported(copy: Copy) -> None:
    copy.change(lambda s: s.execute(update(db.Build).where(db.Build.id == 1).values(
        state=db.BuildState.running, locked_by=None)))
    one(copy.found(), "builds row 1 is running but nobody holds it")


@pytest.mark.slow
def test_a_lost_source_upload_is_reported(copy: Copy) -> None:
    with copy.factory() as s:
        key = s.scalars(select(db.SourceUpload.blob_key)
                        .where(db.SourceUpload.version_id == 1)).first()
    assert key is not None
    copy.store.delete(key)
    one(copy.found(), "version 1's model upload")


@pytest.mark.slow
def test_a_served_manifest_signed_by_a_key_the_root_does_not_name_is_reported(
        copy: Copy) -> None:
    payload = manifest_payload(copy.served()).to_bytes()
    forged = manifests.sign_envelope(payload, manifests.MANIFEST_PAYLOAD_TYPE,
                                     [SigningKey.generate()])
    copy.store.put(channel_manifest_key("prod"), [forged])
    one(copy.found(), "prod's served manifest does not verify under root v1")


@pytest.mark.slow
def test_a_dropped_audit_event_of_a_publish_is_reported(copy: Copy) -> None:
    with copy.factory() as s:
        event = s.scalars(select(db.AuditEvent).where(db.AuditEvent.action == "rollout.start")
                          .order_by(db.AuditEvent.id)).first()
        assert event is not None
        event_id, serial = event.id, event.details["serial"]
    copy.change(lambda s: s.execute(delete(db.AuditEvent).where(db.AuditEvent.id == event_id)))
    one(copy.found(), f"prod serial {serial} took effect with no audit event naming it")


@pytest.mark.slow
def test_an_audit_event_of_a_change_that_never_took_effect_is_reported(copy: Copy) -> None:
    copy.change(lambda s: audit.record(s, "ops", "rollout.halt", "prod/clf/1.0.2", serial=999))
    one(copy.found(), "names serial 999, which was never committed")
    copy.change(lambda s: audit.record(s, "ops", "version.upload", "clf/9.9.9"))
    one(copy.found(), "audit event version.upload clf/9.9.9 names no version")


@pytest.mark.slow
def test_a_dropped_upload_or_patch_event_is_reported(copy: Copy) -> None:
    copy.change(lambda s: s.execute(delete(db.AuditEvent).where(
        db.AuditEvent.action.in_(["version.upload", "patches.create"]),
        db.AuditEvent.target.in_(["clf/1.0.1", "version:2"]))))
    found = copy.found()
    one(found, "version clf/1.0.1 exists with no version.upload event")
    one(found, "version 2 has patches with no patches.create event")
