"""Publishing and rollout control against a real database: each change is a new signed
manifest with a higher serial, verified here with the contract's own verifier."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import pytest
from sqlalchemy import select

import manifests
from server.blobstore.keys import channel_manifest_key
from server.db import models as db
from server.observability.metrics import ROLLOUT_HALTS
from server.publish import publisher as publisher_module
from server.publish.errors import KeyStoreError, ManifestTooLargeError
from server.publish.publisher import latest_manifest
from server.publish.resign import resign_due, resign_loop
from server.rollouts import channels
from server.rollouts import service as ro
from server.rollouts.errors import (
    InvalidRolloutError,
    RolloutExistsError,
    RolloutStateError,
    VersionNotFoundError,
    VersionNotReadyError,
)
from tests.publish.conftest import NOW
from tests.support.rollouts import start_rollout

ACTOR = "token:1:test"


def current(factory, blob_store, root, channel="prod", trusted=None):
    with factory() as s:
        ch = s.scalars(select(db.Channel).where(db.Channel.name == channel)).one()
        row = latest_manifest(s, ch.id)
    with blob_store.open(row.blob_key) as f:
        data = f.read()
    m = manifests.verify_manifest(root, data, now=NOW, channel=channel, trusted=trusted)
    return m, data


def test_new_channel_gets_a_signed_empty_manifest_with_serial_1(factory, pub, blob_store, root):
    published = channels.create_channel(factory, pub, "prod", actor=ACTOR)
    m, data = current(factory, blob_store, root)
    assert (published.serial, m.serial, m.models) == (1, 1, {})
    assert m.expires == NOW + 86_400
    with blob_store.open(channel_manifest_key("prod")) as f:
        assert f.read() == data  # the bytes a CDN or bucket serves as they are


def test_each_rollout_change_publishes_a_higher_serial(factory, pub, blob_store, root,
                                                       make_version):
    channels.create_channel(factory, pub, "prod", actor=ACTOR)
    make_version("clf", "1.0")
    view = start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "1.0", 10), actor=ACTOR)
    assert (view.serial, view.record.share_ppm) == (2, 100_000)
    m, _ = current(factory, blob_store, root)
    release = m.models["clf"].releases[0]
    assert (release.version, release.rollout.share_ppm) == ("1.0", 100_000)
    assert release.artifacts[0].url.startswith("http://mf.test/v1/artifacts/")
    salt = release.rollout.salt
    assert ro.ramp_rollout(factory, pub, view.record.id, 0.5, actor=ACTOR).serial == 3
    assert ro.pause_rollout(factory, pub, view.record.id, actor=ACTOR).serial == 4
    assert ro.resume_rollout(factory, pub, view.record.id, actor=ACTOR).serial == 5
    assert ro.pin_devices(factory, pub, view.record.id, ["d1"], actor=ACTOR).serial == 6
    assert ro.unpin_devices(factory, pub, view.record.id, ["d1"], actor=ACTOR).serial == 7
    m, _ = current(factory, blob_store, root)
    assert m.serial == 7
    assert m.models["clf"].releases[0].rollout.share_ppm == 5_000
    assert m.models["clf"].releases[0].rollout.salt == salt  # fixed for the release's life
    with factory() as s:
        actions = [e.action for e in s.scalars(select(db.AuditEvent).order_by(db.AuditEvent.id))]
    assert actions[-6:] == ["rollout.start", "rollout.ramp", "rollout.pause", "rollout.resume",
                            "rollout.pin", "rollout.unpin"]


def test_halt_stops_offering_the_release_and_devices_fall_back(factory, pub, blob_store, root,
                                                               make_version):
    channels.create_channel(factory, pub, "prod", actor=ACTOR)
    make_version("clf", "1.0")
    make_version("clf", "1.1")
    old = start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "1.0", 100), actor=ACTOR)
    new = start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "1.1", 100), actor=ACTOR)
    m, _ = current(factory, blob_store, root)
    assert [r.version for r in m.models["clf"].releases] == ["1.1", "1.0"]
    trusted = manifests.TrustedManifest.of(m)
    halts = {a: ROLLOUT_HALTS.labels(a)._value.get() for a in ("system", "user")}
    halted = ro.halt_rollout(factory, pub, new.record.id, actor="system", reason="kl too high")
    assert halted.serial == m.serial + 1
    m2, _ = current(factory, blob_store, root, trusted=trusted)
    assert [r.version for r in m2.models["clf"].releases] == ["1.0"]
    device = manifests.DeviceProfile(device_id="any", platform="ios")
    assert manifests.select_release(m2, "clf", device).version == "1.0"
    # a retried halt is a no-op: no new manifest
    assert ro.halt_rollout(factory, pub, new.record.id, actor=ACTOR).serial is None
    # GET /metrics: the guard's halt counted once as "system", the no-op retry not at all.
    assert {a: ROLLOUT_HALTS.labels(a)._value.get() - n for a, n in halts.items()} == {
        "system": 1, "user": 0}
    ro.halt_rollout(factory, pub, old.record.id, actor=ACTOR)
    assert ROLLOUT_HALTS.labels("user")._value.get() - halts["user"] == 1
    with pytest.raises(RolloutStateError, match="halted"):
        ro.ramp_rollout(factory, pub, new.record.id, 50, actor=ACTOR)
    assert old.record.id != new.record.id


def test_bad_rollout_requests_are_refused_and_publish_nothing(factory, pub, blob_store, root,
                                                              make_version):
    channels.create_channel(factory, pub, "prod", actor=ACTOR)
    make_version("clf", "1.0")
    make_version("clf", "2.0", state="compiling")
    with pytest.raises(InvalidRolloutError, match="outside 0–100"):
        start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "1.0", 101), actor=ACTOR)
    with pytest.raises(InvalidRolloutError, match="unknown platform"):
        start_rollout(factory, pub, "prod", ro.RolloutSpec(
            "clf", "1.0", 5, filters=manifests.Filters(platforms=["windows"])), actor=ACTOR)
    with pytest.raises(VersionNotReadyError, match="compiling"):
        start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "2.0", 5), actor=ACTOR)
    with pytest.raises(VersionNotFoundError):
        start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "9.9", 5), actor=ACTOR)
    with pytest.raises(InvalidRolloutError, match="shadow"):
        start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "1.0", 5, mode="shadow"),
                         actor=ACTOR)
    m, _ = current(factory, blob_store, root)
    assert m.serial == 1
    view = start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "1.0", 5), actor=ACTOR)
    with pytest.raises(RolloutExistsError):
        start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "1.0", 5), actor=ACTOR)
    with pytest.raises(InvalidRolloutError, match="finer"):
        ro.ramp_rollout(factory, pub, view.record.id, "0.00005", actor=ACTOR)
    assert current(factory, blob_store, root)[0].serial == 2


def test_resign_refreshes_expiry_only_when_due(factory, pub, blob_store, root, clock):
    channels.create_channel(factory, pub, "prod", actor=ACTOR)
    channels.create_channel(factory, pub, "beta", actor=ACTOR)
    clock.now = NOW + 3600  # 23 h left of 24: not due
    assert resign_due(factory, pub) == []
    clock.now = NOW + 13 * 3600  # 11 h left: under half the lifetime
    published = resign_due(factory, pub)
    assert sorted((p.channel, p.serial) for p in published) == [("beta", 2), ("prod", 2)]
    assert all(p.expires == clock.now + 86_400 for p in published)
    assert resign_due(factory, pub) == []  # just done
    m, _ = current(factory, blob_store, root)
    assert m.serial == 2


def test_background_loop_re_signs_a_short_lived_manifest_on_its_own(factory, pub, blob_store,
                                                                    root):
    pub.lifetime_seconds = 2  # re-signed once ≤ 1 s is left; the loop checks every second
    pub.clock = lambda: int(time.time())
    channels.create_channel(factory, pub, "prod", actor=ACTOR)

    async def run_for(seconds):
        task = asyncio.create_task(resign_loop(factory, pub))
        await asyncio.sleep(seconds)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(run_for(2.5))
    with factory() as s:
        serials = sorted(s.scalars(select(db.SignedManifest.serial)))
    assert serials[0] == 1 and len(serials) >= 2


def test_without_a_release_key_nothing_is_created_and_the_error_says_how_to_fix_it(
        factory, pub, key_paths):
    key_paths.release_key_path.unlink()
    with pytest.raises(KeyStoreError, match="keys init"):
        channels.create_channel(factory, pub, "prod", actor=ACTOR)
    with factory() as s:
        assert s.scalars(select(db.Channel)).all() == []


def test_background_loop_without_a_release_key_logs_the_fix_in_one_line(factory, pub,
                                                                       key_paths, caplog):
    channels.create_channel(factory, pub, "prod", actor=ACTOR)
    key_paths.release_key_path.unlink()

    async def one_round():
        task = asyncio.create_task(resign_loop(factory, pub))
        await asyncio.sleep(0.5)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.ERROR, logger="modelfleet.publish.resign"):
        asyncio.run(one_round())
    failed = [r for r in caplog.records if "re-signing failed" in r.getMessage()]
    assert len(failed) == 1 and "keys init" in failed[0].getMessage()
    assert failed[0].exc_info is None  # the message is the fix; no traceback per interval


def test_ramping_only_adds_devices_and_the_rest_stay_on_the_fallback(factory, pub, blob_store,
                                                                      root, make_version):
    channels.create_channel(factory, pub, "prod", actor=ACTOR)
    make_version("clf", "1.0")
    make_version("clf", "1.1")
    start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "1.0", 100), actor=ACTOR)
    new = start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "1.1", 1), actor=ACTOR)
    fleet = [manifests.DeviceProfile(f"dev-{i}", "android" if i % 2 else "ios")
             for i in range(2000)]
    previous: set[str] = set()
    for pct in (1, 5, 20, 50, 100):
        if pct > 1:
            ro.ramp_rollout(factory, pub, new.record.id, pct, actor=ACTOR)
        m, _ = current(factory, blob_store, root)
        picks = {d.device_id: manifests.select_release(m, "clf", d).version for d in fleet}
        on_new = {d for d, v in picks.items() if v == "1.1"}
        assert set(picks.values()) <= {"1.0", "1.1"}  # nobody is left without a release
        assert previous <= on_new  # raising the share only adds devices
        assert abs(len(on_new) / len(fleet) - pct / 100) < 0.05
        previous = on_new
    assert len(previous) == len(fleet)


def test_a_manifest_over_the_device_size_cap_is_refused_and_nothing_changes(
        factory, pub, blob_store, root, make_version, monkeypatch):
    channels.create_channel(factory, pub, "prod", actor=ACTOR)
    make_version("clf", "1.0")
    monkeypatch.setattr(publisher_module, "MANIFEST_MAX_BYTES", 2000)
    view = start_rollout(factory, pub, "prod", ro.RolloutSpec("clf", "1.0", 5), actor=ACTOR)
    with pytest.raises(ManifestTooLargeError, match="cap devices enforce"):
        ro.pin_devices(factory, pub, view.record.id, [f"device-{i:04d}" for i in range(100)],
                       actor=ACTOR)
    m, _ = current(factory, blob_store, root)
    assert m.serial == 2 and m.models["clf"].releases[0].rollout.filters.device_allow == []
