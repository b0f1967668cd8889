"""What devices fetch, without a token: channel manifests (ETag / 304 / Cache-Control), signed
root versions, and artifact and patch files (Range → 206 / 416 on the local store, a 302 to a
presigned URL on S3).

Manifest bytes are served exactly as signed and stored. Each process keeps the current bytes
of a channel for MANIFEST_CACHE_SECONDS so a poll (and above all a 304) costs no database or
storage round trip; changes made through this process invalidate its entry at once. Hits are
answered by `ServingFastAPI` (the app class) before the framework's per-request work, and
fresh hits under uvicorn earlier still, in the HTTP protocol (server/api/fastpoll.py).

The router's lifespan imports signed roots from DATA_DIR/roots and runs the re-sign loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Path, Request, Response
from fastapi.responses import RedirectResponse, StreamingResponse
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from server.api.errors import NOT_FOUND
from server.db import models as db
from server.errors import NotFoundError
from server.publish import rootstore
from server.publish.errors import ChannelNotFoundError, PublishError
from server.publish.httpcache import RangeNotSatisfiable, etag_for, if_none_match, parse_range
from server.publish.patches import PatchScheduler
from server.publish.publisher import MANIFEST_MAX_BYTES, Publisher
from server.publish.resign import resign_loop
from server.publish.rollouts import CHANNEL_NAME
from server.publish.service import key_paths, make_publisher

log = logging.getLogger("modelfleet.serving")

MANIFEST_CACHE_SECONDS = 1.0
MANIFEST_MAX_STALE_SECONDS = 10.0
# Devices and CDNs revalidate at most a minute later: a halt reaches the fleet within a
# minute plus the poll interval, and a revalidation is a cheap 304.
MANIFEST_CACHE_CONTROL = "public, max-age=60, must-revalidate"
CACHE_CONTROL_BYTES = MANIFEST_CACHE_CONTROL.encode()
IMMUTABLE = "public, max-age=31536000, immutable"
SHA256_PATTERN = "^[0-9a-f]{64}$"


@dataclass(frozen=True)
class CachedManifest:
    data: bytes
    etag: str
    loaded_at: float
    # Response headers built once per load, not once per poll.
    headers_304: tuple[tuple[bytes, bytes], ...] = ()
    headers_200: tuple[tuple[bytes, bytes], ...] = ()
    # The same headers as HTTP/1.1 header lines, for the protocol-level fast path
    # (server/api/fastpoll.py), which writes them to the socket itself.
    raw_304: bytes = b""
    raw_200: bytes = b""

    @classmethod
    def of(cls, data: bytes, etag: str) -> CachedManifest:
        common = ((b"etag", etag.encode()), (b"cache-control", CACHE_CONTROL_BYTES))
        full = (*common, (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()))
        return cls(data, etag, time.monotonic(), common, full,
                   _header_lines(common), _header_lines(full))


def _header_lines(headers: tuple[tuple[bytes, bytes], ...]) -> bytes:
    return b"".join(name + b": " + value + b"\r\n" for name, value in headers)


class ManifestCache:
    """The current signed bytes per channel, per process, for a short time."""

    def __init__(self, ttl: float = MANIFEST_CACHE_SECONDS,
                 max_stale: float = MANIFEST_MAX_STALE_SECONDS) -> None:
        self.ttl = ttl
        self.max_stale = max_stale
        self._entries: dict[str, CachedManifest] = {}
        self._reloading: set[str] = set()
        self.tasks: set[asyncio.Task[None]] = set()

    def fresh(self, channel: str) -> CachedManifest | None:
        entry = self._entries.get(channel)
        if entry is None or self.needs_reload(entry):
            return None
        return entry

    def usable(self, channel: str) -> tuple[CachedManifest | None, bool]:
        """(entry, needs a reload): fresh, or stale by less than max_stale (served while a
        reload runs), else (None, True)."""
        entry = self._entries.get(channel)
        if entry is None:
            return None, True
        age = time.monotonic() - entry.loaded_at
        if age > self.max_stale:
            return None, True
        return entry, age > self.ttl

    def needs_reload(self, entry: CachedManifest) -> bool:
        return time.monotonic() - entry.loaded_at > self.ttl

    def claim_reload(self, channel: str) -> bool:
        if channel in self._reloading:
            return False
        self._reloading.add(channel)
        return True

    def release_reload(self, channel: str) -> None:
        self._reloading.discard(channel)

    def put(self, channel: str, data: bytes, sha256: str) -> CachedManifest:
        entry = CachedManifest.of(data, etag_for(sha256))
        self._entries[channel] = entry
        return entry

    def invalidate(self, channel: str) -> None:
        self._entries.pop(channel, None)


class ServingFastAPI(FastAPI):
    """FastAPI that answers a manifest poll from the process cache before any per-request
    framework work (telemetry checks, middleware, routing, dependencies) — that is what keeps
    a 304 cheap. A miss, any other path or method goes through FastAPI as usual, and the
    route fills the cache. An entry older than the cache time is still served (for at most
    MANIFEST_MAX_STALE_SECONDS) while one background reload runs, so polls never queue up
    behind the database."""

    PREFIX = "/v1/channels/"
    SUFFIX = "/manifest"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.manifest_cache = ManifestCache()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if (scope["type"] == "http" and scope["method"] == "GET"
                and path.startswith(self.PREFIX) and path.endswith(self.SUFFIX)
                and await self._serve_cached(path[len(self.PREFIX):-len(self.SUFFIX)],
                                             scope, send)):
            return
        await super().__call__(scope, receive, send)

    async def _serve_cached(self, channel: str, scope: Scope, send: Send) -> bool:
        cache = self.manifest_cache
        entry, stale = cache.usable(channel)
        if entry is None:
            return False
        if stale and cache.claim_reload(channel):
            task = asyncio.get_running_loop().create_task(self._reload(channel))
            cache.tasks.add(task)
            task.add_done_callback(cache.tasks.discard)
        inm = None
        for name, value in scope["headers"]:
            if name == b"if-none-match":
                inm = value.decode("latin-1")
                break
        if inm == entry.etag or if_none_match(inm, entry.etag):
            await send({"type": "http.response.start", "status": 304,
                        "headers": entry.headers_304})
            await send({"type": "http.response.body", "body": b""})
            return True
        await send({"type": "http.response.start", "status": 200, "headers": entry.headers_200})
        await send({"type": "http.response.body", "body": entry.data})
        return True

    async def _reload(self, channel: str) -> None:
        try:
            await run_in_threadpool(_load_manifest, self, channel)
        except Exception:  # the next poll after the stale limit goes the slow way and reports
            log.exception("reloading the manifest of %s failed", channel)
        finally:
            manifest_cache(self).release_reload(channel)


def manifest_cache(app: FastAPI) -> ManifestCache:
    """The app's manifest cache (a plain FastAPI app gets one on its state)."""
    cache: ManifestCache | None = getattr(app, "manifest_cache", None)
    if cache is None:
        cache = getattr(app.state, "manifest_cache", None)
        if cache is None:
            cache = app.state.manifest_cache = ManifestCache()
    return cache


