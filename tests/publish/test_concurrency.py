"""Concurrent rollout changes on one channel never sign two manifests with the same serial."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select

import manifests
from server.db import models as db
from server.rollouts import channels
from server.rollouts import service as ro
from tests.publish.conftest import NOW
from tests.support.rollouts import start_rollout


@pytest.mark.postgres
def test_concurrent_rollout_changes_get_distinct_consecutive_serials_on_postgresql(
        postgres_url, tmp_path, key_paths, root, blob_store, make_version_factory):
    factory, pub, make_version = make_version_factory(postgres_url)
    channels.create_channel(factory, pub, "prod", actor="t")
    ids = []
    for i in range(4):
        make_version("clf", f"1.{i}", platforms=("android",))
        ids.append(start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", f"1.{i}", 1),
                                    actor="t").record.id)
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            start.wait()
            for step in range(3):
                ro.ramp_rollout(factory, pub, ids[n % 4], 2 + n + step, actor=f"w{n}")
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with factory() as s:
        rows = s.scalars(select(db.SignedManifest).order_by(db.SignedManifest.serial)).all()
    serials = [r.serial for r in rows]
    assert serials == list(range(1, 1 + 1 + 4 + 24))  # create + 4 starts + 24 ramps
    assert len({r.sha256 for r in rows}) == len(rows)
    # every stored manifest verifies and carries the serial its row says
    for r in rows:
        with blob_store.open(r.blob_key) as f:
            m = manifests.verify_manifest(root, f.read(), now=NOW, channel="prod", trusted=None)
        assert m.serial == r.serial
