"""Delta patches for published releases: for each artifact of a version being published, the
patches from the last K published artifacts of the same model, platform and variant (newest
first), made by server/delta (which verifies each one by applying it), stored in the blob
store and recorded in the database; then every channel offering the version is re-published
so its manifest lists them.

Made first before the version turns ready (its last build records the job: see
server/jobs/patch_runner.py `patch_before_ready`), so the first manifest offering it lists
them; asked again when a rollout starts, for bases published since. Runs off the request
path: the rollout start calls the job queue's `enqueue_patches(version_id)` — a durable
`patch_jobs` row run by the in-process worker thread or by `modelfleet worker`
(server/jobs/patch_runner.py drives `patch_and_republish` with retries and takeover); each
re-publish is a change of its own (new patches), one signed serial per channel.
`generate_patches` is idempotent: pairs that already have a patch are skipped and the pair's
unique constraint drops a racing duplicate, so a retried or duplicated job never adds a
second row.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, sessionmaker

from server import crashpoints
from server.blobstore import BlobStore
from server.db import audit
from server.db import models as db
from server.db.types import utcnow
from server.delta import DeltaPolicy, PatchResult, make_patches
from server.publish.bucket import store_patch
from server.publish.errors import KeyStoreError
from server.publish.protection import ContentKeys, seal_file, unseal_path
from server.publish.publisher import PublishedManifest, Publisher, publish_channel


def patch_bases(session: Session, artifact: db.Artifact, k: int) -> list[db.Artifact]:
    """The last `k` published artifacts of the same model, platform and variant, newest
    first (published = its version was offered on some channel), excluding this version."""
    version = session.get(db.ModelVersion, artifact.version_id)
    assert version is not None
    last_release = (
        select(db.Release.version_id, func.max(db.Release.id).label("last"))
        .group_by(db.Release.version_id).subquery()
    )
    rows = session.execute(
        select(db.Artifact)
        .join(db.ModelVersion, db.ModelVersion.id == db.Artifact.version_id)
        .join(last_release, last_release.c.version_id == db.Artifact.version_id)
        .where(db.ModelVersion.model_id == version.model_id,
               db.Artifact.version_id != artifact.version_id,
               db.Artifact.platform == artifact.platform,
               db.Artifact.variant == artifact.variant,
               db.Artifact.sha256 != artifact.sha256)
        .order_by(last_release.c.last.desc()).limit(k)
    ).scalars().all()
    return list(rows)


def _download(store: BlobStore, key: str, path: Path) -> Path:
    with open(path, "wb") as f:
        for chunk in store.iter_range(key):
            f.write(chunk)
    return path


def _insert_patch(session: Session, **values: object) -> int:
    """Adds the row unless its pair already has one (1 if added). Two jobs for one version
    racing (a duplicate delivery, a takeover from a worker presumed dead) both get here;
    the pair's unique constraint lets exactly one row in and the loser carries on."""
    values["created_at"] = utcnow()
    dialect = session.get_bind().dialect.name
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    stmt = insert(db.Patch).values(**values).on_conflict_do_nothing(
        index_elements=["from_artifact_id", "to_artifact_id"]).returning(db.Patch.id)
    # RETURNING, not rowcount: psycopg reports no reliable rowcount for ON CONFLICT inserts.
    return 0 if session.execute(stmt).scalar() is None else 1


def generate_patches(factory: sessionmaker[Session], store: BlobStore, version_id: int, *,
                     policy: DeltaPolicy | None = None, workdir: Path | None = None,
                     content_keys: ContentKeys | None = None) -> int:
    """Make and store the missing patches to every artifact of `version_id`; returns how many
    were added. A protected version's patches are made between plaintexts and sealed under
    its content key; none is made from a protected base to an unprotected artifact (the
    patch would give the base away)."""
    policy = policy or DeltaPolicy()
    tmp = Path(tempfile.mkdtemp(prefix="mf-patches-", dir=workdir))
    added = 0
    try:
        with factory() as session:
            artifacts = session.scalars(
                select(db.Artifact).where(db.Artifact.version_id == version_id)).all()
            for art in artifacts:
                if art.cohorts:
                    added += _cohort_patches(session, store, tmp, content_keys, art, policy)
                done = set(session.scalars(select(db.Patch.from_artifact_id)
                                           .where(db.Patch.to_artifact_id == art.id)))
                bases = [b for b in patch_bases(session, art, policy.k) if b.id not in done
                         and (art.plain_sha256 is not None or b.plain_sha256 is None)]
                if not bases:
                    continue
                clear = _Plaintexts(session, store, tmp, content_keys)
                new_path = clear.get(art)
                # server/delta checks each base against its label: the plaintext's sha256
                base_paths = [(_plain_sha(b), clear.get(b)) for b in bases]
                by_sha = {_plain_sha(b): b for b in bases}
                seal_key = clear.key(art)
                made = 0
                for result in make_patches(new_path, base_paths, tmp / "work", policy):
                    sha, length, key = _store_result(store, result, seal_key)
                    crashpoints.reached("patch.stored")
                    made += _insert_patch(
                        session, from_artifact_id=by_sha[result.from_sha256].id,
                        to_artifact_id=art.id, algorithm=result.algorithm,
                        sha256=sha, length=length, blob_key=key)
                if made:  # audited with the rows: a crash after this commit loses neither
                    audit.record(session, "system", "patches.create", f"version:{version_id}",
                                 count=made, artifact=art.sha256)
                added += made
                session.commit()  # per artifact: a crash later keeps what is done
                for p in tmp.iterdir():
                    if p.is_file():
                        p.unlink(missing_ok=True)
            session.commit()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return added