def patch_scheduler(app: FastAPI) -> PatchScheduler:
    """Makes delta patches for newly published versions off the request path."""
    scheduler: PatchScheduler | None = getattr(app.state, "patch_scheduler", None)
    if scheduler is None:
        cache = manifest_cache(app)
        scheduler = app.state.patch_scheduler = PatchScheduler(
            app.state.session_factory, publisher(app), app.state.job_queue,
            on_published=cache.invalidate)
    return scheduler


def publisher(app: FastAPI) -> Publisher:
    """The app's publisher, made on first use from its settings and blob store."""
    pub: Publisher | None = getattr(app.state, "publisher", None)
    if pub is None:
        pub = app.state.publisher = make_publisher(app.state.settings, app.state.blob_store)
    return pub


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    try:
        await run_in_threadpool(import_roots, app)
    except PublishError as e:  # serve anyway: manifests and artifacts do not need the roots
        log.error("signed roots not imported: %s", e.message)
    task = asyncio.create_task(resign_loop(app.state.session_factory, publisher(app)))
    # Everything loaded at start lives as long as the process: moving it out of the cyclic
    # GC's generations stops full collections from rescanning it under load (p99 spikes).
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()  # let a process that builds many apps (tests) collect them again
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        scheduler: PatchScheduler | None = getattr(app.state, "patch_scheduler", None)
        if scheduler is not None:
            await run_in_threadpool(scheduler.shutdown)


def import_roots(app: FastAPI) -> list[int]:
    for attempt in (1, 2):
        try:
            with app.state.session_factory() as session:
                added = rootstore.sync_roots(session, key_paths(app.state.settings))
                session.commit()
            break
        except IntegrityError:
            # Workers and replicas start together and import the same roots: another one
            # stored them first. The second pass sees (and checks) what it stored.
            if attempt == 2:
                raise
    if added:
        log.info("imported signed root versions %s", added)
    return added


router = APIRouter(prefix="/v1", tags=["serving"], lifespan=lifespan)


def _load_manifest(app: FastAPI, channel: str) -> CachedManifest:
    with app.state.session_factory() as session:
        row = session.execute(
            select(db.SignedManifest.blob_key, db.SignedManifest.sha256)
            .join(db.Channel, db.Channel.id == db.SignedManifest.channel_id)
            .where(db.Channel.name == channel)
            .order_by(db.SignedManifest.serial.desc()).limit(1)
        ).first()
    if row is None:
        raise ChannelNotFoundError(f"channel {channel!r} does not exist or has no manifest yet")
    with app.state.blob_store.open(row.blob_key) as f:
        data = f.read(MANIFEST_MAX_BYTES + 1)
    return manifest_cache(app).put(channel, data, row.sha256)


