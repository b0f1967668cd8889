"""The manifest-poll cache: a per-process cache of each channel's signed bytes, and the one
conditional-request rule (If-None-Match → 304) the poll route applies
(`GET /v1/channels/{channel}/manifest`, server/api/serving.py): `ManifestCache.lookup` and
`CachedManifest.not_modified`; on a miss the route waits for `load`.

`lookup` returns an entry younger than `max_stale`; an entry older than `ttl` is still
returned while ONE background reload runs (stale-while-revalidate), so polls during a slow
reload are answered from memory instead of queueing behind database reads.

When a reload fails (the database or the store is away: docs/architecture.md "Outages"), the
last good entry keeps being served, re-stamped so the next reload is tried in the background
one `ttl` later: polls do not wait on a database that is down, and the first reload after it
is back brings the current bytes. A channel with no entry yet falls back to the bucket's copy
(the loader, server/services/serving.py `current_manifest`).

A publish through this process drops the channel's entry at once (the publisher's
"published" event, wired in server/wiring.py); a reload that started before the publish
does not put its older bytes back (a generation counter per channel).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from server.publish.errors import ChannelNotFoundError
from server.publish.httpcache import etag_for, if_none_match

log = logging.getLogger("modelfleet.serving")

MANIFEST_CACHE_SECONDS = 1.0
MANIFEST_MAX_STALE_SECONDS = 10.0
# Devices and CDNs revalidate at most a minute later: a halt reaches the fleet within a
# minute plus the poll interval, and a revalidation is a cheap 304.
MANIFEST_CACHE_CONTROL = "public, max-age=60, must-revalidate"

# channel -> (signed bytes, sha256); raises ChannelNotFoundError for an unknown channel.
ManifestLoader = Callable[[str], tuple[bytes, str]]


@dataclass(frozen=True)
class CachedManifest:
    data: bytes
    etag: str
    loaded_at: float

    @classmethod
    def of(cls, data: bytes, etag: str, loaded_at: float | None = None) -> CachedManifest:
        return cls(data, etag, time.monotonic() if loaded_at is None else loaded_at)

    def not_modified(self, if_none_match_header: str | None) -> bool:
        """The conditional-request rule of every poll path: True → answer 304."""
        if if_none_match_header is None:
            return False
        # The common case (a device echoing our ETag) without parsing the header.
        return if_none_match_header == self.etag or if_none_match(if_none_match_header,
                                                                  self.etag)


@dataclass
class PollStats:
    """What the cache did (per process). Polls themselves are counted per status in
    `modelfleet_http_requests` (server/api/observe.py), like every other request."""

    reloads: int = 0  # background reloads started
    served_last_good: int = 0  # failed loads answered with the last good entry


class ManifestCache:
    """The current signed bytes per channel, per process (see module docstring)."""

    def __init__(self, loader: ManifestLoader, *, ttl: float = MANIFEST_CACHE_SECONDS,
                 max_stale: float = MANIFEST_MAX_STALE_SECONDS) -> None:
        self.loader = loader
        self.ttl = ttl
        self.max_stale = max_stale
        self.stats = PollStats()
        self._entries: dict[str, CachedManifest] = {}
        self._generation: dict[str, int] = {}
        self._reloading: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loading: dict[str, asyncio.Future[CachedManifest]] = {}

    def lookup(self, channel: str) -> CachedManifest | None:
        """The entry to answer a poll with, or None (the caller then waits for `load`).

        Must run on the event loop: an entry past `ttl` starts one background reload."""
        entry = self._entries.get(channel)
        if entry is None:
            return None
        age = time.monotonic() - entry.loaded_at
        if age > self.max_stale:
            return None  # too old to serve: the route reloads it (and reports a failure)
        if age > self.ttl and channel not in self._reloading:
            self._reloading.add(channel)
            self.stats.reloads += 1
            task = asyncio.get_running_loop().create_task(self._reload(channel))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return entry

    async def load(self, channel: str) -> CachedManifest:
        """Reads the channel's current manifest (in a thread) and caches it. Concurrent
        callers share one read: after an idle spell every connection's first poll misses at
        once, and each used to start its own (a queue of database reads behind the
        executor, seconds of p99 when reads are slow)."""
        loop = asyncio.get_running_loop()
        pending = self._loading.get(channel)
        # (A read begun on another event loop — a test client's per-request loop — is not
        # awaited here: that loop may be gone before it completes.)
        if pending is None or pending.get_loop() is not loop:
            pending = loop.run_in_executor(None, self.load_sync, channel)
            self._loading[channel] = pending

            def done(future: asyncio.Future[CachedManifest]) -> None:
                if self._loading.get(channel) is future:
                    del self._loading[channel]

            pending.add_done_callback(done)
        return await asyncio.shield(pending)

    def load_sync(self, channel: str) -> CachedManifest:
        generation = self._generation.get(channel, 0)
        try:
            data, sha256 = self.loader(channel)
        except ChannelNotFoundError:
            raise
        except Exception:
            last = self._entries.get(channel)
            if last is None or self._generation.get(channel, 0) != generation:
                raise
            log.warning("reloading the manifest of %s failed; serving the last good one",
                        channel, exc_info=True)
            self.stats.served_last_good += 1
            kept = replace(last, loaded_at=time.monotonic())
            self._entries[channel] = kept
            return kept
        entry = CachedManifest.of(data, etag_for(sha256))
        # A publish during the read invalidated the channel: keep its newer state instead.
        if self._generation.get(channel, 0) == generation:
            self._entries[channel] = entry
        return entry

    def invalidate(self, channel: str) -> None:
        """Drops the channel's entry (called on every publish through this process)."""
        self._generation[channel] = self._generation.get(channel, 0) + 1
        self._entries.pop(channel, None)
        self._loading.pop(channel, None)  # polls from now on read the new state afresh

    async def _reload(self, channel: str) -> None:
        try:
            await self.load(channel)
        except Exception:  # polls past max_stale then go the slow way and report it
            log.exception("reloading the manifest of %s failed", channel)
        finally:
            self._reloading.discard(channel)