def _cohort_patches(session: Session, store: BlobStore, tmp: Path,
                    content_keys: ContentKeys | None, art: db.Artifact,
                    policy: DeltaPolicy) -> int:
    """The patches to each cohort's copy of `art`, from what a device of that cohort holds
    of each base: the base's copy of the same cohort when the base has as many cohorts, else
    the base artifact itself (an unwatermarked release, which every device took)."""
    added = 0
    clear = _Plaintexts(session, store, tmp, content_keys)
    seal_key = clear.key(art)
    for copy in art.cohorts:
        done = set(session.scalars(select(db.CohortPatch.from_sha256)
                                   .where(db.CohortPatch.to_cohort_artifact_id == copy.id)))
        held: list[tuple[str, db.Artifact | db.CohortArtifact, int]] = []
        for b in patch_bases(session, art, policy.k):
            base: db.Artifact | db.CohortArtifact = b
            if len(b.cohorts) == len(art.cohorts):
                base = b.cohorts[copy.cohort]
            if base.sha256 not in done and (seal_key is not None or b.plain_sha256 is None):
                held.append((base.sha256, base, b.version_id))
        if not held:
            continue
        new_path = clear.get_blob(copy.blob_key, copy.plain_sha256, art.version_id,
                                  f"cohort-{copy.id}")
        paths = [(base.plain_sha256 or base.sha256,
                  clear.get_blob(base.blob_key, base.plain_sha256, version_id, f"b-{i}"))
                 for i, (_, base, version_id) in enumerate(held)]
        by_plain = {base.plain_sha256 or base.sha256: sha for sha, base, _ in held}
        for result in make_patches(new_path, paths, tmp / "work", policy):
            sha, length, key = _store_result(store, result, seal_key)
            session.add(db.CohortPatch(to_cohort_artifact_id=copy.id,
                                       from_sha256=by_plain[result.from_sha256],
                                       algorithm=result.algorithm, sha256=sha, length=length,
                                       blob_key=key))
            added += 1
        session.commit()  # per copy: a crash later keeps what is done
        for p in tmp.iterdir():
            if p.is_file():
                p.unlink(missing_ok=True)
    return added


def _store_result(store: BlobStore, result: PatchResult,
                  seal_key: bytes | None) -> tuple[str, int, str]:
    """Stores one made patch (sealed first under `seal_key` when the target is protected:
    the manifest lists the ciphertext); returns its sha256, length and blob key."""
    path, sha, length = result.path, result.sha256, result.length
    if seal_key is not None:
        path = result.path.with_name(result.path.name + ".sealed")
        with result.path.open("rb") as f, path.open("wb") as out:
            sealed = seal_file(seal_key, f, out)
        sha, length = sealed.sha256, sealed.length
    with open(path, "rb") as f:
        return sha, length, store_patch(store, sha, f)


def _plain_sha(art: db.Artifact) -> str:
    return art.plain_sha256 or art.sha256


class _Plaintexts:
    """Artifacts as plaintext work files (a sealed one decrypted with its version's key)."""

    def __init__(self, session: Session, store: BlobStore, tmp: Path,
                 content_keys: ContentKeys | None) -> None:
        self.session, self.store, self.tmp, self.content_keys = session, store, tmp, content_keys

    def key(self, art: db.Artifact) -> bytes | None:
        if art.plain_sha256 is None:
            return None
        if self.content_keys is None:
            raise KeyStoreError(f"artifact {art.sha256} is sealed but this process has no "
                                "content keys", fix="give it the keys directory's content.kek")
        return self.content_keys.key_for(self.session, art.version_id)

    def get(self, art: db.Artifact) -> Path:
        return self.get_blob(art.blob_key, art.plain_sha256, art.version_id, f"art-{art.id}")

    def get_blob(self, blob_key: str, plain_sha256: str | None, version_id: int,
                 name: str) -> Path:
        path = _download(self.store, blob_key, self.tmp / name)
        if plain_sha256 is None:
            return path
        if self.content_keys is None:
            raise KeyStoreError(f"blob {blob_key} is sealed but this process has no content "
                                "keys", fix="give it the keys directory's content.kek")
        key = self.content_keys.key_for(self.session, version_id)
        clear = unseal_path(key, path, self.tmp / f"plain-{name}")
        path.unlink()
        return clear


def channels_offering(session: Session, version_id: int) -> list[str]:
    return list(session.scalars(
        select(db.Channel.name).join(db.Release, db.Release.channel_id == db.Channel.id)
        .where(db.Release.version_id == version_id,
               db.Release.state != db.ReleaseState.halted)
        .order_by(db.Channel.name)))


def patch_and_republish(factory: sessionmaker[Session], pub: Publisher, version_id: int, *,
                        policy: DeltaPolicy | None = None,
                        republish: bool = False) -> list[PublishedManifest]:
    """The whole job: generate the patches, then re-publish the channels that offer them.

    Without new patches nothing is re-published, unless `republish` (a retried job: the
    attempt that stored the patches may have died before re-signing)."""
    added = generate_patches(factory, pub.blob_store, version_id, policy=policy,
                             content_keys=pub.content_keys)
    if not added and not republish:
        return []
    with factory() as session:
        names = channels_offering(session, version_id)
    return [publish_channel(factory, pub, name, actor="system", action="manifest.patches")
            for name in names]
