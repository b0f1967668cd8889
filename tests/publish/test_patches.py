"""Delta patches for published versions: made by server/delta from the last K published
artifacts, stored, listed in the re-signed manifest, and applying to the exact new bytes."""

from __future__ import annotations

import hashlib
import os

import pytest
from sqlalchemy import select

import manifests
from client_sdk.patching import apply_patch
from server.db import models as db
from server.delta import DeltaPolicy
from server.jobs.interface import NullJobQueue
from server.publish.patches import generate_patches, patch_and_republish
from server.rollouts import channels
from server.rollouts import service as ro
from tests.publish.conftest import NOW
from tests.support.rollouts import start_rollout
from tests.support.versions import add_version as add_any_version


def add_version(factory, store, version, data, platform="android"):
    return add_any_version(factory, store, "clf", version, {platform: data})[0]


@pytest.fixture
def versions(factory, blob_store, pub):
    """Three published versions, each a small edit of the previous one."""
    channels.create_channel(factory, pub, "prod", actor="t")
    base = os.urandom(64 * 1024)
    datas, ids = [], []
    for i in range(3):
        data = bytearray(base)
        data[1000 * (i + 1): 1000 * (i + 1) + 50] = os.urandom(50)
        datas.append(bytes(data))
        ids.append(add_version(factory, blob_store, f"1.{i}", bytes(data)))
        start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", f"1.{i}", 100), actor="t")
    return datas, ids


def test_patches_come_from_the_last_k_published_and_apply_to_the_new_bytes(
        factory, blob_store, pub, root, versions, tmp_path):
    datas, ids = versions
    published = patch_and_republish(factory, pub, ids[2], policy=DeltaPolicy(k=2))
    assert [p.channel for p in published] == ["prod"]
    with factory() as s:
        latest = s.scalars(select(db.SignedManifest).order_by(
            db.SignedManifest.serial.desc())).first()
    with blob_store.open(latest.blob_key) as f:
        m = manifests.verify_manifest(root, f.read(), now=NOW, channel="prod", trusted=None)
    art = m.models["clf"].releases[0].artifacts[0]
    assert {p.from_sha256 for p in art.patches} == {
        hashlib.sha256(d).hexdigest() for d in datas[:2]}
    for patch in art.patches:
        assert patch.length < 0.6 * art.length
        assert patch.url.endswith(f"/v1/patches/{patch.sha256}")
        base_data = next(d for d in datas if hashlib.sha256(d).hexdigest() == patch.from_sha256)
        (tmp_path / "base").write_bytes(base_data)
        with blob_store.open(f"v1/patches/{patch.sha256}") as f:
            (tmp_path / "patch").write_bytes(f.read())
        apply_patch(patch.algorithm, tmp_path / "base", tmp_path / "patch", tmp_path / "out",
                    max_output=art.length)
        assert (tmp_path / "out").read_bytes() == datas[2]
    # idempotent: a repeated job adds nothing and publishes nothing
    assert generate_patches(factory, blob_store, ids[2], policy=DeltaPolicy(k=2)) == 0
    assert patch_and_republish(factory, pub, ids[2], policy=DeltaPolicy(k=2)) == []


def test_unrelated_bytes_get_no_patch(factory, blob_store, pub):
    channels.create_channel(factory, pub, "prod", actor="t")
    add_version(factory, blob_store, "1.0", os.urandom(32 * 1024))
    start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "1.0", 100), actor="t")
    new = add_version(factory, blob_store, "2.0", os.urandom(32 * 1024))
    assert generate_patches(factory, blob_store, new) == 0


def test_a_rollout_start_asks_the_job_queue_for_the_patches_of_bases_published_since(
        factory, pub, blob_store):
    """The durable patch job (no thread of the API process: a crash would lose it)."""
    channels.create_channel(factory, pub, "prod", actor="t")
    version = add_version(factory, blob_store, "1.0", os.urandom(32 * 1024))
    queue = NullJobQueue()
    start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "1.0", 100), actor="t",
                  patches=queue)
    assert queue.patches_enqueued == [version]


def test_a_start_whose_patch_request_fails_is_still_live(factory, pub, blob_store):
    class Down(NullJobQueue):
        def enqueue_patches(self, version_id: int) -> None:
            raise RuntimeError("database gone")

    channels.create_channel(factory, pub, "prod", actor="t")
    add_version(factory, blob_store, "1.0", os.urandom(32 * 1024))
    view = start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "1.0", 100), actor="t",
                         patches=Down())
    assert view.serial == 2  # published: devices download in full until patches exist
