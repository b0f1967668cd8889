"""The one manifest-poll path (server/publish/manifest_cache.py) and its wiring: every publish,
from any source, drops the cached manifest through the publisher's "published" event; a
reload that began before a publish does not put the older bytes back; a reload that fails
(an outage) keeps serving the last good entry; the one conditional-request rule."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from pathlib import Path

import pytest

from server.db.migrate import upgrade
from server.jobs.interface import NullJobQueue
from server.publish.manifest_cache import CachedManifest, ManifestCache
from server.publish.resign import resign_due
from server.rollouts.channels import create_channel, republish
from server.settings import Settings
from server.wiring import Services, build_services
from tests.support.server_keys import init_test_keys


def on_loop(cache: ManifestCache, channel: str) -> CachedManifest | None:
    async def look() -> CachedManifest | None:
        return cache.lookup(channel)

    return asyncio.run(look())


@pytest.fixture
def services(tmp_path: Path) -> Services:
    data = tmp_path / "data"
    init_test_keys(data)
    settings = Settings(data_dir=data)
    upgrade(settings.resolved_database_url)
    made = build_services(settings, job_queue=NullJobQueue())
    create_channel(made.session_factory, made.publisher, "prod", actor="t")
    yield made
    made.close()


def test_a_re_sign_drops_the_cached_manifest_through_the_published_event(services):
    """Before, only routes invalidated; a re-sign (or a patch job) left the old bytes cached."""
    cache = services.manifest_cache
    old = cache.load_sync("prod")
    assert on_loop(cache, "prod") == old
    (published,) = resign_due(services.session_factory, services.publisher, margin=10**9)
    assert on_loop(cache, "prod") is None  # dropped: the next poll loads the new serial
    new = cache.load_sync("prod")
    assert new.etag == f'"{published.sha256}"' != old.etag


def test_a_publish_through_the_rollout_service_drops_the_cached_manifest(services):
    cache = services.manifest_cache
    cache.load_sync("prod")
    republish(services.session_factory, services.publisher, "prod", actor="t")
    assert on_loop(cache, "prod") is None


def test_a_reload_begun_before_a_publish_does_not_put_the_older_bytes_back():
    reading, publish_done = threading.Event(), threading.Event()
    current = {"prod": b"serial 1"}

    def load(channel: str) -> tuple[bytes, str]:
        data = current[channel]  # read before the publish…
        reading.set()
        publish_done.wait(5)  # …returned after it
        return data, hashlib.sha256(data).hexdigest()

    cache = ManifestCache(load)
    loader = threading.Thread(target=cache.load_sync, args=("prod",))
    loader.start()
    assert reading.wait(5)
    current["prod"] = b"serial 2"
    cache.invalidate("prod")  # the publisher's event
    publish_done.set()
    loader.join(5)
    assert on_loop(cache, "prod") is None, "the pre-publish read was cached"
    cache.loader = lambda ch: (current[ch], hashlib.sha256(current[ch]).hexdigest())
    assert cache.load_sync("prod").data == b"serial 2"


def test_an_entry_past_the_stale_limit_is_not_served():
    cache = ManifestCache(lambda ch: (b"x", "0" * 64), ttl=0.01, max_stale=0.05)
    cache.load_sync("prod")
    time.sleep(0.1)
    assert on_loop(cache, "prod") is None  # the route then loads it and reports failures


def test_a_failed_reload_during_an_outage_serves_the_last_good_entry():
    state = {"down": False}

    def load(channel: str) -> tuple[bytes, str]:
        if state["down"]:
            raise ConnectionError("database down")
        return b"serial 1", hashlib.sha256(b"serial 1").hexdigest()

    cache = ManifestCache(load, ttl=0.01, max_stale=0.05)
    good = cache.load_sync("prod")
    state["down"] = True
    time.sleep(0.1)  # past max_stale: the route loads, and the load fails
    kept = cache.load_sync("prod")
    assert (kept.data, kept.etag) == (good.data, good.etag)
    assert cache.stats.served_last_good == 1
    assert on_loop(cache, "prod") == kept  # re-stamped: polls meanwhile do not wait on it
    cache.invalidate("prod")  # with no entry there is nothing good to serve: the error
    with pytest.raises(ConnectionError):
        cache.load_sync("prod")


@pytest.mark.parametrize(("header", "answer"), [
    (None, False), ('"abc"', True), ('W/"abc"', True), ('"x", "abc"', True), ("*", True),
    ('"abcd"', False), ("", False),
])
def test_one_conditional_rule_for_every_poll_path(header, answer):
    assert CachedManifest.of(b"{}", '"abc"').not_modified(header) is answer


def test_concurrent_misses_share_one_read_and_a_publish_starts_a_fresh_one():
    """After an idle spell every connection's first poll misses at once; each used to start
    its own database read (64 connections, slow reads: seconds of p99 in bench/serve)."""
    reads: list[bytes] = []
    current = {"prod": b"serial 1"}
    gate = threading.Event()

    def load(channel: str) -> tuple[bytes, str]:
        data = current[channel]
        reads.append(data)
        gate.wait(5)
        return data, hashlib.sha256(data).hexdigest()

    cache = ManifestCache(load)

    async def polls() -> tuple[list[CachedManifest], CachedManifest]:
        first = [asyncio.ensure_future(cache.load("prod")) for _ in range(20)]
        while not reads:
            await asyncio.sleep(0.01)
        current["prod"] = b"serial 2"
        cache.invalidate("prod")  # a publish while the read runs
        after = asyncio.ensure_future(cache.load("prod"))
        await asyncio.sleep(0.05)
        gate.set()
        return list(await asyncio.gather(*first)), await after

    before, after = asyncio.run(polls())
    assert reads == [b"serial 1", b"serial 2"]  # one read for the 20, one after the publish
    assert {e.data for e in before} == {b"serial 1"} and after.data == b"serial 2"
    assert on_loop(cache, "prod") == after  # only the post-publish read was cached