@router.head("/channels/{channel}/manifest", include_in_schema=False)
@router.get(
    "/channels/{channel}/manifest",
    response_class=Response,
    responses={200: {"content": {"application/json": {}},
                     "description": "The channel's DSSE envelope, exactly as signed"},
               304: {"description": "If-None-Match matched the current ETag"}, **NOT_FOUND},
)
async def get_manifest(channel: str, request: Request) -> Response:
    """The channel's current signed manifest (a DSSE envelope). Poll with If-None-Match."""
    if not CHANNEL_NAME.fullmatch(channel):
        raise ChannelNotFoundError(f"channel {channel[:80]!r} does not exist")
    entry = manifest_cache(request.app).fresh(channel)
    if entry is None:
        entry = await run_in_threadpool(_load_manifest, request.app, channel)
    headers = {"ETag": entry.etag, "Cache-Control": MANIFEST_CACHE_CONTROL}
    if if_none_match(request.headers.get("if-none-match"), entry.etag):
        return Response(status_code=304, headers=headers)
    return Response(entry.data, media_type="application/json", headers=headers)


@router.get("/root", responses={**NOT_FOUND})
def get_root_index(request: Request) -> dict[str, int]:
    """The newest signed root version; fetch each one after yours at /v1/root/{N}.json."""
    with request.app.state.session_factory() as session:
        latest = rootstore.latest_root_version(session)
    if latest is None:
        raise NotFoundError("no signed root yet", fix="run `modelfleet keys init --data-dir DIR`")
    return {"latest_version": latest}


@router.get(
    "/root/{version}.json", response_class=Response,
    responses={200: {"content": {"application/json": {}},
                     "description": "Root version N as a DSSE envelope"}, **NOT_FOUND},
)
def get_root(version: Annotated[int, Path(ge=1, le=1_000_000)], request: Request) -> Response:
    """Signed root version `version` (every version stays served, for rotation)."""
    with request.app.state.session_factory() as session:
        data = rootstore.root_bytes(session, version)
    if data is None:
        raise NotFoundError(f"no root version {version}")
    return Response(data, media_type="application/json", headers={"Cache-Control": IMMUTABLE})


def _serve_blob(request: Request, key: str, sha256: str, length: int) -> Response:
    store = request.app.state.blob_store
    url = store.presigned_url(key)
    if url is not None:
        return RedirectResponse(url, status_code=302)
    headers = {"ETag": etag_for(sha256), "Accept-Ranges": "bytes", "Cache-Control": IMMUTABLE}
    if if_none_match(request.headers.get("if-none-match"), headers["ETag"]):
        return Response(status_code=304, headers=headers)
    try:
        wanted = parse_range(request.headers.get("range"), length)
    except RangeNotSatisfiable:
        return Response(status_code=416, headers={"Content-Range": f"bytes */{length}"})
    if wanted is None:
        headers["Content-Length"] = str(length)
        body = store.iter_range(key) if request.method == "GET" else iter(())
        return StreamingResponse(body, media_type="application/octet-stream", headers=headers)
    headers["Content-Range"] = wanted.content_range(length)
    headers["Content-Length"] = str(wanted.length)
    body = store.iter_range(key, wanted.start, wanted.end) if request.method == "GET" else iter(())
    return StreamingResponse(body, status_code=206, media_type="application/octet-stream",
                             headers=headers)


BLOB_RESPONSES: dict[int | str, dict[str, object]] = {
    200: {"content": {"application/octet-stream": {}}, "description": "The whole file"},
    206: {"description": "The requested byte range"},
    302: {"description": "Redirect to a presigned URL (S3 blob store)"},
    416: {"description": "Range not satisfiable"},
    **NOT_FOUND,
}


@router.head("/artifacts/{sha256}", include_in_schema=False)
@router.get("/artifacts/{sha256}", response_class=Response, responses=BLOB_RESPONSES)
def get_artifact(sha256: Annotated[str, Path(pattern=SHA256_PATTERN)],
                 request: Request) -> Response:
    """An artifact by its sha256 (as named in the manifest). Supports Range."""
    with request.app.state.session_factory() as session:
        row = session.execute(select(db.Artifact.blob_key, db.Artifact.length)
                              .where(db.Artifact.sha256 == sha256).limit(1)).first()
    if row is None:
        raise NotFoundError(f"no artifact with sha256 {sha256}")
    return _serve_blob(request, row.blob_key, sha256, row.length)


@router.head("/patches/{sha256}", include_in_schema=False)
@router.get("/patches/{sha256}", response_class=Response, responses=BLOB_RESPONSES)
def get_patch(sha256: Annotated[str, Path(pattern=SHA256_PATTERN)], request: Request) -> Response:
    """A delta patch by its sha256 (as named in the manifest). Supports Range."""
    with request.app.state.session_factory() as session:
        row = session.execute(select(db.Patch.blob_key, db.Patch.length)
                              .where(db.Patch.sha256 == sha256).limit(1)).first()
    if row is None:
        raise NotFoundError(f"no patch with sha256 {sha256}")
    return _serve_blob(request, row.blob_key, sha256, row.length)
